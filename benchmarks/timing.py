"""Interleaved timing, shared by the focused benchmarks and the machine probes.

Every system or routine compared is called once per round, so noise from other tenants of
this shared machine hits all of them alike; a figure is then the median over rounds.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

MIN_REPS = 3  # the fewest rounds a time budget may cut a measurement to (quartiles need a few)
WARMUP_S = 0.05  # an idle OpenMP pool takes milliseconds to wake on this VM: warm up by time, not by a single call


def warm_up(fns: Sequence[Callable[[], object]], seconds: float = WARMUP_S) -> None:
    """Calls every fn at least once, and keeps calling them until ``seconds`` have passed."""
    deadline = time.perf_counter() + seconds
    while True:
        for fn in fns:
            fn()
        if time.perf_counter() >= deadline:
            return


def balanced_order(n: int, r: int) -> list[int]:
    """Round ``r``'s calling order of ``n`` systems: a row of a balanced Latin square (Williams design).

    Over ``n`` rounds (``2n`` for odd ``n``) every system runs right after every other exactly
    once. Rotating one order keeps neighbours together instead: the system after eager in the
    suite's list always ran on caches eager had just filled (10-20% slower on the detector and
    GPT-2 decode than the same program one place later).
    """
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    order = [(k + r) % n for k in first] if n else []
    return order[::-1] if n % 2 and (r // n) % 2 else order


def interleaved(
    fns: Sequence[Callable[[], object]], reps: int, budget_s: float = float("inf"), *, rotate: bool = False, primed: bool = False
) -> list[list[float]]:
    """Seconds per call for each fn, one call of each per round, ``reps`` rounds or fewer once ``budget_s`` is spent.

    ``rotate`` calls round r's fns in ``balanced_order``, so no fn always runs on caches the same
    other one warmed. ``primed`` precedes each timed call with an untimed one of the same fn: torch and
    the RAL run on different OpenMP runtimes, and the first call after the other's wakes its
    sleeping threads (up to 40% of a 16-row GEMM), which a program's consecutive calls do not pay.
    """
    warm_up(fns)
    times: list[list[float]] = [[] for _ in fns]
    start = time.perf_counter()
    for r in range(reps):
        for i in balanced_order(len(fns), r) if rotate else range(len(fns)):
            if primed:
                fns[i]()
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
        if r + 1 >= MIN_REPS and time.perf_counter() - start > budget_s:
            break
    return times


def interleaved_medians(fns: Mapping[str, Callable[[], object]], reps: int, budget_s: float = float("inf"), **options: bool) -> dict[str, float]:
    """``interleaved`` over named fns: the median seconds of each."""
    times = interleaved(list(fns.values()), reps, budget_s, **options)
    return {name: statistics.median(ts) for name, ts in zip(fns, times)}
