"""The exact metric in the master: config and --metric, store keys, exact comparisons (one
counted run of each binary, a degenerate interval, the determinism sample and its fallback to
time), the workers' check at start, and one end-to-end run-benchmark with the real compiler
and agent.

The service's rules run on fake slots under the real scheduler (counts scripted per binary);
the end-to-end test is the one that needs valgrind.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest
import yaml

from dispatcher.config import ConfigError, parse_config, with_metric
from dispatcher.core.comparison import Comparison
from dispatcher.core.cycles import EVENTS, metric_value
from dispatcher.core.figures import Figure, metric_caption
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import RunRecord, RunResult
from dispatcher.running.exact import IDENTITY, ExactUnavailable, check_workers, exact_job
from dispatcher.running.measurement import (
    DETERMINISM_EVERY,
    MeasurementService,
    PairingPolicy,
    judge_shares,
)
from dispatcher.running.scheduler import Scheduler
from dispatcher.storage.store import Store, measurement_key
from tests.helpers import invoke, needs_valgrind, one_line_error, write_config

REF, CAND = "aa" * 32, "bb" * 32
POLICY = PairingPolicy(min_pairs=3, max_pairs=4, half_width=0.5)


def counts(ir: int, **more: int) -> dict[str, int]:
    return {**{e: 0 for e in EVENTS}, "Ir": ir, **more}


def job(sha: str) -> RunJob:
    return RunJob(sha256=sha, binary=Path("/nonexistent"), args=("7",), runs=3, timeout=5)


class CountingSlot:
    """A worker that counts each binary as scripted (a list: one count per run, the last
    repeated) and times it at ``wall`` ns; it records every job it ran."""

    depth = 1

    def __init__(self, name: str, script: dict[str, list[dict]], wall: dict[str, int]):
        self.name, self.worker_class, self.cpu = name, "local", 0
        self.script, self.wall = script, wall
        self.ran: list[RunJob] = []
        self.lock = threading.Lock()

    def probe(self) -> None:
        pass

    def run(self, job: RunJob) -> RunResult:
        with self.lock:
            self.ran.append(job)
            records = []
            for _ in range(job.runs):
                if job.exact:
                    seq = self.script[job.sha256]
                    got = seq.pop(0) if len(seq) > 1 else seq[0]
                    records.append(RunRecord(wall_ns=10**9, user_s=1.0, sys_s=0.0,
                                             maxrss_kb=1, exit_status=0, output_ok=True,
                                             counts=got))
                else:
                    wall = self.wall[job.sha256]
                    records.append(RunRecord(wall_ns=wall, user_s=wall / 1e9, sys_s=0.0,
                                             maxrss_kb=1, exit_status=0, output_ok=True))
        return RunResult(sha256=job.sha256, args=job.args, worker=self.name,
                         worker_class=self.worker_class, cpu=self.cpu, records=tuple(records))

    def close(self) -> None:
        pass


@pytest.fixture
def world(tmp_path):
    """A service over one counting slot: (service, slot, store root); closed at the end."""
    made = []

    def make(script: dict[str, list[dict]], wall: dict[str, int] | None = None):
        slot = CountingSlot("local/cpu0", script, wall or {REF: 2 * 10**6, CAND: 10**6})
        scheduler = Scheduler([slot])
        service = MeasurementService(scheduler, Store(tmp_path / "store"), min_cpu_share=0.0)
        made.append((service, scheduler))
        return service, slot

    yield make
    for service, scheduler in made:
        service.close()
        scheduler.close()


# --------------------------------------------------------------------------- config, --metric

def test_the_config_takes_a_metric_and_refuses_others_in_one_line():
    assert parse_config({}).measure.metric == "time"
    assert parse_config({"measure": {"metric": "cycles"}}).measure.metric == "cycles"
    with pytest.raises(ConfigError, match=r"measure.metric: expected time \| instructions "
                                          r"\| cycles, got 'wall'"):
        parse_config({"measure": {"metric": "wall"}}, Path("c.yaml"))
    config = parse_config({})
    assert with_metric(config, None) is config
    assert with_metric(config, "instructions").measure.metric == "instructions"


def test_a_bad_metric_option_is_refused_before_anything_runs(tmp_path):
    result = invoke("run-benchmark", "tak", "--metric", "wall", "--config",
                    str(write_config(tmp_path)))
    assert result.exit_code == 2 and "--metric" in result.stderr


# --------------------------------------------------------------------------- jobs and keys

def test_a_timed_job_keeps_its_identity_and_key_and_an_exact_one_names_no_class():
    timed = job(REF)
    assert "metric" not in timed.measurement_identity()
    assert "exact_identity" not in timed.measurement_identity()
    assert "metric" not in timed.request(1)  # the agent's default: time
    assert measurement_key(timed, "a") != measurement_key(timed, "b")
    exact = exact_job(timed)
    assert exact.request(1)["metric"] == "cachegrind" and exact.runs == 1
    assert exact.measurement_identity()["exact_identity"] == IDENTITY
    assert measurement_key(exact, "a") == measurement_key(exact, "b")
    assert measurement_key(exact, "a") != measurement_key(timed, "a")


def test_an_exact_result_stored_on_one_class_answers_another(tmp_path):
    store = Store(tmp_path / "store")
    exact = exact_job(job(REF))
    result = RunResult(sha256=REF, args=("7",), worker="ssh/h/cpu0", worker_class="ssh",
                       cpu=0, records=(RunRecord(wall_ns=1, user_s=0.0, sys_s=0.0,
                                                 maxrss_kb=1, exit_status=0, output_ok=True,
                                                 counts=counts(5)),))
    store.add_measurement(result, exact)
    assert store.job_measurements(exact, "local") == [result]
    assert store.job_measurements(job(REF), "ssh") == []  # a timed job is another thing


def test_exact_runs_are_never_judged_by_their_cpu_share():
    slow = RunRecord(wall_ns=10**9, user_s=0.1, sys_s=0.0, maxrss_kb=1, exit_status=0,
                     output_ok=True, counts=counts(5))
    result = RunResult(sha256=REF, args=(), worker="w", worker_class="c", cpu=0,
                       records=(slow,))
    assert judge_shares({}, result, floor=0.8) is result


# --------------------------------------------------------------------------- comparisons

def test_an_exact_comparison_is_one_counted_run_of_each_with_equal_bounds(world):
    service, slot = world({REF: [counts(1200)], CAND: [counts(1000)]})
    compared = service.compare(job(REF), job(CAND), "local", POLICY,
                               metric="instructions").result(30)
    assert compared.metric == "instructions" and compared.stopped == "exact"
    assert compared.interval == pytest.approx((1.2, 1.2, 1.2))
    assert compared.pairs == 1 and not compared.reused
    assert all(j.exact for j in slot.ran)  # no timed run at all
    # the first binary counted is counted twice (the determinism sample), the next once
    assert sorted(j.runs for j in slot.ran) == [1, 2]


def test_exact_comparisons_in_flight_hold_no_thread_each(tmp_path):
    """An exact comparison waits for its two counts by callbacks: forty of them held at
    their counts run on no comparison thread (a timed one's pairs still take a thread)."""
    gate = threading.Event()
    cands = [f"{i:02x}" * 32 for i in range(40)]

    class Held(CountingSlot):
        def run(self, job: RunJob) -> RunResult:
            gate.wait(30)
            return super().run(job)

    slots = [Held(f"local/cpu{i}", {sha: [counts(1000 + i)] for i, sha in
                                    enumerate([REF, *cands])}, {}) for i in range(4)]
    scheduler = Scheduler(slots)
    service = MeasurementService(scheduler, Store(tmp_path / "store"), min_cpu_share=0.0)
    try:
        futures = [service.compare(job(REF), job(c), "local", POLICY, metric="cycles")
                   for c in cands]
        assert not [t for t in threading.enumerate() if t.name.startswith("compare")]
        gate.set()
        compared = [f.result(30) for f in futures]
        assert [c.interval[0] for c in compared] == pytest.approx(
            [1000 / (1001 + i) for i in range(40)])
    finally:
        gate.set()
        service.close()
        scheduler.close()


def test_cycles_are_the_models_estimate(world):
    service, _ = world({REF: [counts(1000, Bcm=10)], CAND: [counts(1000)]})
    compared = service.compare(job(REF), job(CAND), "local", POLICY,
                               metric="cycles").result(30)
    assert compared.interval[0] == pytest.approx(
        metric_value("cycles", counts(1000, Bcm=10)) / 1000)


def test_a_second_exact_comparison_is_taken_from_the_store(world):
    first, _ = world({REF: [counts(1200)], CAND: [counts(1000)]})
    first.compare(job(REF), job(CAND), "local", POLICY, metric="cycles").result(30)
    again, slot = world({REF: [counts(1)], CAND: [counts(1)]})  # a new master, same store
    compared = again.compare(job(REF), job(CAND), "local", POLICY,
                             metric="cycles").result(30)
    assert slot.ran == [] and compared.reused
    assert compared.interval[0] == pytest.approx(1.2)
    # the same store under the other exact metric: still no run
    assert again.compare(job(REF), job(CAND), "local", POLICY,
                         metric="instructions").result(30).interval[0] == pytest.approx(1.2)
    assert slot.ran == []


def test_the_first_and_every_tenth_binary_counted_are_counted_twice(world):
    script = {REF: [counts(1000)]}
    shas = [f"{i:02d}" * 32 for i in range(2 * DETERMINISM_EVERY)]
    script.update({sha: [counts(900)] for sha in shas})
    service, slot = world(script)
    for sha in shas:  # one at a time: the order binaries are counted in is known
        service.compare(job(REF), job(sha), "local", POLICY, metric="cycles").result(30)
    twice = [j.sha256 for j in slot.ran if j.runs == 2]
    # binaries 0 (the reference), 10 and 20 (the 10th and 20th candidates)
    assert twice == [REF, shas[DETERMINISM_EVERY - 1], shas[2 * DETERMINISM_EVERY - 1]]
    assert len(slot.ran) == 1 + len(shas)  # the reference counted once, then stored


def test_counts_that_differ_are_one_warning_and_the_comparison_falls_back_to_time(
        world, caplog):
    service, slot = world({REF: [counts(1000), counts(1001)], CAND: [counts(900)]})
    with caplog.at_level(logging.WARNING):
        compared = service.compare(job(REF), job(CAND), "local", POLICY,
                                   metric="cycles").result(60)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "not deterministic" in warnings[0] \
        and "falls back to time" in warnings[0]
    assert compared.metric == "time" and compared.pairs >= POLICY.min_pairs
    assert compared.interval[0] == pytest.approx(2.0)  # the wall times: 2 ms against 1 ms
    assert any(not j.exact for j in slot.ran)
    # the two counts stay in the store: a later exact comparison of it falls back as well
    again, _ = world({REF: [counts(1)], CAND: [counts(1)]})
    assert again.compare(job(REF), job(CAND), "local", POLICY,
                         metric="cycles").result(60).metric == "time"


def test_a_failed_exact_run_of_the_candidate_is_a_failed_comparison(world):
    service, _ = world({REF: [counts(1000)], CAND: [counts(900)]})
    original = CountingSlot.run

    def failing(self, job):
        got = original(self, job)
        if job.sha256 != CAND:
            return got
        bad = got.records[0].model_copy(update={"failure": "exit status 2", "counts": None})
        return got.model_copy(update={"records": (bad,)})
    CountingSlot.run = failing  # type: ignore[method-assign]
    try:
        compared = service.compare(job(REF), job(CAND), "local", POLICY,
                                   metric="cycles").result(30)
    finally:
        CountingSlot.run = original  # type: ignore[method-assign]
    assert compared.stopped == "failed" and compared.failed == 1
    assert compared.interval == (None, None, None)


def test_an_exact_comparison_reads_and_writes_its_metric_and_a_timed_one_as_before():
    exact = Comparison(worker="w", reference_times=[12.0], candidate_times=[10.0],
                       results=[], stopped="exact", min_pairs=1, metric="cycles")
    assert Comparison.from_json(json.loads(json.dumps(exact.to_json()))) == exact
    timed = Comparison(worker="w", reference_times=[1.0], candidate_times=[1.0], results=[],
                       stopped="budget")
    assert "metric" not in timed.to_json()
    assert Comparison.from_json(timed.to_json()).metric == "time"


def test_every_figure_names_its_metric():
    assert "low = high" in metric_caption("cycles")
    assert "95% intervals" in metric_caption("time")
    assert Figure(1.2, 1.2, 1.2, 1, metric="cycles").significant is True


# --------------------------------------------------------------------------- the workers' check

class AskedSlot:
    def __init__(self, name: str, info: dict, host: str):
        self.name, self.info, self.host = name, info, host

    def exact_info(self) -> tuple[dict, str]:
        return self.info, self.host


def test_a_worker_that_cannot_count_is_one_line_naming_it_and_its_host():
    fine = AskedSlot("local/cpu0", {"available": True, "identity": IDENTITY,
                                     "version": "3.19.0"}, "m")
    missing = AskedSlot("ssh/h1/cpu2", {"available": False, "reason": "valgrind is not "
                                        "installed (Debian package valgrind)"}, "h1")
    # all can: nothing said, and the counts' identity names the valgrind they run
    assert check_workers([fine], "cycles") == f"{IDENTITY} valgrind-3.19.0"
    with pytest.raises(ExactUnavailable) as got:
        check_workers([fine, missing], "cycles")
    assert str(got.value) == ("ssh/h1/cpu2 (host h1): cannot measure in cycles: valgrind is "
                              "not installed (Debian package valgrind)")
    other = AskedSlot("ssh/h2/cpu0", {"available": True, "identity": "cachegrind[x]"}, "h2")
    with pytest.raises(ExactUnavailable, match="ssh/h2/cpu0 .host h2.: its exact counts are "
                                               r"cachegrind\[x\]"):
        check_workers([other], "instructions")
    newer = AskedSlot("ssh/h3/cpu1", {"available": True, "identity": IDENTITY,
                                      "version": "3.22.0"}, "h3")
    with pytest.raises(ExactUnavailable, match=r"ssh/h3/cpu1 \(host h3\): runs valgrind "
                                               r"3.22.0 where local/cpu0 \(host m\) runs "
                                               "3.19.0"):
        check_workers([fine, newer], "cycles")


@needs_valgrind
def test_a_local_agent_says_it_can_count(tmp_path):
    from dispatcher.running.local import LocalSlot
    from tests.helpers import FIRST_CPU
    slot = LocalSlot(FIRST_CPU, tmp_path / "cache", "local", lock_dir=tmp_path / "locks")
    try:
        info, host = slot.exact_info()
        identity = check_workers([slot], "cycles")
    finally:
        slot.close()
    assert info["available"] and info["identity"] == IDENTITY and host
    assert identity == f"{IDENTITY} valgrind-{info['version']}"


def test_run_benchmark_stops_in_one_line_when_a_worker_cannot_count(tmp_path, monkeypatch):
    from dispatcher.running import local
    monkeypatch.setattr(local.LocalSlot, "exact_info", lambda self: (
        {"available": False, "reason": "valgrind is not installed"}, "box"))
    cfg = write_config(tmp_path, run={"runs": 1, "timeout": 30, "size": "tiny"})
    line = one_line_error(invoke("run-benchmark", "tak", "--metric", "cycles", "--config",
                                 str(cfg)))
    assert line.startswith("run-benchmark: local/cpu") and "(host box): cannot measure in " \
        "cycles: valgrind is not installed" in line


# --------------------------------------------------------------------------- end to end

@needs_valgrind
def test_run_benchmark_in_cycles_gives_an_exact_ratio_and_takes_it_from_the_store_again(
        tmp_path):
    """The real compiler and agent: a bundled program at the tiny size, never-inline against
    the heuristic in estimated cycles; the second invocation runs nothing."""
    cfg = write_config(tmp_path, run={"runs": 1, "timeout": 30, "size": "tiny"})
    args = ("run-benchmark", "tak", "--policy", "never-inline", "--metric", "cycles",
            "--config", str(cfg), "--summary")
    first = invoke(*args)
    line = [ln for ln in first.stdout.splitlines() if ln.startswith("speedup")]
    assert line and line[0].startswith("speedup over the heuristic in cycles: "), first.stdout
    ratio, low, high = (float(x.strip("[],")) for x in line[0].split(": ", 1)[1].split()[:3])
    assert ratio == low == high and ratio > 0
    measurements = sorted((tmp_path / "store" / "measurements").rglob("*.json"))
    before = {p: p.read_bytes() for p in measurements}
    second = invoke(*args)
    again = [ln for ln in second.stdout.splitlines() if ln.startswith("speedup")]
    assert again and again[0].split(" (")[0] == line[0].split(" (")[0]
    assert "from the store" in again[0]
    after = {p: p.read_bytes() for p in sorted((tmp_path / "store" / "measurements")
                                               .rglob("*.json"))}
    assert after == before  # no new run of any kind


@needs_valgrind
def test_a_search_screens_on_cycles_and_confirms_its_best_in_time(tmp_path):
    """run_training_experiments --metric cycles: the experiment records the metric (no
    re-measurements, no canaries), each candidate's figure is exact (low = high), and the
    chain's best is confirmed in wall time, in pairs."""
    from dispatcher.core.records import CanaryEvent, ConfirmEvent, RemeasureEvent, StepEvent
    from dispatcher.core.rundir import Rundir
    from tests.helpers import only_rundir, run_to_end, search_config
    # counts and the seeded walk over every site alike are deterministic: seed 1 finds a
    # candidate of mandelbrot with fewer cycles at step 2, which the chain then confirms
    cfg = search_config(tmp_path, tmp_path / "store", algorithm="random-walk",
                        focus="uniform")
    tasks = tmp_path / "tasks"
    tasks.write_text("mandelbrot\n")
    run_to_end(cfg, "--tasks", str(tasks), "--steps", "3", "--size", "tiny", "--metric",
               "cycles", "--runs", "2", "--seed", "1")
    rundir = Rundir(only_rundir(tmp_path))
    e = rundir.experiment
    assert (e.metric, e.remeasure_every, e.canary_every) == ("cycles", 0, 0)
    assert json.loads((rundir.path / "experiment.json").read_text())["metric"] == "cycles"
    events = rundir.events()
    measured = [c for s in events if isinstance(s, StepEvent) for c in s.candidates
                if c.speedup is not None]
    assert measured and all(c.ci95 is not None and c.ci95[0] == c.ci95[1] == c.speedup
                            for c in measured)
    assert not any(isinstance(x, (RemeasureEvent, CanaryEvent)) for x in events)
    confirms = [x for x in events if isinstance(x, ConfirmEvent)]
    assert max(c.speedup for c in measured) > 1  # the winner in cycles...
    assert len(confirms) == 1 and len(confirms[0].times) >= 2  # ... confirmed in pairs
    assert confirms[0].ci95 is not None and confirms[0].ci95[0] < confirms[0].ci95[1]
    # the readers: an unconfirmed candidate keeps its exact figure, the confirmed one its pairs
    from analysis import export, extract
    _, rows = extract.rundir_rows(rundir.path, {})
    exact_rows = [r for r in rows if r["metric"] == "cycles"]
    assert exact_rows and all(r["ci_low"] == r["ci_high"] == r["speedup"] and r["pairs"] == 1
                              and not r["unresolved"] for r in exact_rows)
    confirmed = [r for r in rows if r["confirmed"]]
    assert len(confirmed) == 1 and confirmed[0]["metric"] == "time"
    assert confirmed[0]["pairs"] >= 2 and confirmed[0]["ci_low"] < confirmed[0]["ci_high"]
    figures = {(r["step"], r["candidate"]): r for r in export.rundir_rows(rundir.path)}
    step2 = [r for (step, _), r in figures.items() if step > 0 and not r["confirmed"]
             and r["pairs"] == 1]
    assert step2 and all(r["ci_low"] == r["ci_high"] == r["speedup"] for r in step2)
    # batch-log: the confirmed best in time; an unconfirmed best in cycles, said so
    from analysis.batch_log import Summary, format_speedup, summarize, summarize_speedup
    shown = summarize(rundir.path)
    assert shown.confirmed and shown.metric == "time" and "in cycles" not in format_speedup(
        shown)
    best = [x for x in events if isinstance(x, StepEvent)][-1].best
    unconfirmed = Summary(task="t", rundir="r", algorithm="random-walk", steps_done=3,
                          steps_planned=3, best_speedup=None, ci_low=None, ci_high=None,
                          last_update=None, status="finished")
    summarize_speedup(unconfirmed, [x for x in events if not isinstance(x, ConfirmEvent)],
                      best, min_pairs=2, metric="cycles")
    assert unconfirmed.best_speedup == unconfirmed.ci_low == unconfirmed.ci_high
    assert not unconfirmed.unresolved and "(in cycles)" in format_speedup(unconfirmed)


def test_an_older_experiment_reads_as_timed_and_writes_out_as_it_was_read():
    from dispatcher.core.records import read_experiment
    from tests.helpers import V2
    v2 = read_experiment(V2 / "experiment.json")
    assert v2.metric == "time"
    assert v2.to_json() == json.loads((V2 / "experiment.json").read_text())


def test_a_campaign_may_screen_its_search_on_cycles_and_publishes_on_time(tmp_path):
    from pipeline.campaign import plan, stages
    from tests.test_campaign import simulated_config, write_campaign
    timed = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path)))
    assert timed.search.metric == "time"
    assert "--metric" not in stages.stage_command(timed, "search")
    screened = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path),
                                                 search={"metric": "cycles"}))
    search = stages.stage_command(screened, "search")
    assert search[search.index("--metric") + 1] == "cycles"
    assert "--metric" not in stages.stage_command(screened, "labels")  # labels in time
    assert screened.identity != timed.identity
    counted = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path),
                                                labels={"metric": "instructions",
                                                        "retest": True}))
    labels = stages.stage_command(counted, "labels")
    assert labels[labels.index("--metric") + 1] == "instructions" and "--retest" in labels
    with pytest.raises(plan.CampaignError, match="labels.retest: expected true with "
                                                 "labels.metric cycles"):
        plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path),
                                          labels={"metric": "cycles", "retest": False}))
    with pytest.raises(plan.CampaignError, match="search.metric: expected time | "
                                                 "instructions | cycles, got 'wall'"):
        plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path),
                                          search={"metric": "wall"}))


# --------------------------------------------------------------------------- where exact jobs run

def test_exact_jobs_run_on_a_cpu_lent_to_them_while_the_timed_slot_is_busy(tmp_path):
    """The compile CPU's slot (EXACT_CLASS) takes exact jobs of any class; a timed job of the
    class never goes there, and a comparison in cycles finishes while the class's one slot is
    held by a timed run."""
    from dispatcher.running.backend import EXACT_CLASS
    timed_slot = CountingSlot("local/cpu1", {REF: [counts(1200)], CAND: [counts(1000)]},
                              {REF: 10**6, CAND: 10**6})
    lent = CountingSlot("local/cpu0/exact", timed_slot.script, timed_slot.wall)
    lent.worker_class = EXACT_CLASS
    gate = threading.Event()
    original = timed_slot.run

    def held(job):
        if not job.exact:
            assert gate.wait(30)
        return original(job)
    timed_slot.run = held  # type: ignore[method-assign]
    scheduler = Scheduler([timed_slot, lent])
    service = MeasurementService(scheduler, Store(tmp_path / "store"), min_cpu_share=0.0)
    try:
        busy = scheduler.submit(job(REF), worker_class="local")  # a timed run holds cpu1
        compared = service.compare(job(REF), job(CAND), "local", POLICY,
                                   metric="cycles").result(30)
        assert compared.interval[0] == pytest.approx(1.2)
        assert [j.exact for j in lent.ran] == [True, True]
        gate.set()
        busy.result(30)
        assert all(j.exact for j in lent.ran) and not any(j.exact for j in timed_slot.ran)
    finally:
        gate.set()
        service.close()
        scheduler.close()


def test_a_cpu_lent_to_exact_jobs_refuses_a_timed_one(tmp_path):
    from dispatcher.running.backend import EXACT_CLASS
    from dispatcher.running.local import ExactSlot, LocalBackend
    slot = ExactSlot(0, tmp_path / "cache", lock_dir=tmp_path / "locks")
    assert slot.worker_class == EXACT_CLASS and slot.name == "local/cpu0/exact"
    with pytest.raises(ValueError, match="a timed job on a CPU lent to exact jobs only"):
        slot.run(job(REF))
    backend = LocalBackend((1,), tmp_path / "cache", lock_dir=tmp_path / "locks",
                           exact_cpus=(0,))
    assert [s.name for s in backend.slots] == ["local/cpu1", "local/cpu0/exact"]
    backend.close()


def test_a_lent_cpus_agent_runs_at_the_lowest_priority_and_a_timing_one_does_not(tmp_path):
    """A compile CPU lent to counts: its agent (and so every thread and run it starts) at nice
    19, so the compiles on that CPU go first; a timing slot's agent keeps the master's."""
    from dispatcher.running.local import ExactSlot, LocalSlot

    def nice_of_threads(pid: int) -> set[int]:
        return {int(Path(task, "stat").read_text().rsplit(")", 1)[1].split()[16])
                for task in Path(f"/proc/{pid}/task").iterdir()}

    lent = ExactSlot(0, tmp_path / "cache", lock_dir=tmp_path / "locks")
    timing = LocalSlot(0, tmp_path / "cache", "local", lock_dir=tmp_path / "locks2")
    try:
        lent.exact_info()  # starts its agent
        timing.exact_info()
        assert nice_of_threads(lent._agent.process.pid) == {19}  # noqa: SLF001
        assert nice_of_threads(timing._agent.process.pid) == {os.nice(0)}  # noqa: SLF001
    finally:
        lent.close()
        timing.close()


@pytest.mark.parametrize("command", [
    ["run_training_experiments", "--tasks", "TASKS", "--steps", "1"],
    ["measure-sites", "--tasks", "TASKS", "--sweep", "1"]])
def test_a_search_or_labels_stop_in_one_line_before_any_rundir_when_a_worker_cannot_count(
        tmp_path, monkeypatch, command):
    from dispatcher.running import local
    from tests.helpers import search_config
    monkeypatch.setattr(local.LocalSlot, "exact_info", lambda self: (
        {"available": False, "reason": "valgrind is not installed"}, "box"))
    cfg = search_config(tmp_path, tmp_path / "store")
    tasks = tmp_path / "tasks"
    tasks.write_text("tak\n")
    args = [str(tasks) if a == "TASKS" else a for a in command]
    line = one_line_error(invoke(*args, "--config", str(cfg), "--metric", "instructions",
                                 cwd=tmp_path))
    assert line.startswith(f"{command[0]}: local/cpu") and line.endswith(
        "(host box): cannot measure in instructions: valgrind is not installed")
    assert not (tmp_path / "rundirs").exists() or not any((tmp_path / "rundirs").iterdir())


def test_a_global_setting_tuned_in_another_metric_is_tuned_again(tmp_path):
    """The baselines' record names its metric (absent: time, as every earlier record): a
    choice made in cycles is not reused by a run in time."""
    from dispatcher.baselines import GRID, RECORD, read_record, tune
    from dispatcher.build.manifest import resolve_benchmark
    benches = [resolve_benchmark("kahan"), resolve_benchmark("hamming")]
    record = {"version": 1, "chosen": "O2", "flags": ["-O2"], "benchmarks": ["hamming", "kahan"],
              "size": "quick", "grid": {k: list(v) for k, v in GRID.items()}, "training": {}}
    (tmp_path / RECORD).write_text(json.dumps(record))
    got = tune(None, tmp_path, benches, {}, "quick", 2, None, False)  # type: ignore[arg-type]
    assert got.reused and got.metric == "time" and "metric" not in got.to_json()
    (tmp_path / RECORD).write_text(json.dumps({**record, "metric": "cycles"}))
    assert read_record(tmp_path / RECORD)["metric"] == "cycles"  # type: ignore[index]
    said: list[str] = []
    with pytest.raises(AttributeError):  # the measuring, with no session
        tune(None, tmp_path, benches, {"kahan": None, "hamming": None},  # type: ignore
             "quick", 2, None, False, say=said.append)  # type: ignore[arg-type]
    assert said == [f"{tmp_path / RECORD}: tuned in cycles, not time: tuning again"]


def test_a_backend_that_cannot_count_is_refused_at_start():
    class Simulated:
        name = "simulated/0"
    with pytest.raises(ExactUnavailable, match="simulated/0: cannot measure in cycles: its "
                                               "backend does not run cachegrind"):
        check_workers([Simulated()], "cycles")


@needs_valgrind
def test_run_benchmark_in_instructions_over_ssh_counts_on_the_hosts(tmp_path):
    """The SSH hosts' agents are asked at start and count; the exact ratio is the same
    whichever host ran which binary (two real sshd hosts on this machine)."""
    from tests.sshhosts import LabUnavailable, SshLab
    from tests.test_ssh import CPU
    try:
        with SshLab(tmp_path / "lab", hosts=2) as lab:
            data = {**lab.config(cpus=[CPU]), "store": str(tmp_path / "store"),
                    "run": {"runs": 1, "timeout": 30, "size": "tiny"}}
            cfg = tmp_path / "c.yaml"
            cfg.write_text(yaml.safe_dump(data))
            got = invoke("run-benchmark", "kahan", "--policy", "never-inline", "--metric",
                         "instructions", "--config", str(cfg), "--summary")
    except LabUnavailable as exc:
        pytest.skip(str(exc))
    line = [ln for ln in got.stdout.splitlines() if ln.startswith("speedup")]
    assert line and line[0].startswith("speedup over the heuristic in instructions: "), (
        got.stdout, got.stderr)
    ratio, low, high = (float(x.strip("[],")) for x in line[0].split(": ", 1)[1].split()[:3])
    assert ratio == low == high
    assert "ssh/h" in line[0]


def test_a_failed_count_in_the_store_is_counted_again(tmp_path, world):
    """A stored exact result whose run failed (a timeout, say) does not answer: the binary is
    counted again, and the new count answers from then on."""
    store = Store(tmp_path / "store")
    failed = RunRecord(wall_ns=1, user_s=0.0, sys_s=0.0, maxrss_kb=1, exit_status=-9,
                       output_ok=False, failure="timed out")
    store.add_measurement(RunResult(sha256=CAND, args=("7",), worker="w", worker_class="c",
                                    cpu=0, records=(failed,)), exact_job(job(CAND)))
    service, slot = world({REF: [counts(1200)], CAND: [counts(1000)]})
    compared = service.compare(job(REF), job(CAND), "local", POLICY,
                               metric="instructions").result(30)
    assert compared.interval[0] == pytest.approx(1.2)
    assert sorted(j.sha256 for j in slot.ran) == [REF, CAND]
