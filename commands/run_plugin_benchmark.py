"""``run-plugin-benchmark POLICY [BENCH|training|test|all ...]``: compile benchmarks with an
inlining policy answering the compiler (a policy file evaluated by the compiler itself,
``-inlining-policy``; any other policy through its policy channel) and measure each against
the heuristic build.

POLICY is ``heuristic``, ``never-inline``, ``always-inline``, an overrides file
(``optimal.sexp``) or a policy file ``train-policy`` wrote
(``dispatcher.build.policies.parse_policy``).  Each benchmark is compiled with the policy
serving the compiler, then compared with its heuristic build in pairs on one worker CPU, as
``run-benchmark`` compares; each comparison is written to
``<results>/<bench>/plugins/plugin_<name>.csv`` (one line per worker for the policy's runs and
one for the heuristic's, as ``run-all-benchmarks`` writes) as soon as it ends.  The table at
the end: each benchmark's speedup with its 95% interval, the geometric mean over the training
split and over the test split with its interval (``dispatcher.core.stats.geomean_speedup_ci``), and
how many benchmarks are significantly faster or slower.

``--baselines`` also measures, on the same benchmarks, the best global Flambda setting tuned on
the training split (``dispatcher.baselines``: chosen once, recorded in
``<results>/global-setting.json``, ``--retune`` to tune again), ``never-inline`` and
``always-inline``, each against the heuristic and written as its own ``plugin_<name>.csv``, and
reports the policy against each and against the per-program oracle of the baselines (per
benchmark and per split, with intervals and binary sizes; a baseline build that failed counted
at the heuristic's figure, and said so: ``dispatcher.baselines.table_cells``; also
``<results>/plugin_<name>.summary.csv``).
"""
from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import click

from analysis.results import Outcome
from commands.common import (
    backend_errors_in_one_line,
    closing_session,
    fail,
    metric_option,
    show_warnings,
)
from dispatcher import baselines as base
from dispatcher.build.manifest import SPLITS, Benchmark
from dispatcher.build.policies import PolicyError, PolicySpec, parse_policy
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.compare import pairing_policy
from dispatcher.config import MAX_RUNS, Config, ConfigError, load_config, with_metric
from dispatcher.core.figures import Figure, against, geomean_figure, metric_caption
from dispatcher.core.guards import CostGuard
from dispatcher.core.stats import geomean
from dispatcher.session import Session
from pipeline import evaluation
from pipeline.evaluation import Evaluated, EvaluationError
from pipeline.longrun import progress

PROG = "run-plugin-benchmark"
_NAME_BAD = re.compile(r"[^A-Za-z0-9._-]")


def policy_name(spec: PolicySpec, given: str | None) -> str:
    """The name in ``plugin_<name>.csv``: given, or the policy file's stem, or its kind."""
    raw = given or (Path(spec.source).stem if spec.source else spec.kind)
    name = _NAME_BAD.sub("_", raw)
    if not name.strip("._"):
        fail(f"--name {given!r}: expected letters, digits, '.', '_' or '-'")
    return name


def summary_lines(outcomes: list[Outcome], splits: dict[str, str],
                  counted: Mapping[str, base.Cell] | None = None) -> list[str]:
    """Per split: the geometric mean speedup with its interval, and how many benchmarks are
    significantly faster or slower than the heuristic; a program ``counted`` at the
    heuristic's figure (past the cost guards) counted so, and named."""
    lines = []
    counted = counted or {}

    def figure(o: Outcome) -> Figure:
        cell = counted.get(o.benchmark)
        return cell.counted if cell is not None and cell.fallback else o.figure
    for split in SPLITS:
        mine = [figure(o) for o in outcomes if splits.get(o.benchmark) == split
                and o.figure.speedup is not None]
        if not mine:
            continue
        faster = sum(1 for f in mine if f.low is not None and f.low > 1)
        slower = sum(1 for f in mine if f.high is not None and f.high < 1)
        g = geomean_figure(mine)
        mean = g.text() if g is not None else "- (a benchmark has no interval)"
        fell = base.counted_line(
            {(_POLICY_ROW, n): c for n, c in counted.items()}, _POLICY_ROW,
            [o.benchmark for o in outcomes if splits.get(o.benchmark) == split])
        lines.append(f"{split}: geometric mean speedup {mean} over {len(mine)} benchmark"
                     f"{'s' if len(mine) != 1 else ''}; significantly faster {faster}, "
                     f"slower {slower}" + (f"; {fell}" if fell else ""))
    return lines


_POLICY_ROW = "policy"  # summary_lines' key for the policy's own cells


@click.command()
@click.argument("policy")
@click.argument("benchmarks", nargs=-1)
@click.option("--name", help="The policy's name in plugin_<name>.csv (default: its file's "
                             "stem, or the built-in policy's name).")
@click.option("--results", type=click.Path(path_type=Path), default=Path("results"),
              show_default=True, help="Where results/<bench>/plugins/ go.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@click.option("--size", help="Benchmark size from its manifest (default: config).")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="Fewest pairs per comparison (default: config run.runs).")
@click.option("--max-pairs", type=click.IntRange(1, MAX_RUNS),
              help="Most pairs per comparison (default: config measure.max_pairs).")
@click.option("--baselines", is_flag=True,
              help="Also measure the best global setting tuned on the training split, "
                   "never-inline and always-inline, and report the policy against each.")
@click.option("--tune-on", multiple=True, metavar="BENCH",
              help="--baselines: tune the global setting on these benchmarks (names or "
                   "splits; default: training).")
@click.option("--retune", is_flag=True,
              help="--baselines: tune again, even where RESULTS/global-setting.json holds a "
                   "choice made on the same benchmarks, size and grid.")
@metric_option
@backend_errors_in_one_line
def run_plugin_benchmark(policy: str, benchmarks: tuple[str, ...], name: str | None,
                         results: Path, config_path: Path | None, size: str | None,
                         runs: int | None, max_pairs: int | None, baselines: bool,
                         tune_on: tuple[str, ...], retune: bool, metric: str | None) -> None:
    """Compile BENCHMARKS (names, directories, training, test or all; default all) with
    POLICY answering the compiler, measure each against its heuristic build, write
    RESULTS/<bench>/plugins/plugin_<name>.csv and print the speedups.

    POLICY is heuristic, never-inline, always-inline, an overrides file (.sexp) or a .policy file
    train-policy wrote (plain data, which the compiler evaluates itself: docs/policies.md)."""
    try:
        spec = parse_policy(policy)
        config = with_metric(load_config(config_path), metric)
    except (PolicyError, ConfigError) as exc:
        fail(str(exc))
    label = policy_name(spec, name)
    if (tune_on or retune) and not baselines:
        fail("--tune-on, --retune: only with --baselines")
    try:
        benches = evaluation.select(benchmarks)
        tuning_benches = evaluation.select(tune_on or ("training",)) if baselines else []
        size_name = size or config.run.size
        sizes = evaluation.sizes_of([*benches, *tuning_benches], size_name)
        runs = runs or config.run.runs
        pairing = pairing_policy(config, runs, max_pairs)
        session = Session(config)
        show_warnings()
        with closing_session(session):
            tuning = (tune_global(session, results, tuning_benches, sizes, size_name, runs,
                                  pairing, retune) if baselines else None)
            contenders, others = evaluation.policy_contenders(spec, label, benches, sizes,
                                                              tuning)
            steps = list(_reported(evaluation.measure_policy(
                session, contenders, label, spec, results, runs, pairing), label))
        report(steps, label, others, benches, config, results, baselines)
    except (CompilerNotFound, EvaluationError) as exc:
        fail(str(exc))
    if any(s.errors for s in steps):
        sys.exit(1)


def report(steps: list[Evaluated], label: str, others: list[str], benches: list[Benchmark],
           config: Config, results: Path, baselines: bool) -> None:
    """The tables, each program past the cost guards in one line on stderr, and the summary
    CSV (``dispatcher.baselines.table_cells`` counts every cell, under ``config.policy``)."""
    splits = {b.name: b.split for b in benches}
    metric = config.measure.metric
    figures = {(s.tag[0], s.tag[1].name): s.figure for s in steps}
    cells = base.table_cells(figures, label, others, [b.name for b in benches], metric,
                             config.policy)
    for b in benches:
        for build in [label, *others]:
            why = base.past_guard(cells[(build, b.name)].measured, config.policy)
            if why is not None:
                click.echo(f"{PROG}: {b.name}: {build}: {why}: falls back to the "
                           "heuristic's decisions, counted at the heuristic's figure (1.000)",
                           err=True)
    click.echo(metric_caption(metric))
    print_table([s.outcome for s in steps if s.tag[0] == label and s.outcome is not None],
                splits, label, {n: c for (build, n), c in cells.items() if build == label})
    if baselines:
        print_baselines(figures, label, others, benches, splits, metric, config.policy)
    path = evaluation.write_summary(results, label, others, benches, figures, metric,
                                    config.policy)
    progress(f"summary -> {path}")


def _reported(steps: Iterable[Evaluated], label: str) -> Iterator[Evaluated]:
    """Each comparison as it ends, with its progress line and its errors on stderr."""
    for step in steps:
        build, bench = step.tag
        m, c = step.figure, step.comparison
        if build != label:
            size = f", binary {m.size_ratio:.3f}x" if m.size_ratio is not None else ""
            progress(f"{bench.name}: {build}: speedup {m.cell()}{size}"
                     + (f" ({m.error})" if m.error else ""))
        elif c is not None and step.outcome is not None:
            figure = (f"speedup {step.outcome.text()} ({c.pairs} pairs on {c.worker})"
                      if c.resolved else f"no speedup, {c.unresolved_line()}")
            if c.metric != "time":
                figure = f"speedup in {c.metric} {step.outcome.text()} (exact, on {c.worker})"
            progress(f"{bench.name}: {figure} -> {step.csv}")
        for line in step.errors:
            click.echo(f"{PROG}: {line}", err=True)
        yield step


def tune_global(session: Session, results: Path, benches: list[Benchmark],
                sizes: dict, size_name: str, runs: int, pairing, retune: bool) -> base.Tuning:
    """The global setting (``dispatcher.baselines.tune``), with a progress line per comparison
    and one line on the choice."""
    def each(tag: tuple[str, str], m: Figure) -> None:
        progress(f"tuning {tag[0]} on {tag[1]}: speedup {m.cell()}"
                 + (f" ({m.error})" if m.error else ""))
    tuning = evaluation.tune_global(session, results, benches, sizes, size_name, runs,
                                    pairing, retune, on_each=each, say=progress)
    where = (f"reused from {results / base.RECORD}" if tuning.reused
             else f"recorded in {results / base.RECORD}")
    for line in grid_lines(tuning):
        click.echo(line)
    if tuning.chosen is None:
        click.echo(f"global setting: none measured on every tuning benchmark ({where})")
    else:
        g = tuning.table[tuning.chosen]["geomean"]
        click.echo(f"global setting: {tuning.chosen} ({' '.join(tuning.flags)}), training "
                   f"geometric mean speedup {Figure(*g).text()} over "
                   f"{len(tuning.benchmarks)} benchmarks ({where})")
    return tuning


def grid_lines(tuning: base.Tuning) -> list[str]:
    """Each setting of the grid with its training geometric mean and the benchmarks it was
    counted at the heuristic's figure on (its build failed), the chosen one marked."""
    lines = [f"global settings tuned on {len(tuning.benchmarks)} benchmarks at size "
             f"{tuning.size}, in {tuning.metric} (geometric mean speedup against the "
             "heuristic; a failed build counted at the heuristic's figure):"]
    for setting, row in tuning.table.items():
        g = row.get("geomean")
        mean = Figure(*g).text() if g else "- (a benchmark has no figure)"
        failed = row.get("failed") or {}
        extra = (f"; counted at the heuristic's figure: "
                 f"{', '.join(f'{n} {why}' for n, why in sorted(failed.items()))}"
                 if failed else "")
        mark = " (chosen)" if setting == tuning.chosen else ""
        lines.append(f"  {setting:30} {mean}{mark}{extra}")
    return lines


def print_baselines(figures: dict[tuple[str, str], Figure], label: str,
                    others: list[str], benches: list[Benchmark],
                    splits: dict[str, str], metric: str = "time",
                    guard: CostGuard | None = None) -> None:
    """Per benchmark and baseline: the baseline's speedup against the heuristic and its size,
    and the policy against it, then the oracle's row; per split, the geometric means of both
    with their intervals, and the programs counted at the heuristic's figure
    (``dispatcher.baselines.table_cells``: the rules, here only their wording)."""
    names = [b.name for b in benches]
    cells = base.table_cells(figures, label, others, names, metric, guard)
    picks = base.oracle_builds([label, *others])
    builds = [label, *others, *([base.ORACLE] if picks else [])]
    click.echo(f"policy {label} against each baseline (speedup: the heuristic's time / the "
               "build's, paired; policy against a baseline: the ratio of the two speedups, "
               "interval from both; size: binary size / the heuristic's)")
    click.echo("a baseline's build that failed (past the build budget, or refused by the "
               "compiler), and any build past the cost guards (compile time, binary size), is "
               "counted at the heuristic's figure (1.000) in the means and against the policy: "
               "a user would ship the default build")
    if picks:
        click.echo(f"{base.ORACLE}: per program the best of {base.HEURISTIC}, "
                   f"{', '.join(picks)} (chosen after measuring: the ceiling of picking a "
                   "baseline per program; note: the one it took)")
    click.echo(f"{'benchmark':20} {'split':9} {'build':24} {'speedup [95% CI]':24} "
               f"{'size':>6}  {label + ' against it [95% CI]':28} note")
    ordered = sorted(benches, key=lambda b: (splits.get(b.name, ""), b.name))
    for b in ordered:
        mine = cells[(label, b.name)].counted
        for build in builds:
            c = cells[(build, b.name)]
            m = c.measured
            size = f"{m.size_ratio:.3f}" if m.size_ratio is not None else "-"
            shown = base.failed_build(m) or m.cell()
            vs = "-" if build == label else against(mine, c.counted).cell()
            click.echo(f"{b.name:20} {splits.get(b.name, ''):9} {build:24} {shown:24} "
                       f"{size:>6}  {vs:28} {c.note or ''}".rstrip())
    for split in SPLITS:
        in_split = [b.name for b in ordered if splits.get(b.name) == split]
        for build in builds if in_split else []:
            click.echo(_split_line(cells, label, build, split, in_split))


def _split_line(cells: dict[tuple[str, str], base.Cell], label: str, build: str, split: str,
                names: list[str]) -> str:
    """A build's geometric means over a split's benchmarks, as counted: its speedup, the
    policy against it, its binary size; and the programs counted at the heuristic's figure."""
    mine = [cells[(label, n)].counted for n in names]
    theirs = [cells[(build, n)].counted for n in names]
    line = f"{split}: {build}: geometric mean speedup {_mean(theirs)}"
    if build != label:
        line += f"; {label} against it " + _mean(against(a, b) for a, b in zip(mine, theirs))
    sizes = [r for f in theirs if (r := f.size_ratio)]
    if len(sizes) == len(names):
        line += f"; binary size geometric mean {geomean(sizes):.3f}x"
    line += f" over {len(names)} benchmark{'s' if len(names) != 1 else ''}"
    counted = base.counted_line(cells, build, names)
    line += f"; {counted}" if counted else ""
    both = base.both_compiled(cells, label, build, names)
    if build not in (label, base.ORACLE) and both is not None:
        line += (f"; as measured where both compiled ({len(both)} of {len(names)}, the cost "
                 f"guards aside): {build} {_mean(cells[(build, n)].measured for n in both)}, "
                 f"{label} {_mean(cells[(label, n)].measured for n in both)}, {label} against "
                 "it " + _mean(against(cells[(label, n)].measured, cells[(build, n)].measured)
                               for n in both))
    return line


def _mean(figures: Iterable[Figure]) -> str:
    g = geomean_figure(figures)
    return "- (a benchmark has no figure)" if g is None else g.text()


def print_table(outcomes: list[Outcome], splits: dict[str, str], label: str,
                counted: Mapping[str, base.Cell] | None = None) -> None:
    """The policy's speedup per benchmark, as measured (``fell back`` where it is past the
    cost guards: ``counted``), then each split's means as counted."""
    fell = {n for n, c in (counted or {}).items() if c.fallback}
    metrics = sorted({o.figure.metric for o in outcomes if o.figure.speedup is not None})
    unit = "time" if metrics in ([], ["time"]) else " or ".join(metrics)
    click.echo(f"policy {label} against the heuristic (speedup = heuristic {unit} / policy "
               f"{unit}{', paired, 95% interval' if unit == 'time' else ''})")
    click.echo(f"{'benchmark':24} {'split':9} {'speedup [95% CI]':28} {'significant':12} pairs")
    for o in sorted(outcomes, key=lambda o: (splits.get(o.benchmark, ""), o.benchmark)):
        f = o.figure
        word = "fell back" if o.benchmark in fell else "-" if f.significant is None else (
            "faster" if f.significant and f.speedup and f.speedup > 1
            else "slower" if f.significant else "no")
        click.echo(f"{o.benchmark:24} {splits.get(o.benchmark, ''):9} "
                   f"{o.text():28} {word:12} {f.pairs}")
    for line in summary_lines(outcomes, splits, counted):
        click.echo(line)


main = run_plugin_benchmark
