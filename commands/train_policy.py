"""``train-policy``: an inlining policy from the rewards ``assign-rewards`` wrote, or the
labels ``measure-sites`` measured, or both, with the features the compiler dumps, validated on
benchmarks it did not see.

Rewards (the default, or ``--rewards DIR``): for each benchmark under the rewards directory (or
each one named), its rewards for one model and hyperparameters (``--hyper``; ``best``: the
setting with the best mean held-out R^2 in its ``fits.csv``), and the features of its call
sites, from the decision dumps of its heuristic build (compiled, or taken from the store).

Labels (``--labels [DIR]``, DIR ``labels`` when not given): for each benchmark with a table
``DIR/<bench>/sites.parquet`` (or ``sites.csv``), or each one named, its measured sites labelled
by ``analysis.label_training``'s rule (``--label-threshold``, in log-speedup units), features
from the table itself: nothing is compiled.  With ``--rewards`` given too, both, a measured
label winning where both label a site (``analysis.policy_training.combine``).

Dataset (``--dataset DIR``, what ``export-dataset`` wrote: ``analysis.dataset``): the labels
and/or rewards it was exported from, with the features it carries: no compile, no config.  The
training table is the one those labels and rewards give, so the policy file is byte for byte
the one ``--labels``/``--rewards`` write with the same options.

``pipeline.policy.training`` reads the sources (``pipeline.policy.inputs``), and
``analysis.policy_training`` validates leave-one-benchmark-out and trains; the policy file
(``dispatcher.build.policy_file``: plain data, with the guard rails ``--margin``,
``--ranges`` and ``--growth-budget``) goes to ``--out`` with the validation scores beside it
(``<out>.scores.csv``).

``--validate measured`` also compiles each fold's policy into its held-out benchmark and
measures it against the heuristic (``pipeline.policy.validation``): the classifier kept is the
one whose worst held-out measured speedup is best, and below ``--gate`` (0.95) the command
still writes the file but says FAIL and exits 3 (``pipeline.policy.selection``).  This module
parses the options and words what each step returns.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import click
import pandas as pd

from analysis.label_training import DEFAULT_LABEL_THRESHOLD
from analysis.policy_training import CLASSIFIERS, LABELS, pooled_balanced_accuracy, summary
from commands.common import FiniteFloatRange, backend_errors_in_one_line, fail, show_warnings
from dispatcher.build.policy_file import DEFAULT_GROWTH_BUDGET, DEFAULT_MARGIN, MAX_GROWTH_BUDGET
from dispatcher.config import MAX_RUNS
from pipeline.policy.inputs import DEFAULT_THRESHOLD, InputError
from pipeline.policy.selection import EXIT_GATE, GATE, FoldMeasure, geomean_text, worst
from pipeline.policy.training import (
    MeasuredChoice,
    TrainingRequest,
    TrainingTable,
    label_scores,
    measured_choice,
    plan_training,
    training_table,
    write_policy,
)

PROG = "train-policy"


class _GrowthBudget(click.ParamType):
    """A growth budget: an integer from 1 to MAX_GROWTH_BUDGET, or 0 or ``none`` (no
    budget: None)."""

    name = "growth budget"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            number = value
        elif str(value).strip().lower() == "none":
            return None
        else:
            try:
                number = int(str(value).strip())
            except ValueError:
                self.fail(f"{value!r}: expected an integer (callee_size units), 0 or none.",
                          param, ctx)
        if number is not None and not 0 <= number <= MAX_GROWTH_BUDGET:
            self.fail(f"{value!r}: expected an integer from 0 to {MAX_GROWTH_BUDGET} (0: "
                      "none).", param, ctx)
        return number or None


@click.command()
@click.argument("benchmarks", nargs=-1)
@click.option("--labels", "labels_dir", type=click.Path(path_type=Path), is_flag=False,
              flag_value="labels", default=None, metavar="[DIR]",
              help="Train on the sites measure-sites measured: DIR/<bench>/sites.parquet "
                   "(or sites.csv); --labels alone reads labels/.  Without --rewards, on "
                   "these labels only.  [DIR default: labels]")
@click.option("--rewards", "rewards_dir", type=click.Path(path_type=Path), default=None,
              help="What assign-rewards wrote (--out).  [default: rewards, unless --labels "
                   "or --dataset is given; with --labels too: both, a measured label winning]")
@click.option("--dataset", "dataset_dir", type=click.Path(path_type=Path), default=None,
              help="Train on what export-dataset wrote (its labels and/or rewards, features "
                   "included): nothing compiled, no config.  Not with --labels or --rewards.")
@click.option("--model", default="ridge", show_default=True,
              help="Whose rewards: a model assign-rewards fitted.")
@click.option("--hyper", default="best", show_default=True,
              help="Hyperparameters (a directory name such as gamma0.8-alpha0.01-log), or "
                   "best: per benchmark, the best mean held-out R^2.")
@click.option("--threshold", type=FiniteFloatRange(0), default=DEFAULT_THRESHOLD,
              show_default=True, help="Rewards: |net reward| at or below this: does not "
                                      "matter.")
@click.option("--label-threshold", type=FiniteFloatRange(0), default=DEFAULT_LABEL_THRESHOLD,
              show_default=True, help="Labels: |effect| (log speedup) at or below this: does "
                                      "not matter.")
@click.option("--margin", type=FiniteFloatRange(0, 1), default=DEFAULT_MARGIN,
              show_default=True,
              help="Guard rail: the policy overrules the heuristic only where the model's "
                   "probability of its answer exceeds that of the heuristic's action by at "
                   "least this (0: always).")
@click.option("--ranges/--no-ranges", default=True, show_default=True,
              help="Guard rail: a site with a feature outside its training range gets "
                   "default.")
@click.option("--growth-budget", type=_GrowthBudget(), default=DEFAULT_GROWTH_BUDGET,
              show_default=True,
              help="Guard rail: the most the policy's inline answers where the heuristic "
                   "did not inline may add to one function in one round, in callee_size "
                   "units (beyond it: default); 0 or none: no budget.")
@click.option("--classifier", type=click.Choice(["all", *CLASSIFIERS]), default="all",
              show_default=True, help="all: validate each, keep the best.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("policy.policy"),
              show_default=True, help="The policy file to write.")
@click.option("--validate", type=click.Choice(["labels", "measured"]), default="labels",
              show_default=True,
              help="labels: held-out label accuracy only.  measured: also compile each "
                   "fold's policy into its held-out benchmark and measure it against the "
                   "heuristic; keep the classifier whose worst held-out speedup is best; "
                   "FAIL (exit 3, the file still written) below --gate.")
@click.option("--gate", type=FiniteFloatRange(0, min_open=True),
              default=GATE, show_default=True,
              help="--validate measured: the lowest worst held-out speedup that passes.")
@click.option("--size", help="--validate measured: benchmark size (default: config).")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="--validate measured: fewest pairs per comparison (default: config "
                   "run.runs).")
@click.option("--max-pairs", type=click.IntRange(1, MAX_RUNS),
              help="--validate measured: most pairs per comparison (default: config "
                   "measure.max_pairs).")
@click.option("--config", "config_path", type=click.Path(path_type=Path))
@click.option("--require-sign-agreement", "agreement", is_flag=True,
              help="Labels (--labels, or a dataset's): a wall-time effect that is "
                   "significant and beyond --label-threshold gives a label only where the "
                   "same flip's cycles effect (cycles_effect) agrees in sign; otherwise the "
                   "row says nothing.")
@backend_errors_in_one_line
def train_policy(benchmarks, labels_dir, rewards_dir, dataset_dir, model, hyper, threshold,
                 label_threshold, margin, ranges, growth_budget, classifier, out, validate,
                 gate, size, runs, max_pairs, config_path, agreement) -> None:
    """Train an inlining policy on the rewards or measured labels of BENCHMARKS (default:
    every one there)."""
    ctx = click.get_current_context()
    named = {o: v for o, v in (("model", model), ("hyper", hyper))
             if ctx.get_parameter_source(o) != click.core.ParameterSource.DEFAULT}
    request = TrainingRequest(
        tuple(benchmarks), labels_dir, rewards_dir, dataset_dir, model, hyper, threshold,
        label_threshold, margin, ranges, growth_budget,
        tuple(CLASSIFIERS) if classifier == "all" else (classifier,), out,
        validate == "measured", gate, size, runs, max_pairs, config_path, named, agreement)
    show_warnings()
    try:
        passed = _train(request)
    except InputError as exc:
        fail(str(exc))
    if not passed:
        sys.exit(EXIT_GATE)


def _train(request: TrainingRequest) -> bool:
    """Each step of ``pipeline.policy.training`` in turn, worded as it ends; whether the kept
    policy passed its gate (True without one)."""
    plan = plan_training(request)
    table = training_table(plan)
    _word_table(table)
    classifiers = list(request.classifiers)
    held = label_scores(plan, table)
    scores, chosen = held.scores, held.chosen
    report_validation(scores, chosen, table.ts.labels, table.trained_on, table.labelled)
    measured: MeasuredChoice | None = None
    if request.measured:
        measured = measured_choice(plan, table, held)
        for line in measured.lost_workers:
            click.echo(line, err=True)
        report_measures(measured.measures, scores, classifiers)
        if measured.by_measure is not None and measured.by_measure != chosen:
            click.echo(f"kept {measured.by_measure}, not {chosen}: its worst held-out measured "
                       "speedup is the best (label accuracy chose the other)")
        chosen, scores = measured.chosen, measured.scores
    policy = write_policy(plan, table, chosen, scores)
    click.echo(f"{chosen} trained on {', '.join(policy.benchmarks)}: {request.out}")
    if measured is not None:
        click.echo(measured.gate_line, err=not measured.passed)
        return measured.passed
    return True


def _word_table(table: TrainingTable) -> None:
    """What each labels table gave, where labels and rewards met, and the sites trained on."""
    for r in table.labels_read:
        featureless = (f", {r.featureless} without features (not in the heuristic build) "
                       "left out" if r.featureless else "")
        click.echo(f"labels {r.benchmark}: {r.rows} rows, {r.measured} measured; "
                   f"{r.sites} sites labelled ("
                   + ", ".join(f"{r.counts.get(k, 0)} {k}" for k in LABELS)
                   + f"), {r.unmeasured} without a measured row left out" + featureless
                   + (f"; {r.disagree} measured row(s) set aside: a significant wall effect "
                      "without a cycles effect of its sign" if r.disagree else ""))
    if table.both is not None:
        both, disagree = table.both
        click.echo(f"labels and rewards: {both} sites labelled by both (the measured label "
                   f"kept; {disagree} of them disagree)")
    counts = table.ts.labels.value_counts()
    click.echo(f"{len(table.ts.labels)} call sites from {len(table.trained_on)} benchmark(s): "
               + ", ".join(f"{counts.get(k, 0)} {k}" for k in LABELS))


def report_validation(scores: pd.DataFrame, chosen: str, labels: pd.Series,
                      benchmarks: list[str], labelled: list[str] | None) -> None:
    """The held-out scores: the mean per classifier, the chosen one's per benchmark and
    overall, and one line when the overall figure is not above chance or there is none.
    ``labelled``: the benchmarks with measured labels (None: no labels given)."""
    if labelled is not None and len(labelled) < 2:
        names = f" ({', '.join(labelled)})" if labelled else ""
        what = ("no leave-one-benchmark-out figure" if len(benchmarks) < 2 else
                "no leave-one-benchmark-out figure for the measured labels alone")
        click.echo(f"fewer than 2 benchmarks have measured labels{names}: {what}", err=True)
    table = summary(scores)
    if table.empty:
        if labelled is None or len(labelled) >= 2:
            click.echo("one benchmark: no validation on a benchmark left out", err=True)
        return
    click.echo("held out one benchmark at a time (balanced accuracy over the pooled "
               "held-out sites, the others a mean over benchmarks):")
    click.echo(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    mine = scores[scores["classifier"] == chosen]
    click.echo(f"{chosen}, each benchmark held out:")
    for r in mine.itertuples():
        click.echo(f"  {r.held_out}: {r.sites} sites, balanced accuracy "
                   f"{r.balanced_accuracy:.3f}, accuracy {r.accuracy:.3f}, opposite "
                   f"{r.opposite:.3f}")
    overall = pooled_balanced_accuracy(mine)
    classes = int(labels.nunique())
    chance = 1 / classes
    click.echo(f"{chosen} overall: balanced accuracy {overall:.3f} over the {int(mine.sites.sum())}"
               f" sites of {len(mine)} benchmarks held out, pooled (chance {chance:.3f}: "
               f"{classes} label(s) present)")
    if overall <= chance:
        click.echo(f"not above chance: {chosen}'s balanced accuracy on benchmarks left out, "
                   f"{overall:.3f}, is not above {chance:.3f} (1/{classes} labels present)",
                   err=True)


def report_measures(measures: list[FoldMeasure], scores: pd.DataFrame,
                    classifiers: list[str]) -> None:
    """Per classifier and held-out benchmark: label accuracy beside the measured speedup;
    then per classifier its worst and geometric mean held-out speedup."""
    acc = {(r.classifier, r.held_out): r.balanced_accuracy for r in scores.itertuples()}
    click.echo("measured, each benchmark held out (speedup = heuristic time / fold policy "
               "time, paired, 95% interval; binary size relative to the heuristic's):")
    click.echo(f"  {'classifier':10} {'held out':20} {'bal.acc':>7}  {'speedup [95% CI]':24} "
               f"{'size':>6} pairs")
    for m in sorted(measures, key=lambda m: (classifiers.index(m.classifier), m.held_out)):
        a = acc.get((m.classifier, m.held_out), math.nan)
        ratio = m.figure.size_ratio
        size = f"{ratio:.3f}" if ratio is not None else "-"
        click.echo(f"  {m.classifier:10} {m.held_out:20} {a:7.3f}  {m.text():24} "
                   f"{size:>6} {m.figure.pairs}")
    for name in classifiers:
        mine = [m for m in measures if m.classifier == name]
        w = worst(mine)
        if w is None:
            missing = ", ".join(m.held_out for m in mine if not m.measured)
            click.echo(f"{name}: no worst held-out speedup (not measured: {missing})")
        else:
            click.echo(f"{name}: worst held-out measured speedup {w.text()} ({w.held_out}); "
                       f"geometric mean {geomean_text(mine)} over {len(mine)} benchmarks")


def main() -> None:
    train_policy(prog_name=PROG)
