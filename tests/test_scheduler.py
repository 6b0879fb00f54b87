"""The scheduler's handling of lost workers, with scripted slots (no processes).

The same behaviour through real agents and real sshd is in tests/test_ssh.py."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dispatcher.config import SchedulerConfig
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunResult
from dispatcher.running.backend import AgentError, PermanentLoss, Slot, WorkerLost
from dispatcher.running.scheduler import NoWorkers, Scheduler

# Every test twice: runner threads, and slots that answer by themselves (conftest.py).
pytestmark = pytest.mark.usefixtures("both_slot_kinds")

JOB = RunJob("0" * 64, Path("/nonexistent"), ("x",), runs=1, timeout=1)
FAST = SchedulerConfig(attempts=3, quarantine_after=2, backoff_s=0.01, backoff_max_s=0.02)


class ScriptedSlot:
    """Fails with the scripted exceptions, one per job (or per probe), then succeeds."""

    depth = 1

    def __init__(self, name: str, failures=(), probe_failures=(), worker_class: str = "test"):
        self.name, self.worker_class, self.cpu = name, worker_class, 0
        self.failures = list(failures)
        self.probe_failures = list(probe_failures)
        self.ran = []
        self.probes = 0
        self.closed = False
        self.lock = threading.Lock()

    def probe(self) -> None:
        with self.lock:
            self.probes += 1
            if self.probe_failures:
                raise self.probe_failures.pop(0)

    def run(self, job: RunJob) -> RunResult:
        with self.lock:
            self.ran.append(job)
            if self.failures:
                raise self.failures.pop(0)
        return RunResult(sha256=job.sha256, args=job.args, worker=self.name,
                         worker_class=self.worker_class, cpu=self.cpu, records=())

    def close(self) -> None:
        self.closed = True


def test_a_job_lost_with_its_worker_runs_on_another_slot():
    bad = ScriptedSlot("bad", failures=[WorkerLost("bad: gone")] * 10,
                       probe_failures=[WorkerLost("bad: still gone")] * 10)
    good = ScriptedSlot("good")
    with Scheduler([bad, good], FAST) as scheduler:
        result = scheduler.submit(JOB, slot="bad").result(timeout=10)
        assert result.worker == "good"
        assert scheduler.lost_jobs == 1
        assert result.lost_on == ("bad: bad: gone",)  # kept with the measurement
        assert RunResult.from_json(result.to_json()) == result
        # Lost, with its reason, until a probe succeeds or it is taken out of service.
        assert scheduler.down.get("bad", scheduler.quarantined.get("bad", "")).startswith("bad:")
    assert len(bad.ran) == 1 and len(good.ran) == 1  # measured once, where it succeeded


def test_a_sibling_thread_of_a_lost_slot_takes_no_job_until_it_is_probed():
    """A slot of depth 2 that loses a job: its second thread must not take the retried job
    (it would most likely be lost again, at the cost of an attempt)."""
    class DeepSlot(ScriptedSlot):
        depth = 2

    bad = DeepSlot("bad", failures=[WorkerLost("bad: gone")] * 10,
                   probe_failures=[WorkerLost("bad: still gone")] * 10)
    good = ScriptedSlot("good")
    slow = threading.Event()
    real_run = good.run

    def run(job):
        slow.wait(0.2)  # busy while the lost job is queued again
        return real_run(job)

    good.run = run  # type: ignore[method-assign]
    with Scheduler([bad, good], FAST) as scheduler:
        futures = [scheduler.submit(JOB, slot="good"), scheduler.submit(JOB, slot="bad")]
        results = [f.result(timeout=10) for f in futures]
    assert [r.worker for r in results] == ["good", "good"]
    assert results[1].lost_on == ("bad: bad: gone",)
    assert len(bad.ran) == 1


def test_a_lost_slot_is_probed_then_serves_again():
    flaky = ScriptedSlot("flaky", failures=[WorkerLost("flaky: dropped")])
    with Scheduler([flaky], FAST) as scheduler:
        result = scheduler.submit(JOB).result(timeout=10)
    assert result.worker == "flaky" and len(flaky.ran) == 2 and flaky.probes == 1
    assert not scheduler.quarantined and not scheduler.down  # probed fine: back in service


def test_attempts_are_bounded():
    slots = [ScriptedSlot(f"s{i}", failures=[WorkerLost(f"s{i}: gone")] * 10) for i in range(4)]
    policy = SchedulerConfig(attempts=2, quarantine_after=100, backoff_s=0.01,
                             backoff_max_s=0.01)
    with Scheduler(slots, policy) as scheduler:
        with pytest.raises(WorkerLost, match="lost its worker 2 times"):
            scheduler.submit(JOB).result(timeout=10)
    assert sum(len(s.ran) for s in slots) == 2


def test_a_slot_that_keeps_failing_is_quarantined_and_reported():
    dead = ScriptedSlot("dead", failures=[WorkerLost("dead: gone")],
                        probe_failures=[WorkerLost("dead: refused")] * 10)
    good = ScriptedSlot("good")
    with Scheduler([dead, good], FAST) as scheduler:
        first = scheduler.submit(JOB, slot="dead")
        assert first.result(timeout=10).worker == "good"
        deadline = threading.Event()
        for _ in range(200):
            if "dead" in scheduler.quarantined:
                break
            deadline.wait(0.01)
        assert scheduler.quarantined == {"dead": "dead: refused"}
        # Work meant for a quarantined slot goes to the others.
        assert scheduler.submit(JOB, slot="dead").result(timeout=10).worker == "good"
    assert dead.closed and dead.probes == FAST.quarantine_after - 1


def test_a_permanent_failure_quarantines_at_once_and_no_slot_left_fails_the_queue():
    untrusted = ScriptedSlot("untrusted",
                             failures=[PermanentLoss("h: host key CHANGED")])
    with Scheduler([untrusted], FAST) as scheduler:
        with pytest.raises(NoWorkers, match="no worker slot left in service .untrusted: h: "
                                            "host key CHANGED"):
            scheduler.submit(JOB).result(timeout=10)
        assert untrusted.probes == 0  # no back-off, no re-probe
        with pytest.raises(NoWorkers):  # later submissions fail at once, never hang
            scheduler.submit(JOB).result(timeout=1)


def test_a_job_failing_on_its_own_merits_is_not_retried():
    refusing = ScriptedSlot("s", failures=[AgentError("s: binary abc not in cache")])
    with Scheduler([refusing], FAST) as scheduler:
        with pytest.raises(AgentError, match="not in cache"):
            scheduler.submit(JOB).result(timeout=10)
        assert scheduler.submit(JOB).result(timeout=10).worker == "s"
    assert scheduler.lost_jobs == 0 and not scheduler.quarantined


def test_scripted_slots_satisfy_the_slot_protocol():
    slot: Slot = ScriptedSlot("s")  # checked by mypy; and at run time, the attributes used
    assert (slot.name, slot.worker_class, slot.cpu, slot.depth) == ("s", "test", 0, 1)


def test_jobs_of_a_worker_class_run_only_on_its_slots():
    fast = [ScriptedSlot(f"fast{i}", worker_class="fast") for i in range(2)]
    slow = ScriptedSlot("slow", worker_class="slow")
    with Scheduler([*fast, slow], FAST) as scheduler:
        assert scheduler.worker_classes == ["fast", "slow"]
        futures = [scheduler.submit(JOB, worker_class="slow") for _ in range(6)]
        assert {f.result(timeout=10).worker for f in futures} == {"slow"}
        futures = [scheduler.submit(JOB, worker_class="fast") for _ in range(6)]
        assert {f.result(timeout=10).worker for f in futures} <= {"fast0", "fast1"}
        with pytest.raises(KeyError, match="no worker slot of class 'medium'"):
            scheduler.submit(JOB, worker_class="medium")


def test_a_lost_class_fails_its_jobs_but_not_the_others():
    """A slot of a class, lost, never hands its job to a slot of another class."""
    gone = ScriptedSlot("gone", failures=[PermanentLoss("gone: host key CHANGED")],
                        worker_class="a")
    other = ScriptedSlot("other", worker_class="b")
    with Scheduler([gone, other], FAST) as scheduler:
        with pytest.raises(NoWorkers, match="no worker slot of class a left in service "
                                            r"\(gone: gone: host key CHANGED\)"):
            scheduler.submit(JOB, worker_class="a").result(timeout=10)
        assert scheduler.submit(JOB, worker_class="b").result(timeout=10).worker == "other"
        with pytest.raises(NoWorkers):  # at once, never hangs
            scheduler.submit(JOB, worker_class="a").result(timeout=1)
    assert len(other.ran) == 1


def test_a_job_put_back_after_its_only_slot_was_given_up_fails_instead_of_waiting():
    """Two threads of one slot (depth 2): one quarantines the slot while the other still runs
    a job, which it then loses and puts back; nothing is left to run it, so it must fail,
    not wait forever."""
    holder: dict = {}
    both = threading.Barrier(2)

    class DeepSlot(ScriptedSlot):
        depth = 2

        def run(self, job):
            with self.lock:
                self.ran.append(job)
                first = len(self.ran) == 1
            both.wait(timeout=5)  # each thread holds a job
            if not first:  # the second job: lost only once the slot is out of service
                for _ in range(500):
                    if "gone" in holder["scheduler"].quarantined:
                        break
                    threading.Event().wait(0.01)
            raise PermanentLoss("gone: CPU 1 is in use")

    gone = DeepSlot("gone")
    with Scheduler([gone], FAST) as scheduler:
        holder["scheduler"] = scheduler
        futures = [scheduler.submit(JOB) for _ in range(2)]
        for f in futures:
            with pytest.raises(NoWorkers):
                f.result(timeout=10)
