"""benchmarks/timing.py: the order of calls and what is returned, never how long anything took."""

from __future__ import annotations

from benchmarks.timing import MIN_REPS, interleaved, interleaved_medians


def _recorders(log: list[str], names: str) -> list:
    return [lambda name=name: log.append(name) for name in names]


def test_rotated_primed_rounds_call_in_the_agreed_order() -> None:
    log: list[str] = []
    times = interleaved(_recorders(log, "abc"), 3, rotate=True, primed=True)
    assert [len(t) for t in times] == [3, 3, 3]
    # After the warm-up: each round starts one fn later, and each timed call follows an untimed one.
    assert "".join(log[-18:]) == "aabbcc" + "bbccaa" + "ccaabb"


def test_plain_rounds_keep_their_order_and_a_spent_budget_stops_at_the_minimum() -> None:
    log: list[str] = []
    times = interleaved(_recorders(log, "ab"), 10, budget_s=0.0)
    assert [len(t) for t in times] == [MIN_REPS, MIN_REPS]
    assert "".join(log[-2 * MIN_REPS :]) == "ab" * MIN_REPS
    medians = interleaved_medians({"x": lambda: None, "y": lambda: None}, 3)
    assert set(medians) == {"x", "y"} and all(m >= 0 for m in medians.values())
