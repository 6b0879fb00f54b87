"""Rundirs: everything needed to inspect or continue one experiment.

    <rundir>/experiment.json    what was asked: task, benchmark, algorithm, seed, steps, ...
    <rundir>/config.yaml        the config used (resolved)
    <rundir>/journal.jsonl      append-only, fsynced, one JSON event per line
    <rundir>/state.json         the search state after the last step (a copy of the journal's)
    <rundir>/steps/<nnnnn>/c<k>/  per candidate: overrides.sexp (the proposal), the compiler's
                                *.decisions.sexp (what it really did), measurements.json
    <rundir>/plot.png           energy against step (written by analysis.plots)

The journal is the truth: each ``step`` event carries the search state after that step (RNG
state, temperature, incumbent, best), so ``--resume`` continues from the last complete line and
a crash loses only the step in flight.  Event kinds: ``start``, ``baseline``, ``step``,
``remeasure``, ``resume``, ``finish``.  Every event has ``event`` and ``time`` (Unix seconds).
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from dispatcher.files import append_json_line, write_json_atomic

FORMAT_VERSION = 1


class RundirError(RuntimeError):
    pass


def read_journal(path: Path) -> list[dict]:
    """Every complete event; a torn last line (crash mid-write) is ignored."""
    events = []
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1 or all(not rest.strip() for rest in lines[i + 1:]):
                break  # the torn tail of an interrupted write
            raise RundirError(f"{path}:{i + 1}: corrupt journal line") from None
    return events


@dataclass
class Rundir:
    path: Path

    @property
    def journal_path(self) -> Path:
        return self.path / "journal.jsonl"

    @property
    def experiment(self) -> dict:
        return json.loads((self.path / "experiment.json").read_text())

    @classmethod
    def create(cls, path: Path, experiment: dict, config_raw: dict) -> "Rundir":
        if path.exists() and any(path.iterdir()):
            raise RundirError(f"{path}: already exists and is not empty (use --resume)")
        path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path / "experiment.json", {"version": FORMAT_VERSION, **experiment})
        (path / "config.yaml").write_text(yaml.safe_dump(config_raw, sort_keys=True))
        rundir = cls(path)
        rundir.append({"event": "start", **experiment})
        return rundir

    @classmethod
    def open(cls, path: Path) -> "Rundir":
        if not (path / "experiment.json").is_file():
            raise RundirError(f"{path}: not a rundir (no experiment.json)")
        rundir = cls(path)
        rundir._drop_torn_tail()
        return rundir

    def _drop_torn_tail(self) -> None:
        """Cut a half-written last line so the next append starts on a fresh line."""
        try:
            data = self.journal_path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            cut = data.rfind(b"\n") + 1
            with open(self.journal_path, "r+b") as f:
                f.truncate(cut)
                os.fsync(f.fileno())

    def append(self, event: dict) -> None:
        append_json_line(self.journal_path, event)

    def events(self) -> list[dict]:
        return read_journal(self.journal_path)

    def events_of(self, kind: str) -> Iterator[dict]:
        return (e for e in self.events() if e.get("event") == kind)

    def last_step(self) -> dict | None:
        steps = list(self.events_of("step"))
        return steps[-1] if steps else None

    def baseline(self) -> dict | None:
        return next(self.events_of("baseline"), None)

    def finished(self) -> dict | None:
        events = self.events()
        return events[-1] if events and events[-1].get("event") == "finish" else None

    def write_state(self, state: dict) -> None:
        write_json_atomic(self.path / "state.json", state)

    def candidate_dir(self, step: int, candidate: int) -> Path:
        d = self.path / "steps" / f"{step:05d}" / f"c{candidate}"
        if d.exists():  # left by a step that was in flight at a crash: redo it cleanly
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d


def append_batch_log(path: Path, entry: dict) -> None:
    """The batch log lists every experiment started: one JSON line each, fsynced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    append_json_line(path, {**entry, "time": time.time()})


def read_batch_log(path: Path) -> list[dict]:
    return read_journal(path)
