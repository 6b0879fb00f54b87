"""``export-dataset``: the training data as one dataset anyone can reload
(``analysis.dataset``; docs/dataset.md): per benchmark ``sites.parquet`` (features, labels with
their intervals, rewards) and ``trees.parquet`` (the trees a search measured, with their
speedups), and ``dataset.json``.

Labels come from ``--labels DIR`` (the tables ``measure-sites`` writes), rewards from
``--rewards DIR`` (``assign-rewards``; ``--model`` and ``--hyper`` choose them as
``train-policy`` does, and the heuristic builds are compiled for their features, which the
dataset then carries), trees from ``--rundir``/``--batch-log`` (search rundirs; labels rundirs
in a batch log are passed over: their labels are in the tables).  ``train-policy --dataset
DIR`` trains from the dataset alone, the same policy file as from these inputs.
"""
from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path
from typing import NoReturn

import click
import pandas as pd

from analysis.batch_log import AnalysisError, load_batch_log, resolve_rundir
from analysis.dataset import (
    INDEX,
    DatasetError,
    LabelsInput,
    RewardsInput,
    Sources,
    TreesInput,
    best_hyper,
    build_dataset,
    rundir_settings,
    write_dataset,
)
from analysis.label_training import (
    DEFAULT_LABEL_THRESHOLD,
    LabelsError,
    labelled_benchmarks,
    read_sites_table,
    table_path,
)
from analysis.sources import SOURCES, SourcesError, benchmark_of
from commands.common import backend_errors_in_one_line, show_warnings
from commands.train_policy import DEFAULT_THRESHOLD
from dispatcher.build.manifest import ManifestError
from dispatcher.build.service import CompileError, CompileJob
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import ConfigError, load_config
from dispatcher.core.decisions import feature_rows
from dispatcher.core.site_records import is_sites_rundir
from dispatcher.storage.store import StoreError

PROG = "export-dataset"


def _fail(message: str) -> NoReturn:
    click.echo(f"{PROG}: {message}", err=True)
    sys.exit(2)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_labels(labels_dir: Path, names: list[str]) -> dict[str, LabelsInput]:
    out = {}
    for n in names:
        path = table_path(labels_dir, n)
        assert path is not None  # labelled_benchmarks found it
        try:
            out[n] = LabelsInput(read_sites_table(path), path.name, _sha256(path))
        except LabelsError as exc:
            _fail(str(exc))
        except OSError as exc:
            _fail(f"{path}: unreadable ({exc.strerror or exc})")
    return out


def read_rewards(rewards_dir: Path, names: list[str], model: str, hyper: str,
                 config_path: Path | None) -> dict[str, RewardsInput]:
    """Each benchmark's rewards (model and hyperparameters chosen as train-policy chooses
    them) and the features of its heuristic build (compiled, or taken from the store)."""
    tables: dict[str, tuple[str, pd.DataFrame, str]] = {}
    for n in names:
        slug = hyper
        if hyper == "best":
            fits_path = rewards_dir / n / "fits.csv"
            try:
                chosen = best_hyper(pd.read_csv(fits_path), model)
            except (OSError, ValueError, KeyError) as exc:
                _fail(f"{fits_path}: unreadable ({exc}; expected the fits.csv assign-rewards "
                      "writes)")
            if chosen is None:
                _fail(f"{fits_path}: no fit of model {model}")
            slug = chosen
        path = rewards_dir / n / model / slug / "rewards.csv"
        try:
            tables[n] = (slug, pd.read_csv(path), _sha256(path))
        except FileNotFoundError:
            _fail(f"{path}: no such rewards table (assign-rewards writes one per model and "
                  "hyperparameters)")
        except (OSError, ValueError) as exc:
            _fail(f"{path}: unreadable ({exc})")
    from dispatcher.session import Session
    try:
        session = Session(load_config(config_path))
    except (ConfigError, CompilerNotFound, StoreError) as exc:
        _fail(str(exc))
    show_warnings()
    out = {}
    with session:
        for n, (slug, table, digest) in tables.items():
            try:
                bench = benchmark_of(rewards_dir, n)[0]
                built = session.builds.compile(CompileJob(bench))
            except (SourcesError, ManifestError, CompileError, StoreError) as exc:
                _fail(f"{n}: {exc}")
            rows = feature_rows(built.artifact.dumps())
            if not rows:
                _fail(f"{n}: its decision dumps carry no features (dump version 2 needed: "
                      "rebuild the compiler with compiler/build)")
            out[n] = RewardsInput(table, slug, digest, pd.DataFrame(rows))
    return out


def read_trees(rundirs: list[Path], names: set[str] | None) -> dict[str, TreesInput]:
    """The measured candidates of the search rundirs, per benchmark (``analysis.extract``)."""
    from analysis.extract import ExtractError, extract
    for r in rundirs:
        if not (r / "journal.jsonl").is_file():
            _fail(f"{r}: not a rundir (no journal.jsonl)")
    try:
        found = extract(rundirs)
    except ExtractError as exc:
        _fail(str(exc))
    return {b: TreesInput(c.table, {d: list(t.decisions()) for d, t in c.trees.items()})
            for b, c in found.items() if names is None or b in names}


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{math.ceil(n / 1e3)} KB"


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("benchmarks", nargs=-1)
@click.option("--labels", "labels_dir", type=click.Path(path_type=Path),
              help="The labels tables measure-sites wrote: DIR/<bench>/sites.parquet (or "
                   "sites.csv).")
@click.option("--rewards", "rewards_dir", type=click.Path(path_type=Path),
              help="What assign-rewards wrote (its --out); the heuristic builds are compiled "
                   "for their features (--config).")
@click.option("--model", default="ridge", show_default=True,
              help="--rewards: whose rewards (a model assign-rewards fitted).")
@click.option("--hyper", default="best", show_default=True,
              help="--rewards: hyperparameters (a directory name), or best: per benchmark, "
                   "the best mean held-out R^2 (as train-policy chooses).")
@click.option("--label-threshold", type=click.FloatRange(0), default=DEFAULT_LABEL_THRESHOLD,
              show_default=True,
              help="The stored label column: |effect| (log speedup) at or below this does not "
                   "matter.  (train-policy --dataset labels again at its own.)")
@click.option("--threshold", type=click.FloatRange(0), default=DEFAULT_THRESHOLD,
              show_default=True,
              help="The stored reward_label column: |net reward| at or below this does not "
                   "matter.")
@click.option("--rundir", "rundirs", multiple=True, type=click.Path(path_type=Path),
              help="A search rundir whose measured trees go in (repeatable).")
@click.option("--batch-log", type=click.Path(dir_okay=False, path_type=Path),
              help="Take the trees of every search rundir this batch log lists.")
@click.option("--config", "config_path", type=click.Path(path_type=Path),
              help="--rewards: the config whose compiler and store build the heuristic "
                   "builds.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("results/dataset"), show_default=True,
              help="The dataset directory (new, empty, or a dataset to replace).")
@backend_errors_in_one_line
def export_dataset(benchmarks, labels_dir, rewards_dir, model, hyper, label_threshold,
                   threshold, rundirs, batch_log, config_path, out) -> None:
    """Export the labels, rewards and measured trees of BENCHMARKS (default: every one
    there) as a dataset: DIR/<bench>/sites.parquet, trees.parquet and DIR/dataset.json."""
    if labels_dir is None and rewards_dir is None and not rundirs and batch_log is None:
        _fail("nothing to export: give --labels, --rewards, --rundir or --batch-log")
    for t in (label_threshold, threshold):
        if not math.isfinite(t):
            _fail(f"threshold {t}: expected a finite number")
    labels_names: list[str] = []
    if labels_dir is not None:
        if not labels_dir.is_dir():
            _fail(f"{labels_dir}: no such labels directory (measure-sites writes one table "
                  "per benchmark there)")
        labels_names = labelled_benchmarks(labels_dir)
        if not labels_names:
            _fail(f"{labels_dir}: no benchmark's labels there (expected <bench>/sites.parquet "
                  "or <bench>/sites.csv, as measure-sites writes)")
    reward_names: list[str] = []
    if rewards_dir is not None:
        if not rewards_dir.is_dir():
            _fail(f"{rewards_dir}: no such rewards directory (assign-rewards --out writes "
                  "one)")
        reward_names = sorted(p.name for p in rewards_dir.iterdir()
                              if (p / SOURCES).is_file())
        if not reward_names:
            _fail(f"{rewards_dir}: no benchmark's rewards there (expected <bench>/{SOURCES}, "
                  "as assign-rewards writes)")
    paths = [Path(r) for r in rundirs]
    if batch_log is not None:
        try:
            entries = load_batch_log(batch_log)
        except AnalysisError as exc:
            _fail(str(exc))
        listed = [resolve_rundir(batch_log, e.rundir) for e in entries]
        paths += [p for p in listed if not is_sites_rundir(p)]
    paths = list(dict.fromkeys(paths))
    names = [p.name for p in paths]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        _fail(f"two rundirs named {twice[0]}: a dataset names each rundir by its name")
    known = set(labels_names) | set(reward_names)
    chosen = set(benchmarks) if benchmarks else None
    for b in benchmarks:
        if b not in known and not paths:
            _fail(f"unknown benchmark {b}: no labels or rewards of it (benchmarks there: "
                  f"{', '.join(sorted(known)) or 'none'})")
    labels = read_labels(labels_dir, [n for n in labels_names if chosen is None or n in chosen]) \
        if labels_dir is not None else {}
    trees = read_trees(paths, chosen) if paths else {}
    if chosen is not None:
        missing = sorted(chosen - known - set(trees))
        if missing:
            _fail(f"unknown benchmark {', '.join(missing)}: no labels, rewards or trees of it")
    rewards = {}
    if rewards_dir is not None:
        rewards = read_rewards(rewards_dir, [n for n in reward_names
                                             if chosen is None or n in chosen],
                               model, hyper, config_path)
    try:
        settings = {p.name: rundir_settings(p) for p in paths}
    except DatasetError as exc:
        _fail(str(exc))
    sources = Sources(
        labels=str(labels_dir) if labels_dir is not None else None,
        rewards=str(rewards_dir) if rewards_dir is not None else None,
        model=model if rewards_dir is not None else None,
        hyper=hyper if rewards_dir is not None else None,
        rundirs={n: v for n, v in settings.items()
                 if chosen is None or v["task"] in chosen},
        batch_log=batch_log.name if batch_log is not None else None,
        label_threshold=label_threshold, reward_threshold=threshold)
    try:
        built = build_dataset(labels, rewards, trees, sources)
        write_dataset(built, out)
    except DatasetError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{out}: cannot write the dataset ({exc.strerror or exc})")
    for bench, entry in built.index["benchmarks"].items():
        parts = [f"{entry['sites']} sites"] if entry["labels"] or entry["rewards"] else []
        if entry.get("labels"):
            featureless = entry["labelled_without_features"]
            parts.append(f"{entry['labels_rows']} label rows, {entry['labelled_sites']} sites "
                         f"labelled at {label_threshold:g}"
                         + (f" ({featureless} without features)" if featureless else ""))
        if entry.get("rewards"):
            parts.append(f"{entry['reward_sites']} with rewards")
        if "trees" in entry:
            parts.append(f"{entry['trees']} trees")
        click.echo(f"{bench}: " + ", ".join(parts))
    total = sum(f["bytes"] for f in built.index["files"].values())
    click.echo(f"{out}: {len(built.index['benchmarks'])} benchmarks, "
               f"{len(built.index['files'])} files, {_size(total)} ({INDEX}: the sha256 of "
               "each)")


def main() -> None:
    export_dataset(prog_name=PROG)
