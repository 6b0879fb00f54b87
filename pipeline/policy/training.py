"""``train-policy`` as steps: which sources a policy is trained on, the training table they
give, held-out validation on labels (and, asked, measured), and the kept policy written.

Each step returns a record the command words before the next starts (a user reads what was
read before the folds are measured), and raises ``InputError`` (one line) for anything the
user can fix.  Every input is checked in ``plan_training``, before anything is trained.

The training-source rules: ``--dataset`` alone, or ``--labels`` and/or ``--rewards`` (rewards
when neither is given); each named benchmark must be in one of them; labels win over rewards
where both label a site (``analysis.policy_training.combine``); a dataset trains as the
labels and/or rewards it was exported from.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.dataset import Dataset, DatasetError, read_dataset
from analysis.label_training import label_sites
from analysis.policy_training import (
    KEY,
    TrainingError,
    TrainingSet,
    choose,
    combine,
    encode,
    fold_models,
    leave_one_benchmark_out,
    train,
)
from dispatcher.build.manifest import Benchmark, ManifestError, Size
from dispatcher.build.policy_file import TrainedPolicy, policy_bytes, write_policy_bytes
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import Config, ConfigError, load_config
from dispatcher.core.files import atomic_output
from dispatcher.storage.store import StoreError
from pipeline.policy.inputs import (
    InputError,
    labels_benchmarks,
    read_labels,
    read_rewards,
    rewarded_sites,
    rewards_benchmarks,
)
from pipeline.policy.selection import GATE, FoldMeasure, choose_measured, gate_line
from pipeline.policy.validation import (
    fold_policies,
    held_out_programs,
    measure_folds,
    scores_with_measures,
)


@dataclass(frozen=True)
class TrainingRequest:
    """What ``train-policy`` was asked, as parsed."""

    benchmarks: tuple[str, ...]
    labels_dir: Path | None
    rewards_dir: Path | None
    dataset_dir: Path | None
    model: str
    hyper: str
    threshold: float  # rewards: |net reward| at or below it does not matter
    label_threshold: float  # labels: |effect| at or below it does not matter
    margin: float
    ranges: bool
    growth_budget: int | None
    classifiers: tuple[str, ...]
    out: Path
    measured: bool  # --validate measured
    gate: float = GATE
    size: str | None = None
    runs: int | None = None
    max_pairs: int | None = None
    config_path: Path | None = None
    named: Mapping[str, str] = field(default_factory=dict)  # model/hyper named on the line
    # --require-sign-agreement: a label rests on a wall effect only where its cycles effect
    # agrees in sign (analysis.label_training, "Sign agreement")
    agreement: bool = False


@dataclass(frozen=True)
class TrainingPlan:
    """The sources resolved and checked: what is trained on, and how it will be measured."""

    request: TrainingRequest
    rewards_dir: Path | None
    dataset: Dataset | None
    names: list[str]
    label_names: list[str]
    reward_names: list[str]
    with_labels: bool
    config: Config | None = None
    programs: dict[str, Benchmark] = field(default_factory=dict)
    sizes: dict[str, Size] = field(default_factory=dict)

    @property
    def labels_source(self) -> Path | None:
        """Where the labels come from, as messages name it."""
        return self.request.labels_dir or self.request.dataset_dir


@dataclass(frozen=True)
class LabelsRead:
    """What one benchmark's labels table gave."""

    benchmark: str
    rows: int
    measured: int
    sites: int  # labelled
    counts: dict[str, int]  # labelled sites per label
    unmeasured: int  # sites left out: no measured row
    featureless: int  # sites left out: not in the heuristic build
    disagree: int = 0  # measured wall-time rows set aside: wall and cycles disagree in sign


@dataclass(frozen=True)
class TrainingTable:
    """The encoded training set and what it was made of."""

    ts: TrainingSet
    threshold: float  # the one the policy records: the rewards' if any, else the labels'
    labels_read: list[LabelsRead]
    labelled: list[str] | None  # benchmarks with measured labels (None: no labels given)
    both: tuple[int, int] | None  # sites labelled by both sources, of them disagreeing

    @property
    def trained_on(self) -> list[str]:
        return sorted(self.ts.benchmarks.unique())


@dataclass(frozen=True)
class LabelScores:
    """Each classifier's leave-one-benchmark-out scores on the labels, the classifier label
    accuracy keeps, and the folds' fitted models (per classifier and held-out benchmark),
    which --validate measured exports as the fold policies instead of fitting them again."""

    scores: pd.DataFrame
    chosen: str
    models: dict[tuple[str, str], Any]


@dataclass(frozen=True)
class MeasuredChoice:
    """--validate measured: every fold measured, the classifier kept and the gate's verdict."""

    measures: list[FoldMeasure]
    by_measure: str | None  # the classifier the measures chose (None: none complete)
    chosen: str  # kept: by measure, else by label accuracy
    passed: bool
    gate_line: str
    scores: pd.DataFrame  # the held-out scores with the measured figures
    lost_workers: list[str]


# -- the plan ------------------------------------------------------------------------------

def plan_training(request: TrainingRequest) -> TrainingPlan:
    """Every input checked before anything is trained: the sources, the benchmarks named,
    where the policy goes, and for --validate measured the config, programs and size."""
    r = request
    dataset = _dataset(r) if r.dataset_dir is not None else None
    rewards_dir = r.rewards_dir
    if dataset is None and r.labels_dir is None and rewards_dir is None:
        rewards_dir = Path("rewards")
    if not r.measured:
        given = [o for o, v in (("--size", r.size), ("--runs", r.runs),
                                ("--max-pairs", r.max_pairs),
                                ("--gate", None if r.gate == GATE else r.gate)) if v is not None]
        if given:
            raise InputError(f"{', '.join(given)}: only with --validate measured (they set how "
                             "the held-out policies are measured)")
    _check_writable(r.out)
    if r.agreement and dataset is None and r.labels_dir is None:
        raise InputError("--require-sign-agreement: only with --labels or --dataset (it "
                         "judges measured labels, not rewards)")
    if r.agreement and dataset is not None and not dataset.has_labels:
        raise InputError(f"--require-sign-agreement: {r.dataset_dir} holds no labels (it "
                         "judges measured labels, not rewards)")
    if r.agreement and dataset is not None and dataset.version < 2:
        raise InputError(f"--require-sign-agreement: {r.dataset_dir} is a dataset of version "
                         f"{dataset.version}, which keeps no cycles effects: export it again "
                         "from its labels tables (export-dataset --labels)")
    known_labels = (dataset.labelled if dataset is not None else
                    labels_benchmarks(r.labels_dir) if r.labels_dir is not None else [])
    known_rewards = (dataset.rewarded if dataset is not None else
                     rewards_benchmarks(rewards_dir) if rewards_dir is not None else [])
    names = _names(r, rewards_dir, sorted(set(known_labels) | set(known_rewards)))
    plan = TrainingPlan(
        r, rewards_dir, dataset, names, [n for n in names if n in known_labels],
        [n for n in names if n in known_rewards],
        r.labels_dir is not None or (dataset is not None and dataset.has_labels))
    return _with_measuring(plan) if r.measured else plan


def _dataset(r: TrainingRequest) -> Dataset:
    if r.labels_dir is not None or r.rewards_dir is not None:
        raise InputError("--dataset: not with --labels or --rewards (a dataset holds the "
                         "labels and rewards it was exported from)")
    assert r.dataset_dir is not None
    try:
        dataset = read_dataset(r.dataset_dir)
    except DatasetError as exc:
        raise InputError(str(exc)) from None
    for option, held in (("model", dataset.model), ("hyper", dataset.hyper)):
        asked = r.named.get(option)
        if asked is not None and dataset.has_rewards and asked != held:
            raise InputError(f"--{option} {asked}: {r.dataset_dir} holds the rewards of "
                             f"--{option} {held} (export-dataset chose them; export again for "
                             "others)")
        if asked is not None and not dataset.has_rewards:
            raise InputError(f"--{option}: {r.dataset_dir} holds no rewards")
    return dataset


def _check_writable(out: Path) -> None:
    """A wrong --out fails at once, in one line, not after the folds (and their lines)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot write the policy ({exc.strerror or exc})") from None
    if not os.access(out.parent, os.W_OK):
        raise InputError(f"{out}: cannot write the policy (its directory is not writable)")


def _names(r: TrainingRequest, rewards_dir: Path | None, known: list[str]) -> list[str]:
    """The benchmarks trained on: those named, each known to a source, or every known one."""
    for b in r.benchmarks:
        if b not in known:
            wheres = []
            if r.dataset_dir is not None:
                wheres.append(f"{r.dataset_dir / b}/sites.parquet with labels or rewards")
            if r.labels_dir is not None:
                wheres.append(f"{r.labels_dir / b}/sites.parquet or sites.csv")
            if rewards_dir is not None:
                wheres.append(f"{rewards_dir / b}/sources.json")
            raise InputError(f"unknown benchmark {b}: no {' or '.join(wheres)} (benchmarks "
                             f"there: {', '.join(known) or 'none'})")
    names = list(r.benchmarks) or known
    if not names:
        if r.dataset_dir is not None:
            raise InputError(f"{r.dataset_dir}: no benchmark's labels or rewards there")
        if rewards_dir is None:
            raise InputError(f"{r.labels_dir}: no benchmark's labels there (expected "
                             "<bench>/sites.parquet or <bench>/sites.csv, as measure-sites "
                             "writes)")
        raise InputError(f"{rewards_dir}: no benchmark's rewards there")
    return names


def _with_measuring(plan: TrainingPlan) -> TrainingPlan:
    """--validate measured compiles every held-out benchmark: each must name a program, and
    the config and size must be good, before anything is trained."""
    r = plan.request
    try:
        config = load_config(r.config_path)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    programs = held_out_programs(plan.names, plan.reward_names, plan.rewards_dir,
                                 plan.labels_source)
    try:
        sizes = {n: b.size(r.size or config.run.size) for n, b in programs.items()}
    except ManifestError as exc:
        raise InputError(str(exc)) from None
    return TrainingPlan(plan.request, plan.rewards_dir, plan.dataset, plan.names,
                        plan.label_names, plan.reward_names, plan.with_labels, config,
                        programs, sizes)


# -- the training table --------------------------------------------------------------------

def training_table(plan: TrainingPlan) -> TrainingTable:
    """The labelled sites of the plan's sources, encoded: labels first, rewards beside them."""
    r = plan.request
    labelled, reads = (_labelled(plan) if plan.with_labels else (pd.DataFrame(), []))
    rewarded = pd.DataFrame()
    if plan.reward_names and plan.dataset is not None:
        names = plan.reward_names
        rewarded = rewarded_sites({n: plan.dataset.rewards_table(n) for n in names},
                                  {n: plan.dataset.build_features(n) for n in names},
                                  r.threshold)
    elif plan.reward_names:
        assert plan.rewards_dir is not None
        got = read_rewards(plan.rewards_dir, plan.reward_names, r.model, r.hyper,
                           r.config_path)
        rewarded = rewarded_sites({n: i.table for n, i in got.items()},
                                  {n: i.features for n, i in got.items()}, r.threshold)
    both = None
    if not plan.with_labels:
        sites = rewarded
    else:
        sites = combine(labelled, rewarded)
        if not len(sites):
            raise InputError(f"{plan.labels_source}: no site has a label (in the tables of "
                             f"{', '.join(plan.label_names)}: no site with a measured row and "
                             "features)")
        if len(labelled) and len(rewarded):
            j = labelled.merge(rewarded, on=["benchmark", *KEY], suffixes=("", "_r"))
            both = (len(j), int((j["label"] != j["label_r"]).sum()))
    used = r.threshold if not plan.with_labels or plan.reward_names else r.label_threshold
    have = (sorted(set(labelled["benchmark"])) if len(labelled) else []) \
        if plan.with_labels else None
    return TrainingTable(encode(sites), used, reads, have, both)


def _labelled(plan: TrainingPlan) -> tuple[pd.DataFrame, list[LabelsRead]]:
    """The labelled sites of each benchmark's labels table, and what each table gave."""
    if plan.dataset is not None:
        tables = {n: plan.dataset.labels_table(n) for n in plan.label_names}
    else:
        assert plan.request.labels_dir is not None
        tables = {n: i.table for n, i in
                  read_labels(plan.request.labels_dir, plan.label_names).items()}
    parts, reads = [], []
    for n, table in tables.items():
        if plan.request.agreement and "cycles_effect" not in table.columns and \
                plan.dataset is not None:
            raise InputError(f"{plan.labels_source}/{n}: exported from a labels table with no "
                             "cycles_effect column (measured before labels carried their "
                             "cycles effect): --require-sign-agreement cannot judge it "
                             "(measure-sites again, or add the counts: bench/label_cycles, "
                             "and export again)")
        if plan.request.agreement and "cycles_effect" not in table.columns:
            raise InputError(f"{plan.labels_source}/{n}: its labels table has no cycles_effect "
                             "column (measured before labels carried their cycles effect): "
                             "--require-sign-agreement cannot judge it (measure-sites again, "
                             "or add the counts: bench/label_cycles)")
        sites, left_out = label_sites(table, plan.request.label_threshold,
                                      plan.request.agreement)
        parts.append(sites.assign(benchmark=n))
        counts = sites["label"].value_counts()
        reads.append(LabelsRead(n, len(table), int((table["status"] == "measured").sum()),
                                len(sites), {str(k): int(v) for k, v in counts.items()},
                                left_out["unmeasured"], left_out["featureless"],
                                left_out.get("disagree", 0)))
    return (pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()), reads


# -- validation, the choice and the policy -------------------------------------------------

def label_scores(plan: TrainingPlan, table: TrainingTable) -> LabelScores:
    """Each classifier's leave-one-benchmark-out scores, and the one label accuracy keeps."""
    names = list(plan.request.classifiers)
    models: dict[tuple[str, str], Any] = {}
    parts = []
    for name in names:
        folds = fold_models(table.ts, name)
        models.update({(name, bench): m for bench, m in folds.items()})
        parts.append(leave_one_benchmark_out(table.ts, name, models=folds))
    scores = pd.concat(parts, ignore_index=True)
    return LabelScores(scores, choose(scores, names), models)


def measured_choice(plan: TrainingPlan, table: TrainingTable,
                    held: LabelScores) -> MeasuredChoice:
    """--validate measured: each fold's policy measured on its held-out benchmark; the
    classifier whose worst fold is best kept (label accuracy's choice when none is
    complete), and the gate's verdict on it."""
    r = plan.request
    assert plan.config is not None
    if len(table.trained_on) < 2:
        raise InputError("--validate measured: fewer than 2 benchmarks have labelled sites "
                         f"({', '.join(table.trained_on)}): no fold has a benchmark left out "
                         "to measure")
    try:
        folds = fold_policies(table.ts, r.classifiers, table.threshold,
                              r.out.with_name(r.out.name + ".folds"), margin=r.margin,
                              ranges=r.ranges, growth_budget=r.growth_budget,
                              models=held.models)
    except TrainingError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{r.out}.folds: cannot write the fold policies "
                         f"({exc.strerror or exc})") from None
    try:
        got = measure_folds(plan.config, folds, plan.programs, plan.sizes,
                            r.runs or plan.config.run.runs, r.max_pairs)
    except (CompilerNotFound, StoreError) as exc:
        raise InputError(str(exc)) from None
    by_measure = choose_measured(got.measures, r.classifiers)
    kept = by_measure or held.chosen
    passed, line = gate_line(kept, got.measures, r.gate)
    return MeasuredChoice(got.measures, by_measure, kept, passed, line,
                          scores_with_measures(held.scores, got.measures), got.lost_workers)


def write_policy(plan: TrainingPlan, table: TrainingTable, chosen: str,
                 scores: pd.DataFrame) -> TrainedPolicy:
    """The kept classifier trained on every site, written to --out with the scores beside
    it (``<out>.scores.csv``)."""
    r = plan.request
    try:
        policy = train(table.ts, chosen, table.threshold, margin=r.margin, ranges=r.ranges,
                       growth_budget=r.growth_budget)
    except TrainingError as exc:
        raise InputError(str(exc)) from None
    try:
        r.out.parent.mkdir(parents=True, exist_ok=True)
        write_policy_bytes(policy_bytes(policy), r.out)
        if not scores.empty:
            with atomic_output(r.out.with_name(r.out.name + ".scores.csv")) as tmp:
                scores.drop(columns=["truth", "predicted"], errors="ignore").to_csv(
                    tmp, index=False)
    except OSError as exc:
        raise InputError(f"{r.out}: cannot write the policy ({exc.strerror or exc})") from None
    return policy
