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

import math
from pathlib import Path

import click

from analysis.dataset import INDEX, Built
from analysis.label_training import DEFAULT_LABEL_THRESHOLD
from commands.common import backend_errors_in_one_line, fail, show_warnings
from pipeline.policy.export import ExportRequest, export
from pipeline.policy.inputs import DEFAULT_THRESHOLD, InputError

PROG = "export-dataset"


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
    request = ExportRequest(tuple(benchmarks), labels_dir, rewards_dir, model, hyper,
                            label_threshold, threshold, tuple(Path(r) for r in rundirs),
                            batch_log, config_path, out)
    show_warnings()
    try:
        built = export(request)
    except InputError as exc:
        fail(str(exc))
    _word(built, out, label_threshold)


def _word(built: Built, out: Path, label_threshold: float) -> None:
    """A line per benchmark on what went in, then the dataset's files and size."""
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
