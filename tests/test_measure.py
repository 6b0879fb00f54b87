"""The measurement service: reuse of stored results, sharing of jobs in flight, worker classes.

The scheduler is scripted here (the service's unit test); the real one runs under it in
tests/test_experiment.py and tests/test_ssh.py.
"""
from __future__ import annotations

import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunRecord, RunResult
from dispatcher.running.measurement import MeasurementService, PairingPolicy, ReferenceFailed
from dispatcher.storage.store import Store

A, B = "ab" * 32, "cd" * 32


class ScriptedScheduler:
    """Records every submitted job; the test resolves their futures."""

    def __init__(self) -> None:
        self.jobs: list[tuple[RunJob, str | None, Future]] = []
        self.slots: list = []

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


# --------------------------------------------------------------------------- comparisons

class SlotStub:
    def __init__(self, name: str, worker_class: str = "local"):
        self.name, self.worker_class = name, worker_class


class TimedScheduler:
    """Runs each one-run job at once: its time is ``speed[sha] * drift`` (drift grows by 1%
    per job, as a warming or throttling CPU might), on the slot asked for unless that slot
    is in ``moved`` (then on ``moved[slot]``, as the scheduler does with a lost slot)."""

    def __init__(self, speed: dict[str, float], failing: str | None = None):
        self.slots = [SlotStub("local/cpu1"), SlotStub("local/cpu2")]
        self.speed, self.failing = speed, failing
        self.moved: dict[str, str] = {}
        self.order: list[tuple[str, str]] = []  # (sha, slot) in the order they ran
        self.drift = 1.0

    def submit(self, job: RunJob, slot: str | None = None,
               worker_class: str | None = None) -> Future:
        assert job.runs == 1 and slot is not None
        where = self.moved.get(slot, slot)
        self.order.append((job.sha256, where))
        self.drift *= 1.01
        fails = job.sha256 == self.failing
        record = RunRecord(wall_ns=int(1e9 * self.speed[job.sha256] * self.drift), user_s=0.0,
                           sys_s=0.0, maxrss_kb=1, exit_status=1 if fails else 0,
                           output_ok=not fails, failure="exit status 1" if fails else None)
        future: Future = Future()
        future.set_result(RunResult(sha256=job.sha256, args=job.args, worker=where,
                                    worker_class="local", cpu=1, records=(record,)))
        return future


def compare(scheduler, policy, candidate=B, store: Path | None = None,
            trial: str | None = None):
    if store is None:
        store = Path(tempfile.mkdtemp(prefix="compare-store-"))
    svc = MeasurementService(scheduler, Store(store))  # type: ignore[arg-type]
    try:
        return svc.compare(job(A, 1), job(candidate, 1), "local", policy,
                           trial=trial).result(timeout=10)
    finally:
        svc.close()


def test_a_comparison_alternates_abba_on_one_slot_and_cancels_drift():
    scheduler = TimedScheduler({A: 1.0, B: 0.8})
    got = compare(scheduler, PairingPolicy(min_pairs=4, max_pairs=8, half_width=1e-9))
    assert got.stopped == "budget" and got.pairs == 8 and got.dropped == 0
    assert [sha for sha, _ in scheduler.order[:8]] == [A, B, B, A, A, B, B, A]
    assert len({slot for _, slot in scheduler.order}) == 1  # pairs never mix slots
    speedup, low, high = got.interval
    assert speedup == pytest.approx(1.25, rel=1e-9)  # ABBA: linear drift cancels exactly
    assert low <= speedup <= high
    assert [r.sha256 for r in got.results] == [sha for sha, _ in scheduler.order]


def test_a_comparison_stops_at_its_target_half_width():
    got = compare(TimedScheduler({A: 1.0, B: 0.5}),
                  PairingPolicy(min_pairs=4, max_pairs=40, half_width=0.05))
    speedup, low, high = got.interval
    assert got.stopped == "target" and got.pairs < 40
    assert high / speedup - 1 <= 0.05 and 1 - low / speedup <= 0.05


def test_a_candidate_that_cannot_beat_the_bar_stops_early():
    got = compare(TimedScheduler({A: 1.0, B: 1.5}),
                  PairingPolicy(min_pairs=4, max_pairs=40, half_width=1e-9, must_beat=1.0))
    assert got.stopped == "worse" and got.pairs == 4
    assert got.interval[2] < 1.0


def test_a_failing_candidate_stops_and_a_failing_reference_is_an_error():
    got = compare(TimedScheduler({A: 1.0, B: 0.5}, failing=B), PairingPolicy())
    assert got.stopped == "failed" and got.failed == 2 and got.pairs == 0
    assert got.interval == (None, None, None)
    with pytest.raises(ReferenceFailed, match="the reference abababababab failed on "
                                              "local/cpu[12]: exit status 1"):
        compare(TimedScheduler({A: 1.0, B: 0.5}, failing=A), PairingPolicy())


def test_a_round_moved_to_another_slot_is_not_paired():
    class MovingScheduler(TimedScheduler):
        def submit(self, job, slot=None, worker_class=None):
            if len(self.order) == 5:  # mid second round: the slot is lost from here on
                self.moved[slot] = "local/cpu2" if slot == "local/cpu1" else "local/cpu1"
            return super().submit(job, slot, worker_class)

    scheduler = MovingScheduler({A: 1.0, B: 0.5})
    got = compare(scheduler, PairingPolicy(min_pairs=4, max_pairs=6, half_width=1e-9))
    assert got.dropped == 2 and got.pairs == 6
    assert len(got.results) == 16  # every run kept, the dropped round's too
    slots = [slot for _, slot in scheduler.order]
    assert slots[4] != slots[5] and len(set(slots[8:])) == 1  # then on the slot it went to


def test_a_comparison_is_stored_and_answered_from_the_store(tmp_path):
    """Identical binaries are compared once: a later request (another chain, a rerun with the
    same store) gets the same pairs without running anything; another policy is measured."""
    first = TimedScheduler({A: 1.0, B: 0.8})
    policy = PairingPolicy(min_pairs=2, max_pairs=4, half_width=1e-9)
    got = compare(first, policy, store=tmp_path)
    again = TimedScheduler({A: 1.0, B: 0.8})
    assert compare(again, policy, store=tmp_path) == got and again.order == []
    compare(again, PairingPolicy(min_pairs=2, max_pairs=4, half_width=1e-9, must_beat=1.1),
            store=tmp_path)
    assert len(again.order) > 0


def test_a_named_trial_is_measured_apart_and_replayed_only_by_itself(tmp_path):
    """The search's re-measurement at step 4 and at step 6 are new pairs each (a stored
    comparison answering both would pool the same pairs twice); the step-4 trial asked again
    (a resume redoing step 4) is answered from the store."""
    policy = PairingPolicy(min_pairs=2, max_pairs=4, half_width=1e-9)
    compare(TimedScheduler({A: 1.0, B: 0.8}), policy, store=tmp_path)  # the step's own
    runs = TimedScheduler({A: 1.0, B: 0.8})
    step4 = compare(runs, policy, store=tmp_path, trial="remeasure step 4")
    assert len(runs.order) == 2 * step4.pairs  # measured, not the untrialled one
    step6 = compare(runs, policy, store=tmp_path, trial="remeasure step 6")
    assert len(runs.order) == 2 * (step4.pairs + step6.pairs)
    assert step6.candidate_times != step4.candidate_times  # the drift went on: new runs
    again = TimedScheduler({A: 1.0, B: 0.8})
    assert compare(again, policy, store=tmp_path, trial="remeasure step 4") == step4
    assert again.order == []


def test_a_run_whose_cpu_share_drops_below_its_binarys_own_is_disturbed_and_redone():
    """A planted load takes the CPU during one run: its share falls from ~0.95 to 0.5; the
    run is marked, kept in the results, and its pair measured again."""
    class LoadedScheduler(TimedScheduler):
        def submit(self, job, slot=None, worker_class=None):
            future = super().submit(job, slot, worker_class)
            result = future.result()
            share = 0.5 if len(self.order) == 10 else 0.95 + 0.001 * (len(self.order) % 3)
            record = result.records[0].model_copy(update={"cpu_share": share,
                                                          "cpu_share_source": "task-clock"})
            done: Future = Future()
            done.set_result(result.model_copy(update={"records": (record,)}))
            return done

    scheduler = LoadedScheduler({A: 1.0, B: 0.8})
    got = compare(scheduler, PairingPolicy(min_pairs=6, max_pairs=6, half_width=1e-9))
    marked = [rec for r in got.results for rec in r.records if rec.disturbed]
    assert len(marked) == 1 and marked[0].cpu_share == 0.5
    assert "below this binary's 0.95" in marked[0].disturbed
    # The round's other pair counts; one more round replaces the lost pair.
    assert got.pairs == 7 and got.dropped == 1 and len(got.results) == 16


def test_a_comparison_takes_the_first_slot_to_free_in_the_order_comparisons_asked():
    """Three comparisons on two slots: two start at once on different slots; the third runs
    nothing until one of them ends, then goes to the slot that freed (not to one chosen in
    turn when it was asked for, which may still be busy); never two on one slot at once."""
    C, D = "ef" * 32, "01" * 32
    held = {B: threading.Event(), C: threading.Event()}  # candidates whose runs wait
    submitted: list[tuple[str, str]] = []  # (sha, slot) as the jobs were submitted

    class GatedScheduler(TimedScheduler):
        def submit(self, job, slot=None, worker_class=None):
            submitted.append((job.sha256, slot))
            future: Future = Future()

            def run():
                if job.sha256 in held:
                    held[job.sha256].wait(30)
                future.set_result(TimedScheduler.submit(self, job, slot, worker_class).result())
            threading.Thread(target=run, daemon=True).start()
            return future

    scheduler = GatedScheduler({A: 1.0, B: 0.8, C: 0.9, D: 0.7})
    svc = MeasurementService(scheduler, Store(Path(tempfile.mkdtemp(prefix="slots-"))))  # type: ignore[arg-type]
    policy = PairingPolicy(min_pairs=1, max_pairs=1, half_width=1e-9)
    try:
        first = svc.compare(job(A, 1), job(B, 1), "local", policy)
        second = svc.compare(job(A, 1), job(C, 1), "local", policy)
        third = svc.compare(job(A, 1), job(D, 1), "local", policy)
        deadline = time.monotonic() + 10
        while {B, C} - {sha for sha, _ in submitted} and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)
        slot_of = {sha: slot for sha, slot in submitted}
        assert D not in slot_of  # waiting: both slots are taken
        assert slot_of[B] != slot_of[C]
        held[C].set()  # the second ends first: its slot is the one free
        assert second.result(timeout=10).worker == slot_of[C]
        assert third.result(timeout=10).worker == slot_of[C]
        assert not first.done()
        held[B].set()
        assert first.result(timeout=10).worker == slot_of[B]
    finally:
        for gate in held.values():
            gate.set()
        svc.close()
