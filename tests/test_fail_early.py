"""Campaigns and labels fail early (issue 36 item 3): the campaign's identity covers the
content of the files it runs on, invalid values are refused rather than adjusted, output
directories are checked before anything is measured, measure-sites' --tree is checked
against its program (and never read from a FIFO), the simulated model names only programs
and decisions that exist, and a search's plot is drawn whatever stopped it on the way.

Each in this process (CliRunner) on the simulated backend: seconds, no compiler."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatcher.config import ConfigError, parse_config
from dispatcher.core.rundir import SitesRundir
from pipeline.campaign import plan
from pipeline.campaign import state as cstate
from pipeline.campaign.publish import publish
from tests.helpers import invoke, one_line_error

KAHAN_KEY = ("D(Summation.add@summation.ml:53:10-130)/"
             "C(Summation.two_sum@summation.ml:54:17-30)")
KAHAN_TREE = ("(inlining_overrides (version 1) (overrides\n ((unit Summation) (round 0) "
              f'(key "{KAHAN_KEY}") (action inline))))\n')


def sim_config(tmp: Path, model: dict | None = None, **extra) -> Path:
    data = {"backend": "simulated", "store": str(tmp / "store"),
            "simulated": {"slots": 2, "time_scale": 0.01, "compile_jobs": 2,
                          "cache_dir": str(tmp / "sim-cache"),
                          "model": model or {"default": {"run_s": 1.0, "compile_s": 0.2}}},
            "scheduler": {"backoff_s": 0.01, "backoff_max_s": 0.05},
            "search": {"rundirs": str(tmp / "rundirs"), "batch_log": str(tmp / "batch.log"),
                       "focus": "uniform"},
            **extra}
    path = tmp / "sim.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def campaign_file(tmp: Path, config: Path, **sections) -> Path:
    data: dict[str, Any] = {"config": str(config), "dir": "camp", "results": "out", "size": "quick",
            "search": {"benchmarks": ["kahan"], "steps": 2},
            "labels": {"runs": 2, "max_pairs": 2, "max_tests": 2, "sweep": 1,
                       "retest": False},
            "evaluate": {"benchmarks": ["lu"], "baselines": False}}
    for k, v in sections.items():
        data[k] = {**data.get(k, {}), **v} if isinstance(v, dict) else v
    path = tmp / "campaign.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# -- the campaign

def test_a_changed_experiment_config_is_refused_naming_it(tmp_path):
    config = sim_config(tmp_path)
    c = plan.load_campaign(campaign_file(tmp_path, config))
    c.dir.mkdir()
    cstate.write_state(c, cstate.new_state(c).with_stage("search", state="done"))
    data = yaml.safe_load(config.read_text())
    data["simulated"]["model"]["default"]["run_s"] = 2.0  # same path, other content
    config.write_text(yaml.safe_dump(data))
    line = one_line_error(invoke("run-campaign", "--config", str(tmp_path / "campaign.yaml"),
                                 cwd=tmp_path))
    assert "campaign.json" in line and f"other content in {config}" in line, line
    # put back: the same campaign
    data["simulated"]["model"]["default"]["run_s"] = 1.0
    config.write_text(yaml.safe_dump(data))
    again = plan.load_campaign(tmp_path / "campaign.yaml")
    assert cstate.read_state(again).stages["search"].state == "done"


def test_a_model_file_is_part_of_the_identity(tmp_path):
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump({"default": {"run_s": 1.0}}))
    config = sim_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["simulated"]["model"] = "model.yaml"
    config.write_text(yaml.safe_dump(data))
    path = campaign_file(tmp_path, config)
    first = plan.load_campaign(path)
    model.write_text(yaml.safe_dump({"default": {"run_s": 3.0}}))
    assert plan.load_campaign(path).identity != first.identity


def test_a_directory_started_before_the_identity_covered_content_is_taken_over(tmp_path):
    c = plan.load_campaign(campaign_file(tmp_path, sim_config(tmp_path)))
    c.dir.mkdir()
    old = cstate.new_state(c).with_stage("search", state="done")
    cstate.write_state(c, old)
    data = json.loads((c.dir / cstate.STATE_FILE).read_text())
    data["identity"] = c.legacy_identity
    del data["inputs"]
    (c.dir / cstate.STATE_FILE).write_text(json.dumps(data))
    taken = cstate.read_state(c)
    assert taken.identity == c.identity and taken.stages["search"].state == "done"


@pytest.mark.parametrize("runs", [1, 0, True])
def test_labels_runs_below_two_is_refused_not_raised(tmp_path, runs):
    path = campaign_file(tmp_path, sim_config(tmp_path), labels={"runs": runs})
    line = one_line_error(invoke("run-campaign", "--config", str(path), cwd=tmp_path))
    assert line.startswith(f"run-campaign: {path}: labels.runs: expected an integer from 2"), \
        line
    assert not (tmp_path / "camp").exists()


@pytest.mark.parametrize("stage", ["policy", "evaluate"])
def test_max_pairs_below_runs_is_refused_not_raised(tmp_path, stage):
    path = campaign_file(tmp_path, sim_config(tmp_path), **{stage: {"runs": 4, "max_pairs": 2}})
    line = one_line_error(invoke("run-campaign", "--config", str(path), cwd=tmp_path))
    assert line == (f"run-campaign: {path}: {stage}.max_pairs: expected at least {stage}.runs "
                    "(4), got 2"), line


def test_a_results_path_that_is_a_file_is_refused_before_any_stage(tmp_path):
    path = campaign_file(tmp_path, sim_config(tmp_path))
    (tmp_path / "out").write_text("a file\n")
    line = one_line_error(invoke("run-campaign", "--config", str(path), cwd=tmp_path))
    assert line == f"run-campaign: {path}: results: {tmp_path / 'out'}: not a directory", line
    assert not (tmp_path / "camp").exists()


# -- a search's plot, whatever stopped it

def test_a_search_plot_is_drawn_by_the_resume_and_by_publishing(tmp_path):
    """A chain that finished in a run stopped later was never plotted (plots are drawn only
    when no stop came) and its resume said "already finished": the resume draws it, and
    publishing draws every search's plot from its journal, so a campaign killed on the way
    publishes the same search/*.png as one that was not."""
    config = sim_config(tmp_path)
    got = invoke("run_training_experiments", "--config", str(config), "--tasks",
                 str(_tasks(tmp_path, "kahan")), "--steps", "2", "--runs", "2",
                 "--max-pairs", "2", "--size", "quick", cwd=tmp_path)
    assert got.exit_code == 0, got.stderr
    rundir = next((tmp_path / "rundirs").iterdir())
    drawn = (rundir / "plot.png").read_bytes()
    (rundir / "plot.png").unlink()  # as a stop after the chain ended leaves it
    again = invoke("run_training_experiments", "--config", str(config), "--resume",
                   str(rundir), cwd=tmp_path)
    assert again.exit_code == 0 and "already finished" in again.stderr, again.stderr
    assert (rundir / "plot.png").read_bytes() == drawn

    (rundir / "plot.png").unlink()
    stale = rundir / ".plot.png.k1ll3d.png.tmp"  # a kill during an earlier publish's plot
    stale.write_bytes(b"half a png")
    c = plan.load_campaign(campaign_file(tmp_path, config, dir=str(tmp_path)))
    assert c.batch_log == tmp_path / "batch.log"
    written = publish(c)
    out = tmp_path / "out" / "search" / f"{rundir.name}.png"
    assert out in written and out.read_bytes() == drawn
    assert not stale.exists()  # swept, as bench/kill_loops' stray check asks


def _tasks(tmp: Path, *names: str) -> Path:
    path = tmp / "tasks"
    path.write_text("".join(f"{n}\n" for n in names))
    return path


# -- measure-sites

def _tree(tmp: Path) -> Path:
    path = tmp / "tree.sexp"
    path.write_text(KAHAN_TREE)
    return path


def _nothing_made(tmp: Path) -> None:
    assert not (tmp / "rundirs").exists() or not any((tmp / "rundirs").iterdir())
    assert not (tmp / "batch.log").exists() or not (tmp / "batch.log").read_text()


def test_labels_that_cannot_be_written_are_refused_before_any_measurement(tmp_path):
    cfg = sim_config(tmp_path)
    (tmp_path / "labels-file").write_text("")
    line = one_line_error(invoke("measure-sites", "--config", str(cfg), "--tree",
                                 f"kahan={_tree(tmp_path)}", "--labels",
                                 str(tmp_path / "labels-file"), cwd=tmp_path))
    assert line == (f"measure-sites: {tmp_path / 'labels-file'}: --labels: not a directory "
                    "(the labels tables go there)"), line
    assert not (tmp_path / "rundirs").exists() or not any((tmp_path / "rundirs").iterdir())


def test_a_resume_of_a_finished_labels_rundir_writes_its_table(tmp_path):
    """The run that finished the rundir may have been stopped before it wrote the table (or
    could not write it): a --resume writes it, and refuses --labels it cannot write."""
    cfg = sim_config(tmp_path)
    args = ["measure-sites", "--config", str(cfg), "--tree", f"kahan={_tree(tmp_path)}",
            "--runs", "2", "--max-pairs", "2", "--max-tests", "2", "--sweep", "0"]
    got = invoke(*args, cwd=tmp_path)
    assert got.exit_code == 0, got.stderr
    rundir = next((tmp_path / "rundirs").iterdir())
    assert SitesRundir.open(rundir, lock=False).finished_completed()
    table = (tmp_path / "labels" / "kahan" / "sites.csv").read_bytes()
    shutil.rmtree(tmp_path / "labels")
    (tmp_path / "labels").write_text("")
    line = one_line_error(invoke("measure-sites", "--config", str(cfg), "--resume",
                                 str(rundir), cwd=tmp_path))
    assert "--labels: not a directory" in line, line
    (tmp_path / "labels").unlink()
    again = invoke("measure-sites", "--config", str(cfg), "--resume", str(rundir),
                   cwd=tmp_path)
    assert again.exit_code == 0, again.stderr
    assert "already finished" in again.stderr and "kahan: labels in" in again.stderr
    assert (tmp_path / "labels" / "kahan" / "sites.csv").read_bytes() == table


def test_a_tree_of_another_program_is_refused_naming_the_file(tmp_path):
    cfg = sim_config(tmp_path)
    tree = _tree(tmp_path)
    line = one_line_error(invoke("measure-sites", "--config", str(cfg), "--tree",
                                 f"lu={tree}", cwd=tmp_path))
    assert line.startswith(f"measure-sites: {tree}: --tree lu: its decisions are for unit "
                           "Summation, which lu does not have"), line
    _nothing_made(tmp_path)


def test_a_tree_that_is_a_fifo_is_one_line_at_once(tmp_path):
    cfg = sim_config(tmp_path)
    fifo = tmp_path / "tree.fifo"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    line = one_line_error(invoke("measure-sites", "--config", str(cfg), "--tree",
                                 f"kahan={fifo}", cwd=tmp_path))
    assert time.monotonic() - t0 < 30
    assert line == f"measure-sites: {fifo}: not a regular file", line
    _nothing_made(tmp_path)


# -- the simulated model

@pytest.mark.parametrize("programs, key, expected", [
    ({"kahn": {"run_s": 2.0}}, "simulated.model.programs.kahn", "no bundled benchmark"),
    ({"./nowhere": {"run_s": 2.0}}, "simulated.model.programs../nowhere",
     "not a benchmark directory"),
    ({"kahan": {"effects": [{"unit": "Summation", "round": 0, "key": "C(Nope.f@x.ml:1:1-2)",
                             "action": "inline", "log_speedup": 0.1}]}},
     "simulated.model.programs.kahan.effects[0]", "kahan has no call"),
    ({"kahan": {"effects": [{"unit": "Summation", "round": 0, "key": KAHAN_KEY,
                             "action": "inline", "log_speedup": 0.1,
                             "requires": [{"unit": "Main", "round": 0, "key": KAHAN_KEY,
                                           "action": "inline"}]}]}},
     "simulated.model.programs.kahan.effects[0].requires[0]", "kahan has no call"),
])
def test_a_model_of_a_program_or_decision_that_does_not_exist_is_one_line(
        tmp_path, programs, key, expected):
    cfg = sim_config(tmp_path, {"programs": programs})
    line = one_line_error(invoke("run_training_experiments", "--config", str(cfg), "--tasks",
                                 str(_tasks(tmp_path, "kahan")), cwd=tmp_path))
    assert line.startswith(f"run_training_experiments: {cfg}: {key}: "), line
    assert expected in line, line
    _nothing_made(tmp_path)


def test_an_effect_inside_an_inlined_body_is_accepted():
    """A site that exists only once a call is inlined (``<call>/I/...``) can be taken: the
    model may plant an effect on it."""
    from dispatcher.core.decisions import Override
    from dispatcher.running.simulated.programs import DUMPS_DIR, compile_tree, read_bundle
    program = read_bundle(DUMPS_DIR / "kahan.tar.gz")
    heuristic = {(u, r, n.key) for u, r, n in program.tree.calls()}
    for u, r, n in program.tree.calls():
        if n.decided == "dont_inline" and program.decls.get(n.name, (None, None))[1] is not None:
            inlined = compile_tree(program, [Override(u, r, n.key, "inline")])
            new = [(uu, rr, m.key) for uu, rr, m in inlined.tree.calls()
                   if (uu, rr, m.key) not in heuristic]
            if new:
                break
    else:
        pytest.fail("no call of kahan brings sites in when inlined")
    unit, round_, key = new[0]
    parse_config({"backend": "simulated", "simulated": {"model": {"programs": {"kahan": {
        "effects": [{"unit": unit, "round": round_, "key": key, "action": "inline",
                     "log_speedup": 0.1}]}}}}}, Path("c.yaml"))
    with pytest.raises(ConfigError):
        parse_config({"backend": "simulated", "simulated": {"model": {"programs": {"kahan": {
            "effects": [{"unit": unit, "round": round_, "key": key + "/I/C(No.f@n.ml:1:1-2)",
                         "action": "inline", "log_speedup": 0.1}]}}}}}, Path("c.yaml"))


def test_run_campaign_killed_when_one_chain_had_finished_publishes_every_search_plot(tmp_path):
    """kill -9 of run-campaign just after kahan's chain finished and while orbit's runs: the
    stage stops gracefully (PR_SET_PDEATHSIG), kahan unplotted; the rerun resumes both
    (kahan "already finished") and publishing gives each search its plot, as an
    uninterrupted campaign does (the missing search/kahan-sa-*.png of the issue)."""
    import subprocess
    import sys

    # orbit's runs (0.6 s each at this time scale) are long enough that its chain is still
    # running when kahan's ends on a loaded machine (at 0.12 s, at load 8 on 2 CPUs, orbit's
    # chain once ended first: the master's own work per candidate outweighed the runs)
    config = sim_config(tmp_path, {"default": {"run_s": 1.0, "compile_s": 0.2},
                                   "programs": {"orbit": {"run_s": 60.0}}},
                        run={"runs": 2}, measure={"max_pairs": 2, "canary_every": 0})
    path = campaign_file(tmp_path, config, search={"benchmarks": ["kahan", "orbit"],
                                                   "steps": 3})
    argv = [str(Path(sys.executable).parent / "run-campaign"), "--config", str(path),
            "--until", "search"]
    env = {**os.environ, "INLINING_CAMPAIGN_POLL_S": "0.3"}
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=env)
    rundirs = tmp_path / "rundirs"

    def finished(name: str) -> bool:
        for r in rundirs.glob(f"{name}-sa-*"):
            journal = r / "journal.jsonl"
            if journal.exists() and '"finish"' in journal.read_text():
                return True
        return False

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and not finished("kahan"):
        time.sleep(0.05)
    assert proc.poll() is None and not finished("orbit"), "orbit ended before kahan"
    proc.kill()
    proc.communicate(timeout=240)  # stderr's end: the stage (which shares it) has exited too
    time.sleep(0.5)  # the stage stops on its own (SIGINT from the kernel), its locks released
    again = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    searches = sorted(rundirs.glob("*-sa-*"))
    assert len(searches) == 2
    written = publish(plan.load_campaign(path))
    for r in searches:
        out = tmp_path / "out" / "search" / f"{r.name}.png"
        assert out in written and out.read_bytes() == (r / "plot.png").read_bytes()
