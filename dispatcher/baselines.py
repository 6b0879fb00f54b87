"""Baselines for ``run-plugin-benchmark --baselines``: the best *global* inlining setting tuned on
the training split, and the extremes ``never-inline`` and ``always-inline``.

A learned policy is worth its complexity only if it beats what a user gets by turning Flambda's
global knobs; so the grid ``GRID`` (allow-listed options only, ``dispatcher.build.manifest``) is
measured against the heuristic on the tuning benchmarks, the setting with the best geometric
mean of paired speedups is chosen, and that choice is written to ``<results>/global-setting.json``
so later runs reuse it (``--retune`` tunes again).  Tuning is resumable: every comparison goes
through the store (``dispatcher.compare``), so a tuning cut short measures only what it had not
measured when run again.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dispatcher.build.manifest import ALLOWED_FLAGS, ALLOWED_VALUE_FLAGS, Benchmark, Size
from dispatcher.build.service import CompileJob
from dispatcher.compare import Compared, Contender, Failure, compare_with_heuristic
from dispatcher.core.figures import Figure, geomean_figure
from dispatcher.core.files import TextFileError, atomic_output, read_regular_text
from dispatcher.running.measurement import PairingPolicy
from dispatcher.session import Session

#: The global settings tuned: name -> the options that replace the manifest's optimisation
#: level (and any option the setting names).  Small on purpose: each is one build and one
#: comparison per tuning benchmark.  -O3 alone is the heuristic's own build (the manifests'
#: level), so it is the reference, not a candidate.
GRID: dict[str, tuple[str, ...]] = {
    "O2": ("-O2",),
    "O3-inline-100": ("-O3", "-inline", "100"),
    "O3-inline-400": ("-O3", "-inline", "400"),
    "O3-max-depth-3": ("-O3", "-inline-max-depth", "3"),
    "O3-max-unroll-2": ("-O3", "-inline-max-unroll", "2"),
    "O3-unbox-closures": ("-O3", "-unbox-closures"),
}
RECORD = "global-setting.json"
RECORD_VERSION = 1
_LEVELS = ("-O2", "-O3", "-Oclassic")


class BaselineError(RuntimeError):
    """A record that cannot be used; the message is one line naming the file."""


def check_grid(grid: Mapping[str, Sequence[str]], what: str = "grid setting ") -> None:
    """Every option of the grid is on the manifests' allow-list (a value option followed by
    its value); ValueError naming ``what`` and the setting otherwise."""
    for name, flags in grid.items():
        i = 0
        while i < len(flags):
            if flags[i] in ALLOWED_VALUE_FLAGS and i + 1 < len(flags):
                i += 2
            elif flags[i] in ALLOWED_FLAGS:
                i += 1
            else:
                raise ValueError(f"{what}{name}: {flags[i]!r} is not allow-listed")


def setting_flags(bench: Benchmark, flags: Sequence[str]) -> tuple[str, ...]:
    """The manifest's flags with ``flags`` in place of its optimisation level and of any
    option ``flags`` sets itself (so -unsafe, -g and the like stay)."""
    setting = set(flags)
    kept: list[str] = []
    given = list(bench.flags)
    i = 0
    while i < len(given):
        f = given[i]
        width = 2 if f in ALLOWED_VALUE_FLAGS else 1
        if f not in _LEVELS and f not in setting:
            kept.extend(given[i:i + width])
        i += width
    return (*kept, *flags)


def measured_of(session: Session, got: Compared[Any]) -> Figure:
    """What ``compare_with_heuristic`` handed back, as a figure with the binary size ratio."""
    if got.failure is Failure.COMPILE:
        return Figure(error=f"does not compile: {_line(got.error)}", compiled=False)
    if got.failure is Failure.HEURISTIC:
        return Figure(error=f"the heuristic build failed: {_line(got.error)}")
    if got.failure is Failure.MEASURE:
        return Figure(error=f"not measured: {_line(got.error)}")
    c = got.comparison
    assert c is not None
    if not c.resolved:
        return Figure(pairs=c.pairs, error=c.unresolved_line())
    if c.failed:
        return Figure(pairs=c.pairs, error="a run of its build failed")
    speedup, low, high = c.interval
    return Figure(speedup, low, high, c.pairs, size_ratio(session, got), metric=c.metric)


def size_ratio(session: Session, got: Compared[Any]) -> float | None:
    """The contender's binary size over its heuristic build's (None: a binary not kept)."""
    if got.compiled is None:
        return None
    heuristic = session.builds.compile(CompileJob(got.contender.bench))  # cached
    try:
        return got.compiled.binary.stat().st_size / heuristic.binary.stat().st_size
    except OSError:
        return None


def _line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def measure_all(session: Session, contenders: Sequence[Contender[Any]], runs: int,
                pairing: PairingPolicy, on_each=None) -> dict[Any, Figure]:
    """Every contender against its heuristic build, by tag; ``on_each(tag, measured)`` as each
    ends (a progress line)."""
    out: dict[Any, Figure] = {}
    with closing(compare_with_heuristic(session, contenders, runs, pairing)) as compared:
        for got in compared:
            m = measured_of(session, got)
            out[got.contender.tag] = m
            if on_each is not None:
                on_each(got.contender.tag, m)
    return out


@dataclass(frozen=True)
class Tuning:
    """The global setting chosen and the training figures it was chosen on."""

    chosen: str | None  # None: no setting was measured on every tuning benchmark
    flags: tuple[str, ...]
    benchmarks: tuple[str, ...]
    size: str
    table: dict[str, dict[str, Any]]  # setting -> {"geomean": [g, low, high] | None, ...}
    reused: bool = False
    metric: str = "time"  # what the figures are in (docs/measurement.md, "Exact metrics")

    def to_json(self) -> dict[str, Any]:
        data = {"version": RECORD_VERSION, "chosen": self.chosen, "flags": list(self.flags),
                "benchmarks": list(self.benchmarks), "size": self.size,
                "grid": {k: list(v) for k, v in GRID.items()}, "training": self.table}
        if self.metric != "time":  # absent: time, as every record before the key
            data["metric"] = self.metric
        return data


class _TrainingRow(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    geomean: Optional[Annotated[list[float], Field(min_length=3, max_length=3)]]
    # per benchmark: speedup, low, high, size ratio (None: not measured)
    benchmarks: dict[str, Annotated[list[Optional[float]], Field(min_length=4, max_length=4)]]


class _Record(BaseModel):
    """The shape of ``global-setting.json``: checked whole on every read (a record is data
    that chooses compiler flags: nothing in it is taken on trust)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    version: Literal[1]
    chosen: Optional[str]
    flags: list[str] = Field(max_length=64)
    benchmarks: list[str] = Field(max_length=10_000)
    size: str
    grid: dict[str, list[str]] = Field(max_length=1_000)
    training: dict[str, _TrainingRow] = Field(max_length=1_000)
    metric: Literal["time", "instructions", "cycles"] = "time"


RECORD_LIMIT = 16 << 20  # bytes: a record of the whole bundled suite is a few kB


def read_record(path: Path) -> dict[str, Any] | None:
    """The recorded choice, or None when there is none; BaselineError (one line naming the
    file and the field) for a file that is not one: not a regular file, not JSON, a field
    of the wrong type, a flag outside the allow-list, a ``chosen`` that is not a setting of
    its grid or whose flags are not that setting's."""
    def bad(what: str) -> BaselineError:
        return BaselineError(f"{path}: {what}; --retune writes it again")
    try:
        data = json.loads(read_regular_text(path, RECORD_LIMIT))
    except FileNotFoundError:
        return None
    except (TextFileError, ValueError, RecursionError) as exc:
        raise bad(f"unreadable ({str(exc).removeprefix(f'{path}: ')})") from None
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        raise bad(f"not a global-setting record of version {RECORD_VERSION}")
    try:
        record = _Record.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise bad(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    try:
        check_grid({**{f"grid.{k}": v for k, v in record.grid.items()},
                    "flags": record.flags}, what="")
    except ValueError as exc:
        raise bad(str(exc)) from None
    if record.chosen is None:
        if record.flags:
            raise bad("flags given but no setting chosen")
    elif record.grid.get(record.chosen) != record.flags:
        raise bad(f"chosen: {record.chosen!r} is not a setting of its grid with flags "
                  f"{record.flags}")
    return data


def tune(session: Session, results: Path, benches: Sequence[Benchmark],
         sizes: Mapping[str, Size], size_name: str, runs: int, pairing: PairingPolicy,
         retune: bool, on_each=None, say=None) -> Tuning:
    """The recorded choice when it was made on the same benchmarks, size, grid and metric (unless
    ``retune``; a record that chose nothing is not reused), else the grid measured on
    ``benches`` and the best training geometric mean recorded."""
    check_grid(GRID)
    path = results / RECORD
    names = tuple(sorted(b.name for b in benches))
    grid = {k: list(v) for k, v in GRID.items()}
    metric = session.config.measure.metric if session is not None else "time"
    if not retune:
        data = read_record(path)
        if data is not None:
            same = (tuple(data["benchmarks"]) == names and data.get("size") == size_name
                    and data["grid"] == grid)
            was = data.get("metric", "time")
            if same and was == metric and data["chosen"] is not None:  # (read_record: its
                # flags are the grid's)
                return Tuning(data["chosen"], GRID[data["chosen"]], names,
                              size_name, data["training"], reused=True, metric=metric)
            if say is not None:
                say(f"{path}: " + ("tuned on other benchmarks, size or grid" if not same
                                   else f"tuned in {was}, not {metric}" if was != metric
                                   else "no setting was measured on every tuning benchmark")
                    + ": tuning again")
    contenders = [Contender((setting, b.name), b,
                            CompileJob(b, flags=setting_flags(b, flags)), sizes[b.name])
                  for setting, flags in GRID.items() for b in benches]
    got = measure_all(session, contenders, runs, pairing, on_each)
    table: dict[str, dict[str, Any]] = {}
    best: tuple[float, str] | None = None
    for setting in GRID:
        figures = {b.name: got[(setting, b.name)] for b in benches}
        g = geomean_figure(figures.values())
        table[setting] = {"geomean": [g.speedup, g.low, g.high] if g else None,
                          "benchmarks": {n: [m.speedup, m.low, m.high, m.size_ratio]
                                         for n, m in figures.items()}}
        if g is not None and g.speedup is not None and (best is None or g.speedup > best[0]):
            best = (g.speedup, setting)
    chosen = best[1] if best else None
    tuning = Tuning(chosen, GRID[chosen] if chosen else (), names, size_name, table,
                    metric=metric)
    results.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        Path(tmp).write_text(json.dumps(tuning.to_json(), indent=1, sort_keys=True) + "\n")
    return tuning
