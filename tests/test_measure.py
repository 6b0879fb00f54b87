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
    if store is None:  # a store of its own, removed after (not one left in /tmp per call)
        with tempfile.TemporaryDirectory(prefix="compare-store-") as own:
            return compare(scheduler, policy, candidate, Path(own), trial)
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
    answered = compare(again, policy, store=tmp_path)
    assert answered == got and again.order == []
    assert answered.reused and not got.reused  # what a label's cost (cpu_s) leaves out
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


class SharedScheduler(TimedScheduler):
    """Each run's CPU share is ``share(n)`` for the n-th run (0-based) it runs."""

    def __init__(self, speed, share):
        super().__init__(speed)
        self.share = share

    def submit(self, job, slot=None, worker_class=None):
        result = super().submit(job, slot, worker_class).result()
        record = result.records[0].model_copy(update={
            "cpu_share": self.share(len(self.order) - 1), "cpu_share_source": "task-clock"})
        done: Future = Future()
        done.set_result(result.model_copy(update={"records": (record,)}))
        return done


def quiet(n: int) -> float:
    return 0.95 + 0.001 * (n % 3)


def test_a_run_whose_cpu_share_drops_below_its_binarys_own_is_disturbed_and_redone():
    """A load takes some of the CPU during one run: its share falls from ~0.95 to 0.85 (above
    the floor, below the binary's own): the run is marked, kept in the results, and its pair
    measured again; the pair count is still exactly the budget."""
    scheduler = SharedScheduler({A: 1.0, B: 0.8}, lambda n: 0.85 if n == 9 else quiet(n))
    got = compare(scheduler, PairingPolicy(min_pairs=6, max_pairs=6, half_width=1e-9))
    marked = [rec for r in got.results for rec in r.records if rec.disturbed]
    assert len(marked) == 1 and marked[0].cpu_share == 0.85
    assert "below this binary's 0.95" in marked[0].disturbed
    # The round's other pair counts; half a round replaces the lost pair: 6, not 7.
    assert got.pairs == 6 and got.dropped == 1 and len(got.results) == 14
    assert got.stopped == "budget" and got.resolved


def test_a_load_present_from_the_start_is_caught_by_the_floor_and_gives_no_speedup():
    """Every run at half the CPU from the first one: the relative check alone would take
    0.5 as the binaries' own level; the floor flags every run, nothing is paired, and the
    comparison is unresolved (no interval), in a bounded number of runs."""
    scheduler = SharedScheduler({A: 1.0, B: 0.8}, lambda n: 0.45 + 0.001 * (n % 5))
    got = compare(scheduler, PairingPolicy(min_pairs=3, max_pairs=6, half_width=1e-9))
    runs = [rec for r in got.results for rec in r.records]
    assert runs and all(rec.disturbed and "below the floor 0.80" in rec.disturbed
                        for rec in runs)
    assert got.stopped == "unresolved" and not got.resolved and got.pairs == 0
    assert got.interval == (None, None, None)
    assert len(runs) <= 4 * 6  # at most max_pairs rounds
    assert got.unresolved_line() == (f"unresolved: 0 undisturbed pairs of the 3 needed; "
                                     f"{len(runs)} of {len(runs)} runs disturbed (CPU shares "
                                     "0.45)")


def test_a_comparison_short_of_its_minimum_is_unresolved_not_a_speedup():
    """Half the runs disturbed (the candidate's): with a budget of 4 rounds and a minimum of
    5 pairs there can never be enough; it stops once the minimum is out of reach."""
    scheduler = SharedScheduler({A: 1.0, B: 0.8},
                                lambda n: 0.5 if n % 4 in (1, 2) and n > 3 else quiet(n))
    got = compare(scheduler, PairingPolicy(min_pairs=5, max_pairs=4, half_width=1e-9))
    assert got.stopped == "unresolved" and got.pairs == 2 and got.interval[0] is None
    assert got.pairs < got.min_pairs == 5


@pytest.mark.parametrize("most", [1, 3, 5, 8, 9])
def test_pair_counts_never_exceed_the_budget(most):
    """ABBA adds two pairs a round: an odd budget ends with half a round (AB)."""
    scheduler = TimedScheduler({A: 1.0, B: 0.8})
    got = compare(scheduler, PairingPolicy(min_pairs=1, max_pairs=most, half_width=1e-9))
    assert got.pairs == most and got.stopped == "budget"
    assert len(scheduler.order) == 2 * most
    if most % 2:
        assert [sha for sha, _ in scheduler.order[-2:]] == [A, B]


def test_quiet_history_is_kept_per_binary_and_slot_across_comparisons(tmp_path):
    """A first comparison on a quiet CPU teaches the service the binaries' shares (~0.95); a
    later one whose runs all lose a tenth of the CPU (0.85, above the floor) is judged
    against that history, not against its own loaded runs."""
    shares = iter([quiet(n) for n in range(8)] + [0.85] * 100)
    scheduler = SharedScheduler({A: 1.0, B: 0.8, "ef" * 32: 0.9}, lambda n: next(shares))
    scheduler.slots = scheduler.slots[:1]  # one CPU: both comparisons on it
    svc = MeasurementService(scheduler, Store(tmp_path / "store"))  # type: ignore[arg-type]
    policy = PairingPolicy(min_pairs=2, max_pairs=4, half_width=1e-9)
    try:
        first = svc.compare(job(A, 1), job(B, 1), "local", policy).result(timeout=10)
        second = svc.compare(job(A, 1), job("ef" * 32, 1), "local", policy).result(timeout=10)
    finally:
        svc.close()
    assert first.resolved and first.disturbed == 0
    # the reference's runs (A, seen before) are flagged: no pair, unresolved
    assert second.stopped == "unresolved"
    assert all(rec.disturbed for r in second.results if r.sha256 == A for rec in r.records)


def test_a_stored_comparison_is_judged_again_when_read(tmp_path):
    """Comparisons stored with low shares (a master without the floor, or an older version),
    unresolved ones and ones over the pair budget are measured again, not trusted."""
    policy = PairingPolicy(min_pairs=2, max_pairs=4, half_width=1e-9)
    loaded = SharedScheduler({A: 1.0, B: 0.8}, lambda n: 0.5)
    svc = MeasurementService(loaded, Store(tmp_path), min_cpu_share=0.0)  # type: ignore[arg-type]
    try:
        stored = svc.compare(job(A, 1), job(B, 1), "local", policy).result(timeout=10)
    finally:
        svc.close()
    assert stored.resolved and stored.pairs == 4  # without a floor it was used
    again = TimedScheduler({A: 1.0, B: 0.8})
    fresh = compare(again, policy, store=tmp_path)  # the default floor: measured again
    assert again.order and fresh.disturbed == 0
    # now a trusted comparison is stored under the key: it answers
    third = TimedScheduler({A: 1.0, B: 0.8})
    assert compare(third, policy, store=tmp_path) == fresh and third.order == []
    # an unresolved one is measured again
    never = SharedScheduler({A: 1.0, B: 0.8}, lambda n: 0.5)
    assert compare(never, policy, store=tmp_path, trial="t").stopped == "unresolved"
    later = TimedScheduler({A: 1.0, B: 0.8})
    assert compare(later, policy, store=tmp_path, trial="t").resolved and later.order


def test_reusing_a_stored_comparison_does_not_depend_on_what_this_process_measured(tmp_path):
    """Stored comparisons are judged again against the floor only: a process whose quiet
    history of the same binaries is higher (it ran them on a quieter CPU) still reuses one
    whose shares lie above the floor, as the process that stored it would, so a resumed
    chain reuses exactly what an uninterrupted one would have."""
    policy = PairingPolicy(min_pairs=2, max_pairs=4, half_width=1e-9)
    svc = MeasurementService(SharedScheduler({A: 1.0, B: 0.8}, lambda n: 0.85),  # type: ignore[arg-type]
                             Store(tmp_path), min_cpu_share=0.8)
    try:
        stored = svc.compare(job(A, 1), job(B, 1), "local", policy).result(timeout=10)
    finally:
        svc.close()
    assert stored.resolved and stored.pairs == 4
    quiet = SharedScheduler({A: 1.0, B: 0.8}, lambda n: 0.99)
    svc = MeasurementService(quiet, Store(tmp_path), min_cpu_share=0.8)  # type: ignore[arg-type]
    try:  # this process learns quiet shares of 0.99 for both binaries on the slot first
        svc.compare(job(A, 1), job(B, 1), "local", policy, trial="learn").result(timeout=10)
        ran = len(quiet.order)
        again = svc.compare(job(A, 1), job(B, 1), "local", policy).result(timeout=10)
    finally:
        svc.close()
    assert len(quiet.order) == ran and again.pairs == stored.pairs  # reused, not measured


def test_stored_runs_are_judged_again_when_reused(tmp_path):
    """A result stored with a share below the floor (measured by a master without it) comes
    back from the store with that run disturbed: its time is not used."""
    store = Store(tmp_path / "store")
    loaded = result(A, 3)
    records = tuple(r.model_copy(update={"cpu_share": s})
                    for r, s in zip(loaded.records, (0.96, 0.4, 0.95)))
    store.add_measurement(loaded.model_copy(update={"records": records}), job(A, 3))
    svc = MeasurementService(ScriptedScheduler(), store)  # type: ignore[arg-type]
    got = svc.measure(job(A, 3), "local")
    assert got.reused and len(got.times) == 2
    assert [rec.disturbed is not None for rec in got.results[0].records] == [False, True, False]


def test_a_comparison_takes_the_first_slot_to_free_in_the_order_comparisons_asked(tmp_path):
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
    svc = MeasurementService(scheduler, Store(tmp_path / "store"))  # type: ignore[arg-type]
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
