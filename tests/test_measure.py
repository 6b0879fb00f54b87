"""The measurement service: reuse of stored results, sharing of jobs in flight, worker classes.

The scheduler is scripted here (the service's unit test); the real one runs under it in
tests/test_experiment.py and tests/test_ssh.py.
"""
from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from dispatcher.measure import MeasurementService
from dispatcher.records import RunRecord, RunResult
from dispatcher.store import Store
from dispatcher.worker import RunJob

A, B = "ab" * 32, "cd" * 32


class ScriptedScheduler:
    """Records every submitted job; the test resolves their futures."""

    def __init__(self) -> None:
        self.jobs: list[tuple[RunJob, str | None, Future]] = []

    def submit(self, job: RunJob, slot: str | None = None,
               worker_class: str | None = None) -> Future:
        future: Future = Future()
        self.jobs.append((job, worker_class, future))
        return future


def job(sha: str, runs: int) -> RunJob:
    return RunJob(sha256=sha, binary=Path("/nonexistent"), args=("7",), runs=runs, timeout=5)


def result(sha: str, runs: int, worker_class: str = "local") -> RunResult:
    record = RunRecord(wall_ns=10**6, user_s=0.0, sys_s=0.0, maxrss_kb=1, exit_status=0,
                       output_ok=True)
    return RunResult(sha256=sha, args=("7",), worker="local/cpu1", worker_class=worker_class,
                     cpu=1, records=(record,) * runs)


@pytest.fixture
def service(tmp_path):
    scheduler = ScriptedScheduler()
    return MeasurementService(scheduler, Store(tmp_path / "store")), scheduler  # type: ignore[arg-type]


def test_requests_for_a_binary_in_flight_share_its_job_and_it_is_stored_once(service):
    svc, scheduler = service
    pending = [svc.submit(job(A, 5), "local") for _ in range(3)]
    assert len(scheduler.jobs) == 1 and scheduler.jobs[0][1] == "local"
    smaller = svc.submit(job(A, 3), "local")  # fewer runs than the job in flight: shared
    larger = svc.submit(job(B, 5), "local")  # another binary: its own job
    assert len(scheduler.jobs) == 2
    r = result(A, 5)
    scheduler.jobs[0][2].set_result(r)
    measured = [svc.wait(p) for p in pending]
    assert [m.reused for m in measured] == [False, True, True]
    assert all(m.results == [r] for m in measured)
    assert svc.wait(smaller).reused
    assert len(svc.store.measurements_for(A, ("7",), "local")) == 1  # stored once
    # Stored: the store answers; a re-measurement queues a job regardless.
    again = svc.submit(job(A, 5), "local")
    assert again.stored == [r] and len(scheduler.jobs) == 2
    svc.submit(job(A, 5), "local", reuse=False)
    assert len(scheduler.jobs) == 3
    # A failed job is not shared: the next request queues again.
    scheduler.jobs[1][2].set_exception(RuntimeError("worker lost"))
    with pytest.raises(RuntimeError, match="worker lost"):
        svc.wait(larger)
    svc.submit(job(B, 5), "local")
    assert len(scheduler.jobs) == 4


def test_a_result_is_in_the_store_before_its_waiter_sees_it(service):
    """A re-measurement reads every run of the binary from the store right after waiting."""
    svc, scheduler = service
    pending = svc.submit(job(A, 2), "local", reuse=False)
    seen = []
    pending.future.add_done_callback(
        lambda f: seen.append(len(svc.store.measurements_for(A, ("7",), "local"))))
    scheduler.jobs[0][2].set_result(result(A, 2))
    assert svc.wait(pending).times and seen == [1]


def test_worker_classes_are_kept_apart(service):
    """A measurement on one class is neither reused nor shared for another."""
    svc, scheduler = service
    svc.submit(job(A, 2), "fast")
    svc.submit(job(A, 2), "slow")
    assert [cls for _, cls, _ in scheduler.jobs] == ["fast", "slow"]
    scheduler.jobs[0][2].set_result(result(A, 2, "fast"))
    assert svc.submit(job(A, 2), "fast").stored is not None
    assert svc.submit(job(A, 2), "slow").stored is None
