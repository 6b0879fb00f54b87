"""Every measured run of some rundirs as one table (pandas), for CSV or Parquet export.

One row per run, from each candidate dir's ``measurements.json`` (a list of run results, each
with its ``records``; docs/rundir-format.md) joined with the journal's ``baseline`` and ``step``
events.  The baseline is step 0, candidate 0, energy 1.0, accepted False.  A candidate whose
compile failed (``sha256`` null) has no runs and so no rows; a candidate that should have
measurements but whose file is missing or unreadable is skipped with a ``MeasurementWarning``.
``energy`` is the step event's (a later ``remeasure`` does not change it); a remeasure's runs
appear only if the experiment wrote them into the candidate's ``measurements.json``.

Columns: benchmark, rundir, step, candidate, dir, mutation, accepted, energy, inlined,
not_inlined, prevented, sha256, worker, worker_class, cpu, run (index of the record within the
candidate's measurements.json, over all its results), wall_s, user_s, sys_s, maxrss_kb,
exit_status, signal, failure, output_ok, then ``gc_<name>`` for every GC statistic and
``perf_<event>`` for every perf counter seen (NaN when absent, unsupported or not counted).
"""
from __future__ import annotations

import json
import math
import os
import tempfile
import warnings
from pathlib import Path
from typing import Iterable

import pandas as pd

from dispatcher.rundir import read_journal

BASE_COLUMNS = ("benchmark", "rundir", "step", "candidate", "dir", "mutation", "accepted",
                "energy", "inlined", "not_inlined", "prevented", "sha256", "worker",
                "worker_class", "cpu", "run", "wall_s", "user_s", "sys_s", "maxrss_kb",
                "exit_status", "signal", "failure", "output_ok")

PARQUET_MISSING = "parquet export needs pyarrow: pip install pyarrow"


class ExportError(RuntimeError):
    """A fatal export problem; the message is one line."""


class MeasurementWarning(UserWarning):
    """A candidate's measurements could not be read; its runs are left out."""


def experiment_info(rundir: Path, events: list[dict]) -> dict:
    """The experiment's fields: the journal's start event, else experiment.json, else {}."""
    start = next((e for e in events if e.get("event") == "start"), None)
    if start is not None:
        return start
    try:
        return json.loads((rundir / "experiment.json").read_text())
    except (OSError, ValueError):
        return {}


def _candidates(events: list[dict]) -> list[dict]:
    """(step, candidate) entries of the baseline and every step, in order."""
    out = []
    baseline = next((e for e in events if e.get("event") == "baseline"), None)
    if baseline is not None:
        out.append({"step": 0, "candidate": 0, "dir": baseline.get("dir") or "steps/00000/c0",
                    "mutation": None, "accepted": False, "energy": 1.0,
                    "decisions": baseline.get("decisions"), "sha256": baseline.get("sha256"),
                    "expect_runs": True})
    steps: dict[int, dict] = {}
    for e in events:  # a step journaled twice (should not happen) counts once: the last one
        if e.get("event") == "step" and isinstance(e.get("step"), int):
            steps[e["step"]] = e
    for n in sorted(steps):
        e = steps[n]
        for k, c in enumerate(e.get("candidates") or []):
            k = c.get("candidate", k)
            out.append({"step": n, "candidate": k,
                        "dir": c.get("dir") or f"steps/{n:05d}/c{k}",
                        "mutation": c.get("mutation"),
                        "accepted": bool(e.get("accepted")) and e.get("chosen") == k,
                        "energy": c.get("energy"), "decisions": c.get("decisions"),
                        "sha256": c.get("sha256"),
                        "expect_runs": c.get("sha256") is not None
                        and bool(c.get("times") or c.get("failed"))})
    return out


def _read_measurements(path: Path, expect: bool) -> list[dict]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        if expect:
            warnings.warn(f"{path}: missing, its runs are left out", MeasurementWarning)
        return []
    except (OSError, ValueError) as exc:
        warnings.warn(f"{path}: unreadable ({exc}), its runs are left out", MeasurementWarning)
        return []
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        warnings.warn(f"{path}: not a list of run results, left out", MeasurementWarning)
        return []
    return [r for r in data if isinstance(r, dict)]


def _perf_value(entry) -> float:
    if isinstance(entry, dict) and isinstance(entry.get("value"), (int, float)) \
            and not entry.get("unsupported") and not entry.get("not_counted"):
        return float(entry["value"])
    return math.nan


def rundir_rows(rundir: Path) -> list[dict]:
    """The rows of one rundir (raises RundirError for a corrupt journal)."""
    rundir = Path(rundir)
    events = read_journal(rundir / "journal.jsonl")
    task = experiment_info(rundir, events).get("task")
    rows = []
    for c in _candidates(events):
        decisions = c["decisions"] or {}
        head = {"benchmark": task, "rundir": str(rundir), "step": c["step"],
                "candidate": c["candidate"], "dir": c["dir"], "mutation": c["mutation"],
                "accepted": c["accepted"], "energy": c["energy"],
                "inlined": decisions.get("inlined"), "not_inlined": decisions.get("not_inlined"),
                "prevented": decisions.get("prevented")}
        run = 0
        for result in _read_measurements(rundir / c["dir"] / "measurements.json",
                                         c["expect_runs"]):
            for rec in result.get("records") or []:
                row = {**head, "sha256": result.get("sha256", c["sha256"]),
                       "worker": result.get("worker"), "worker_class": result.get("worker_class"),
                       "cpu": result.get("cpu"), "run": run,
                       "wall_s": rec["wall_ns"] / 1e9 if rec.get("wall_ns") is not None
                       else math.nan,
                       "user_s": rec.get("user_s"), "sys_s": rec.get("sys_s"),
                       "maxrss_kb": rec.get("maxrss_kb"), "exit_status": rec.get("exit_status"),
                       "signal": rec.get("signal"), "failure": rec.get("failure"),
                       "output_ok": rec.get("output_ok")}
                for name, value in (rec.get("gc") or {}).items():
                    row[f"gc_{name}"] = value
                for event, entry in (rec.get("perf") or {}).items():
                    row[f"perf_{event}"] = _perf_value(entry)
                rows.append(row)
                run += 1
    return rows


def measurements_table(rundirs: Iterable[Path]) -> pd.DataFrame:
    """One row per run of every candidate (baseline included) of ``rundirs``."""
    rows = [row for r in rundirs for row in rundir_rows(Path(r))]
    extra = sorted({k for row in rows for k in row if k not in BASE_COLUMNS},
                   key=lambda k: (not k.startswith("gc_"), k))
    columns = list(BASE_COLUMNS) + extra
    df = pd.DataFrame(rows, columns=columns)
    for col in extra:
        df[col] = pd.to_numeric(df[col], errors="coerce")
    for col in ("energy", "wall_s", "user_s", "sys_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    # Counts stay integers (nullable: no 3.0 in the CSV because one row lacks the value).
    for col in ("step", "candidate", "inlined", "not_inlined", "prevented", "cpu", "run",
                "maxrss_kb", "exit_status", "signal", *(c for c in extra if c.startswith("gc_"))):
        values = pd.to_numeric(df[col], errors="coerce")
        present = values.dropna()
        if len(df) and (present == present.round()).all():
            df[col] = values.astype("Int64")
    df["accepted"] = df["accepted"].astype(bool)
    return df


def export_format(out: Path) -> str:
    """"csv" or "parquet" from the file name; raises ExportError if it cannot be written."""
    suffix = out.suffix.lower()
    if suffix == ".csv":
        return "csv"
    if suffix in (".parquet", ".pq"):
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise ExportError(PARQUET_MISSING) from None
        return "parquet"
    raise ExportError(f"{out}: unknown export format {suffix or '(no extension)'!r} "
                      "(use .csv or .parquet)")


def write_table(df: pd.DataFrame, out: Path) -> Path:
    """Write ``df`` as CSV or Parquet by ``out``'s extension, atomically."""
    out = Path(out)
    fmt = export_format(out)
    directory = out.parent if str(out.parent) else Path(".")
    if not directory.is_dir():
        raise ExportError(f"{out}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=directory)
    os.close(fd)
    try:
        if fmt == "csv":
            df.to_csv(tmp, index=False)
        else:
            df.to_parquet(tmp, index=False, engine="pyarrow")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
