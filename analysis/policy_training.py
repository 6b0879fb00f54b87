"""Training an inlining policy: labels from reward assignment or from measured sites,
features from the compiler.

A call site's label comes from one of two sources.  From rewards: its *net* reward (what
inlining it adds, ``analysis.rewards``) and a threshold ``t`` on it, as the research tool
labelled: ``inline`` when the net reward is above ``t``, ``dont_inline`` below ``-t``,
``default`` (does not matter: the heuristic decides) in between.  From measured sites (the
tables ``measure-sites`` writes): the rule of ``analysis.label_training``, each decision's
effect measured directly with its interval.  Where both label a site, ``combine`` keeps the
measured label.  Its features are those the inliner saw at the site (the decision dump's
``features``, ``dispatcher.core.decisions``), so the policy host can ask the same questions of a
program the policy never saw.  A classifier (scikit-learn: logistic regression, gradient-boosted
trees, a small MLP) is validated leave-one-benchmark-out (each benchmark held out in turn:
scores on programs the classifier did not see), then fitted to every benchmark and saved.

The policy file, the policy it holds and the features' encoding are the compiler side's as
much as training's: they live in ``dispatcher.build.policy_file``, imported from there.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from dispatcher.build.policy_file import (
    DEFAULT_GROWTH_BUDGET,
    DEFAULT_MARGIN,
    Column,
    ConstantModel,
    ExportError,
    TrainedPolicy,
    export_model,
    numeric_features,
)

LABELS = ("inline", "dont_inline", "default")
CLASSIFIERS = ("logistic", "boosted", "mlp")
KEY = ["unit", "round", "key"]


class TrainingError(RuntimeError):
    """Data that cannot be trained on; the message is one line."""


def label(net: float, threshold: float) -> str:
    """The label of a call with net reward ``net`` (NaN: no reward, does not matter)."""
    if math.isnan(net) or abs(net) <= threshold:
        return "default"
    return "inline" if net > 0 else "dont_inline"


@dataclass
class TrainingSet:
    """One row per labelled call site: features, label, and the benchmark it comes from."""

    features: pd.DataFrame  # numeric columns, one per feature
    labels: pd.Series
    benchmarks: pd.Series

    @property
    def columns(self) -> list[str]:
        return list(self.features.columns)


def reward_sites(rewards: Mapping[str, pd.DataFrame], features: Mapping[str, pd.DataFrame],
                 threshold: float) -> pd.DataFrame:
    """Join each benchmark's rewards (``rewards.csv``: its call rows) with its features
    (``unit``, ``round``, ``key`` and one column per feature) on the call's key: one row per
    call site with ``benchmark``, ``label`` and its features, not yet encoded."""
    parts = []
    for bench, table in sorted(rewards.items()):
        if bench not in features:
            raise TrainingError(f"{bench}: no features (its decision dumps carry none)")
        calls = table[table["kind"] == "call"][KEY + ["net"]]
        joined = calls.merge(features[bench], on=KEY, how="inner")
        if joined.empty:
            continue
        joined["benchmark"] = bench
        joined["label"] = [label(float(n), threshold) for n in joined["net"]]
        parts.append(joined.drop(columns=["net"]))
    if not parts:
        raise TrainingError("no call site has both a reward and features")
    return pd.concat(parts, ignore_index=True)


#: Columns of a site table that are not features (``round`` is both: a key, so not used).
NOT_FEATURES = KEY + ["benchmark", "label", "source"]


def encode(sites: pd.DataFrame) -> TrainingSet:
    """The training set of a site table (``benchmark``, ``label``, ``unit``, ``round``,
    ``key``, optionally ``source``, and one column per feature): every other column a feature,
    encoded as the policy host encodes a site's (``numeric_features``)."""
    sites = sites.reset_index(drop=True)
    feats = numeric_features(sites.drop(columns=[c for c in NOT_FEATURES if c in sites]))
    return TrainingSet(features=feats, labels=sites["label"], benchmarks=sites["benchmark"])


def training_set(rewards: Mapping[str, pd.DataFrame], features: Mapping[str, pd.DataFrame],
                 threshold: float) -> TrainingSet:
    """The training set of the rewards' labels (``reward_sites``), features encoded."""
    return encode(reward_sites(rewards, features, threshold))


def combine(labelled: pd.DataFrame, rewarded: pd.DataFrame) -> pd.DataFrame:
    """One site table of both sources (each a site table with ``benchmark``): where both label
    a site (same benchmark, unit, round and key), the measured label is kept and the reward's
    dropped.  A ``source`` column says which (``labels`` or ``rewards``)."""
    site = ["benchmark"] + KEY
    labelled = labelled.assign(source="labels")
    rewarded = rewarded.assign(source="rewards")
    taken = pd.MultiIndex.from_frame(labelled[site]) if len(labelled) else None
    if taken is not None and len(rewarded):
        rewarded = rewarded[~pd.MultiIndex.from_frame(rewarded[site]).isin(taken)]
    parts = [p for p in (labelled, rewarded) if len(p)]
    if not parts:
        return labelled
    return pd.concat(parts, ignore_index=True)


def make_classifier(name: str, seed: int = 0) -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    if name == "logistic":
        return make_pipeline(StandardScaler(), LogisticRegression(
            max_iter=2000, class_weight="balanced"))
    if name == "boosted":
        return HistGradientBoostingClassifier(random_state=seed, class_weight="balanced")
    if name == "mlp":
        return make_pipeline(StandardScaler(), MLPClassifier(
            hidden_layer_sizes=(32, 16), max_iter=2000, random_state=seed))
    raise TrainingError(f"classifier {name!r}: expected one of {', '.join(CLASSIFIERS)}")


def _fit(name: str, X: pd.DataFrame, y: pd.Series, seed: int) -> Any:
    if y.nunique() < 2:
        return ConstantModel(str(y.iloc[0]))
    return make_classifier(name, seed).fit(X.to_numpy(), y.to_numpy())


def _balanced_accuracy(truth: Any, pred: Any) -> float:
    """scikit-learn's balanced accuracy (the plain accuracy when the held-out benchmark has one
    label), without its warning for predicted labels the benchmark lacks: that is expected of
    a benchmark left out, and a warning on stderr would break the commands' one-line output."""
    import warnings

    from sklearn.metrics import balanced_accuracy_score
    if len(set(truth)) <= 1:
        return float((truth == pred).mean())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return float(balanced_accuracy_score(truth, pred))


def fold_models(ts: TrainingSet, name: str, seed: int = 0) -> dict[str, Any]:
    """Per held-out benchmark, classifier ``name`` fitted on every other benchmark (nothing
    when there is one benchmark).  Fitted once, then scored on the held-out labels
    (``leave_one_benchmark_out``) and, for --validate measured, exported as that fold's
    policy (``exported_policy``): fitting it twice cost train-policy half its time."""
    benches = sorted(ts.benchmarks.unique())
    if len(benches) < 2:
        return {}
    return {bench: _fit(name, ts.features[ts.benchmarks != bench],
                        ts.labels[ts.benchmarks != bench], seed) for bench in benches}


def leave_one_benchmark_out(ts: TrainingSet, name: str, seed: int = 0,
                            models: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """Per held-out benchmark: rows, accuracy, balanced accuracy, and the share of its sites
    the classifier gets wrong in the costly way (inline for dont_inline or back).  ``models``:
    the folds' models already fitted (``fold_models``)."""
    rows = []
    folds = fold_models(ts, name, seed) if models is None else models
    for bench, model in sorted(folds.items()):
        test = ts.benchmarks == bench
        truth = ts.labels[test].to_numpy()
        pred = model.predict(ts.features[test].to_numpy())
        opposite = ((truth == "inline") & (pred == "dont_inline")) | \
            ((truth == "dont_inline") & (pred == "inline"))
        rows.append({"classifier": name, "held_out": bench, "sites": int(test.sum()),
                     "accuracy": float((truth == pred).mean()),
                     "balanced_accuracy": _balanced_accuracy(truth, pred),
                     "opposite": float(opposite.mean()),
                     "truth": list(truth), "predicted": list(pred)})
    return pd.DataFrame(rows)


def pooled_balanced_accuracy(scores: pd.DataFrame) -> float:
    """The balanced accuracy of every held-out prediction of ``scores`` (one classifier's
    folds) taken together: the leave-one-benchmark-out figure.  A mean of per-benchmark
    figures would score a benchmark with one label by plain accuracy, so a classifier
    answering ``default`` everywhere would look perfect on benchmarks without a measured
    effect."""
    truth = [t for ts in scores["truth"] for t in ts]
    pred = [p for ps in scores["predicted"] for p in ps]
    return _balanced_accuracy(pd.Series(truth), pd.Series(pred)) if truth else math.nan


def table_sha256(ts: TrainingSet) -> str:
    """The identity of a training set: the sha256 of its table (benchmark, label and the
    encoded features of every site, in order) as CSV."""
    import hashlib
    table = pd.concat([ts.benchmarks.rename("benchmark").reset_index(drop=True),
                       ts.labels.rename("label").reset_index(drop=True),
                       ts.features.reset_index(drop=True)], axis=1)
    return hashlib.sha256(table.to_csv(index=False, lineterminator="\n").encode()).hexdigest()


def train(ts: TrainingSet, name: str, threshold: float, seed: int = 0,
          margin: float = DEFAULT_MARGIN, ranges: bool = True,
          growth_budget: int | None = DEFAULT_GROWTH_BUDGET) -> TrainedPolicy:
    """The policy of classifier ``name`` fitted to every site of ``ts``, exported as plain
    data (``dispatcher.build.policy_file``) with each column's training range and the guard
    rails ``margin``, ``ranges`` and ``growth_budget`` (None: none)."""
    return exported_policy(ts, name, _fit(name, ts.features, ts.labels, seed), threshold,
                           margin=margin, ranges=ranges, growth_budget=growth_budget)


def exported_policy(ts: TrainingSet, name: str, model: Any, threshold: float, *,
                    margin: float = DEFAULT_MARGIN, ranges: bool = True,
                    growth_budget: int | None = DEFAULT_GROWTH_BUDGET) -> TrainedPolicy:
    """``model``, classifier ``name`` already fitted to every site of ``ts``, as ``train``
    exports it."""
    try:
        classes, exported = export_model(model)
    except ExportError as exc:
        raise TrainingError(f"{name}: {exc}") from None
    columns = [Column(c, float(ts.features[c].min()), float(ts.features[c].max()))
               for c in ts.columns]
    return TrainedPolicy(classifier=name, classes=classes, model=exported, columns=columns,
                         threshold=threshold, benchmarks=sorted(ts.benchmarks.unique()),
                         table_sha256=table_sha256(ts), sites=len(ts.labels), margin=margin,
                         ranges=ranges, growth_budget=growth_budget)


def fit_model(ts: TrainingSet, name: str, seed: int = 0) -> Any:
    """The scikit-learn model ``train`` exports (for checking the export against it)."""
    return _fit(name, ts.features, ts.labels, seed)


def summary(scores: pd.DataFrame) -> pd.DataFrame:
    """Held-out scores per classifier, best first: mean accuracy and share of opposite
    answers over the benchmarks, balanced accuracy over their pooled predictions."""
    if scores.empty:
        return scores
    agg = scores.groupby("classifier").agg(
        benchmarks=("held_out", "count"), sites=("sites", "sum"),
        accuracy=("accuracy", "mean"), opposite=("opposite", "mean"))
    agg["balanced_accuracy"] = [pooled_balanced_accuracy(scores[scores["classifier"] == c])
                                for c in agg.index]
    return agg.sort_values("balanced_accuracy", ascending=False).reset_index()


def choose(scores: pd.DataFrame, names: Sequence[str]) -> str:
    """The classifier with the best held-out balanced accuracy, pooled (the first given
    when there is nothing to compare)."""
    table = summary(scores)
    return str(table["classifier"].iloc[0]) if not table.empty else names[0]
