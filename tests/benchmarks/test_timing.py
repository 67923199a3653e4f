"""benchmarks/timing.py: the order of calls and what is returned, never how long anything took."""

from __future__ import annotations

import pytest

from benchmarks.timing import MIN_REPS, balanced_order, interleaved, interleaved_medians


def _recorders(log: list[str], names: str) -> list:
    return [lambda name=name: log.append(name) for name in names]


def test_rotated_primed_rounds_call_in_the_agreed_order() -> None:
    log: list[str] = []
    times = interleaved(_recorders(log, "abcd"), 4, rotate=True, primed=True)
    assert [len(t) for t in times] == [4, 4, 4, 4]
    # After the warm-up: rows of a balanced Latin square, each timed call after an untimed one.
    assert "".join(log[-32:]) == "aabbddcc" + "bbccaadd" + "ccddbbaa" + "ddaaccbb"


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7])
def test_balanced_orders_let_every_system_follow_every_other_equally_often(n: int) -> None:
    period = n if n % 2 == 0 else 2 * n
    rows = [balanced_order(n, r) for r in range(period)]
    assert all(sorted(row) == list(range(n)) for row in rows)
    follows = [(row[k], row[k + 1]) for row in rows for k in range(n - 1)]
    pairs = {(a, b) for a in range(n) for b in range(n) if a != b}
    assert set(follows) == pairs
    assert all(follows.count(p) == period // n for p in pairs)  # once each (twice for odd n)


def test_plain_rounds_keep_their_order_and_a_spent_budget_stops_at_the_minimum() -> None:
    log: list[str] = []
    times = interleaved(_recorders(log, "ab"), 10, budget_s=0.0)
    assert [len(t) for t in times] == [MIN_REPS, MIN_REPS]
    assert "".join(log[-2 * MIN_REPS :]) == "ab" * MIN_REPS
    medians = interleaved_medians({"x": lambda: None, "y": lambda: None}, 3)
    assert set(medians) == {"x", "y"} and all(m >= 0 for m in medians.values())
