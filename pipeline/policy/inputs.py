"""Training inputs: the one reader of the tables a policy is trained on.

``train-policy`` trains on, and ``export-dataset`` exports, the same three things: each
benchmark's labels table (``measure-sites``), its rewards for one model and hyperparameters
(``assign-rewards``), and the features of its heuristic build's call sites (the compiler's
decision dumps).  They are read here once, the same way for both, into the records of
``analysis.dataset`` (``LabelsInput``, ``RewardsInput``); a dataset written from them trains
the same policy as they do.
"""
from __future__ import annotations

import hashlib
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from analysis.dataset import LabelsInput, RewardsInput, best_hyper
from analysis.label_training import LabelsError, labelled_benchmarks, read_labels_file, table_path
from analysis.policy_training import TrainingError, reward_sites
from analysis.sources import SOURCES, SourcesError, benchmark_of
from dispatcher.build.manifest import Benchmark, ManifestError
from dispatcher.build.service import CompileError, CompileJob
from dispatcher.core.decisions import feature_rows
from dispatcher.storage.store import StoreError

if TYPE_CHECKING:
    from dispatcher.session import Session

DEFAULT_THRESHOLD = 0.005  # net reward (log speedup with the default target): half a percent
#: Columns of a feature table that describe the heuristic's decision, not the site: kept in a
#: dataset, never trained on (a policy answers before the heuristic has decided).
DECISION_COLUMNS = ("callee", "action", "reason")


class InputError(ValueError):
    """A training input that cannot be read or used; the message is one line."""


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- where the inputs are ------------------------------------------------------------------

def labels_benchmarks(labels_dir: Path) -> list[str]:
    """The benchmarks with a labels table under ``labels_dir``."""
    if not labels_dir.is_dir():
        raise InputError(f"{labels_dir}: no such labels directory (measure-sites writes one "
                         "table per benchmark there)")
    return labelled_benchmarks(labels_dir)


def rewards_benchmarks(rewards_dir: Path) -> list[str]:
    """The benchmarks ``assign-rewards`` wrote rewards for under ``rewards_dir``."""
    if not rewards_dir.is_dir():
        raise InputError(f"{rewards_dir}: no such rewards directory (assign-rewards --out "
                         "writes one)")
    return sorted(p.name for p in rewards_dir.iterdir() if (p / SOURCES).is_file())


# -- labels --------------------------------------------------------------------------------

def read_labels(labels_dir: Path, names: Sequence[str]) -> dict[str, LabelsInput]:
    """Each benchmark's labels table, checked (``read_labels_file``), with the sha256 of the
    bytes it was read from."""
    out = {}
    for n in names:
        path = table_path(labels_dir, n)
        if path is None:
            raise InputError(f"{labels_dir / n}: no labels table (expected sites.parquet or "
                             "sites.csv, as measure-sites writes)")
        try:
            table, digest = read_labels_file(path)
        except LabelsError as exc:
            raise InputError(str(exc)) from None
        out[n] = LabelsInput(table, path.name, digest)
    return out


# -- rewards -------------------------------------------------------------------------------

def chosen_hyper(rewards_dir: Path, name: str, model: str, hyper: str) -> str:
    """``hyper`` itself, or for ``best`` the hyperparameters of ``model`` with the best mean
    held-out score in the benchmark's ``fits.csv`` (``analysis.dataset.best_hyper``)."""
    if hyper != "best":
        return hyper
    fits_path = rewards_dir / name / "fits.csv"
    try:
        chosen = best_hyper(pd.read_csv(fits_path), model)
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"{fits_path}: unreadable ({exc}; expected the fits.csv "
                         "assign-rewards writes)") from None
    if chosen is None:
        raise InputError(f"{fits_path}: no fit of model {model}")
    return chosen


def read_rewards_table(rewards_dir: Path, name: str, model: str, hyper: str
                       ) -> tuple[str, pd.DataFrame, str]:
    """(hyperparameters chosen, the rewards table, its file's sha256): the file read once."""
    slug = chosen_hyper(rewards_dir, name, model, hyper)
    path = rewards_dir / name / model / slug / "rewards.csv"
    try:
        data = path.read_bytes()
        return slug, pd.read_csv(io.BytesIO(data)), _sha256(data)
    except FileNotFoundError:
        raise InputError(f"{path}: no such rewards table (assign-rewards writes one per model "
                         "and hyperparameters)") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: unreadable ({exc})") from None


def build_features(session: Session, name: str, bench: Benchmark) -> pd.DataFrame:
    """One row per decision of ``bench``'s heuristic build (compiled, or taken from the
    store) that has features: ``feature_rows``, the table a dataset keeps."""
    try:
        built = session.builds.compile(CompileJob(bench))
    except (CompileError, StoreError) as exc:
        raise InputError(f"{name}: {exc}") from None
    rows = feature_rows(built.artifact.dumps())
    if not rows:
        raise InputError(f"{name}: its decision dumps carry no features (dump version 2 "
                         "needed: rebuild the compiler with compiler/build)")
    return pd.DataFrame(rows)


def read_rewards(rewards_dir: Path, names: Sequence[str], model: str, hyper: str,
                 config_path: Path | None) -> dict[str, RewardsInput]:
    """Each benchmark's rewards and its heuristic build's features.  Every table is read
    before anything compiles, so a missing one fails at once."""
    tables = {n: read_rewards_table(rewards_dir, n, model, hyper) for n in names}
    from dispatcher.build.toolchain import CompilerNotFound
    from dispatcher.config import ConfigError, load_config
    from dispatcher.session import Session
    try:
        session = Session(load_config(config_path))
    except (ConfigError, CompilerNotFound, StoreError) as exc:
        raise InputError(str(exc)) from None
    out = {}
    with session:
        for n, (slug, table, digest) in tables.items():
            try:
                bench = benchmark_of(rewards_dir, n)[0]
            except (SourcesError, ManifestError) as exc:
                raise InputError(f"{n}: {exc}") from None
            out[n] = RewardsInput(table, slug, digest, build_features(session, n, bench))
    return out


def training_features(features: pd.DataFrame) -> pd.DataFrame:
    """A feature table as training takes it: the site's key and features only."""
    return features.drop(columns=[c for c in DECISION_COLUMNS if c in features])


def rewarded_sites(rewards: Mapping[str, pd.DataFrame], features: Mapping[str, pd.DataFrame],
                   threshold: float) -> pd.DataFrame:
    """The reward-labelled sites (``analysis.policy_training.reward_sites``) of each
    benchmark's rewards and build features."""
    try:
        return reward_sites(rewards, {n: training_features(f) for n, f in features.items()},
                            threshold)
    except TrainingError as exc:
        raise InputError(str(exc)) from None
