"""Data generation end to end: real compiles, real runs, and kill -9 of the master."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from dispatcher.config import SearchConfig
from dispatcher.core.dump_cache import DUMPS
from dispatcher.core.outputs import OUTPUTS, unpack
from dispatcher.core.records import (
    FORMAT_VERSION,
    BaselineEvent,
    CanaryEvent,
    ConfirmEvent,
    FinishEvent,
    Pointer,
    ResumeEvent,
    StepEvent,
)
from dispatcher.core.rundir import KILL_HOOK_ENV, Rundir, read_batch_log
from dispatcher.core.tree import Tree
from dispatcher.search.chain_core import counts
from tests.helpers import (
    FIRST_CPU,
    REPO,
    invoke,
    kill_after,
    one_line_error,
    only_rundir,
    run_to_end,
    rundirs_in,
    start,
)
from tests.helpers import search_config as config
from tests.helpers import training_command as command

PROG = "run_training_experiments"

def proposals(rundir: Path) -> list[tuple[int, int, str, str]]:
    """(step, candidate, mutation, proposal text) for every candidate of every step."""
    out = []
    for e in Rundir(rundir).events_of(StepEvent):
        for c in e.candidates:
            text = (rundir / c.dir / "overrides.sexp").read_text()
            out.append((e.step, c.candidate, c.mutation, text))
    return out


def step_numbers(rundir: Path) -> list[int]:
    return [e.step for e in Rundir(rundir).events_of(StepEvent)]


@pytest.mark.parametrize("algorithm, store_shared", [("random-walk", False), ("sa", True)])
def test_kill_and_resume_replays_an_uninterrupted_run(compiler, tmp_path, algorithm,
                                                      store_shared):
    steps = "5"  # killed after the baseline and steps 2 and 4; a canary after step 3
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("# one benchmark\nkahan\n")
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir(), b_dir.mkdir()
    # SA decisions depend on measured energies, and focused proposals on the baseline's
    # profile: run B shares A's store, so the same binaries replay the same measurements and
    # the same profile. Unfocused random-walk proposals do not depend on timing at all.
    store_a = a_dir / "store"
    store_b = store_a if store_shared else b_dir / "store"
    focus = "hot" if store_shared else "uniform"
    # The tiny size: what is asserted is the replay, not the figures.
    cfg_a = config(a_dir, store_a, {"canary_every": 3}, algorithm=algorithm, seed=11,
                   focus=focus, run_size="tiny")
    cfg_b = config(b_dir, store_b, {"canary_every": 3}, algorithm=algorithm, seed=11,
                   focus=focus, run_size="tiny")
    run_to_end(cfg_a, "--tasks", str(tasks), "--steps", steps)
    rundir_a = only_rundir(a_dir)

    proc = start(cfg_b, "--tasks", str(tasks), "--steps", steps)
    deadline = time.monotonic() + 60
    while not rundirs_in(b_dir):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.01)
    rundir_b = only_rundir(b_dir)
    kill_after(proc, rundir_b / "journal.jsonl", 0)
    for kill_at in (2, 4):
        proc = start(cfg_b, "--resume", str(rundir_b))
        kill_after(proc, rundir_b / "journal.jsonl", kill_at)
    run_to_end(cfg_b, "--resume", str(rundir_b))

    if focus == "hot":  # kept before the baseline, read again by every resume
        assert Rundir(rundir_b).profile() == Rundir(rundir_a).profile()
        assert Rundir(rundir_b).profile().functions
    else:
        assert not (rundir_b / "profile.json").exists()
    assert step_numbers(rundir_a) == list(range(1, int(steps) + 1))
    assert step_numbers(rundir_b) == list(range(1, int(steps) + 1))  # none twice, none skipped
    assert proposals(rundir_b) == proposals(rundir_a)
    events = Rundir(rundir_b).events()
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == "completed"
    assert sum(isinstance(e, BaselineEvent) for e in events) == 1
    # A canary follows step 3 (lost to a kill at most), never twice; one
    # confirmation of the best, just before the end, unless nothing beat the baseline.
    canaries = [e.step for e in events if isinstance(e, CanaryEvent)]
    assert canaries == sorted(set(canaries)) and set(canaries) <= {3}
    best = Rundir(rundir_b).last_step().best
    confirms = [e for e in events if isinstance(e, ConfirmEvent)]
    assert [(e.step, e.candidate) for e in confirms] == \
        ([(best.step, best.candidate)] if best.step else [])
    if confirms:
        assert events[-2] is confirms[0] and confirms[0].reference_times
    # The batch log lists the experiment once, however often it was resumed.
    assert [e.rundir for e in read_batch_log(b_dir / "batch.log")] == [str(rundir_b)]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resume_runs_with_the_recorded_settings_not_the_configs(compiler, tmp_path, mode):
    """A chain killed before its baseline, resumed, killed after step 2 and resumed to its end,
    both times under a config whose run.timeout, run.perf, run.aslr and search.focus differ
    from those it started with: every run is made with the recorded ones (no profile, no
    randomised layout, no perf counts, and none times out under the recorded timeout where
    the config's would fail them all), and the resume event names no setting taken from the
    config.  Before version 5 a resume took all four from its config."""
    tasks = tmp_path / "tasks.txt"
    tasks.write_text(f"{REPO / 'tests' / 'golden' / 'tinysum'}\n")
    cfg = config(tmp_path, tmp_path / "store", {"canary_every": 0, "confirm": False},
                 seed=5, mode=mode, candidates_per_step=1, focus="uniform")
    data = yaml.safe_load(cfg.read_text())
    data["run"].update(timeout=30, perf=False, aslr=False)
    cfg.write_text(yaml.safe_dump(data))
    edited = tmp_path / "edited.yaml"
    data["run"].update(timeout=0.001, perf=True, aslr=True)
    data["search"]["focus"] = "hot"
    edited.write_text(yaml.safe_dump(data))

    proc = start(cfg, "--tasks", str(tasks), "--steps", "4")
    deadline = time.monotonic() + 60
    while not rundirs_in(tmp_path):  # killed as soon as it exists: before its baseline
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    rundir = only_rundir(tmp_path)
    assert Rundir(rundir).baseline() is None
    recorded = Rundir(rundir).experiment
    assert (recorded.version, recorded.timeout, recorded.perf, recorded.aslr, recorded.focus) \
        == (FORMAT_VERSION, 30, False, False, "uniform")
    proc = subprocess.Popen(command(edited, "--resume", str(rundir)), cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, KILL_HOOK_ENV: "step:2"})
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL and step_numbers(rundir) == [1, 2]
    run_to_end(edited, "--resume", str(rundir))

    events = Rundir(rundir).events()
    assert step_numbers(rundir) == [1, 2, 3, 4]
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == "completed"
    resumes = [e for e in events if isinstance(e, ResumeEvent)]
    assert [e.from_step for e in resumes] == [3] and resumes[0].from_config == {}
    assert "from_config" not in (rundir / "journal.jsonl").read_text()
    assert not (rundir / "profile.json").exists()  # focus: uniform, as recorded
    records = [r for d in rundir.glob("steps/*/*") for result in Rundir.read_measurements(d)
               for r in result.records]
    assert len(records) >= 3 + 4 * 2 * 2  # the baseline's, then 2 pairs or more per step
    assert all(r.failure is None for r in records)  # timeout: 30 s, not 1 ms
    assert all(r.aslr is False and r.env_pad is None for r in records)
    assert all(r.perf is None and r.migrations is None for r in records)
    assert Rundir(rundir).experiment == recorded


def test_a_compiler_a_ctrl_c_stopped_interrupts_the_chain_and_records_no_step(compiler,
                                                                             tmp_path):
    """A compiler that died of SIGINT (a Ctrl-C that reached it in the instant before it left
    the master's process group) is an interruption: its candidate is not journaled as "compile
    failed", the chain ends interrupted, and the command says how to resume."""
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    wrapper = prefix / "bin" / "ocamlopt.opt"  # every compile with a proposal is Ctrl-C'd
    wrapper.write_text('#!/bin/sh\ncase " $* " in *" -inlining-overrides "*) kill -INT $$;; '
                       f'esac\nexec {shlex.quote(str(compiler.ocamlopt))} "$@"\n')
    wrapper.chmod(0o755)
    cfg = config(tmp_path, tmp_path / "store", algorithm="sa", seed=1)
    (tmp_path / "t.txt").write_text("lens\n")
    env = {**os.environ, "INLINING_COMPILER_PREFIX": str(prefix)}
    proc = subprocess.run(command(cfg, "--tasks", str(tmp_path / "t.txt"), "--steps", "3"),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 130, proc.stderr
    rundir = Rundir(only_rundir(tmp_path))
    assert rundir.baseline() is not None and rundir.last_step() is None
    last = rundir.events()[-1]
    assert isinstance(last, FinishEvent) and last.reason == "interrupted"
    assert f"--resume {rundir.path}" in proc.stderr and "Traceback" not in proc.stderr


def test_sa_rundir_contents_and_ctrl_c(compiler, tmp_path):
    cfg = config(tmp_path, tmp_path / "store", {"canary_every": 1}, algorithm="sa", seed=1,
                 remeasure_every=2)
    proc = start(cfg, "--tasks", str(tmp_path / "t.txt"), "--steps", "200") \
        if (tmp_path / "t.txt").write_text("lens\n") else None
    journal = None
    deadline = time.monotonic() + 120
    while journal is None or "\"canary\"" not in journal.read_text():
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        rundirs = rundirs_in(tmp_path)
        journal = rundirs[0] / "journal.jsonl" if rundirs else None
        if journal is not None and not journal.exists():
            journal = None
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    proc.wait(timeout=60)
    assert proc.returncode == 130
    rundir = Rundir(journal.parent)
    last = rundir.events()[-1]
    assert isinstance(last, FinishEvent) and last.reason == "interrupted"
    baseline = rundir.baseline()
    assert baseline is not None and baseline.ci95[0] <= baseline.geomean <= baseline.ci95[1]
    step = rundir.last_step()
    assert step is not None
    cand = step.candidates[0]
    d = journal.parent / cand.dir
    # Version 6: the candidate keeps the store's pack of its outputs (its dumps in it, no
    # plain dump beside it) and its proposal as text; its dumps give the decisions recorded.
    assert rundir.experiment.packs_outputs and not list(d.glob("*.decisions.sexp"))
    entry = tmp_path / "store" / "compiled" / cand.artifact[:2] / cand.artifact
    assert (d / OUTPUTS).read_bytes() == (entry / OUTPUTS).read_bytes()
    kept = unpack(d / OUTPUTS)
    assert kept["overrides.sexp"] == (d / "overrides.sexp").read_bytes()
    assert counts(DUMPS.build(kept, str(d))) == cand.decisions
    assert Tree.from_dir(d) == DUMPS.tree_of_dir(d) and len(Tree.from_dir(d))
    results = rundir.read_measurements(d)
    # Paired with the baseline on one CPU, one run per job, in ABBA rounds.
    shas = [r.sha256 for r in results]
    assert shas[:4] == [baseline.sha256, cand.sha256, cand.sha256, baseline.sha256]
    assert len({r.worker for r in results}) == 1 and cand.worker == results[0].worker
    assert len(cand.reference_times) == len(cand.times) >= 2  # runs: 2 (the fewest pairs)
    assert cand.speedup is not None and cand.ci95 is not None
    assert cand.energy == pytest.approx(1 / cand.speedup)
    assert cand.ci95[0] <= cand.speedup <= cand.ci95[1]
    assert cand.stopped in ("target", "budget", "worse")
    result = results[0]
    assert result.records and result.records[0].gc
    # Everything the agent measured is kept: the run's CPU mask and its output's hash.
    assert result.records[0].cpus_allowed == str(FIRST_CPU)
    assert result.records[0].stdout_sha256 and result.worker_class == "local"
    assert rundir.experiment.worker_class == "local"
    assert step.temperature == pytest.approx(SearchConfig().t_start)  # the default
    assert isinstance(step.incumbent, Pointer)
    # The A/A canary after step 1: the baseline against itself, in pairs.
    (canary,) = [e for e in rundir.events() if isinstance(e, CanaryEvent)]
    assert canary.step == 1 and len(canary.times) == len(canary.reference_times) >= 2
    assert {r.sha256 for r in rundir.read_measurements(journal.parent / "steps/00001/canary")} \
        == {baseline.sha256}
    assert canary.significant == (canary.ci95[0] > 1 or canary.ci95[1] < 1)
    state = json.loads((journal.parent / "state.json").read_text())
    assert state["step"] == step.step and state["rng"] == step.rng


def test_a_user_benchmark_named_like_a_bundled_one_gets_its_own_rundir(compiler, tmp_path):
    """Both run, each in its own rundir, both listed: the second used to collide with the
    first's rundir name and abort the batch, leaving a rundir that held only ``start``."""
    mine = tmp_path / "mine" / "kahan"
    shutil.copytree(REPO / "benchmarks" / "kahan", mine)
    tasks = tmp_path / "tasks.txt"
    tasks.write_text(f"kahan\n{mine}\n")
    cfg = config(tmp_path, tmp_path / "store", measure={"canary_every": 0, "confirm": False},
                 run_size="tiny", candidates_per_step=1)
    proc = run_to_end(cfg, "--tasks", str(tasks), "--steps", "1")
    rundirs = sorted(rundirs_in(tmp_path))
    assert len(rundirs) == 2, proc.stderr
    benchmarks = {Rundir(r).experiment.benchmark: r for r in rundirs}
    assert set(benchmarks) == {str(REPO / "benchmarks" / "kahan"), str(mine)}
    assert all(Rundir(r).finished_completed() for r in rundirs)
    assert benchmarks[str(mine)].name != benchmarks[str(REPO / "benchmarks" / "kahan")].name
    assert all(r.name.startswith("kahan-") for r in rundirs)
    assert sorted(e.rundir for e in read_batch_log(tmp_path / "batch.log")) == \
        sorted(str(r) for r in rundirs)


def test_bad_inputs_fail_with_one_line(tmp_path):
    cfg = config(tmp_path, tmp_path / "store")
    (tmp_path / "tasks.txt").write_text("no-such-benchmark\n")
    (tmp_path / "empty.txt").write_text("# nothing yet\n\n")
    (tmp_path / "twice.txt").write_text(f"kahan\n{REPO}/benchmarks/kahan\n")
    (tmp_path / "latin1.txt").write_bytes("# d\xe9j\xe0 vu\nkahan\n".encode("latin-1"))
    rundir = tmp_path / "finished"
    shutil.copytree(REPO / "tests" / "golden" / "rundir-v2", rundir)
    for args, expected in [(["--tasks", str(tmp_path / "tasks.txt")], "no-such-benchmark"),
                           (["--resume", str(tmp_path)], "not a rundir"),
                           (["--tasks", str(tmp_path / "missing.txt")], "missing.txt"),
                           (["--tasks", str(tmp_path / "empty.txt")],
                            "empty.txt: no benchmark listed"),
                           (["--resume", str(rundir), "--steps", "9", "--seed", "3"],
                            "--steps, --seed cannot be used with --resume"),
                           (["--resume", str(rundir), "--resume", str(rundir)],
                            "given to --resume twice"),
                           (["--tasks", str(tmp_path / "twice.txt")],
                            f"twice.txt: {REPO}/benchmarks/kahan: the same benchmark as kahan"),
                           (["--tasks", str(tmp_path / "latin1.txt")],
                            "latin1.txt: expected UTF-8 text (invalid continuation byte at "
                            "byte 3)")]:
        # in this process: each is refused before a session, a worker or a rundir exists
        line = one_line_error(invoke(PROG, "--config", str(cfg), *args, cwd=REPO))
        assert line.startswith(f"{PROG}: ") and expected in line, line
    assert not list((tmp_path / "rundirs").glob("*"))  # refused before any rundir was made
    # A finished rundir is left as it is: no second finish.
    journal = (rundir / "journal.jsonl").read_bytes()
    result = invoke(PROG, "--config", str(cfg), "--resume", str(rundir), cwd=REPO)
    assert result.exit_code == 0 and "already finished" in result.stderr, result.stderr
    assert (rundir / "journal.jsonl").read_bytes() == journal
