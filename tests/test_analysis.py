"""analysis/: the batch-log table, CSV/Parquet export and plots, on synthetic rundirs.

The rundirs are written with dispatcher.core.rundir (Rundir.create + append, append_batch_log) and
dispatcher.running.agent_client (RunResult.to_json for measurements.json), following docs/rundir-format.md.
"""
from __future__ import annotations

import csv
import io
import json
import math
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from analysis.batch_log import best_times, summaries
from analysis.export import PARQUET_MISSING, measurements_table
from analysis.plots import plot_experiment
from commands.batch_log import batch_log
from dispatcher.core.records import (
    BaselineEvent,
    BatchEntry,
    Candidate,
    Experiment,
    Pointer,
    RemeasureEvent,
    RunRecord,
    RunResult,
    StepEvent,
    event_from_json,
)
from dispatcher.core.rundir import Rundir, append_batch_log, rundirs_of_batch_log

NOW = time.time()
GC = {"minor_collections": 12, "major_collections": 3, "minor_words": 123456,
      "top_heap_words": 40960}
PERF_EVENTS = ("cycles", "instructions", "task-clock")
UNSUPPORTED = "cache-misses"

# Baseline and best candidate log-times: the hand computation in tests/test_stats.py
# (test_hand_computed_speedup_ci) gives their speedup and interval.
BASE_LOGS = [0.0, 0.02, -0.02]
BEST_LOGS = [-0.1, -0.08, -0.12]


# --------------------------------------------------------------------------- builders

def record(t: float, failure: str | None = None) -> RunRecord:
    perf = {e: {"value": 1000.0 * t * (i + 1), "unit": "msec" if e == "task-clock" else ""}
            for i, e in enumerate(PERF_EVENTS)}
    perf[UNSUPPORTED] = {"unsupported": True}
    return RunRecord(wall_ns=round(t * 1e9), user_s=round(0.9 * t, 6), sys_s=0.01,
                     maxrss_kb=4096, exit_status=2 if failure else 0, signal=None,
                     output_ok=None if failure else True, gc={} if failure else dict(GC),
                     perf=perf, failure=failure, stderr_tail="boom" if failure else "")


def write_measurements(d: Path, sha: str, times: list[float], failed: int = 0) -> None:
    d.mkdir(parents=True, exist_ok=True)
    recs = [record(t) for t in times] + [record(9.9, "exit status 2") for _ in range(failed)]
    result = RunResult(sha256=sha, args=("100",), worker="local/cpu1", worker_class="test",
                       cpu=1, records=tuple(recs))
    (d / "measurements.json").write_text(json.dumps([result.to_json()]))


def event(data: dict):
    """A journal event from its JSON, checked as the experiment's would be."""
    return event_from_json(data, "test")


def geo(times: list[float]) -> float:
    return math.exp(sum(math.log(t) for t in times) / len(times))


def build(root: Path, name: str, *, algorithm: str = "sa", planned: int, steps: list[dict],
          finish: str | None = None, t0: float = NOW - 600, seed: int = 7,
          baseline: bool = True, batch_log: Path | None = None) -> Path:
    """A rundir as dispatcher/search/chain.py writes it.

    ``steps``: [{"cands": [log-times list | "compile" (compile failed) | ("fail", n)],
                 "accept": bool, "remeasure": log-times of the incumbent measured again}]
    """
    path = root / "rundirs" / name
    exp = {"task": name.split("-")[0], "benchmark": f"/bench/{name}", "algorithm": algorithm,
           "seed": seed, "steps": planned, "chain": 0, "size": "quick", "runs": 3,
           "baseline_runs": 3, "candidates_per_step": 2, "t_start": 0.04, "t_end": 0.001,
           "remeasure_every": 4, "rundir": str(path)}
    rd = Rundir.create(path, Experiment(**exp, max_flips=2), {"store": "/nowhere"})
    if batch_log is not None:
        append_batch_log(batch_log, BatchEntry(task=exp["task"], rundir=str(path),
                                               algorithm=algorithm, steps=planned))
    t = t0
    if baseline:
        base_times = [math.exp(v) for v in BASE_LOGS]
        write_measurements(path / "steps/00000/c0", "sha-base", base_times)
        t += 1
        rd.append(event({"event": "baseline", "time": t, "sha256": "sha-base",
                         "dir": "steps/00000/c0",
                   "times": base_times, "geomean": geo(base_times),
                   "median": sorted(base_times)[1], "ci95": [0.95, 1.05],
                   "decisions": {"inlined": 10, "not_inlined": 5, "prevented": 1}}))
        base = geo(base_times)
    incumbent = {"step": 0, "candidate": 0, "dir": "steps/00000/c0", "energy": 1.0}
    best = dict(incumbent)
    all_times = {"steps/00000/c0": base_times} if baseline else {}
    for n, spec in enumerate(steps, start=1):
        cands = []
        for k, c in enumerate(spec["cands"]):
            d = f"steps/{n:05d}/c{k}"
            entry = {"candidate": k, "dir": d, "mutation": f"flip {n}.{k}", "sha256": None,
                     "cached": False, "decisions": None, "times": [], "failed": 0,
                     "energy": None, "error": None}
            (path / d).mkdir(parents=True)
            if c == "compile":
                entry["error"] = "compile failed: syntax"
            elif isinstance(c, tuple):
                entry.update(sha256=f"sha-{n}-{k}", failed=c[1],
                             decisions={"inlined": 11, "not_inlined": 4, "prevented": 1})
                write_measurements(path / d, entry["sha256"], [], failed=c[1])
            else:
                times = [math.exp(v) for v in c]
                entry.update(sha256=f"sha-{n}-{k}", times=times, energy=geo(times) / base,
                             decisions={"inlined": 10 + k, "not_inlined": 5 - k,
                                        "prevented": n})
                write_measurements(path / d, entry["sha256"], times)
                all_times[d] = times
            cands.append(entry)
        scored = [e for e in cands if e["energy"] is not None]
        chosen = min(scored, key=lambda e: e["energy"]) if scored else None
        accepted = bool(chosen) and spec.get("accept", True)
        if accepted:
            incumbent = {"step": n, **{k: chosen[k] for k in ("candidate", "dir", "energy")}}
        for e in scored:
            if e["energy"] < best["energy"]:
                best = {"step": n, **{k: e[k] for k in ("candidate", "dir", "energy")}}
        if "remeasure" in spec:
            extra = [math.exp(v) for v in spec["remeasure"]]
            all_times[incumbent["dir"]] = all_times[incumbent["dir"]] + extra
            energy = geo(all_times[incumbent["dir"]]) / base
            t += 1
            write_measurements(path / f"steps/{n:05d}/remeasure", "sha-remeasure", extra)
            rd.append(event({"event": "remeasure", "time": t, "step": n,
                             "dir": incumbent["dir"], "times": extra, "energy": energy,
                             "measurements": f"steps/{n:05d}/remeasure/measurements.json"}))
            incumbent = {**incumbent, "energy": energy}
        t += 1
        rd.append(event({"event": "step", "time": t, "step": n,
                   "temperature": 0.04 / n if algorithm == "sa" else None,
                   "candidates": cands, "chosen": chosen["candidate"] if chosen else None,
                   "accepted": accepted, "incumbent": incumbent, "best": best,
                   "rng": [3, [1, 2, 3], None], "busy_s": 2.0 * n, "elapsed_s": 1.5 * n}))
    if finish is not None:
        t += 1
        rd.append(event({"event": "finish", "time": t, "reason": finish}))
    return path


A_STEPS = [
    {"cands": [[-0.03, -0.02, -0.04], [0.01, 0.02, 0.0]]},                  # c0 accepted
    {"cands": [[-0.01, 0.0, -0.02], BEST_LOGS]},                            # c1: the best
    {"cands": [[-0.05, -0.04, -0.06], "compile"]},                          # uphill accept
    {"cands": [[0.02, 0.03, 0.01], ("fail", 3)], "accept": False,
     "remeasure": [-0.06, -0.05, -0.04]},                                   # incumbent again
]


@pytest.fixture
def batch(tmp_path):
    """Six experiments: finished, running, interrupted, failed, missing, stale."""
    log = tmp_path / "batch.log"
    paths = {
        "finished": build(tmp_path, "alpha-sa", planned=4, steps=A_STEPS, finish="completed",
                          t0=1_700_000_000, batch_log=log),
        "running": build(tmp_path, "beta-rw", algorithm="random-walk", planned=10,
                         steps=[{"cands": [[0.01, 0.0, 0.02]]}, {"cands": [[-0.02] * 3]}],
                         batch_log=log),
        "interrupted": build(tmp_path, "gamma-sa", planned=5,
                             steps=[{"cands": [[0.05] * 3, [0.04, 0.05, 0.06]]}],
                             finish="interrupted", batch_log=log),
        "failed": build(tmp_path, "delta-sa", planned=5, steps=[], baseline=False,
                        finish="failed: delta: baseline: timeout", batch_log=log),
    }
    gone = tmp_path / "rundirs" / "epsilon-sa"
    append_batch_log(log, BatchEntry(task="epsilon", rundir=str(gone), algorithm="sa",
                                     steps=7))
    paths["missing"] = gone
    paths["stale"] = build(tmp_path, "zeta-rw", algorithm="random-walk", planned=6,
                           steps=[{"cands": [[0.0, 0.01, -0.01]]}], t0=NOW - 7200,
                           batch_log=log)
    return log, paths


def run_cli(*args: str):
    return CliRunner().invoke(batch_log, list(args), catch_exceptions=False)


def by_task(rows):
    return {s.task: s for s in rows}


# --------------------------------------------------------------------------- statistics
# (the formulas themselves: tests/test_stats.py)

def test_best_times_pool_remeasures_of_the_same_binary():
    def step(n: int, sha: str, times: list[float]) -> StepEvent:
        cand = Candidate(candidate=0, dir=f"steps/{n:05d}/c0", mutation="flip 1", sha256=sha,
                         times=times)
        pointer = Pointer(step=n, candidate=0, dir=cand.dir, energy=1.0)
        return StepEvent(step=n, temperature=None, candidates=[cand], chosen=0, accepted=True,
                         incumbent=pointer, best=pointer, rng=[])

    def remeasure(d: str, times: list[float]) -> RemeasureEvent:
        return RemeasureEvent(step=2, dir=d, measurements="m", times=times, energy=1.0)

    events = [
        BaselineEvent(sha256="b", times=[1.0, 1.0], geomean=1.0, median=1.0, ci95=(1.0, 1.0)),
        step(1, "x", [0.9, 0.91]),
        step(2, "x", [0.92]),
        remeasure("steps/00002/c0", [0.93]),
        remeasure("steps/00001/c0", [0.94]),
        remeasure("steps/00009/c0", [5.0]),
    ]
    best = Pointer(step=1, candidate=0, dir="steps/00001/c0", energy=0.905)
    # its own runs, then remeasures of its dir and of another dir with the same binary
    assert best_times(events, best) == [0.9, 0.91, 0.93, 0.94]
    assert best_times(events, Pointer(step=3, candidate=0, dir="steps/00003/c0",
                                      energy=1.0)) is None


# --------------------------------------------------------------------------- the table

def test_summaries_of_every_experiment(batch):
    log, paths = batch
    rows = by_task(summaries(rundirs_of_batch_log(log)))
    assert list(rows) == ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    expect = {"alpha": ("finished", 4, 4), "beta": ("running", 2, 10),
              "gamma": ("interrupted", 1, 5), "delta": ("failed", 0, 5),
              "epsilon": ("missing", None, 7), "zeta": ("stale", 1, 6)}
    for task, (status, done, planned) in expect.items():
        assert (rows[task].status, rows[task].steps_done, rows[task].steps_planned) == \
            (status, done, planned), task
    a = rows["alpha"]
    assert (a.best_speedup, a.ci_low, a.ci_high) == (
        pytest.approx(1.105171, abs=1e-6), pytest.approx(1.056182, abs=1e-6),
        pytest.approx(1.156431, abs=1e-6))
    assert a.algorithm == "sa" and rows["beta"].algorithm == "random-walk"
    assert a.last_update == 1_700_000_000 + 1 + 5 + 1  # baseline, 4 steps + remeasure, finish
    assert rows["delta"].best_speedup is None and rows["epsilon"].best_speedup is None
    # gamma's only step was slower than the baseline: the best is still the baseline
    assert rows["gamma"].best_speedup == 1.0 and rows["gamma"].best_step == 0


def test_table_cli(batch, monkeypatch):
    log, paths = batch
    result = run_cli(str(log))
    assert result.exit_code == 0, result.output
    out = result.stdout
    lines = {line.split()[0]: line for line in out.splitlines()
             if line.strip() and line.split()[0] in
             ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")}
    assert set(lines) == {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"}
    assert "1.105 [1.056, 1.156]" in lines["alpha"] and " 4/4 " in lines["alpha"]
    assert datetime.fromtimestamp(1_700_000_007).strftime("%Y-%m-%d %H:%M:%S") in lines["alpha"]
    assert lines["alpha"].rstrip().endswith("finished")
    assert " 2/10 " in lines["beta"] and lines["beta"].rstrip().endswith("running")
    assert "1.000 (baseline)" in lines["gamma"] and "interrupted" in lines["gamma"]
    assert " 0/5 " in lines["delta"] and lines["delta"].rstrip().endswith("failed")
    assert str(paths["missing"]) in lines["epsilon"] and " -/7 " in lines["epsilon"]
    assert lines["epsilon"].rstrip().endswith("missing")
    assert lines["zeta"].rstrip().endswith("stale")
    # ./batch.log by default
    monkeypatch.chdir(log.parent)
    assert run_cli().stdout == out


def test_csv_cli(batch):
    log, paths = batch
    result = run_cli(str(log), "--csv")
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["task"] for r in rows] == ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    alpha = rows[0]
    assert alpha["rundir"] == str(paths["finished"])
    assert (alpha["steps_done"], alpha["steps_planned"], alpha["status"]) == ("4", "4",
                                                                             "finished")
    assert float(alpha["best_speedup"]) == pytest.approx(1.105171, abs=1e-6)
    assert float(alpha["ci_low"]) == pytest.approx(1.056182, abs=1e-6)
    assert float(alpha["ci_high"]) == pytest.approx(1.156431, abs=1e-6)
    assert [r["status"] for r in rows] == ["finished", "running", "interrupted", "failed",
                                           "missing", "stale"]
    assert rows[4]["best_speedup"] == "" and rows[4]["last_update"] == ""


def test_rundir_option_selects(batch):
    log, paths = batch
    result = run_cli(str(log), "--csv", "--rundir", str(paths["running"]))
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["task"] for r in rows] == ["beta"]


def test_missing_batch_log(tmp_path):
    result = run_cli(str(tmp_path / "nope.log"))
    assert result.exit_code != 0
    assert result.stderr.strip() == f"batch-log: {tmp_path / 'nope.log'}: batch log not found"


def test_corrupt_journal_line(batch):
    log, paths = batch
    journal = paths["finished"] / "journal.jsonl"
    lines = journal.read_text().splitlines(True)
    lines.insert(3, '{"event": "step", "step": \n')
    journal.write_text("".join(lines))
    result = run_cli(str(log), "--csv")
    assert result.exit_code == 1
    assert result.stderr.strip() == f"batch-log: {journal}:4: corrupt journal line"
    rows = {r["task"]: r for r in csv.DictReader(io.StringIO(result.stdout))}
    assert rows["alpha"]["status"] == "corrupt" and rows["beta"]["status"] == "running"
    result = run_cli(str(log), "--export", str(log.parent / "out.csv"))
    assert result.exit_code != 0
    # the missing rundir is noted and skipped; the corrupt journal is fatal, in one line
    assert result.stderr.strip().splitlines() == [
        f"batch-log: {paths['missing']}: rundir missing, skipped",
        f"batch-log: {journal}:4: corrupt journal line"]
    assert not (log.parent / "out.csv").exists()


def test_torn_last_line_is_ignored(batch):
    log, paths = batch
    journal = paths["running"] / "journal.jsonl"
    with open(journal, "a") as f:
        f.write('{"event": "step", "step": 3, "candid')
    before = journal.read_bytes()
    rows = by_task(summaries(rundirs_of_batch_log(log)))
    assert rows["beta"].status == "running" and rows["beta"].steps_done == 2
    result = run_cli(str(log))
    assert result.exit_code == 0 and result.stderr == ""
    assert journal.read_bytes() == before  # the reader never truncates a live journal


# --------------------------------------------------------------------------- export

def test_export_csv(batch):
    log, paths = batch
    out = log.parent / "runs.csv"
    result = run_cli(str(log), "--export", str(out))
    assert result.exit_code == 0, result.output
    assert f"{paths['missing']}: rundir missing, skipped" in result.stderr
    df = pd.read_csv(out)
    # alpha: baseline 3 + step1 6 + step2 6 + step3 3 (+ compile failure: none) + step4 3 + 3
    # failed + the incumbent re-measured at step 4: 3; beta 3 + 3 + 3; gamma 3 + 6; delta 0;
    # zeta 3 + 3
    assert (df["benchmark"] == "alpha").sum() == 3 + 6 + 6 + 3 + 6 + 3
    assert len(df) == 27 + 9 + 9 + 0 + 6
    again = df[df["remeasured_at"].notna()]
    assert len(again) == 3 and (again["remeasured_at"] == 4).all()
    assert (again["step"] == 3).all() and (again["candidate"] == 0).all()  # the incumbent
    assert sorted(again["wall_s"].round(6)) == sorted(round(math.exp(v), 6)
                                                      for v in A_STEPS[3]["remeasure"])
    assert set(df["benchmark"]) == {"alpha", "beta", "gamma", "zeta"}
    gc_cols = {f"gc_{k}" for k in GC}
    perf_cols = {f"perf_{e}" for e in PERF_EVENTS + (UNSUPPORTED,)}
    assert gc_cols <= set(df.columns) and perf_cols <= set(df.columns)
    assert df[f"perf_{UNSUPPORTED}"].isna().all()
    assert df["perf_cycles"].notna().all()
    for col in ("benchmark", "rundir", "step", "candidate", "mutation", "accepted", "energy",
                "inlined", "not_inlined", "prevented", "worker", "cpu", "run", "wall_s",
                "user_s", "sys_s", "maxrss_kb", "exit_status", "failure", "output_ok"):
        assert col in df.columns, col

    a = df[df["benchmark"] == "alpha"]
    base = a[a["step"] == 0]
    assert len(base) == 3 and (base["candidate"] == 0).all() and (base["energy"] == 1.0).all()
    assert list(base["run"]) == [0, 1, 2] and (base["inlined"] == 10).all()
    assert list(base["wall_s"]) == pytest.approx([math.exp(v) for v in BASE_LOGS], abs=1e-9)
    best = a[(a["step"] == 2) & (a["candidate"] == 1)]
    assert best["accepted"].all() and best["energy"].iloc[0] == pytest.approx(math.exp(-0.1))
    assert not a[(a["step"] == 2) & (a["candidate"] == 0)]["accepted"].any()
    assert not a[a["step"] == 4]["accepted"].any()  # step 4 was not accepted
    assert a[(a["step"] == 3)]["candidate"].unique().tolist() == [0]  # c1 did not compile
    failed = a[a["failure"].notna()]
    assert len(failed) == 3 and (failed["step"] == 4).all() and (failed["exit_status"] == 2).all()
    assert failed["gc_minor_collections"].isna().all()
    ok = a[a["failure"].isna()]
    assert (ok["gc_minor_collections"] == 12).all() and ok["output_ok"].all()
    assert a[a["step"] == 0]["mutation"].isna().all()
    b = a[a["step"] > 0]
    assert (b["mutation"] == "flip " + b["step"].astype(str) + "."
            + b["candidate"].astype(str)).all()


def test_export_library_and_rundir_option(batch):
    log, paths = batch
    df = measurements_table([paths["running"]])
    assert isinstance(df, pd.DataFrame) and len(df) == 9
    assert set(df["step"]) == {0, 1, 2} and df["rundir"].unique().tolist() == \
        [str(paths["running"])]
    assert measurements_table([]).empty
    out = log.parent / "one.csv"
    result = run_cli(str(log), "--export", str(out), "--rundir", str(paths["interrupted"]))
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(out)) == 9


def test_export_parquet_without_pyarrow(batch, monkeypatch):
    log, _ = batch
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow -> ImportError
    out = log.parent / "runs.parquet"
    result = run_cli(str(log), "--export", str(out))
    assert result.exit_code != 0
    assert result.stderr.strip() == f"batch-log: {PARQUET_MISSING}"
    assert PARQUET_MISSING == "parquet export needs pyarrow: pip install pyarrow"
    assert not out.exists()


def test_export_parquet(batch):
    pytest.importorskip("pyarrow")
    log, _ = batch
    out = log.parent / "runs.parquet"
    result = run_cli(str(log), "--export", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_parquet(out)
    assert len(df) == 51 and df[f"perf_{UNSUPPORTED}"].isna().all()


def test_export_unknown_extension(batch):
    log, _ = batch
    result = run_cli(str(log), "--export", str(log.parent / "runs.xlsx"))
    assert result.exit_code != 0 and "use .csv or .parquet" in result.stderr


# --------------------------------------------------------------------------- plots

def check_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 10_000  # axes, dots, lines, text: not an empty canvas
    assert data[12:16] == b"IHDR"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (900, 500)


def test_plot_cli(batch):
    log, paths = batch
    result = run_cli(str(log), "--plot")
    assert result.exit_code == 0, result.output
    printed = result.stdout.split()
    expected = [str(paths[k] / "plot.png") for k in
                ("finished", "running", "interrupted", "failed", "stale")]
    assert printed == expected
    assert f"{paths['missing']}: rundir missing" in result.stderr
    for p in expected:
        check_png(Path(p))
    for k in ("finished", "running"):  # no temporary file left behind
        assert sorted(f.name for f in paths[k].iterdir() if f.name.startswith(".")) == []


def test_plot_experiment_directly(batch):
    _, paths = batch
    out = plot_experiment(paths["finished"])
    assert out == paths["finished"] / "plot.png"
    check_png(out)


def test_plot_experiment_rewrites_the_plot(batch):
    _, paths = batch
    rundir = paths["running"]
    out = plot_experiment(rundir)
    before, inode = out.read_bytes(), out.stat().st_ino
    # The same journal again: a new file (renamed over the old one), the same picture.
    assert plot_experiment(rundir) == out
    assert out.stat().st_ino != inode and out.read_bytes() == before
    # One more step in the journal (the last step's record with a new number and a far worse
    # proposal, appended as the experiment would): the plot changes.
    journal = rundir / "journal.jsonl"
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    step = json.loads(json.dumps([e for e in events if e["event"] == "step"][-1]))
    step["step"] += 1
    step["time"] += 1
    step["accepted"] = False
    for c in step["candidates"]:
        c["energy"] = 3.0
    with open(journal, "a") as f:
        f.write(json.dumps(step) + "\n")
    plot_experiment(rundir)
    check_png(out)
    assert out.read_bytes() != before
    # Removed, it comes back.
    out.unlink()
    plot_experiment(rundir)
    check_png(out)
    assert sorted(f.name for f in rundir.iterdir() if f.name.startswith(".")) == []


# --------------------------------------------------------------------------- golden rundirs

GOLDEN = Path(__file__).resolve().parent / "golden"


def test_golden_rundirs_of_both_versions_summarize_export_and_plot(tmp_path):
    """Real rundirs, written by format version 1 and 2 (tests/golden), read by every analysis
    path: the table, the export (re-measurements included) and the plot."""
    log = GOLDEN / "batch.log"
    rows = summaries(rundirs_of_batch_log(log))
    assert [(s.rundir, s.status, s.steps_done, s.steps_planned) for s in rows] == [
        ("rundir-v1", "finished", 4, 4), ("rundir-v2", "finished", 4, 4)]
    for s in rows:
        assert s.task == "tinysum" and s.algorithm == "sa" and s.best_speedup is not None
        if s.best_step:  # a candidate beat the baseline: its interval is there
            assert s.ci_low is not None and s.ci_low <= s.best_speedup <= s.ci_high
    out = tmp_path / "runs.csv"
    result = run_cli(str(log), "--export", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out)
    for name in ("rundir-v1", "rundir-v2"):
        runs = df[df["rundir"] == str(GOLDEN / name)]
        assert (runs[runs["step"] == 0]["run"].count()) == 3  # the baseline's runs
        assert runs["remeasured_at"].notna().sum() > 0
        assert runs["failure"].isna().all() and (runs["wall_s"] > 0).all()
    for name in ("rundir-v1", "rundir-v2"):
        rundir = tmp_path / name
        shutil.copytree(GOLDEN / name, rundir)
        assert plot_experiment(rundir).stat().st_size > 10_000


# --------------------------------------------------------------------------- paired speedups

def test_batch_log_speedup_is_the_paired_one_then_the_confirmation_and_counts_canaries():
    from analysis.batch_log import Summary, format_canaries, format_speedup, summarize_speedup
    from dispatcher.core.records import CanaryEvent, ConfirmEvent
    from dispatcher.core.stats import paired_speedup_ci

    ref1, cand1 = [1.0, 1.2, 0.9, 1.1], [0.9, 1.09, 0.8, 1.0]
    ref2, cand2 = [1.05, 0.95], [0.95, 0.86]
    cand = Candidate(candidate=0, dir="steps/00001/c0", mutation="flip 1", sha256="x",
                     times=cand1, reference_times=ref1)
    best = Pointer(step=1, candidate=0, dir=cand.dir, energy=0.9, sha256="x")
    events = [
        BaselineEvent(sha256="b", times=[1.0, 1.0], geomean=1.0, median=1.0, ci95=(1.0, 1.0)),
        StepEvent(step=1, temperature=0.04, candidates=[cand], chosen=0, accepted=True,
                  incumbent=best, best=best, rng=[]),
        RemeasureEvent(step=1, dir=cand.dir, measurements="m", times=cand2,
                       reference_times=ref2, energy=0.9),
        CanaryEvent(step=1, times=[1.0, 1.01], reference_times=[1.0, 1.0], speedup=0.995,
                    ci95=(0.9, 1.1), significant=False),
        CanaryEvent(step=2, times=[1.0, 1.0], reference_times=[1.1, 1.1], speedup=1.1,
                    ci95=(1.1, 1.1), significant=True),
    ]
    s = Summary(task="t", rundir="r", algorithm="sa", steps_done=1, steps_planned=1,
                best_speedup=None, ci_low=None, ci_high=None, last_update=None, status="x")
    summarize_speedup(s, events, best)
    # Every pair of the best candidate: its step's and its re-measurement's.
    assert (s.best_speedup, s.ci_low, s.ci_high) == paired_speedup_ci(ref1 + ref2, cand1 + cand2)
    assert s.paired and not s.confirmed and s.significant
    assert (s.canaries, s.canary_alarms) == (2, 1) and format_canaries(s) == "1/2"
    # A confirmation, when there is one, is the speedup shown; this one is not significant.
    events.append(ConfirmEvent(step=1, candidate=0, dir=cand.dir, times=[1.0, 1.0],
                               reference_times=[1.0, 1.02], speedup=1.01, ci95=(0.95, 1.07),
                               significant=False))
    summarize_speedup(s, events, best)
    assert (s.best_speedup, s.ci_low, s.ci_high) == (1.01, 0.95, 1.07)
    # A confirmed best whose interval holds 1 is no win: the line says so (issue 20).
    assert format_speedup(s) == ("no candidate beat the heuristic (confirmed 1.010 [0.950, "
                                 "1.070])")
    assert s.none_better


# --------------------------------------------------------------------------- one best figure

def paired_rundir(root: Path, name: str, ref: list[float], cand: list[float],
                  confirm: tuple[list[float], list[float]] | None = None,
                  batch: Path | None = None) -> Path:
    """A finished paired chain (run.runs 5) whose best is step 1's candidate, measured in
    ``len(cand)`` pairs, confirmed with ``confirm`` (reference, candidate) pairs if given."""
    from dispatcher.core.stats import paired_speedup_ci
    path = root / "rundirs" / name
    exp = {"task": name, "benchmark": f"/bench/{name}", "algorithm": "sa", "seed": 1,
           "steps": 1, "chain": 0, "size": "quick", "runs": 5, "baseline_runs": 3,
           "candidates_per_step": 1, "t_start": 0.04, "t_end": 0.001, "remeasure_every": 0,
           "rundir": str(path), "max_pairs": 8, "half_width": 0.01}
    rd = Rundir.create(path, Experiment(**exp, max_flips=2), {"store": "/nowhere"})
    if batch is not None:
        append_batch_log(batch, BatchEntry(task=name, rundir=str(path), algorithm="sa",
                                           steps=1))
    write_measurements(path / "steps/00000/c0", "sha-base", [1.0, 1.0, 1.0])
    rd.append(event({"event": "baseline", "time": NOW, "sha256": "sha-base",
                     "dir": "steps/00000/c0", "times": [1.0, 1.0, 1.0], "geomean": 1.0,
                     "median": 1.0, "ci95": [1.0, 1.0]}))
    d = path / "steps/00001/c0"
    d.mkdir(parents=True)
    runs = [r for pair in zip(ref, cand) for r in pair]
    recs = [record(t).model_copy(update={"cpu_share": 0.97}) for t in runs]
    recs.append(record(2.0).model_copy(update={"cpu_share": 0.41, "disturbed":
                                               "CPU share 0.41, below the floor 0.80"}))
    result = RunResult(sha256="sha-c", args=("1",), worker="local/cpu1", worker_class="test",
                       cpu=1, records=tuple(recs))
    (d / "measurements.json").write_text(json.dumps([result.to_json()]))
    speedup, low, high = paired_speedup_ci(ref, cand)
    best = {"step": 1, "candidate": 0, "dir": "steps/00001/c0", "energy": 1 / speedup,
            "sha256": "sha-c"}
    rd.append(event({"event": "step", "time": NOW, "step": 1, "temperature": 0.04,
                     "candidates": [{"candidate": 0, "dir": "steps/00001/c0",
                                     "mutation": "flip", "sha256": "sha-c", "times": cand,
                                     "reference_times": ref, "speedup": speedup,
                                     "ci95": [low, high], "energy": 1 / speedup,
                                     "stopped": "budget"}],
                     "chosen": 0, "accepted": True, "incumbent": best, "best": best,
                     "rng": []}))
    if confirm is not None:
        cref, ccand = confirm
        cs, cl, ch = paired_speedup_ci(cref, ccand)
        rd.append(event({"event": "confirm", "time": NOW, "step": 1, "candidate": 0,
                         "dir": "steps/00001/c0", "times": ccand, "reference_times": cref,
                         "speedup": cs, "ci95": [cl, ch],
                         "significant": cl > 1 or ch < 1}))
    rd.append(event({"event": "finish", "time": NOW, "reason": "completed"}))
    rd.close()
    return path


# Search pairs that say 1.15, and a confirmation that says 0.968 [0.949, 0.987]-ish.
SEARCH_REF, SEARCH_CAND = [1.15, 1.16, 1.14, 1.15, 1.17, 1.13], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
CONF_REF = [0.97, 0.95, 0.98, 0.96, 0.97, 0.96]
CONF_CAND = [1.0] * 6


def test_batch_log_says_no_candidate_beat_the_heuristic_and_refuses_short_comparisons(
        tmp_path):
    """Through the command: a chain whose confirmed best is below 1 says that no candidate
    beat the heuristic (not "best 0.968"); one whose best was measured in 3 pairs, fewer
    than its minimum of 5 (journaled by a version that used such comparisons), shows no
    speedup but "unresolved"; a chain whose confirmation holds is shown as confirmed."""
    log = tmp_path / "batch.log"
    paired_rundir(tmp_path, "slower", SEARCH_REF, SEARCH_CAND, (CONF_REF, CONF_CAND), log)
    paired_rundir(tmp_path, "short", SEARCH_REF[:3], SEARCH_CAND[:3], None, log)
    paired_rundir(tmp_path, "faster", SEARCH_REF, SEARCH_CAND, (SEARCH_REF, SEARCH_CAND), log)
    result = run_cli(str(log))
    assert result.exit_code == 0, result.output
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "no candidate beat the heuristic (confirmed 0.965 [" in lines["slower"]
    assert "1.1" not in lines["slower"]
    assert "unresolved (3 pairs, fewer than the chain's minimum)" in lines["short"]
    assert "1.15" not in lines["short"]
    assert "1.150 [" in lines["faster"] and "(confirmed)" in lines["faster"]
    rows = {r["task"]: r for r in csv.DictReader(io.StringIO(run_cli(str(log),
                                                                    "--csv").stdout))}
    assert rows["slower"]["none_better"] == "True" and rows["slower"]["pairs"] == "6"
    assert rows["short"]["unresolved"] == "True" and rows["short"]["best_speedup"] == ""


def test_export_carries_the_one_figure_and_each_runs_share(tmp_path):
    """Through ``batch-log --export``: each candidate's speedup, interval, pairs and
    confirmation, its energy the confirmed one (the search's first figure kept apart as
    search_energy), and each run's cpu_share and disturbed reason."""
    from dispatcher.core.stats import paired_speedup_ci
    log = tmp_path / "batch.log"
    paired_rundir(tmp_path, "slower", SEARCH_REF, SEARCH_CAND, (CONF_REF, CONF_CAND), log)
    paired_rundir(tmp_path, "short", SEARCH_REF[:3], SEARCH_CAND[:3], None, log)
    out = tmp_path / "runs.csv"
    result = run_cli(str(log), "--export", str(out))
    assert result.exit_code == 0, result.output
    df = pd.read_csv(out)
    slower = df[(df["benchmark"] == "slower") & (df["step"] == 1)]
    confirmed = paired_speedup_ci(CONF_REF, CONF_CAND)
    assert slower["confirmed"].all() and (slower["pairs"] == 6).all()
    assert slower["speedup"].iloc[0] == pytest.approx(confirmed[0])
    assert slower["ci_low"].iloc[0] == pytest.approx(confirmed[1])
    assert slower["energy"].iloc[0] == pytest.approx(1 / confirmed[0])
    assert slower["search_energy"].iloc[0] == pytest.approx(
        1 / paired_speedup_ci(SEARCH_REF, SEARCH_CAND)[0])
    assert sorted(slower["cpu_share"].unique()) == [0.41, 0.97]
    assert slower["disturbed"].notna().sum() == 1
    assert "below the floor" in slower["disturbed"].dropna().iloc[0]
    short = df[(df["benchmark"] == "short") & (df["step"] == 1)]
    assert short["unresolved"].all() and short["speedup"].isna().all()
    assert short["energy"].isna().all() and (short["pairs"] == 3).all()
