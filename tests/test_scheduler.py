"""The scheduler's handling of lost workers, with scripted slots (no processes).

The same behaviour through real agents and real sshd is in tests/test_ssh.py."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from dispatcher.config import SchedulerConfig
from dispatcher.scheduler import NoWorkers, Scheduler
from dispatcher.ssh import HostError
from dispatcher.worker import AgentError, RunJob, RunResult, WorkerLost

JOB = RunJob("0" * 64, Path("/nonexistent"), ("x",), runs=1, timeout=1)
FAST = SchedulerConfig(attempts=3, quarantine_after=2, backoff_s=0.01, backoff_max_s=0.02)


class ScriptedSlot:
    """Fails with the scripted exceptions, one per job (or per probe), then succeeds."""

    def __init__(self, name: str, failures=(), probe_failures=()):
        self.name, self.worker_class, self.cpu = name, "test", 0
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
        return RunResult(job.sha256, job.args, self.name, self.worker_class, self.cpu, ())

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
                             failures=[HostError("h: host key CHANGED", permanent=True)])
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
