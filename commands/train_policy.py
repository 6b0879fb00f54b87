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

``analysis.policy_training`` validates leave-one-benchmark-out and trains; the policy file
(``dispatcher.build.policy_file``: plain data, with the guard rails ``--margin``,
``--ranges`` and ``--growth-budget``) goes to ``--out`` with the validation scores beside it
(``<out>.scores.csv``).

``--validate measured`` also compiles each fold's policy into its held-out benchmark and
measures it against the heuristic (``commands.policy_validation``): the classifier kept is the
one whose worst held-out measured speedup is best, and below ``--gate`` (0.95) the command
still writes the file but says FAIL and exits 3.
"""
from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import pandas as pd

from analysis.dataset import Dataset, DatasetError, read_dataset
from analysis.dataset import best_hyper as best_hyperparameters
from analysis.label_training import (
    DEFAULT_LABEL_THRESHOLD,
    LabelsError,
    label_sites,
    labelled_benchmarks,
    read_sites_table,
    table_path,
)
from analysis.policy_training import (
    CLASSIFIERS,
    KEY,
    LABELS,
    TrainingError,
    choose,
    combine,
    encode,
    leave_one_benchmark_out,
    pooled_balanced_accuracy,
    reward_sites,
    summary,
    train,
)
from analysis.sources import SourcesError, benchmark_of
from commands import policy_validation as measured
from commands.common import backend_errors_in_one_line, show_warnings
from dispatcher.build.manifest import Benchmark, ManifestError, Size, resolve_benchmark
from dispatcher.build.policy_file import (
    DEFAULT_GROWTH_BUDGET,
    DEFAULT_MARGIN,
    MAX_GROWTH_BUDGET,
    save_policy_file,
)
from dispatcher.build.service import CompileError, CompileJob
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import MAX_RUNS, Config, ConfigError, load_config
from dispatcher.core.files import atomic_output
from dispatcher.session import Session
from dispatcher.storage.store import StoreError

PROG = "train-policy"
DEFAULT_THRESHOLD = 0.005  # net reward (log speedup with the default target): half a percent


def _fail(message: str) -> NoReturn:
    click.echo(f"{PROG}: {message}", err=True)
    sys.exit(2)


def best_hyper(bench_dir: Path, model: str) -> str:
    """The hyperparameters of ``model`` with the best mean held-out score (fits.csv)."""
    fits_path = bench_dir / "fits.csv"
    try:
        fits = pd.read_csv(fits_path)
    except (OSError, ValueError) as exc:
        _fail(f"{fits_path}: unreadable ({exc})")
    chosen = best_hyperparameters(fits, model)  # the rule export-dataset shares
    if chosen is None:
        _fail(f"{fits_path}: no fit of model {model}")
    return chosen


def read_rewards(rewards: Path, name: str, model: str, hyper: str) -> pd.DataFrame:
    slug = best_hyper(rewards / name, model) if hyper == "best" else hyper
    path = rewards / name / model / slug / "rewards.csv"
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        _fail(f"{path}: no such rewards table (assign-rewards writes one per model and "
              "hyperparameters)")
    except (OSError, ValueError) as exc:
        _fail(f"{path}: unreadable ({exc})")


def site_features(session: Session, bench: Benchmark) -> pd.DataFrame:
    """One row per decision of the heuristic build: unit, round, key and its features."""
    try:
        built = session.builds.compile(CompileJob(bench))
    except (CompileError, StoreError) as exc:
        _fail(f"{bench.name}: {exc}")
    rows = []
    for dump in built.artifact.dumps():
        for d in dump.decisions:
            if d.features is not None:
                rows.append({"unit": d.unit, "round": d.round, "key": d.key,
                             **d.features.row()})
    if not rows:
        _fail(f"{bench.name}: its decision dumps carry no features (dump version 2 needed: "
              "rebuild the compiler with compiler/build)")
    return pd.DataFrame(rows)


class _FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses nan and the infinities: ``nan`` compares false with every
    bound, so a plain range lets it through (and every label would be nonsense)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


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


def read_labels(labels_dir: Path | None, names: list[str], threshold: float,
                dataset: Dataset | None = None) -> pd.DataFrame:
    """The labelled sites of each benchmark's labels table (``analysis.label_training``), one
    line per benchmark on what its table gave; with ``dataset``, the tables it holds."""
    parts = []
    for n in names:
        if dataset is not None:
            table = dataset.labels_table(n)
        else:
            assert labels_dir is not None
            path = table_path(labels_dir, n)
            if path is None:
                _fail(f"{labels_dir / n}: no labels table (expected sites.parquet or "
                      "sites.csv, as measure-sites writes)")
            try:
                table = read_sites_table(path)
            except LabelsError as exc:
                _fail(str(exc))
        sites, left_out = label_sites(table, threshold)
        sites = sites.assign(benchmark=n)
        counts = sites["label"].value_counts()
        measured = int((table["status"] == "measured").sum())
        featureless = (f", {left_out['featureless']} without features (not in the heuristic "
                       "build) left out" if left_out["featureless"] else "")
        click.echo(f"labels {n}: {len(table)} rows, {measured} measured; {len(sites)} sites "
                   "labelled (" + ", ".join(f"{counts.get(k, 0)} {k}" for k in LABELS)
                   + f"), {left_out['unmeasured']} without a measured row left out"
                   + featureless)
        parts.append(sites)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


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
@click.option("--threshold", type=_FiniteFloatRange(0), default=DEFAULT_THRESHOLD,
              show_default=True, help="Rewards: |net reward| at or below this: does not "
                                      "matter.")
@click.option("--label-threshold", type=_FiniteFloatRange(0), default=DEFAULT_LABEL_THRESHOLD,
              show_default=True, help="Labels: |effect| (log speedup) at or below this: does "
                                      "not matter.")
@click.option("--margin", type=_FiniteFloatRange(0, 1), default=DEFAULT_MARGIN,
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
@click.option("--gate", type=_FiniteFloatRange(0, min_open=True),
              default=measured.GATE, show_default=True,
              help="--validate measured: the lowest worst held-out speedup that passes.")
@click.option("--size", help="--validate measured: benchmark size (default: config).")
@click.option("--runs", type=click.IntRange(1, MAX_RUNS),
              help="--validate measured: fewest pairs per comparison (default: config "
                   "run.runs).")
@click.option("--max-pairs", type=click.IntRange(1, MAX_RUNS),
              help="--validate measured: most pairs per comparison (default: config "
                   "measure.max_pairs).")
@click.option("--config", "config_path", type=click.Path(path_type=Path))
@backend_errors_in_one_line
def train_policy(benchmarks, labels_dir, rewards_dir, dataset_dir, model, hyper, threshold,
                 label_threshold, margin, ranges, growth_budget, classifier, out, validate,
                 gate, size, runs, max_pairs, config_path) -> None:
    """Train an inlining policy on the rewards or measured labels of BENCHMARKS (default:
    every one there)."""
    dataset: Dataset | None = None
    if dataset_dir is not None:
        if labels_dir is not None or rewards_dir is not None:
            _fail("--dataset: not with --labels or --rewards (a dataset holds the labels and "
                  "rewards it was exported from)")
        try:
            dataset = read_dataset(dataset_dir)
        except DatasetError as exc:
            _fail(str(exc))
        ctx = click.get_current_context()
        for option, asked, held in (("model", model, dataset.model),
                                    ("hyper", hyper, dataset.hyper)):
            named = ctx.get_parameter_source(option) != click.core.ParameterSource.DEFAULT
            if named and dataset.has_rewards and asked != held:
                _fail(f"--{option} {asked}: {dataset_dir} holds the rewards of --{option} "
                      f"{held} (export-dataset chose them; export again for others)")
            if named and not dataset.has_rewards:
                _fail(f"--{option}: {dataset_dir} holds no rewards")
    elif labels_dir is None and rewards_dir is None:
        rewards_dir = Path("rewards")
    if validate != "measured":
        given = [o for o, v in (("--size", size), ("--runs", runs), ("--max-pairs", max_pairs),
                                ("--gate", None if gate == measured.GATE else gate))
                 if v is not None]
        if given:
            _fail(f"{', '.join(given)}: only with --validate measured (they set how the "
                  "held-out policies are measured)")
    # Where the policy goes, checked before any training: a wrong --out fails at once, in
    # one line, not after the folds (and their lines) have run.
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _fail(f"{out}: cannot write the policy ({exc.strerror or exc})")
    if not os.access(out.parent, os.W_OK):
        _fail(f"{out}: cannot write the policy (its directory is not writable)")
    known_labels: list[str] = []
    if dataset is not None:
        known_labels = dataset.labelled
    elif labels_dir is not None:
        if not labels_dir.is_dir():
            _fail(f"{labels_dir}: no such labels directory (measure-sites writes one table "
                  "per benchmark there)")
        known_labels = labelled_benchmarks(labels_dir)
    known_rewards: list[str] = []
    if dataset is not None:
        known_rewards = dataset.rewarded
    elif rewards_dir is not None:
        if not rewards_dir.is_dir():
            _fail(f"{rewards_dir}: no such rewards directory (assign-rewards --out writes "
                  "one)")
        known_rewards = sorted(p.name for p in rewards_dir.iterdir()
                               if (p / "sources.json").is_file())
    known = sorted(set(known_labels) | set(known_rewards))
    # with a dataset, trained as from the labels and/or rewards it was exported from
    with_labels = labels_dir is not None or (dataset is not None and dataset.has_labels)
    for b in benchmarks:
        if b not in known:
            wheres = []
            if dataset_dir is not None:
                wheres.append(f"{dataset_dir / b}/sites.parquet with labels or rewards")
            if labels_dir is not None:
                wheres.append(f"{labels_dir / b}/sites.parquet or sites.csv")
            if rewards_dir is not None:
                wheres.append(f"{rewards_dir / b}/sources.json")
            where = " or ".join(wheres)
            _fail(f"unknown benchmark {b}: no {where} (benchmarks there: "
                  f"{', '.join(known) or 'none'})")
    names = list(benchmarks) or known
    if not names:
        if dataset_dir is not None:
            _fail(f"{dataset_dir}: no benchmark's labels or rewards there")
        if rewards_dir is None:
            _fail(f"{labels_dir}: no benchmark's labels there (expected "
                  "<bench>/sites.parquet or <bench>/sites.csv, as measure-sites writes)")
        _fail(f"{rewards_dir}: no benchmark's rewards there")
    label_names = [n for n in names if n in known_labels]
    reward_names = [n for n in names if n in known_rewards]
    # --validate measured compiles every held-out benchmark: each must name a program, and the
    # config and size must be good, before anything is trained
    programs: dict[str, Benchmark] = {}
    sizes: dict[str, Size] = {}
    config: Config | None = None
    if validate == "measured":
        try:
            config = load_config(config_path)
        except ConfigError as exc:
            _fail(str(exc))
        programs = held_out_programs(names, reward_names, rewards_dir,
                                     labels_dir or dataset_dir)
        try:
            sizes = {n: b.size(size or config.run.size) for n, b in programs.items()}
        except ManifestError as exc:
            _fail(str(exc))
    labelled = pd.DataFrame()
    if with_labels:
        labelled = read_labels(labels_dir, label_names, label_threshold, dataset)
    rewarded = pd.DataFrame()
    if reward_names and dataset is not None:
        try:
            rewarded = reward_sites({n: dataset.rewards_table(n) for n in reward_names},
                                    {n: dataset.build_features(n) for n in reward_names},
                                    threshold)
        except TrainingError as exc:
            _fail(str(exc))
    elif reward_names:
        assert rewards_dir is not None
        rewarded = reward_table(rewards_dir, reward_names, model, hyper, threshold,
                                config_path)
    if not with_labels:
        sites = rewarded
    else:
        sites = combine(labelled, rewarded)
        if not len(sites):
            _fail(f"{labels_dir or dataset_dir}: no site has a label (in the tables of "
                  f"{', '.join(label_names)}: no site with a measured row and features)")
        if len(labelled) and len(rewarded):
            both = labelled.merge(rewarded, on=["benchmark", *KEY], suffixes=("", "_r"))
            click.echo(f"labels and rewards: {len(both)} sites labelled by both (the measured "
                       f"label kept; {int((both['label'] != both['label_r']).sum())} of them "
                       "disagree)")
    ts = encode(sites)
    counts = ts.labels.value_counts()
    trained_on = sorted(ts.benchmarks.unique())
    click.echo(f"{len(ts.labels)} call sites from {len(trained_on)} benchmark(s): "
               + ", ".join(f"{counts.get(k, 0)} {k}" for k in LABELS))
    names_to_try = list(CLASSIFIERS) if classifier == "all" else [classifier]
    scores = pd.concat([leave_one_benchmark_out(ts, c) for c in names_to_try],
                       ignore_index=True)
    chosen = choose(scores, names_to_try)
    have_labels = None
    if with_labels:
        have_labels = sorted(set(labelled["benchmark"])) if len(labelled) else []
    report_validation(scores, chosen, ts.labels, trained_on, have_labels)
    used_threshold = threshold if not with_labels or reward_names else label_threshold
    gate_result: tuple[bool, str] | None = None
    if validate == "measured":
        assert config is not None
        if len(trained_on) < 2:
            _fail("--validate measured: fewer than 2 benchmarks have labelled sites "
                  f"({', '.join(trained_on)}): no fold has a benchmark left out to measure")
        try:
            folds = measured.fold_policies(
                ts, names_to_try, used_threshold, out.with_name(out.name + ".folds"),
                margin=margin, ranges=ranges, growth_budget=growth_budget)
        except TrainingError as exc:
            _fail(str(exc))
        except OSError as exc:
            _fail(f"{out}.folds: cannot write the fold policies ({exc.strerror or exc})")
        try:
            measures = measured.measure_folds(config, folds, programs, sizes,
                                              runs or config.run.runs, max_pairs)
        except (CompilerNotFound, StoreError) as exc:
            _fail(str(exc))
        measured.report(measures, scores, names_to_try)
        by_measure = measured.choose_measured(measures, names_to_try)
        if by_measure is not None and by_measure != chosen:
            click.echo(f"kept {by_measure}, not {chosen}: its worst held-out measured speedup "
                       "is the best (label accuracy chose the other)")
        chosen = by_measure or chosen
        gate_result = measured.gate_line(chosen, measures, gate)
        scores = measured.scores_with_measures(scores, measures)
    try:
        policy = train(ts, chosen, used_threshold, margin=margin, ranges=ranges,
                       growth_budget=growth_budget)
    except TrainingError as exc:
        _fail(str(exc))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_policy_file(policy, out)
        if not scores.empty:
            with atomic_output(out.with_name(out.name + ".scores.csv")) as tmp:
                scores.drop(columns=["truth", "predicted"], errors="ignore").to_csv(
                    tmp, index=False)
    except OSError as exc:
        _fail(f"{out}: cannot write the policy ({exc.strerror or exc})")
    click.echo(f"{chosen} trained on {', '.join(policy.benchmarks)}: {out}")
    if gate_result is not None:
        passed, line = gate_result
        click.echo(line, err=not passed)
        if not passed:
            sys.exit(measured.EXIT_GATE)


def held_out_programs(names: list[str], reward_names: list[str], rewards_dir: Path | None,
                      labels_dir: Path | None) -> dict[str, Benchmark]:
    """The program of each benchmark, for --validate measured: a rewards benchmark's from its
    sources.json (or the bundled one of its name), a labels-only one the bundled benchmark of
    its name."""
    out = {}
    for n in names:
        try:
            if n in reward_names and rewards_dir is not None:
                out[n] = benchmark_of(rewards_dir, n)[0]
            else:
                out[n] = resolve_benchmark(n)
        except (SourcesError, ManifestError) as exc:
            if n in reward_names:
                _fail(f"--validate measured compiles each held-out benchmark: {exc}")
            _fail(f"{labels_dir / n if labels_dir else n}: --validate measured compiles each "
                  f"held-out benchmark, and {n} is not the name of a bundled one")
    return out


def reward_table(rewards_dir: Path, names: list[str], model: str, hyper: str,
                 threshold: float, config_path: Path | None) -> pd.DataFrame:
    """The reward-labelled sites of ``names``, their features from the heuristic builds
    (compiled, or taken from the store)."""
    rewards = {n: read_rewards(rewards_dir, n, model, hyper) for n in names}
    try:
        session = Session(load_config(config_path))
    except (ConfigError, CompilerNotFound, StoreError) as exc:
        raise click.ClickException(str(exc)) from None
    show_warnings()
    with session:
        features = {}
        for n in names:
            try:
                bench = benchmark_of(rewards_dir, n)[0]
            except (SourcesError, ManifestError) as exc:
                _fail(str(exc))
            features[n] = site_features(session, bench)
    try:
        return reward_sites(rewards, features, threshold)
    except TrainingError as exc:
        _fail(str(exc))


def main() -> None:
    train_policy(prog_name=PROG)
