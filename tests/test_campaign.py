"""run-campaign: the campaign file's one-line errors, the stages' commands (fresh and
resumed), the state and its identity, the worker clock, and whole campaigns through the
installed command: on simulated workers (the budget stopping the search, Ctrl-C and the
resume), and on the real compiler and a real worker slot, to the published results."""
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

from commands import campaign_plan as plan
from tests.helpers import FIRST_CPU, REPO

BIN = Path(sys.executable).parent


def write_campaign(tmp: Path, config_file: Path, **sections) -> Path:
    data = {"config": str(config_file), "dir": "camp", "results": "out", "size": "quick",
            "budget": {"worker_hours": 1}, "search": {"benchmarks": ["kahan", "orbit"],
                                                      "steps": 4},
            "labels": {"runs": 2, "max_pairs": 2, "max_tests": 2, "sweep": 1,
                       "retest": False},
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


# -- the campaign file

@pytest.mark.parametrize("change, expected", [
    ({"nonsense": 1}, "nonsense: expected one of"),
    ({"search": {"steps": 0}}, "search.steps: expected a positive integer"),
    ({"search": {"benchmarks": ["no_such_program"]}}, "search.benchmarks: unknown benchmark"),
    ({"budget": {"search_share": 2}}, "budget.search_share: expected a number above 0"),
    ({"budget": {"worker_hours": -1}}, "budget.worker_hours: expected a positive number"),
    ({"labels": {"runs": 4, "max_pairs": 2}}, "labels.max_pairs: expected at least"),
    ({"policy": {"classifier": "forest"}}, "policy.classifier: expected one of"),
    ({"size": "huge"}, "size: expected quick or full"),
    ({"search": {"size": "medium"}}, "search.size: expected quick or full"),
    ({"config": "missing.yaml"}, "config: "),
])
def test_a_bad_campaign_file_is_one_line(tmp_path, change, expected):
    path = write_campaign(tmp_path, simulated_config(tmp_path), **change)
    got = campaign("--config", str(path), cwd=tmp_path)
    lines = [ln for ln in got.stderr.splitlines() if ln.strip()]
    assert got.returncode == 2 and len(lines) == 1, got.stderr
    assert lines[0].startswith(f"run-campaign: {path}: ") and expected in lines[0], lines[0]
    assert not (tmp_path / "camp").exists()


def test_yaml_syntax_and_a_missing_quick_section_are_one_line(tmp_path):
    path = tmp_path / "campaign.yaml"
    path.write_text("search: [\n")
    got = campaign("--config", str(path), cwd=tmp_path)
    assert got.returncode == 2 and "YAML syntax error" in got.stderr \
        and len(got.stderr.strip().splitlines()) == 1, got.stderr
    path = write_campaign(tmp_path, simulated_config(tmp_path))
    got = campaign("--config", str(path), "--quick", cwd=tmp_path)
    assert got.returncode == 2 and "quick: --quick needs a quick section" in got.stderr


def test_the_bundled_campaign_files_load():
    full = plan.load_campaign(REPO / "configs" / "campaign.yaml")
    quick = plan.load_campaign(REPO / "configs" / "campaign.yaml", quick=True)
    assert full.size == "full" and quick.size == "quick"
    assert quick.dir != full.dir and quick.results != full.results
    assert full.results == (REPO / "results").resolve()
    assert quick.identity != full.identity


# -- the stages' commands

def test_the_search_may_run_at_its_own_size_and_everything_else_at_the_campaigns(tmp_path):
    path = write_campaign(tmp_path, simulated_config(tmp_path), size="full",
                          search={"size": "quick"})
    c = plan.load_campaign(path)
    search, labels = plan.stage_command(c, "search"), plan.stage_command(c, "labels")
    assert search[search.index("--size") + 1] == "quick"
    assert labels[labels.index("--size") + 1] == "full"
    same = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path), size="full"))
    assert same.search.size == "full" and same.identity != c.identity


def test_a_started_stage_continues_through_its_commands_resume(tmp_path):
    c = plan.load_campaign(write_campaign(tmp_path, simulated_config(tmp_path)))
    fresh = plan.stage_command(c, "search")
    assert fresh[0] == "run_training_experiments" and "--resume" not in fresh
    assert fresh[fresh.index("--steps") + 1] == "4" and "--tasks" in fresh
    assert plan.stage_command(c, "rewards") is None  # no search yet: nothing to assign
    c.dir.mkdir()
    log = c.batch_log
    lines = [{"task": "kahan", "rundir": "rundirs/kahan-sa", "algorithm": "sa", "version": 1},
             {"task": "orbit", "rundir": "rundirs/orbit-sa", "algorithm": "sa", "version": 1},
             {"task": "kahan", "rundir": "rundirs/kahan-sites", "algorithm": "sites",
              "version": 1}]
    log.write_text("".join(json.dumps(x) + "\n" for x in lines))
    resumed = plan.stage_command(c, "search")
    assert resumed == ["run_training_experiments", "--config", str(c.config),
                       "--resume", str(c.dir / "rundirs/kahan-sa"),
                       "--resume", str(c.dir / "rundirs/orbit-sa")]
    labels = plan.stage_command(c, "labels")
    assert labels[-2:] == ["--resume", str(c.dir / "rundirs/kahan-sites")]
    rewards = plan.stage_command(c, "rewards")
    assert rewards[-2:] == [str(c.dir / "rundirs/kahan-sa"), str(c.dir / "rundirs/orbit-sa")]


def test_a_campaign_directory_of_other_settings_is_refused(tmp_path):
    config = simulated_config(tmp_path)
    c = plan.load_campaign(write_campaign(tmp_path, config))
    c.dir.mkdir()
    plan.write_state(c, plan.new_state(c).with_stage("search", state="done"))
    assert plan.read_state(c).next_stage() == "labels"
    # more budget is the same campaign; more steps is another
    more = plan.load_campaign(write_campaign(tmp_path, config, budget={"worker_hours": 5}))
    assert plan.read_state(more).stages["search"].state == "done"
    other = write_campaign(tmp_path, config, search={"steps": 9})
    got = campaign("--config", str(other), cwd=tmp_path)
    assert got.returncode == 2 and "started with other settings" in got.stderr \
        and len(got.stderr.strip().splitlines()) == 1, got.stderr


def test_the_worker_clock_counts_timed_runs_once(tmp_path):
    rundir = tmp_path / "r"
    rundir.mkdir()
    records = [
        {"event": "baseline", "times": [1.0, 2.0]},
        {"event": "step", "candidates": [
            {"times": [0.5, 0.5], "reference_times": [1.0, 1.0]},
            {"cached": True, "times": [9.0], "reference_times": [9.0]}]},
        {"event": "label", "outcome": {"cpu_s": 4.25, "times": [100.0]}},
    ]
    (rundir / "journal.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records)
                                          + '{"event": "step", "candid')  # being written
    clock = plan.WorkerClock()
    assert clock.seconds([rundir]) == pytest.approx(3.0 + 3.0 + 4.25)
    with (rundir / "journal.jsonl").open("a") as f:
        f.write('\n{"event": "confirm", "times": [2.5]}\n')
    assert clock.seconds([rundir, tmp_path / "missing"]) == pytest.approx(12.75)


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
    stages = state(tmp_path)
    assert stages["search"]["state"] == "budget" and stages["labels"]["state"] in (
        "done", "budget")
    assert stages["rewards"]["state"] == "pending"
    c = plan.load_campaign(path)
    searches = plan.experiments(c.batch_log, plan.SEARCHES)
    assert len(searches) == 2
    for r in searches:  # stopped early, as by Ctrl-C: resumable
        assert finish_reasons(r) == ["interrupted"]
    spent = plan.WorkerClock().seconds(searches)
    # The search's share is 120 worker-seconds.  At 4 slots and time_scale 0.02 the searches
    # spend about 200 of them per real second, so what runs between two reads of the clock
    # (every 0.3 s, later on a loaded machine) and the jobs in flight when they stop add to it;
    # the 500 steps of the two searches would have spent over 2,000.
    assert 120 <= spent < 600, spent
    assert "Traceback" not in got.stderr


def test_ctrl_c_stops_the_stage_and_a_rerun_continues_it(tmp_path):
    path = write_campaign(tmp_path, simulated_config(tmp_path), search={"steps": 40},
                          budget={"worker_hours": 1000})
    proc = subprocess.Popen([str(BIN / "run-campaign"), "--config", str(path), "--until",
                             "search"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "INLINING_CAMPAIGN_POLL_S": "0.3"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    c = plan.load_campaign(path)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # until a search has journaled a step
        rundirs = plan.experiments(c.batch_log, plan.SEARCHES) if c.batch_log.exists() \
            else []
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
    before = plan.experiments(c.batch_log, plan.SEARCHES)
    again = campaign("--config", str(path), "--until", "search", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "started 1 time(s) before: continuing" in again.stderr
    assert "--resume" in again.stderr  # through the search's own resume
    assert plan.experiments(c.batch_log, plan.SEARCHES) == before  # no new rundir
    # the first run's log is kept beside the resumed run's
    logs = c.dir / "logs"
    assert "interrupted " in (logs / "search.1.out").read_text()
    assert "finished " in (logs / "search.out").read_text()
    assert "interrupted " not in (logs / "search.out").read_text()
    for r in before:
        assert finish_reasons(r) == ["interrupted", "completed"]
    stages = state(tmp_path)
    assert stages["search"]["state"] == "done" and stages["search"]["runs"] == 2
    # done stages are skipped and shown
    status = campaign("--config", str(path), "--status", cwd=tmp_path)
    assert status.returncode == 0 and "1. search    done" in status.stdout, status.stdout


# -- a whole campaign, real compiler and worker

def test_a_campaign_runs_to_its_published_results_and_a_rerun_writes_the_same(tmp_path):
    path = write_campaign(tmp_path, local_config(tmp_path),
                          search={"benchmarks": ["orbit", "mandelbrot"], "steps": 2},
                          evaluate={"baselines": True})
    got = campaign("--config", str(path), cwd=tmp_path, timeout=1500)
    assert got.returncode == 0, got.stderr[-3000:]
    stages = state(tmp_path)
    assert all(stages[s]["state"] in plan.DONE for s in plan.STAGES), stages
    out = tmp_path / "out"
    summary = (out / "summary.csv").read_text().splitlines()
    assert summary[0].startswith("benchmark,split,build,speedup,low,high,pairs,size_ratio")
    assert {line.split(",")[2] for line in summary[1:]} >= {"policy", "never-inline"}
    assert (out / "README.md").is_file() and (out / "policy.policy").is_file()
    assert (out / "lu" / "plugins" / "plugin_policy.csv").is_file()
    readme = (out / "README.md").read_text()
    assert "## The policy and the baselines" in readme and "lu" in readme
    assert "compiler: " in readme and "machine: " in readme
    assert (out / "dataset" / "dataset.json").is_file()
    # the README's command trains the same policy from the published dataset alone
    command = readme.split("## Reproducing the policy from the dataset")[1].split("```")[1]
    argv = command.split()
    assert argv[0] == "train-policy"
    again = subprocess.run([str(BIN / argv[0]), *argv[1:-1], str(tmp_path / "again.policy")],
                           cwd=out, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.policy").read_bytes() == (out / "policy.policy").read_bytes()
    files = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    again = campaign("--config", str(path), cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"[1/{len(plan.STAGES)}]" not in again.stderr and "search    done" in again.stdout
    assert {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == files
