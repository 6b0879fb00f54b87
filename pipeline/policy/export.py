"""``export-dataset``: the training inputs as one dataset (``analysis.dataset``; docs/dataset.md).

Labels and rewards are read by ``pipeline.policy.inputs``, as ``train-policy`` reads them (so
``train-policy --dataset`` trains the same policy); the trees are the measured candidates of
search rundirs, given or listed in a batch log (labels rundirs there are passed over: their
labels are in the tables).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from analysis.dataset import (
    Built,
    DatasetError,
    LabelsInput,
    RewardsInput,
    Sources,
    TreesInput,
    build_dataset,
    rundir_settings,
    write_dataset,
)
from dispatcher.core.rundir import RundirError, rundirs_of_batch_log
from dispatcher.core.site_records import is_sites_rundir
from pipeline.policy.inputs import (
    InputError,
    labels_benchmarks,
    read_labels,
    read_rewards,
    rewards_benchmarks,
)


@dataclass(frozen=True)
class ExportRequest:
    """What ``export-dataset`` was asked, as parsed."""

    benchmarks: tuple[str, ...]
    labels_dir: Path | None
    rewards_dir: Path | None
    model: str
    hyper: str
    label_threshold: float
    threshold: float
    rundirs: tuple[Path, ...]
    batch_log: Path | None
    config_path: Path | None
    out: Path


def export(r: ExportRequest) -> Built:
    """The dataset of the request's inputs, written to ``r.out``; InputError (one line) for an
    input that cannot go in, before anything is written."""
    if r.labels_dir is None and r.rewards_dir is None and not r.rundirs and r.batch_log is None:
        raise InputError("nothing to export: give --labels, --rewards, --rundir or --batch-log")
    for t in (r.label_threshold, r.threshold):
        if not math.isfinite(t):
            raise InputError(f"threshold {t}: expected a finite number")
    labels_names: list[str] = []
    if r.labels_dir is not None:
        labels_names = labels_benchmarks(r.labels_dir)
        if not labels_names:
            raise InputError(f"{r.labels_dir}: no benchmark's labels there (expected "
                             "<bench>/sites.parquet or <bench>/sites.csv, as measure-sites "
                             "writes)")
    reward_names: list[str] = []
    if r.rewards_dir is not None:
        reward_names = rewards_benchmarks(r.rewards_dir)
        if not reward_names:
            raise InputError(f"{r.rewards_dir}: no benchmark's rewards there (expected "
                             "<bench>/sources.json, as assign-rewards writes)")
    paths = _rundirs(r)
    known = set(labels_names) | set(reward_names)
    chosen = set(r.benchmarks) if r.benchmarks else None
    for b in r.benchmarks:
        if b not in known and not paths:
            raise InputError(f"unknown benchmark {b}: no labels or rewards of it (benchmarks "
                             f"there: {', '.join(sorted(known)) or 'none'})")
    labels: dict[str, LabelsInput] = {}
    if r.labels_dir is not None:
        labels = read_labels(r.labels_dir, [n for n in labels_names
                                            if chosen is None or n in chosen])
    trees = _trees(paths, chosen) if paths else {}
    if chosen is not None:
        missing = sorted(chosen - known - set(trees))
        if missing:
            raise InputError(f"unknown benchmark {', '.join(missing)}: no labels, rewards or "
                             "trees of it")
    rewards: dict[str, RewardsInput] = {}
    if r.rewards_dir is not None:
        rewards = read_rewards(r.rewards_dir, [n for n in reward_names
                                               if chosen is None or n in chosen],
                               r.model, r.hyper, r.config_path)
    try:
        built = build_dataset(labels, rewards, trees, _sources(r, paths, chosen))
        write_dataset(built, r.out)
    except DatasetError as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"{r.out}: cannot write the dataset ({exc.strerror or exc})") from None
    return built


def _rundirs(r: ExportRequest) -> list[Path]:
    """The search rundirs given and listed in the batch log (its labels rundirs passed over),
    once each; two of one name are refused (a dataset names each rundir by its name)."""
    paths = list(r.rundirs)
    if r.batch_log is not None:
        try:
            listed = rundirs_of_batch_log(r.batch_log)
        except RundirError as exc:
            raise InputError(str(exc)) from None
        paths += [p for _, p in listed if not is_sites_rundir(p)]
    paths = list(dict.fromkeys(paths))
    names = [p.name for p in paths]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InputError(f"two rundirs named {twice[0]}: a dataset names each rundir by its "
                         "name")
    return paths


def _trees(rundirs: list[Path], names: set[str] | None) -> dict[str, TreesInput]:
    """The measured candidates of the search rundirs, per benchmark (``analysis.extract``)."""
    from analysis.extract import ExtractError, extract
    for r in rundirs:
        if not (r / "journal.jsonl").is_file():
            raise InputError(f"{r}: not a rundir (no journal.jsonl)")
    try:
        found = extract(rundirs)
    except ExtractError as exc:
        raise InputError(str(exc)) from None
    return {b: TreesInput(c.table, {d: list(t.decisions()) for d, t in c.trees.items()})
            for b, c in found.items() if names is None or b in names}


def _sources(r: ExportRequest, paths: list[Path], chosen: set[str] | None) -> Sources:
    """What dataset.json records of where the dataset came from."""
    try:
        settings = {p.name: rundir_settings(p) for p in paths}
    except DatasetError as exc:
        raise InputError(str(exc)) from None
    rewards = r.rewards_dir is not None
    return Sources(
        labels=str(r.labels_dir) if r.labels_dir is not None else None,
        rewards=str(r.rewards_dir) if rewards else None,
        model=r.model if rewards else None, hyper=r.hyper if rewards else None,
        rundirs={n: v for n, v in settings.items() if chosen is None or v["task"] in chosen},
        batch_log=r.batch_log.name if r.batch_log is not None else None,
        label_threshold=r.label_threshold, reward_threshold=r.threshold)
