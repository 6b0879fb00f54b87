"""The scheduler core: which runner takes which job (``JobBoard``, no threads), and the
scheduler with many slots, under losses, with scripted slots (no processes).

tests/test_scheduler.py has the handling of lost workers case by case."""
from __future__ import annotations

import random
import threading
from collections import Counter
from concurrent.futures import Future
from pathlib import Path

import pytest

from dispatcher.config import SchedulerConfig
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.running.backend import PermanentLoss, WorkerLost
from dispatcher.running.scheduler import JobBoard, NoWorkers, Scheduler, _Queued

# Every test twice: runner threads, and slots that answer by themselves (conftest.py).
pytestmark = pytest.mark.usefixtures("both_slot_kinds")

FAST = SchedulerConfig(attempts=3, quarantine_after=2, backoff_s=0.01, backoff_max_s=0.02)


def job(i: int) -> RunJob:
    return RunJob(f"{i:064x}", Path("/nonexistent"), (str(i),), runs=1, timeout=1)


def queued(i: int, worker_class: str | None = None) -> _Queued:
    return _Queued(job(i), Future(), worker_class)


def number(item: _Queued | None) -> int | None:
    return None if item is None else int(item.job.args[0])


# --------------------------------------------------------------------------- the board

def test_each_slot_gets_a_job_before_any_gets_a_second():
    board: JobBoard[str] = JobBoard([("a", "c", 2), ("b", "c", 2)])
    for slot, runner in [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2")]:
        assert board.take(slot, runner) is None  # nothing queued: it waits
    assert [board.place(queued(i)) for i in range(4)] == ["a1", "b1", "a2", "b2"]
    assert board.place(queued(4)) is None  # every runner holds a job: queued
    assert number(board.take("b", "b1")) == 4


def test_a_job_for_any_slot_goes_to_the_least_loaded_slot_whatever_its_class():
    board: JobBoard[str] = JobBoard([("x0", "x", 1), ("y0", "y", 2)])
    assert board.take("y0", "y1") is None and board.take("y0", "y2") is None
    assert board.place(queued(0, "y")) == "y1"  # y0 now holds one job
    assert board.take("x0", "x1") is None
    assert board.place(queued(1)) == "x1"
    assert board.place(queued(2)) == "y2"


def test_a_job_for_a_slot_waits_for_that_slot_and_goes_before_shared_ones():
    board: JobBoard[str] = JobBoard([("a", "c", 1), ("b", "c", 1)])
    assert board.take("b", "b1") is None
    assert board.place(queued(0), slot="a") is None  # a is busy; b waits, but may not take it
    assert board.place(queued(1)) == "b1"  # b may take any job
    assert board.place(queued(2)) is None
    assert board.place(queued(3), slot="a") is None
    assert [number(board.take("a", "a1")) for _ in range(4)] == [0, 3, 2, None]
    assert board.place(queued(4), slot="a") == "a1"  # waiting since


def test_jobs_of_a_class_go_to_its_slots_only_and_the_oldest_goes_first():
    board: JobBoard[str] = JobBoard([("x0", "x", 1), ("y0", "y", 1)])
    assert board.take("y0", "y") is None
    assert board.place(queued(0, "x")) is None  # y waits, but not for jobs of class x
    assert board.place(queued(1)) == "y"
    for i, cls in [(2, None), (3, "x"), (4, "y"), (5, None)]:
        assert board.place(queued(i, cls)) is None
    assert board.place(queued(6, "x"), front=True) is None  # put back: before the others
    assert [number(board.take("x0", "x")) for _ in range(5)] == [6, 0, 2, 3, 5]
    assert [number(board.take("y0", "y")) for _ in range(2)] == [4, None]


def test_a_slot_out_of_service_is_handed_nothing_and_its_jobs_go_to_the_others():
    board: JobBoard[str] = JobBoard([("a", "c", 1), ("b", "c", 2)])
    assert board.place(queued(0), slot="b") is None  # b busy: queued for it
    assert board.take("a", "a1") is None
    handed = board.set_out("b")
    assert [(runner, number(item)) for runner, item in handed] == [("a1", 0)]
    assert board.take("b", "b1") is None  # out: it waits, and is listed nowhere
    assert board.place(queued(1), slot="b") is None  # out: for any slot of the class
    assert board.place(queued(2)) is None
    assert board.idle == 0  # b1 waits, but out of service
    assert [(runner, number(item)) for runner, item in board.set_in("b")] == [("b1", 1)]
    assert number(board.take("b", "b2")) == 2
    assert board.take("a", "a1") is None and board.idle == 1


def test_quarantined_slots_jobs_go_to_the_front_in_their_order():
    board: JobBoard[str] = JobBoard([("a", "c", 1), ("b", "c", 1)])
    board.place(queued(0))
    board.place(queued(1), slot="b")
    board.place(queued(2), slot="b")
    assert board.set_out("b", front=True) == []
    assert [number(board.take("a", "a1")) for _ in range(4)] == [1, 2, 0, None]
    assert board.stop_waiting("a") == ["a1"] and board.idle == 0


def test_drain_and_remove_queued_take_out_what_no_runner_took():
    board: JobBoard[str] = JobBoard([("x0", "x", 1), ("y0", "y", 1)])
    for i, cls in [(0, "x"), (1, None), (2, "y")]:
        board.place(queued(i, cls))
    board.place(queued(3), slot="x0")
    assert [number(i) for i in board.remove_queued("x")] == [0]
    assert sorted(number(i) for i in board.drain()) == [1, 2, 3]
    assert board.take("x0", "x") is None and board.drain() == []


def test_random_operations_keep_the_board_consistent():
    """Whatever happens, no runner waits while a job it may take is queued, every job is
    queued or with exactly one runner, and each runner holds only jobs it may take."""
    rng = random.Random(14)
    slots = [(f"s{i}", f"c{i % 3}", 1 + i % 2) for i in range(12)]
    board: JobBoard[str] = JobBoard(slots)
    cls_of = {name: cls for name, cls, _ in slots}
    runners = [(name, f"{name}/{k}") for name, _, depth in slots for k in range(depth)]
    free = list(runners)  # runners about to take (they ended a job, or were woken)
    holding: dict[str, _Queued] = {}
    done: set[int | None] = set()
    pins: dict[int, str] = {}
    out: set[str] = set()
    ever_out: set[str] = set()
    submitted = 0

    def hand(runner: str, item: _Queued) -> None:
        slot = runner.split("/")[0]
        assert runner not in holding and slot not in out
        assert item.worker_class in (None, cls_of[slot])
        pin = pins.get(number(item))  # a pinned job runs on its slot, unless that was out
        assert pin is None or pin == slot or pin in ever_out
        holding[runner] = item

    for _ in range(5000):
        op = rng.random()
        if op < 0.4:
            slot = rng.choice(slots)[0] if rng.random() < 0.3 else None
            cls = (cls_of[slot] if slot else rng.choice([None, "c0", "c1", "c2"]))
            item = queued(submitted, cls)
            if slot is not None:
                pins[submitted] = slot
            submitted += 1
            runner = board.place(item, slot, front=rng.random() < 0.1)
            if runner is not None:
                hand(runner, item)
        elif op < 0.75 and free:
            slot, runner = free.pop(rng.randrange(len(free)))
            item = board.take(slot, runner)
            if item is not None:
                hand(runner, item)
        elif op < 0.9 and holding:
            runner = rng.choice(sorted(holding))
            done.add(number(holding.pop(runner)))  # it ended its job
            free.append((runner.split("/")[0], runner))
        else:
            slot = rng.choice(slots)[0]
            if slot in out:
                out.discard(slot)
                handed = board.set_in(slot)
            else:
                out.add(slot)
                ever_out.add(slot)
                handed = board.set_out(slot, front=rng.random() < 0.5)
            for runner, item in handed:
                hand(runner, item)
        # (read in the board's private state: the queues, and the runners waiting)
        for name, state in board._slots.items():
            if state.waiting and not state.out:  # it could take none of the queued jobs
                assert not state.pinned
                assert not board._shared[None] and not board._shared[cls_of[name]]
        queued_now = [number(i) for q in board._shared.values() for _, i in q]
        queued_now += [number(i) for state in board._slots.values() for i in state.pinned]
        held = [number(item) for item in holding.values()]
        everything = queued_now + held + list(done)
        assert sorted(everything) == list(range(submitted))  # each job in one place
        assert board.idle == sum(len(s.waiting) for s in board._slots.values() if not s.out)
    assert submitted > 1000 and len(done) > 500 and ever_out


# --------------------------------------------------------------------------- many slots, threads

class Gate:
    """Holds the runs of the slots given it until ``release``; counts those started."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self._started = threading.Semaphore(0)

    def hold(self) -> None:
        self._started.release()
        self.release.wait(timeout=30)

    def started(self, n: int) -> None:
        """Wait until ``n`` more runs have started (a guard against hanging, no more)."""
        for _ in range(n):
            assert self._started.acquire(timeout=30), "runs did not start"


class FakeSlot:
    """Runs at once; loses a share of its jobs (WorkerLost), or every one (PermanentLoss), or
    holds each run at ``gate``."""

    def __init__(self, name: str, worker_class: str, depth: int, loss_rate: float = 0.0,
                 permanent: bool = False, dead_probe: bool = False, gate: Gate | None = None):
        self.name, self.worker_class, self.cpu, self.depth = name, worker_class, 0, depth
        self.loss_rate, self.permanent, self.dead_probe = loss_rate, permanent, dead_probe
        self.gate = gate
        self.rng = random.Random(name)
        self.lock = threading.Lock()
        self.ran: list[int] = []  # jobs run to the end
        self.lost: list[int] = []
        self.running = 0
        self.closed = False

    def run(self, job: RunJob) -> RunResult:
        i = int(job.args[0])
        with self.lock:
            if self.permanent:
                self.lost.append(i)
                raise PermanentLoss(f"{self.name}: host key CHANGED")
            if self.rng.random() < self.loss_rate:
                self.lost.append(i)
                raise WorkerLost(f"{self.name}: dropped")
            self.running += 1
        if self.gate is not None:
            self.gate.hold()
        with self.lock:
            self.running -= 1
            self.ran.append(i)
        return RunResult(sha256=job.sha256, args=job.args, worker=self.name,
                         worker_class=self.worker_class, cpu=0, records=())

    def probe(self) -> None:
        if self.dead_probe:
            raise WorkerLost(f"{self.name}: refused")

    def close(self) -> None:
        self.closed = True


def eventually(condition) -> None:
    """Wait until ``condition()`` holds (what a runner does after resolving a future, such as
    quarantining its slot, may come just after); a guard against hanging, no more."""
    stop = threading.Event()
    for _ in range(3000):
        if condition():
            return
        stop.wait(0.01)
    assert condition()


def test_200_slots_run_every_job_once_where_it_may_run_despite_losses():
    slots = [FakeSlot(f"s{i}", f"c{i % 4}", 1 + i % 2,
                      loss_rate=0.3 if i % 10 == 3 else 0.0,  # flaky: probed, back
                      permanent=i in (5, 6),  # taken out at once
                      dead_probe=i in (7, 17))  # lost, never answers again: quarantined
              for i in range(200)]
    for s in slots[7], slots[17]:
        s.loss_rate = 1.0
    by_name = {s.name: s for s in slots}
    unreliable = {s.name for s in slots if s.loss_rate or s.permanent}
    rng = random.Random(7)
    policy = SchedulerConfig(attempts=20, quarantine_after=2, backoff_s=0.001,
                             backoff_max_s=0.002)
    wanted: list[tuple[str | None, str | None]] = []  # (slot, class) per job
    with Scheduler(slots, policy) as scheduler:
        futures = []
        for i in range(3000):
            kind = i % 3
            slot = (f"s{[5, 6, 7, 17][i // 3]}" if i < 12 and kind == 2  # surely lost
                    else rng.choice(slots).name if kind == 2 else None)
            cls = f"c{rng.randrange(4)}" if kind == 1 else None
            wanted.append((slot, cls))
            futures.append(scheduler.submit(job(i), slot=slot, worker_class=cls))
        results = [f.result(timeout=60) for f in futures]
        eventually(lambda: {"s5", "s6", "s7", "s17"} <= set(scheduler.quarantined))
    ran = Counter(i for s in slots for i in s.ran)
    assert ran == Counter(range(3000))  # each job ran to the end exactly once
    losses = Counter(i for s in slots for i in s.lost)
    assert scheduler.lost_jobs == sum(losses.values()) > 0
    for i, (result, (slot, cls)) in enumerate(zip(results, wanted)):
        assert i in by_name[result.worker].ran
        assert len(result.lost_on) == losses[i]
        if cls is not None:
            assert result.worker_class == cls
        if slot is not None:
            assert result.worker_class == by_name[slot].worker_class
            if slot not in unreliable:
                assert result.worker == slot
    assert all(by_name[name].closed for name in scheduler.quarantined)
    assert not set(scheduler.quarantined) - unreliable


def test_every_slot_gets_a_job_before_any_gets_a_second_and_none_idles_while_jobs_wait():
    gate = Gate()
    slots = [FakeSlot(f"s{i}", "c", 2, gate=gate) for i in range(50)]
    with Scheduler(slots, FAST) as scheduler:
        futures = [scheduler.submit(job(i)) for i in range(50)]
        gate.started(50)
        assert all(s.running == 1 for s in slots)
        futures += [scheduler.submit(job(i)) for i in range(50, 130)]
        gate.started(50)
        assert all(s.running == 2 for s in slots)  # and 30 jobs wait
        gate.release.set()
        results = [f.result(timeout=30) for f in futures]
    assert sorted(int(r.args[0]) for r in results) == list(range(130))
    assert all(scheduler.busy_s[s.name] > 0 for s in slots)


def test_the_threads_of_a_slot_taken_out_of_service_end():
    """Both threads of a slot of depth 2, the one that lost its job and the one waiting."""
    gone = FakeSlot("gone", "c", 2, permanent=True)
    with Scheduler([gone, FakeSlot("good", "c", 1)], FAST) as scheduler:
        assert scheduler.submit(job(0), slot="gone").result(timeout=30).worker == "good"
        eventually(lambda: not any(t.name == "slot gone" for t in threading.enumerate()))
    assert gone.lost == [0] and gone.closed


def test_a_job_cancelled_while_queued_is_not_run():
    gate = Gate()
    slot = FakeSlot("s", "c", 1, gate=gate)
    with Scheduler([slot], FAST) as scheduler:
        first = scheduler.submit(job(0))
        gate.started(1)
        second = scheduler.submit(job(1))
        assert second.cancel()
        gate.release.set()
        assert first.result(timeout=30).worker == "s"
    assert slot.ran == [0]


def test_close_runs_the_queued_jobs():
    gate = Gate()
    slots = [FakeSlot(f"s{i}", "c", 1, gate=gate) for i in range(2)]
    scheduler = Scheduler(slots, FAST)
    futures = [scheduler.submit(job(i)) for i in range(6)]
    gate.started(2)
    closing = threading.Thread(target=scheduler.close)
    closing.start()
    gate.release.set()
    closing.join(timeout=30)
    assert not closing.is_alive()
    assert sorted(int(f.result(timeout=0).args[0]) for f in futures) == list(range(6))
    with pytest.raises(RuntimeError, match="scheduler is closed"):
        scheduler.submit(job(6))


def test_close_with_abort_fails_queued_and_running_jobs():
    gate = Gate()

    class Closing(FakeSlot):
        def run(self, job: RunJob) -> RunResult:
            super().run(job)
            if self.closed:  # closed under the run: its worker went away
                raise WorkerLost(f"{self.name}: closed")
            raise AssertionError("ran to the end")

        def close(self) -> None:
            self.closed = True
            gate.release.set()

    slots = [Closing(f"s{i}", "c", 1, gate=gate) for i in range(2)]
    scheduler = Scheduler(slots, FAST)
    futures = [scheduler.submit(job(i)) for i in range(6)]
    gate.started(2)
    scheduler.close(abort=True)
    errors = [str(f.exception(timeout=30)) for f in futures]
    assert sum("stopped during the job" in e for e in errors) == 2
    assert sum("stopped before the job could run" in e for e in errors) == 4
    assert scheduler.lost_jobs == 0


def test_with_every_slot_lost_every_job_fails_and_none_hangs():
    slots = [FakeSlot(f"s{i}", f"c{i % 3}", 1 + i % 2, permanent=True) for i in range(200)]
    with Scheduler(slots, FAST) as scheduler:
        futures = [scheduler.submit(job(i), worker_class=f"c{i % 3}" if i % 2 else None)
                   for i in range(1000)]
        errors = [f.exception(timeout=60) for f in futures]
        assert all(isinstance(e, WorkerLost) for e in errors)
        assert any(isinstance(e, NoWorkers) for e in errors)
        assert len(scheduler.quarantined) == 200
        with pytest.raises(NoWorkers):
            scheduler.submit(job(1000)).result(timeout=1)
    assert all(s.ran == [] for s in slots)
