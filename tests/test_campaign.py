"""run-campaign: the campaign file's one-line errors, the stages' commands (fresh and
resumed), the state and its identity, the worker clock, the exit-status rules; whole
campaigns through the installed command on simulated workers (the budget stopping the search,
Ctrl-C and the resume, a campaign to its published results, the README's command reproducing
the policy from the dataset, a rerun writing the same files), and one small campaign on the
real compiler and a real worker slot, every stage through its real command."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dispatcher.core.records import BatchEntry
from pipeline.campaign import budget, plan, stages
from pipeline.campaign import state as cstate
from pipeline.campaign.runner import settle
from pipeline.policy.selection import EXIT_GATE
from tests.helpers import FIRST_CPU, REPO, invoke, one_line_error

BIN = Path(sys.executable).parent


def write_campaign(tmp: Path, config_file: Path, **sections) -> Path:
    data = {"config": str(config_file), "dir": "camp", "results": "out", "size": "quick",
            "budget": {"worker_hours": 1}, "search": {"benchmarks": ["kahan", "orbit"],
                                                      "steps": 4},
            "labels": {"runs": 2, "max_pairs": 2, "max_tests": 2, "sweep": 1,
                       "retest": False},
            "rewards": {"bootstrap": 10, "plots": False},
            "policy": {"classifier": "logistic", "runs": 2, "max_pairs": 2},
            "evaluate": {"benchmarks": ["lu"], "baselines": False, "runs": 2,
                         "max_pairs": 2}}
    for k, v in sections.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) and isinstance(data.get(k), dict) \
            else v
    path = tmp / "campaign.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def simulated_config(tmp: Path) -> Path:
    data = {"backend": "simulated", "store": str(tmp / "store"),
            "simulated": {"slots": 4, "time_scale": 0.02, "compile_jobs": 2,
                          "cache_dir": str(tmp / "sim-cache"),
                          "model": {"default": {"run_s": 1.0, "compile_s": 0.2}}},
            "scheduler": {"backoff_s": 0.01, "backoff_max_s": 0.05},
            "search": {"focus": "uniform"}}
    path = tmp / "sim.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def local_config(tmp: Path) -> Path:
    data = {"backend": "local", "store": str(tmp / "store"), "local": {"cpus": [FIRST_CPU]},
            "run": {"runs": 2, "timeout": 60, "size": "quick"},
            "measure": {"max_pairs": 2, "canary_every": 0}}
    path = tmp / "local.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def campaign(*args: str, cwd: Path, timeout: float = 600, **env: str
             ) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "run-campaign"), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout,
                          env={**os.environ, "INLINING_CAMPAIGN_POLL_S": "0.3", **env})


def finish_reasons(rundir: Path) -> list[str]:
    events = [json.loads(x) for x in (rundir / "journal.jsonl").read_text().splitlines()]
    return [e["reason"] for e in events if e["event"] == "finish"]


def state(tmp: Path) -> dict:
    return json.loads((tmp / "camp" / "campaign.json").read_text())["stages"]


def published(out: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def check_reproduced(tmp: Path, out: Path) -> None:
    """The README's command trains the same policy from the published dataset alone."""
    readme = (out / "README.md").read_text()
    command = readme.split("## Reproducing the policy from the dataset")[1].split("```")[1]
    argv = command.split()
    assert argv[0] == "train-policy"
    again = subprocess.run([str(BIN / argv[0]), *argv[1:-1], str(tmp / "again.policy")],
                           cwd=out, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (tmp / "again.policy").read_bytes() == (out / "policy.policy").read_bytes()


# -- the campaign file

@pytest.mark.parametrize("change, expected", [
    ({"nonsense": 1}, "nonsense: expected one of"),
    ({"search": {"steps": 0}}, "search.steps: expected a positive integer"),
    ({"search": {"benchmarks": ["no_such_program"]}}, "search.benchmarks: unknown benchmark"),
    ({"budget": {"search_share": 2}}, "budget.search_share: expected a number above 0"),
    ({"budget": {"worker_hours": -1}}, "budget.worker_hours: expected a positive number"),
    ({"labels": {"runs": 4, "max_pairs": 2}}, "labels.max_pairs: expected at least"),
    ({"policy": {"classifier": "forest"}}, "policy.classifier: expected one of"),
    ({"policy": {"margin": 2}}, "policy.margin: expected a number from 0 to 1"),
    ({"rewards": {"model": "forest"}}, "rewards.model: expected ridge or lasso"),
    ({"rewards": {"bootstrap": -1}}, "rewards.bootstrap: expected bootstrap refits from 0"),
    ({"rewards": {"plots": "maybe"}}, "rewards.plots: expected"),
    ({"size": "huge"}, "size: expected tiny, quick or full"),
    ({"search": {"size": "medium"}}, "search.size: expected tiny, quick or full"),
    ({"config": "missing.yaml"}, "config: "),
])
def test_a_bad_campaign_file_is_one_line(tmp_path, change, expected):
    path = write_campaign(tmp_path, simulated_config(tmp_path), **change)
    line = one_line_error(invoke("run-campaign", "--config", str(path), cwd=tmp_path))
    assert line.startswith(f"run-campaign: {path}: ") and expected in line, line
    assert not (tmp_path / "camp").exists()


def test_a_config_measuring_in_an_exact_metric_is_refused(tmp_path):
    """train-policy's measured gate and the evaluation read measure.metric: a campaign
    publishes in time and screens through search.metric / labels.metric instead."""
    cfg = simulated_config(tmp_path)
    data = yaml.safe_load(cfg.read_text())
    data.setdefault("measure", {})["metric"] = "cycles"
    cfg.write_text(yaml.safe_dump(data))
    path = write_campaign(tmp_path, cfg)
    line = one_line_error(invoke("run-campaign", "--config", str(path), cwd=tmp_path))
    assert line.startswith(f"run-campaign: {path}: config: ") and \
        "measure.metric is cycles: a campaign publishes in time" in line, line
    assert not (tmp_path / "camp").exists()


def test_yaml_syntax_and_a_missing_quick_section_are_one_line(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text("search: [\n")
    line = one_line_error(invoke("run-campaign", "--config", str(path), cwd=tmp_path))
    assert "YAML syntax error" in line
    path = write_campaign(tmp_path, simulated_config(tmp_path))
    line = one_line_error(invoke("run-campaign", "--config", str(path), "--quick",
                                 cwd=tmp_path))
    assert "quick: --quick needs a quick section" in line


def test_the_bundled_campaign_files_load():
    full = plan.load_campaign(REPO / "configs" / "campaign.yaml")
    quick = plan.load_campaign(REPO / "configs" / "campaign.yaml", quick=True)
    assert full.size == "full" and quick.size == "quick"
    assert quick.dir != full.dir and quick.results != full.results
    assert full.results == (REPO / "results").resolve()
    assert quick.identity != full.identity
    assert not full.searched.enabled and not full.select.enabled  # documented, off
    second = plan.load_campaign(REPO / "configs" / "campaign-2.yaml")
    assert second.searched.enabled and second.select.enabled
    assert second.search.metric == "cycles" and second.labels.retest
    assert second.dir != full.dir and second.results == (REPO / "results" / "campaign-2")
    second_quick = plan.load_campaign(REPO / "configs" / "campaign-2.yaml", quick=True)
    assert second_quick.dir not in (second.dir, quick.dir)


def test_the_defaults_are_their_owners():
    from analysis.policy_training import CLASSIFIERS
    from dispatcher.build.policy_file import DEFAULT_GROWTH_BUDGET, DEFAULT_MARGIN
    from pipeline.policy.selection import GATE
    p = plan.PolicyStage()
    assert (p.gate, p.margin, p.growth_budget) == (GATE, DEFAULT_MARGIN, DEFAULT_GROWTH_BUDGET)
    assert plan.CLASSIFIERS == ("all", *CLASSIFIERS)


# -- the stages' commands

def test_the_search_may_run_at_its_own_size_and_everything_else_at_the_campaigns(tmp_path):
    path = write_campaign(tmp_path, simulated_config(tmp_path), size="full",
                          search={"size": "quick"})
    c = plan.load_campaign(path)
    search, labels = stages.stage_command(c, "search"), stages.stage_command(c, "labels")
    assert search[search.index("--size") + 1] == "quick"
    assert labels[labels.index("--size") + 1] == "full"
    same = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path), size="full"))
    assert same.search.size == "full" and same.identity != c.identity


def test_a_started_stage_continues_through_its_commands_resume(tmp_path):
    c = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path)))
    fresh = stages.stage_command(c, "search")
    assert fresh[0] == "run_training_experiments" and "--resume" not in fresh
    assert fresh[fresh.index("--steps") + 1] == "4" and "--tasks" in fresh
    assert stages.stage_command(c, "rewards") is None  # no search yet: nothing to assign
    c.dir.mkdir()
    log = c.batch_log
    lines = [{"task": "kahan", "rundir": "rundirs/kahan-sa", "algorithm": "sa", "version": 1},
             {"task": "orbit", "rundir": "rundirs/orbit-sa", "algorithm": "sa", "version": 1},
             {"task": "kahan", "rundir": "rundirs/kahan-sites", "algorithm": "sites",
              "version": 1}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    resumed = stages.stage_command(c, "search")
    assert resumed == ["run_training_experiments", "--config", str(c.config),
                       "--resume", str(c.dir / "rundirs/kahan-sa"),
                       "--resume", str(c.dir / "rundirs/orbit-sa")]
    labels = stages.stage_command(c, "labels")
    assert labels[-2:] == ["--resume", str(c.dir / "rundirs/kahan-sites")]
    rewards = stages.stage_command(c, "rewards")
    assert rewards[-2:] == [str(c.dir / "rundirs/kahan-sa"), str(c.dir / "rundirs/orbit-sa")]


def test_the_flipbacks_stage_sets_always_inlines_sites_back_into_the_same_tables(tmp_path):
    from dispatcher.core.rundir import EXPERIMENT
    from dispatcher.core.site_records import SitesExperiment
    config = simulated_config(tmp_path)
    off = plan.load_campaign(write_campaign(tmp_path, config))
    assert stages.stage_command(off, "flipbacks") is None  # skipped: nothing to do
    on = plan.load_campaign(write_campaign(tmp_path, config, flipbacks={
        "enabled": True, "benchmarks": ["orbit"], "sweep": 3}, labels={"retest": True}))
    assert on.identity != off.identity
    assert plan.load_campaign(write_campaign(tmp_path, config, flipbacks={
        "enabled": False, "sweep": 3})).identity == off.identity  # earlier identities hold
    argv = stages.stage_command(on, "flipbacks")
    labels = stages.stage_command(on, "labels")
    assert argv[:3] == ["measure-sites", "--config", str(on.config)]
    assert argv[argv.index("--tasks") + 1] == str(on.dir / stages.FLIPBACK_TASKS)
    assert argv[argv.index("--reference") + 1] == "always-inline"
    assert argv[argv.index("--sweep") + 1] == "3"
    # labels.size: the campaign's by default (the identity as before), its own when given
    assert labels[labels.index("--size") + 1] == on.size
    assert plan.load_campaign(write_campaign(tmp_path, config, flipbacks={
        "enabled": True, "benchmarks": ["orbit"], "sweep": 3}, labels={
        "retest": True, "size": on.size})).identity == on.identity
    tiny = plan.load_campaign(write_campaign(tmp_path, config, flipbacks={
        "enabled": True}, labels={"size": "tiny", "metric": "cycles", "retest": True}))
    assert tiny.identity != on.identity
    for stage in ("labels", "flipbacks"):
        argv_tiny = stages.stage_command(tiny, stage)
        assert argv_tiny[argv_tiny.index("--size") + 1] == "tiny"
        assert argv_tiny[argv_tiny.index("--metric") + 1] == "cycles"
    for option in ("--labels", "--size", "--runs", "--max-pairs"):  # measured as labels are
        assert argv[argv.index(option) + 1] == labels[labels.index(option) + 1]
    assert "--retest" in argv and "--batch-log" not in argv
    on.dir.mkdir()
    stages.write_tasks(on)
    assert (on.dir / stages.FLIPBACK_TASKS).read_text() == "orbit\n"
    # resumed: each stage takes the labels rundirs of its own reference
    lines = []
    for name, reference in (("orbit-sites", None), ("orbit-sites-1", "always-inline")):
        rundir = on.dir / "rundirs" / name
        rundir.mkdir(parents=True)
        (rundir / EXPERIMENT).write_text(json.dumps(SitesExperiment(
            task="orbit", benchmark="orbit", size="quick", runs=2, max_pairs=2,
            half_width=0.01, timeout=10, perf=False, aslr=False, worker_class="local",
            compiler="0" * 64, reference=reference).to_json()))
        lines.append({"task": "orbit", "rundir": f"rundirs/{name}", "algorithm": "sites",
                      "version": 1})
    lines.append({"task": "kahan", "rundir": "rundirs/kahan-sites", "algorithm": "sites",
                  "version": 1})  # no experiment readable: the labels stage's to resume
    on.batch_log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert stages.stage_command(on, "labels")[3:] == [
        "--labels", str(on.dir / "labels"), "--resume", str(on.dir / "rundirs/orbit-sites"),
        "--resume", str(on.dir / "rundirs/kahan-sites")]
    assert stages.stage_command(on, "flipbacks")[3:] == [
        "--labels", str(on.dir / "labels"), "--resume", str(on.dir / "rundirs/orbit-sites-1")]
    # the labels leave the flipbacks their share of the budget
    budgeted = plan.load_campaign(write_campaign(tmp_path, config, flipbacks={
        "enabled": True}, budget={"worker_hours": 2, "search_share": 0.5,
                                  "flipbacks_share": 0.3}))
    assert budget.stage_budget_s(budgeted, "search") == pytest.approx(3600)
    assert budget.stage_budget_s(budgeted, "labels") == pytest.approx(0.7 * 7200)
    assert budget.stage_budget_s(budgeted, "flipbacks") == pytest.approx(7200)
    assert budget.stage_budget_s(off, "labels") == pytest.approx(3600)  # all of it
    with pytest.raises(plan.CampaignError, match="budget.flipbacks_share"):
        plan.load_campaign(write_campaign(tmp_path, config, flipbacks={"enabled": True},
                                          budget={"search_share": 0.8,
                                                  "flipbacks_share": 0.3}))
    with pytest.raises(plan.CampaignError, match="flipbacks.reference"):
        plan.load_campaign(write_campaign(tmp_path, config, flipbacks={"reference": "heuristic"}))
    with pytest.raises(plan.CampaignError, match="flipbacks.sweep"):
        plan.load_campaign(write_campaign(tmp_path, config, flipbacks={"sweep": 0}))


def test_the_evaluation_tunes_the_baselines_on_the_searched_programs(tmp_path):
    """What the real campaign's evaluation runs with ``evaluate.baselines`` (the baselines
    themselves: tests/test_baselines.py, end to end)."""
    c = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path),
                                          evaluate={"baselines": True}))
    argv = stages.stage_command(c, "evaluate")
    assert argv[:4] == ["run-plugin-benchmark", "--config", str(c.config), str(c.policy_file)]
    i = argv.index("--baselines")
    assert argv[i:i + 5] == ["--baselines", "--tune-on", "kahan", "--tune-on", "orbit"]
    assert argv[-2:] == ["--results", str(c.dir / "results")]
    without = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path)))
    assert "--baselines" not in stages.stage_command(without, "evaluate")


def test_the_kept_stage_measures_the_policy_chosen_by_measurement(tmp_path):
    """The campaign's answer when a policy is searched: select's choice, else the searched
    stage's best, measured as the evaluation measures the classifier's, and published apart."""
    from pipeline.campaign.publish import _published
    config = simulated_config(tmp_path)
    c = plan.load_campaign(write_campaign(tmp_path, config, evaluate={"baselines": True}))
    assert stages.kept_policy(c) is None and stages.stage_command(c, "kept") is None
    searched = plan.load_campaign(write_campaign(tmp_path, config,
                                                 evaluate={"baselines": True},
                                                 searched={"enabled": True}))
    assert stages.stage_command(searched, "kept") is None  # the study wrote no policy yet
    best = searched.dir / "searched" / "searched.policy"
    best.parent.mkdir(parents=True)
    best.write_text("policy\n")
    argv = stages.stage_command(searched, "kept")
    evaluate = stages.stage_command(searched, "evaluate")
    assert argv[:4] == ["run-plugin-benchmark", "--config", str(c.config), str(best)]
    assert argv[4:] == [*evaluate[4:5], "--name", "kept", *evaluate[5:]]  # same programs,
    assert "--baselines" in argv  # baselines (found in the store), pairs and results
    both = plan.load_campaign(write_campaign(tmp_path, config, searched={"enabled": True},
                                             select={"enabled": True}))
    assert stages.stage_command(both, "kept") is None  # select decides: it kept nothing
    chosen = both.dir / "selected" / "selected.policy"
    chosen.parent.mkdir(parents=True)
    chosen.write_text("policy\n")
    assert stages.stage_command(both, "kept")[3] == str(chosen)
    measured = both.dir / "results"
    measured.mkdir()
    for name in ("plugin_policy.summary.csv", "plugin_kept.summary.csv"):
        (measured / name).write_text(name)
    published = {dst.name: src.name for src, dst in _published(both)}
    assert published["summary.csv"] == "plugin_policy.summary.csv"
    assert published["summary-kept.csv"] == "plugin_kept.summary.csv"
    # a campaign.json written before the stage existed is read: the stage pending
    on_disk = {"version": 1, "identity": c.identity,
               "stages": {s: {"state": "done"} for s in cstate.STAGES
                          if s not in ("kept", "flipbacks")}}
    c.dir.mkdir(parents=True, exist_ok=True)
    (c.dir / cstate.STATE_FILE).write_text(json.dumps(on_disk))
    st = cstate.read_state(c)
    assert st.stages["kept"].state == "pending" and st.next_stage() == "flipbacks"
    assert st.stages["flipbacks"].state == "pending"


def test_a_campaign_directory_of_other_settings_is_refused(tmp_path):
    config = simulated_config(tmp_path)
    c = plan.load_campaign(write_campaign(tmp_path, config))
    c.dir.mkdir()
    cstate.write_state(c, cstate.new_state(c).with_stage("search", state="done"))
    assert cstate.read_state(c).next_stage() == "labels"
    # more budget is the same campaign; more steps is another
    more = plan.load_campaign(write_campaign(tmp_path, config, budget={"worker_hours": 5}))
    assert cstate.read_state(more).stages["search"].state == "done"
    other = write_campaign(tmp_path, config, search={"steps": 9})
    line = one_line_error(invoke("run-campaign", "--config", str(other), cwd=tmp_path))
    assert "started with other settings" in line


def test_a_stages_exit_status_makes_its_state():
    s = cstate.StageState(state="running", runs=1)
    assert settle(s, "search", 0, "", 0.95).state == "done"
    assert settle(s, "search", 130, "budget", 0.95).state == "budget"
    assert settle(s, "labels", 0, "budget", 0.95).state == "budget"
    gate = settle(s, "policy", EXIT_GATE, "", 0.9)
    assert gate.state == "gate-failed" and gate.done and "(0.9:" in gate.note
    assert settle(s, "search", EXIT_GATE, "", 0.95).state == "failed"
    for status, why in ((130, ""), (1, "interrupted"), (-signal.SIGINT, "")):
        stopped = settle(s, "search", status, why, 0.95)
        assert stopped.state == "pending" and stopped.note == "interrupted" and not stopped.done
    failed = settle(s, "labels", 1, "", 0.95)
    assert failed.state == "failed" and failed.note == "exit status 1" and not failed.done
    assert settle(s, "labels", 1, "budget", 0.95).state == "failed"


def test_the_worker_clock_counts_timed_runs_once(tmp_path):
    pointer = {"step": 0, "candidate": 0, "dir": "baseline", "energy": 1.0}
    search = tmp_path / "search"
    search.mkdir()
    candidate = {"candidate": 0, "dir": "s1/c0", "mutation": None}
    records = [
        {"event": "baseline", "sha256": "0" * 64, "times": [1.0, 2.0], "geomean": 1.4,
         "median": 1.5, "ci95": [1.0, 2.0]},
        {"event": "step", "step": 1, "temperature": None, "chosen": 0, "accepted": True,
         "incumbent": pointer, "best": pointer, "rng": [], "candidates": [
             {**candidate, "times": [0.5, 0.5], "reference_times": [1.0, 1.0]},
             {**candidate, "candidate": 1, "cached": True, "times": [9.0],
              "reference_times": [9.0]}]},
    ]
    confirm = json.dumps({"event": "confirm", "step": 1, "candidate": 0, "dir": "s1/c0",
                          "times": [2.5], "reference_times": [], "speedup": None,
                          "ci95": None, "significant": False}) + "\n"
    (search / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records)
                                          + confirm[:20])  # being written
    sites = tmp_path / "sites"
    sites.mkdir()
    site = {"unit": "u", "round": 0, "key": "k", "callee": "g", "action": "inline"}
    label = {"event": "label", "site": site, "context": "alone", "outcome": {
        "status": "measured", "cpu_s": 4.25, "pairs": 100}}
    (sites / "journal.jsonl").write_text(json.dumps(label) + "\n")
    listed = [(BatchEntry(rundir="search", algorithm="sa"), search),
              (BatchEntry(rundir="sites", algorithm="sites"), sites)]
    clock = budget.WorkerClock()
    assert clock.seconds(listed) == pytest.approx(3.0 + 3.0 + 4.25)
    with (search / "journal.jsonl").open("a") as f:
        f.write(confirm[20:])
    missing = (BatchEntry(rundir="missing", algorithm="sa"), tmp_path / "missing")
    assert clock.seconds([*listed, missing]) == pytest.approx(12.75)


def test_a_search_in_an_exact_metric_spends_only_its_timed_runs(tmp_path):
    """Its candidates' figures are counts (estimated cycles, 1e8 and more), not seconds: the
    budget counted them as seconds and stopped a campaign screening in cycles at once."""
    from dispatcher.core.records import StartEvent
    start = StartEvent(algorithm="sa", seed=0, steps=4, size="tiny", runs=1, baseline_runs=2,
                       candidates_per_step=1, t_start=1.0, t_end=0.1, remeasure_every=0,
                       max_flips=1, task="kahan", benchmark="kahan", chain=0,
                       metric="cycles").to_json()
    pointer = {"step": 0, "candidate": 0, "dir": "baseline", "energy": 1.0}
    records = [
        start,
        {"event": "baseline", "sha256": "0" * 64, "times": [1.0, 2.0], "geomean": 1.4,
         "median": 1.5, "ci95": [1.0, 2.0]},
        {"event": "step", "step": 1, "temperature": None, "chosen": 0, "accepted": True,
         "incumbent": pointer, "best": pointer, "rng": [], "candidates": [
             {"candidate": 0, "dir": "s1/c0", "mutation": None, "times": [175891388.0],
              "reference_times": [175554637.0]}]},
        {"event": "confirm", "step": 1, "candidate": 0, "dir": "s1/c0", "times": [2.5],
         "reference_times": [2.0], "speedup": None, "ci95": None, "significant": False},
    ]
    search = tmp_path / "search"
    search.mkdir()
    (search / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    listed = [(BatchEntry(rundir="search", algorithm="sa"), search)]
    assert budget.WorkerClock().seconds(listed) == pytest.approx(3.0 + 4.5)


# -- whole campaigns, simulated workers

def test_the_budget_stops_the_search_and_the_campaign_goes_on(tmp_path):
    """A search given 2 worker-minutes of a 4-minute budget stops as Ctrl-C stops it (its
    rundirs unfinished, resumable); the sweeps then get the rest."""
    path = write_campaign(tmp_path, simulated_config(tmp_path),
                          budget={"worker_hours": 4 / 60, "search_share": 0.5},
                          search={"steps": 500})
    got = campaign("--config", str(path), "--until", "labels", cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    assert "search: the worker budget for it is spent" in got.stderr
    stages_ = state(tmp_path)
    assert stages_["search"]["state"] == "budget" and stages_["labels"]["state"] in (
        "done", "budget")
    assert stages_["rewards"]["state"] == "pending"
    c = plan.load_campaign(path)
    searches = stages.listed(c.batch_log, plan.SEARCHES)
    assert len(searches) == 2
    for _, r in searches:  # stopped early, as by Ctrl-C: resumable
        assert finish_reasons(r) == ["interrupted"]
    spent = budget.WorkerClock().seconds(searches)
    # The search's share is 120 worker-seconds.  At 4 slots and time_scale 0.02 the searches
    # spend about 200 of them per real second, so what runs between two reads of the clock
    # (every 0.3 s, later on a loaded machine) and the jobs in flight when they stop add to it;
    # the 500 steps of the two searches would have spent over 2,000.
    assert 120 <= spent < 600, spent
    assert "Traceback" not in got.stderr


def test_ctrl_c_stops_the_stage_and_a_rerun_continues_it(tmp_path):
    path = write_campaign(tmp_path, simulated_config(tmp_path), search={"steps": 12},
                          budget={"worker_hours": 1000})
    proc = subprocess.Popen([str(BIN / "run-campaign"), "--config", str(path), "--until",
                             "search"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "INLINING_CAMPAIGN_POLL_S": "0.3"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    c = plan.load_campaign(path)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # until a search has journaled a step
        rundirs = stages.experiments(c.batch_log, plan.SEARCHES)
        if any('"event": "step"' in (r / "journal.jsonl").read_text()
               for r in rundirs if (r / "journal.jsonl").exists()):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        f"run-campaign: interrupted in the search stage; to continue: run-campaign --config "
        f"{path}"), err
    assert "Traceback" not in err
    assert state(tmp_path)["search"]["state"] == "pending"
    before = stages.experiments(c.batch_log, plan.SEARCHES)
    again = campaign("--config", str(path), "--until", "search", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "started 1 time(s) before: continuing" in again.stderr
    assert "--resume" in again.stderr  # through the search's own resume
    assert stages.experiments(c.batch_log, plan.SEARCHES) == before  # no new rundir
    # the first run's log is kept beside the resumed run's
    logs = c.dir / "logs"
    assert "interrupted " in (logs / "search.1.out").read_text()
    assert "finished " in (logs / "search.out").read_text()
    assert "interrupted " not in (logs / "search.out").read_text()
    for r in before:
        assert finish_reasons(r) == ["interrupted", "completed"]
    stages_ = state(tmp_path)
    assert stages_["search"]["state"] == "done" and stages_["search"]["runs"] == 2
    # done stages are skipped and shown
    status = campaign("--config", str(path), "--status", cwd=tmp_path)
    assert status.returncode == 0 and "1. search    done" in status.stdout, status.stdout
    rows = status.stdout.splitlines()[1:]  # one per stage, the names in one column
    assert len(rows) == len(cstate.STAGES) and {r.index(". ") for r in rows} == {3}, rows


def test_a_simulated_campaign_publishes_reproducibly_and_a_rerun_writes_the_same(tmp_path):
    """Search, labels, rewards, the optimal trees, the dataset and the publishing through
    their commands on simulated workers.  The simulation builds no policy, so the policy is
    trained here as the stage trains it, without its measured validation (the same file: the
    classifier is fixed), and the evaluation is marked skipped; the real-compiler test below
    runs both."""
    path = write_campaign(tmp_path, simulated_config(tmp_path), budget={"worker_hours": 1000})
    got = campaign("--config", str(path), "--until", "rewards", cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    c = plan.load_campaign(path)
    trained = subprocess.run(
        [str(BIN / "train-policy"), "--config", str(c.config), "--labels", str(c.dir / "labels"),
         "--rewards", str(c.dir / "rewards"), "--model", c.rewards_model, "--classifier",
         c.policy.classifier, "--margin", str(c.policy.margin), "--growth-budget",
         str(c.policy.growth_budget), "--out", str(c.policy_file)],
        cwd=c.dir, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 0, trained.stderr[-3000:]
    s = cstate.read_state(c)
    s = s.with_stage("policy", state="done", finished=1.0)
    cstate.write_state(c, s.with_stage("evaluate", state="skipped", finished=1.0))
    got = campaign("--config", str(path), cwd=tmp_path)
    assert got.returncode == 0, got.stderr[-3000:]
    stages_ = state(tmp_path)
    assert all(stages_[s]["state"] in cstate.DONE for s in cstate.STAGES), stages_
    assert stages_["optimal"]["state"] == "done" and stages_["dataset"]["state"] == "done"
    out = tmp_path / "out"
    assert (out / "README.md").is_file() and (out / "policy.policy").is_file()
    assert (out / "dataset" / "dataset.json").is_file()
    readme = (out / "README.md").read_text()
    assert "## Optimal trees of the rewards" in readme and "Worker budget: " in readme
    check_reproduced(tmp_path, out)
    files = published(out)
    again = campaign("--config", str(path), cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"[1/{len(cstate.STAGES)}]" not in again.stderr and "search    done" in again.stdout
    assert published(out) == files


# -- a whole campaign, real compiler and worker

def test_a_campaign_runs_to_its_published_results(tmp_path):
    """The smoke test of the real thing: every stage's command on the real compiler and one
    worker slot, the policy's measured validation and its evaluation included, to the
    published results (a small campaign that does: two programs searched for two steps, one
    evaluated; the rerun and the reproduction are the simulated test's; the baselines the
    evaluation adds are tests/test_baselines.py's, end to end, and the command that asks for
    them is checked above)."""
    path = write_campaign(tmp_path, local_config(tmp_path), size="tiny",
                          search={"benchmarks": ["orbit", "mandelbrot"], "steps": 2})
    got = campaign("--config", str(path), cwd=tmp_path, timeout=1500)
    assert got.returncode == 0, got.stderr[-3000:]
    stages_ = state(tmp_path)
    assert all(stages_[s]["state"] in cstate.DONE for s in cstate.STAGES), stages_
    assert stages_["policy"]["state"] in ("done", "gate-failed")
    assert stages_["evaluate"]["state"] == "done"
    out = tmp_path / "out"
    summary = (out / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("benchmark,split,build,speedup,low,high,pairs,size_ratio")
    assert {(row[0], row[2]) for row in map(lambda x: x.split(","), summary[1:])} == {
        ("lu", "policy")}, summary
    assert (out / "README.md").is_file() and (out / "policy.policy").is_file()
    assert (out / "lu" / "plugins" / "plugin_policy.csv").is_file()
    readme = (out / "README.md").read_text()
    assert "## The policy and the baselines" in readme and "lu" in readme
    assert "compiler: " in readme and "machine: " in readme
    assert (out / "dataset" / "dataset.json").is_file()
    check_reproduced(tmp_path, out)
