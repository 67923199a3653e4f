"""The shared ``run_in_threads`` fixture: a worker's exception must fail the test that started it."""

import pytest


def test_an_exception_in_a_worker_thread_is_raised_in_the_test(run_in_threads):
    done: list[int] = []

    def work(k: int) -> None:
        if k == 2:
            raise ValueError("worker 2 failed")
        done.append(k)

    with pytest.raises(ValueError, match="worker 2 failed"):
        run_in_threads(work, 4)
    assert sorted(done) == [0, 1, 3]  # the others still ran to the end
