"""``search-policy [BENCH|training ...] --out DIR``: a policy file's parameters searched for
the geometric-mean speedup of the training programs (``pipeline.policy.search``).

Each trial compiles every program with its candidate policy file (evaluated by the compiler)
and measures it against the heuristic build in ``--metric`` (default cycles: exact, one
counted run of each binary); the objective is the geometric mean speedup less the penalties
for binary size and compile time.  The study (Optuna, TPE) is journaled in ``DIR/study.db``:
the same command again continues it, after Ctrl-C or a kill.  The best trial's policy goes to
``DIR/searched.policy`` (``searched.json``: its provenance; ``trials.csv``: every trial);
then it is confirmed in paired wall time at ``--confirm-size`` (``DIR/confirm.csv``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from commands.common import backend_errors_in_one_line, closing_session, fail, show_warnings
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.compare import pairing_policy
from dispatcher.config import MAX_RUNS, ConfigError, load_config, with_metric
from dispatcher.core.figures import METRICS, metric_caption
from dispatcher.session import Session
from dispatcher.storage.store import StoreError
from pipeline import evaluation
from pipeline.evaluation import EvaluationError
from pipeline.longrun import InterruptLatch, progress
from pipeline.policy import search
from pipeline.policy.searched import Penalties, SearchSpaceError, space_with

PROG = "search-policy"


@click.command()
@click.argument("benchmarks", nargs=-1)
@click.option("--out", type=click.Path(path_type=Path), default=Path("searched-policy"),
              show_default=True, help="The study's directory (resumed when it holds one).")
@click.option("--trials", type=click.IntRange(1, 100_000), default=40, show_default=True,
              help="Complete trials the study should have (a rerun adds the missing ones).")
@click.option("--metric", type=click.Choice(METRICS), default="cycles", show_default=True,
              help="What each trial measures (an exact metric screens: one run of each).")
@click.option("--size", default="tiny", show_default=True, help="The trials' size.")
@click.option("--confirm-size", default="quick", show_default=True,
              help="The confirmation's size, in paired wall time; 'none': no confirmation.")
@click.option("--confirm-on", multiple=True, metavar="BENCH",
              help="Confirm on these programs (default: those searched).")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="Confirmation: fewest pairs (default: config run.runs).")
@click.option("--max-pairs", type=click.IntRange(1, MAX_RUNS),
              help="Confirmation: most pairs (default: config measure.max_pairs).")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
@click.option("--size-allowance", type=click.FloatRange(0, 10), default=0.05,
              show_default=True, help="Binary growth (geometric mean) free of penalty.")
@click.option("--size-weight", type=click.FloatRange(0, 100), default=1.0, show_default=True)
@click.option("--time-allowance", type=click.FloatRange(0, 100), default=1.0,
              show_default=True, help="Compile-time growth free of penalty (1: twice).")
@click.option("--time-weight", type=click.FloatRange(0, 100), default=0.1, show_default=True)
@click.option("--max-compile-ratio", type=click.FloatRange(1, 1e6),
              help="A program whose build compiles longer than this times the heuristic's "
                   "counts at the heuristic's figure (default: config policy.max_compile_ratio, "
                   "else 2).")
@click.option("--max-size-ratio", type=click.FloatRange(1, 1e6),
              help="The same for binary size (default: config policy.max_size_ratio, else "
                   "1.5).")
@click.option("--column", "columns", multiple=True, metavar="NAME=SCALE",
              help="Another feature in the score, divided by SCALE (repeatable; e.g. "
                   "direct_call_of_indirect=2): a study of another space.")
@click.option("--discount", "discounts", multiple=True, metavar="FEATURE",
              help="Search a growth-budget discount for this number feature (repeatable; "
                   "e.g. direct_call_of_indirect): a site's growth is its callee_size over "
                   "1 + weight x feature; a study of another space, policy format 2.")
@click.option("--start-from", type=click.Path(path_type=Path), metavar="SEARCHED.JSON",
              help="Try an earlier study's best point first (its searched.json), each "
                   "discount it lacks at 0, 0.5, 1, 2 and 4.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@backend_errors_in_one_line
def search_policy(benchmarks: tuple[str, ...], out: Path, trials: int, metric: str,
                  size: str, confirm_size: str, confirm_on: tuple[str, ...],
                  runs: int | None, max_pairs: int | None, seed: int,
                  size_allowance: float, size_weight: float, time_allowance: float,
                  time_weight: float, max_compile_ratio: float | None,
                  max_size_ratio: float | None, columns: tuple[str, ...],
                  discounts: tuple[str, ...], start_from: Path | None,
                  config_path: Path | None) -> None:
    """Search a policy file's parameters for the speedup of BENCHMARKS (names, directories or
    training; default training), write OUT/searched.policy and confirm it in wall time."""
    try:
        config = load_config(config_path)
        benches = evaluation.select(benchmarks or ("training",))
        confirmed = evaluation.select(confirm_on) if confirm_on else benches
        space = space_with(columns, discounts=discounts)
        settings = search.SearchSettings(
            tuple(benches), evaluation.sizes_of(benches, size), size, metric, trials, seed,
            space=space,
            extra_seeds=search.start_from_file(start_from, space) if start_from else (),
            penalties=Penalties(size_allowance, size_weight, time_allowance, time_weight,
                                max_compile_ratio=max_compile_ratio
                                or config.policy.max_compile_ratio,
                                max_size_ratio=max_size_ratio or config.policy.max_size_ratio))
        confirm_sizes = (evaluation.sizes_of(confirmed, confirm_size)
                         if confirm_size != "none" else None)
    except (ConfigError, EvaluationError, SearchSpaceError, search.SearchError) as exc:
        fail(str(exc))
    show_warnings()
    try:
        with search.locked(out):
            outcome = _search(with_metric(config, metric), settings, out)
            _report(outcome, out, metric)
            if confirm_sizes is not None and outcome.best is not None:
                timed = with_metric(config, "time")
                pairing = pairing_policy(timed, runs or timed.run.runs, max_pairs)
                with closing_session(Session(timed)) as session:
                    c = search.confirm(session, out, settings, confirmed, confirm_sizes,
                                       confirm_size, pairing)
                _report_confirmation(c)
    except (search.SearchError, CompilerNotFound, StoreError, OSError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        click.echo(f"{PROG}: interrupted: the same command continues the study in {out}",
                   err=True)
        sys.exit(130)


def _search(config, settings: search.SearchSettings, out: Path) -> search.SearchOutcome:
    with closing_session(Session(config)) as session, InterruptLatch() as latch:
        return search.run_search(session, settings, out, say=progress, check=latch.check)


def _report(outcome: search.SearchOutcome, out: Path, metric: str) -> None:
    done = [t for t in outcome.trials if t.state == "complete"]
    click.echo(metric_caption(metric))
    click.echo(f"study {out / search.DB}: {len(done)} complete trial(s), {outcome.added} "
               f"this run, {outcome.retried} cut short before and tried again")
    for t in outcome.trials:
        if t.state == "complete":
            click.echo(f"  trial {t.number:4} {t.seed or '-':22} objective {t.objective:.4f} "
                       f"speedup {t.speedup:.4f} size {t.size:.3f}x"
                       + (f" compile {t.compile:.2f}x" if t.compile is not None else ""))
    b = outcome.best
    if b is not None:
        click.echo(f"best: trial {b.number}, objective {b.objective:.4f}, geometric mean "
                   f"speedup {b.speedup:.4f} in {metric} over {len(b.programs)} programs, "
                   f"binary size {b.size:.3f}x -> {outcome.policy}")


def _report_confirmation(c: search.Confirmation) -> None:
    click.echo(f"confirmation at size {c.size}: {metric_caption(c.metric)}")
    for name, f in c.figures.items():
        click.echo(f"  {name:24} {f.cell():28} {f.error or ''}".rstrip())
    click.echo("  geometric mean " + (c.mean.text() if c.mean is not None
                                      else "- (a program has no figure)"))


main = search_policy
