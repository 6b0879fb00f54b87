"""``select-policy [BENCH|training ...] --labels DIR --out DIR``: which kind of policy to keep,
chosen by measurement on the training split (``pipeline.policy.choosing``).

Each kind -- ``searched`` (search-policy's study), ``classifier`` (trained on the labels) and
``combined`` (the study started from the classifier) -- is made once per fold from the other
folds' programs and measured on the fold's programs, which it never saw.  The kind kept has
the best geometric mean over every program among those whose worst fold passes the A/A gate
and that are not the heuristic under another name (``pipeline.policy.choice``); it is made
again from every program and written to ``OUT/selected.policy``.  The same command again
continues after Ctrl-C or a kill.
"""
from __future__ import annotations

import sys
from pathlib import Path

import click

from analysis.label_training import DEFAULT_LABEL_THRESHOLD
from analysis.policy_training import CLASSIFIERS, TrainingSet
from commands.common import (
    FiniteFloatRange,
    backend_errors_in_one_line,
    closing_session,
    fail,
    show_warnings,
)
from dispatcher.build.policy_file import DEFAULT_GROWTH_BUDGET, DEFAULT_MARGIN
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import ConfigError, load_config, with_metric
from dispatcher.core.figures import METRICS, metric_caption
from dispatcher.session import Session
from dispatcher.storage.store import StoreError
from pipeline import evaluation
from pipeline.evaluation import EvaluationError
from pipeline.longrun import InterruptLatch, progress
from pipeline.policy import choosing, search
from pipeline.policy.choice import KINDS, ChoiceError
from pipeline.policy.inputs import InputError
from pipeline.policy.searched import Penalties
from pipeline.policy.training import TrainingRequest, plan_training, training_table

PROG = "select-policy"


@click.command()
@click.argument("benchmarks", nargs=-1)
@click.option("--labels", "labels_dir", type=click.Path(path_type=Path),
              help="measure-sites' labels tables (DIR/<bench>/sites.parquet or .csv; from "
                   "the heuristic's tree and from an aggressive reference alike): what the "
                   "classifier and combined kinds train on.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("selected-policy"),
              show_default=True, help="Where the folds' studies, choice.csv, choice.json and "
                                      "selected.policy go (resumed when it holds them).")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS),
              help="The kinds compared (default: every one).")
@click.option("--folds", type=click.IntRange(2, 100), default=3, show_default=True,
              help="Groups of training programs, each held out once.")
@click.option("--trials", type=click.IntRange(1, 100_000), default=40, show_default=True,
              help="Complete trials of each study (each fold's and the final one).")
@click.option("--metric", type=click.Choice(METRICS), default="cycles", show_default=True)
@click.option("--size", default="tiny", show_default=True)
@click.option("--classifier", type=click.Choice(CLASSIFIERS), default="mlp",
              show_default=True)
@click.option("--label-threshold", type=FiniteFloatRange(0), default=DEFAULT_LABEL_THRESHOLD,
              show_default=True, help="Labels: |effect| at or below this does not matter.")
@click.option("--margin", type=FiniteFloatRange(0, 1), default=DEFAULT_MARGIN,
              show_default=True, help="The classifier's margin guard rail.")
@click.option("--growth-budget", type=click.IntRange(1), default=DEFAULT_GROWTH_BUDGET,
              show_default=True, help="The classifier's growth budget (and the combined "
                                      "study's first point's).")
@click.option("--seed", type=click.IntRange(0, 2**31 - 1), default=0, show_default=True)
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="Config file (default: configs/local.yaml).")
@backend_errors_in_one_line
def select_policy(benchmarks: tuple[str, ...], labels_dir: Path | None, out: Path,
                  kinds: tuple[str, ...], folds: int, trials: int, metric: str, size: str,
                  classifier: str, label_threshold: float, margin: float, growth_budget: int,
                  seed: int, config_path: Path | None) -> None:
    """Choose the kind of policy for BENCHMARKS (names, directories or training; default
    training) by leave-fold-out measurement, and write OUT/selected.policy."""
    try:
        config = load_config(config_path)
        benches = evaluation.select(benchmarks or ("training",))
        labels = _labels(labels_dir, label_threshold, margin, growth_budget, classifier, out)
        request = choosing.ChoiceRequest(
            tuple(benches), evaluation.sizes_of(benches, size), size, metric, folds, trials,
            kinds or KINDS, labels, classifier,
            choosing.Rails(label_threshold, margin, True, growth_budget),
            Penalties(max_compile_ratio=config.policy.max_compile_ratio,
                      max_size_ratio=config.policy.max_size_ratio), seed)
        choosing.folds_of(request)
    except (ConfigError, EvaluationError, InputError, ChoiceError) as exc:
        fail(str(exc))
    show_warnings()
    try:
        with search.locked(out), closing_session(Session(with_metric(config, metric))) as s, \
                InterruptLatch() as latch:
            outcome = choosing.choose_policy(s, request, out, say=progress, check=latch.check)
    except (ChoiceError, search.SearchError, CompilerNotFound, StoreError, OSError) as exc:
        fail(str(exc))
    except KeyboardInterrupt:
        click.echo(f"{PROG}: interrupted: the same command continues in {out}", err=True)
        sys.exit(130)
    _report(outcome, metric, out)


def _labels(labels_dir: Path | None, threshold: float, margin: float, budget: int,
            classifier: str, out: Path) -> TrainingSet | None:
    """The labelled sites of every program in ``labels_dir`` (None: none given)."""
    if labels_dir is None:
        return None
    request = TrainingRequest((), labels_dir, None, None, "", "", 0.0, threshold, margin,
                              True, budget, (classifier,), out / "unused.policy", False)
    return training_table(plan_training(request)).ts


def _report(outcome: choosing.ChoiceOutcome, metric: str, out: Path) -> None:
    click.echo(metric_caption(metric))
    click.echo("folds: " + "; ".join(f"{i}: {', '.join(g)} (A/A gate {gate:.4f})"
                                     for i, (g, gate) in enumerate(zip(outcome.groups,
                                                                       outcome.gates))))
    for r in outcome.choice.results:
        if r.figure is None:
            click.echo(f"  {r.kind:10} {r.refused}")
            continue
        folds = ", ".join(f"{f:.4f}" for f in r.fold_figures)
        click.echo(f"  {r.kind:10} geometric mean {r.figure:.4f} over every held-out program; "
                   f"folds {folds}" + (f"; not kept: {r.refused}" if r.refused else ""))
    if outcome.selected is None:
        click.echo("no kind passed: nothing kept, the heuristic stays "
                   f"({out / choosing.CHOICE_JSON})")
    else:
        click.echo(f"kept {outcome.choice.kept}: {outcome.selected} "
                   f"({out / choosing.CHOICE_JSON} says why)")


main = select_policy
