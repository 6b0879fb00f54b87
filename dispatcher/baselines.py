"""Baselines for ``run-plugin-benchmark --baselines``: the best *global* inlining setting tuned on
the training split, and the extremes ``never-inline`` and ``always-inline``.

A learned policy is worth its complexity only if it beats what a user gets by turning Flambda's
global knobs; so the grid ``GRID`` (allow-listed options only, ``dispatcher.build.manifest``) is
measured against the heuristic on the tuning benchmarks, the setting with the best geometric
mean of paired speedups is chosen, and that choice is written to ``<results>/global-setting.json``
so later runs reuse it (``--retune`` tunes again).  Tuning is resumable: every comparison goes
through the store (``dispatcher.compare``), so a tuning cut short measures only what it had not
measured when run again.

Every evaluation table reads the baselines through ``table_cells``: a baseline build that fails
(past the build budget, or refused by the compiler) is reported as failed and counted at the
heuristic's figure (a user falls back to the default build), as is any build, the policy's
included, past the cost guards (``dispatcher.core.guards``: compile time, binary size), and
the per-program oracle, the
best of the heuristic, the tuned global setting and always-inline, is a row of its own: the
ceiling of what choosing among the baselines per program would give.
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
from dispatcher.core.guards import CostGuard, over_guard
from dispatcher.running.measurement import PairingPolicy
from dispatcher.session import Session

#: The global settings tuned: name -> the options that replace the manifest's optimisation
#: level (and any option the setting names).  Each is one build and one comparison per tuning
#: benchmark, so the grid stays about a dozen.  -O3 alone is the heuristic's own build (the
#: manifests' level), so it is the reference, not a candidate.  A value option given once is
#: the user's value for every round, above -O3's per-round values (round 0 at the defaults,
#: round 1 at -O2's, later rounds at -O3's: -inline 10/25/50, -inline-max-depth 1/2/3).  The
#: last six are the aggressive end (issue 35): a learned policy must beat what a user gets by
#: simply inlining much more.
GRID: dict[str, tuple[str, ...]] = {
    "O2": ("-O2",),
    "O3-inline-100": ("-O3", "-inline", "100"),
    "O3-inline-400": ("-O3", "-inline", "400"),
    "O3-max-depth-3": ("-O3", "-inline-max-depth", "3"),
    "O3-max-unroll-2": ("-O3", "-inline-max-unroll", "2"),
    "O3-unbox-closures": ("-O3", "-unbox-closures"),
    "O3-inline-1000": ("-O3", "-inline", "1000"),
    "O3-inline-200-depth-5": ("-O3", "-inline", "200", "-inline-max-depth", "5"),
    "O3-inline-200-unroll-3": ("-O3", "-inline", "200", "-inline-max-unroll", "3"),
    "O3-inline-200-unbox-closures": ("-O3", "-inline", "200", "-unbox-closures"),
    "O3-rounds-4": ("-O3", "-rounds", "4"),
    # the costs of what inlining would not remove, twice -O3's last round's (call 15, alloc
    # 21, prim 9): a removed call, allocation or primitive is worth more, so more is inlined
    "O3-costs-x2": ("-O3", "-inline-call-cost", "30", "-inline-alloc-cost", "42",
                    "-inline-prim-cost", "18"),
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
    """What ``compare_with_heuristic`` handed back, as a figure with the binary size and
    compile time ratios (those also on a figure not measured: the cost guards judge a build
    that compiled whatever its measurement did)."""
    if got.failure is Failure.COMPILE:
        return Figure(error=f"does not compile: {_line(got.error)}", compiled=False)
    if got.failure is Failure.HEURISTIC:
        return Figure(error=f"the heuristic build failed: {_line(got.error)}")
    size, cpu = cost_ratios(session, got)
    if got.failure is Failure.MEASURE:
        return Figure(error=f"not measured: {_line(got.error)}", size_ratio=size,
                      compile_ratio=cpu)
    c = got.comparison
    assert c is not None
    if not c.resolved:
        return Figure(pairs=c.pairs, error=c.unresolved_line(), size_ratio=size,
                      compile_ratio=cpu)
    if c.failed:
        return Figure(pairs=c.pairs, error="a run of its build failed", size_ratio=size,
                      compile_ratio=cpu)
    speedup, low, high = c.interval
    return Figure(speedup, low, high, c.pairs, size, metric=c.metric, compile_ratio=cpu)


def cost_ratios(session: Session, got: Compared[Any]) -> tuple[float | None, float | None]:
    """The contender's binary size and compile CPU time over its heuristic build's (None: a
    binary not kept, a compile time not recorded: ``CompileResult.cpu_s``)."""
    if got.compiled is None:
        return None, None
    heuristic = session.builds.compile(CompileJob(got.contender.bench))  # cached
    try:
        size: float | None = (got.compiled.binary.stat().st_size
                              / heuristic.binary.stat().st_size)
    except OSError:
        size = None
    mine, theirs = got.compiled.cpu_s, heuristic.cpu_s
    return size, (mine / theirs if mine is not None and theirs else None)


def size_ratio(session: Session, got: Compared[Any]) -> float | None:
    """The contender's binary size over its heuristic build's (None: a binary not kept)."""
    return cost_ratios(session, got)[0]


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


# --------------------------------------------------------------------------- the tables' rules

#: What a build past its budget says (``dispatcher.build.driver.build_benchmark`` and the Ray
#: cluster's builder both word it so); any other failed build "does not compile".
BUDGET_WORDS = "timed out (build budget"
HEURISTIC = "heuristic"
ORACLE = "oracle"  # the per-program best of the baselines: a row of every evaluation table
ALWAYS_INLINE = "always-inline"
GLOBAL_PREFIX = "global-"  # the tuned setting's build: global-<setting>


def heuristic_figure(metric: str = "time") -> Figure:
    """The heuristic build against itself: 1 exactly (no interval to speak of: it is the same
    binary), its own size."""
    return Figure(1.0, 1.0, 1.0, 0, 1.0, metric=metric)


def failed_build(m: Figure) -> str | None:
    """Why a build counts at the heuristic's figure, in a few words (None: it compiled)."""
    if m.compiled:
        return None
    return "past the build budget" if m.error and BUDGET_WORDS in m.error \
        else "does not compile"


def past_guard(m: Figure, guard: CostGuard | None) -> str | None:
    """Why a build that compiled is past the cost guard, naming the ratio and the limit (None:
    within it, or no guard): ``dispatcher.core.guards.over_guard`` on the figure's ratios."""
    if not m.compiled:
        return None
    return over_guard(m.compile_ratio, m.size_ratio, guard)


@dataclass(frozen=True)
class Cell:
    """One build on one program in an evaluation table: ``measured`` as measured (a failed
    build: its error), ``counted`` as the split's geometric means count it, ``note`` why they
    differ (a failed build, a build past the cost guard) or which baseline the oracle took;
    ``fallback``: why the program was counted at the heuristic's figure, in a few words."""

    measured: Figure
    counted: Figure
    note: str | None = None
    fallback: str | None = None


def fallback_cell(m: Figure, why: str, metric: str = "time") -> Cell:
    """``m`` counted at the heuristic's figure, and why."""
    return Cell(m, heuristic_figure(metric), f"{why}: counted at the heuristic's figure", why)


def baseline_cell(m: Figure, metric: str = "time", guard: CostGuard | None = None) -> Cell:
    """A baseline's figure as the tables count it: a failed build, or one past the cost
    ``guard``, at the heuristic's figure, since a user whose build fails (or outlasts the
    budget, or costs too much) ships the default build; a figure missing for any other
    reason (not measured) stays missing, so no mean hides it."""
    why = failed_build(m) or past_guard(m, guard)
    return Cell(m, m) if why is None else fallback_cell(m, why, metric)


def policy_cell(m: Figure, metric: str = "time", guard: CostGuard | None = None) -> Cell:
    """The policy's own figure as the tables count it: as measured (its failed build is an
    error of the run, never a fallback), but at the heuristic's figure where its build is
    past the cost ``guard`` (the program falls back to the heuristic's decisions)."""
    why = past_guard(m, guard)
    return Cell(m, m) if why is None else fallback_cell(m, why, metric)


def oracle_cell(cells: Mapping[str, Cell], metric: str = "time") -> Cell:
    """The best counted figure of the heuristic and ``cells`` (the baselines the oracle picks
    among), by speedup, ties to the heuristic then to the order given; no figure when one of
    them has none (a best of fewer is not the ceiling).  Chosen after measuring, so its
    interval is the winner's and says nothing of the choice."""
    best_name, best = HEURISTIC, heuristic_figure(metric)
    for name, c in cells.items():
        f = c.counted
        if not f.ok:
            missing = Figure(error=f"{name} has no figure")
            return Cell(missing, missing)
        assert f.speedup is not None and best.speedup is not None
        if f.speedup > best.speedup:
            best_name, best = name, f
    return Cell(best, best, best_name)


def oracle_builds(builds: Sequence[str]) -> list[str]:
    """The builds the oracle picks among, besides the heuristic: the tuned global setting and
    always-inline (never-inline, the other extreme, is a floor, not a candidate)."""
    return [b for b in builds if b.startswith(GLOBAL_PREFIX) or b == ALWAYS_INLINE]


def table_cells(figures: Mapping[tuple[str, str], Figure], label: str, others: Sequence[str],
                names: Sequence[str], metric: str = "time", guard: CostGuard | None = None
                ) -> dict[tuple[str, str], Cell]:
    """Every (build, program) cell of an evaluation table, ``ORACLE``'s row included (when a
    baseline is there to pick).  The policy ``label`` is counted as measured (its own failure
    is an error of the run, never a fallback) unless past the cost ``guard`` (None: none);
    a baseline as ``baseline_cell`` counts it."""
    none = Figure()
    out: dict[tuple[str, str], Cell] = {}
    for n in names:
        for build in [label, *others]:
            m = figures.get((build, n), none)
            out[(build, n)] = (policy_cell(m, metric, guard) if build == label
                               else baseline_cell(m, metric, guard))
        picks = oracle_builds([label, *others]) if others else []  # no baseline, no oracle
        if picks:
            out[(ORACLE, n)] = oracle_cell({b: out[(b, n)] for b in picks}, metric)
    return out


def counted_line(cells: Mapping[tuple[str, str], Cell], build: str, names: Sequence[str]
                 ) -> str | None:
    """The programs a build's mean counts at the heuristic's figure (a failed build, one
    past the cost guard), and why, in one clause (None: none)."""
    failed = []
    for n in names:
        cell = cells.get((build, n))
        why = cell.fallback if cell is not None else None
        if why is not None:
            failed.append(f"{n} {why}")
    if not failed:
        return None
    return f"counted at the heuristic's figure (1.000): {', '.join(failed)}"


def both_compiled(cells: Mapping[tuple[str, str], Cell], label: str, build: str,
                  names: Sequence[str]) -> list[str] | None:
    """The programs where both ``label``'s build and ``build``'s compiled and were measured,
    when the means count any program otherwise (a build that failed, or one past the cost
    guard, counted at the heuristic's figure); None when they count none so: the split's
    means are already over the builds as measured."""
    if not any(cells[(b, n)].fallback for b in (label, build) for n in names):
        return None
    return [n for n in names
            if all(cells[(b, n)].measured.compiled and cells[(b, n)].measured.ok
                   for b in (label, build))]


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
    # per benchmark whose build failed: why, counted at the heuristic's figure (absent in
    # records written before the rule)
    failed: dict[str, str] = Field(default_factory=dict, max_length=10_000)


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


def other_grid(path: Path, recorded: Mapping[str, Sequence[str]]) -> str:
    """The line refusing a record of another grid: its choice is not comparable, and tuning
    the new grid costs a build and a comparison per setting and benchmark, so only an explicit
    ``--retune`` pays it (and rewrites the record)."""
    changed = sum(1 for k, v in GRID.items() if list(recorded.get(k, ())) != list(v))
    gone = sum(1 for k in recorded if k not in GRID)
    return (f"{path}: tuned on another grid ({len(recorded)} settings; this one has "
            f"{len(GRID)}, {changed} new or changed, {gone} gone): --retune tunes this grid "
            "and rewrites the record")


def tune(session: Session, results: Path, benches: Sequence[Benchmark],
         sizes: Mapping[str, Size], size_name: str, runs: int, pairing: PairingPolicy,
         retune: bool, on_each=None, say=None, guard: CostGuard | None = None) -> Tuning:
    """The recorded choice when it was made on the same benchmarks, size, grid and metric (unless
    ``retune``; a record that chose nothing is not reused), else the grid measured on
    ``benches`` and the best training geometric mean recorded.  A record of another grid is
    refused (BaselineError, one line) unless ``retune``.  A setting whose build fails on a
    benchmark, or is past the cost ``guard`` there, is counted there at the heuristic's
    figure (``baseline_cell``) and competes."""
    check_grid(GRID)
    path = results / RECORD
    names = tuple(sorted(b.name for b in benches))
    grid = {k: list(v) for k, v in GRID.items()}
    metric = session.config.measure.metric if session is not None else "time"
    if not retune:
        data = read_record(path)
        if data is not None:
            if data["grid"] != grid:
                raise BaselineError(other_grid(path, data["grid"]))
            same = tuple(data["benchmarks"]) == names and data.get("size") == size_name
            was = data.get("metric", "time")
            if same and was == metric and data["chosen"] is not None:  # (read_record: its
                # flags are the grid's)
                return Tuning(data["chosen"], GRID[data["chosen"]], names,
                              size_name, data["training"], reused=True, metric=metric)
            if say is not None:
                say(f"{path}: " + ("tuned on other benchmarks or size" if not same
                                   else f"tuned in {was}, not {metric}" if was != metric
                                   else "no setting was measured on every tuning benchmark")
                    + ": tuning again")
    contenders = [Contender((setting, b.name), b,
                            CompileJob(b, flags=setting_flags(b, flags)), sizes[b.name])
                  for setting, flags in GRID.items() for b in benches]
    got = measure_all(session, contenders, runs, pairing, on_each)
    table = training_table({k: {b.name: got[(k, b.name)] for b in benches} for k in GRID},
                           metric, guard)
    chosen = choose(table)
    tuning = Tuning(chosen, GRID[chosen] if chosen else (), names, size_name, table,
                    metric=metric)
    results.mkdir(parents=True, exist_ok=True)
    with atomic_output(path) as tmp:
        Path(tmp).write_text(json.dumps(tuning.to_json(), indent=1, sort_keys=True) + "\n")
    return tuning


def training_table(figures: Mapping[str, Mapping[str, Figure]], metric: str = "time",
                   guard: CostGuard | None = None) -> dict[str, dict[str, Any]]:
    """The record's ``training`` table: per setting its geometric mean over the benchmarks
    (failed builds, and builds past the cost ``guard``, counted at the heuristic's figure;
    None when a figure is missing for any other reason), each benchmark's figure as
    measured, and the builds so counted with why."""
    table: dict[str, dict[str, Any]] = {}
    for setting, per in figures.items():
        cells = {n: baseline_cell(m, metric, guard) for n, m in per.items()}
        g = geomean_figure(c.counted for c in cells.values())
        row: dict[str, Any] = {
            "geomean": [g.speedup, g.low, g.high] if g else None,
            "benchmarks": {n: [m.speedup, m.low, m.high, m.size_ratio]
                           for n, m in per.items()}}
        failed = {n: c.fallback for n, c in cells.items() if c.fallback is not None}
        if failed:
            row["failed"] = failed
        table[setting] = row
    return table


def choose(table: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The setting with the best training geometric mean (the first of equals, in the grid's
    order); None when no setting has one."""
    best: tuple[float, str] | None = None
    for setting, row in table.items():
        g = row.get("geomean")
        if g is not None and g[0] is not None and (best is None or g[0] > best[0]):
            best = (g[0], setting)
    return best[1] if best else None
