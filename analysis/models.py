"""Reward assignment, step 3: linear models from expanded-tree features to speedups.

A model's coefficients are the rewards: what each decision (a node inlined, or left out of
line, weighted by depth) adds to the target.  Ridge and lasso (scikit-learn), without an
intercept (a tree's decisions are the whole story; the baseline's own row, speedup 1, anchors
the scale), over a grid of ``gamma`` (depth weight), ``alpha`` (regularisation strength) and
target (``linear``: speedup - 1; ``log``: log speedup, so rewards add up as factors).

Each configuration is validated two ways with scikit-learn's cross-validation
(``cross_val_predict``): a seeded shuffled k-fold split by tree (``GroupKFold``, five folds or
one per distinct tree when fewer; every candidate held out once, and the rows of one tree, a
tree measured again, always on the same side) and, when there are several chains, a split by
chain (``LeaveOneGroupOut``: each chain held out in turn).  Each is scored by R^2 and Spearman's
rank correlation over the pooled held-out predictions of every row (a fold of one or two rows
has no R^2 of its own).  The k-fold R^2 is the model's *held-out R^2*: below 0, the model
predicts the candidates it did not see worse than their mean does.
A reward's 95% interval comes from a bootstrap over candidates (percentiles of the refitted
coefficients), so a user sees which rewards the data supports.  Every call is in a tree either
inlined or out of line, so only the difference of its two coefficients (its *net* reward: what
inlining it adds) is determined by the data; each side alone takes a share of a constant.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # scipy is imported by the data's builder (analysis.expanded), not here
    import scipy.sparse as sp

MODELS = ("ridge", "lasso")
TARGETS = ("linear", "log")
DEFAULT_GAMMAS = (0.5, 0.8, 1.0)
DEFAULT_ALPHAS = (0.001, 0.01, 0.1)


@dataclass(frozen=True, order=True)
class Hyper:
    model: str
    gamma: float
    alpha: float
    target: str

    @property
    def slug(self) -> str:
        """The directory name of this configuration: ``gamma0.8-alpha0.01-log``."""
        return f"gamma{self.gamma:g}-alpha{self.alpha:g}-{self.target}"

    @staticmethod
    def parse(model: str, slug: str) -> Hyper:
        gamma, alpha, target = slug.split("-")
        return Hyper(model, float(gamma[len("gamma"):]), float(alpha[len("alpha"):]), target)


def grid(models: Iterable[str] = MODELS, gammas: Iterable[float] = DEFAULT_GAMMAS,
         alphas: Iterable[float] = DEFAULT_ALPHAS,
         targets: Iterable[str] = TARGETS) -> list[Hyper]:
    return sorted(Hyper(m, g, a, t) for m in models for g in gammas for a in alphas
                  for t in targets)


def target_values(speedups: np.ndarray, target: str) -> np.ndarray:
    return np.log(speedups) if target == "log" else speedups - 1.0


def predicted_speedups(values: np.ndarray, target: str) -> np.ndarray:
    return np.exp(values) if target == "log" else values + 1.0


def _estimator(hyper: Hyper):
    from sklearn.linear_model import Lasso, Ridge
    if hyper.model == "ridge":
        return Ridge(alpha=hyper.alpha, fit_intercept=False)
    if hyper.model == "lasso":
        return Lasso(alpha=hyper.alpha, fit_intercept=False, max_iter=20000)
    raise ValueError(f"unknown model {hyper.model!r} (expected one of {', '.join(MODELS)})")


def fit(X: sp.csr_matrix, y: np.ndarray, hyper: Hyper) -> np.ndarray:
    """The coefficients (rewards) of ``hyper``'s model fitted to (X, y)."""
    estimator = _estimator(hyper)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lasso's convergence notes on tiny data
        estimator.fit(X, y)
    return np.asarray(estimator.coef_, dtype=float).ravel()


def _r2(y: np.ndarray, pred: np.ndarray) -> float:
    from sklearn.metrics import r2_score
    if len(y) < 2 or np.all(y == y[0]):
        return math.nan  # no variance to explain
    return float(r2_score(y, pred))


def _spearman(y: np.ndarray, pred: np.ndarray) -> float:
    from scipy.stats import spearmanr
    if len(y) < 3 or np.all(y == y[0]) or np.all(pred == pred[0]):
        return math.nan
    return float(spearmanr(y, pred).statistic)


KFOLD = "kfold"  # the split whose R^2 is the held-out R^2
CHAIN = "chain"
FOLDS = 5


@dataclass(frozen=True)
class Score:
    split: str  # KFOLD | CHAIN
    r2: float
    spearman: float
    n_test: int  # rows held out (each once)
    folds: int = 0


def _held_out(X: sp.csr_matrix, y: np.ndarray, hyper: Hyper, cv, groups: Sequence[str],
              split: str) -> Score:
    from sklearn.model_selection import cross_val_predict
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lasso's convergence notes on tiny data
        pred = cross_val_predict(_estimator(hyper), X, y, groups=list(groups), cv=cv)
    return Score(split, _r2(y, pred), _spearman(y, pred), len(y), cv.get_n_splits(groups=groups))


def validate(X: sp.csr_matrix, speedups: np.ndarray, chains: Sequence[str], hyper: Hyper,
             seed: int = 0, trees: Sequence[str] | None = None) -> list[Score]:
    """Held-out scores of ``hyper`` (see the module's docstring): the k-fold split by tree
    (``trees``: each row's tree; default, each row its own), then the split by chain when
    there are several chains."""
    from sklearn.model_selection import GroupKFold, LeaveOneGroupOut
    y = target_values(speedups, hyper.target)
    groups = list(trees) if trees is not None else [str(i) for i in range(len(y))]
    scores = []
    distinct = len(set(groups))
    if distinct >= 3:
        cv = GroupKFold(n_splits=min(FOLDS, distinct), shuffle=True, random_state=seed)
        scores.append(_held_out(X, y, hyper, cv, groups, KFOLD))
    if len(set(chains)) >= 2:
        scores.append(_held_out(X, y, hyper, LeaveOneGroupOut(), chains, CHAIN))
    return scores


def held_out(scores: Sequence[Score]) -> Score | None:
    """The k-fold score: the held-out R^2 and Spearman a prediction is printed with."""
    return next((s for s in scores if s.split == KFOLD), None)


def bootstrap(X: sp.csr_matrix, speedups: np.ndarray, hyper: Hyper, rounds: int = 100,
              seed: int = 0) -> np.ndarray:
    """The coefficients of ``rounds`` refits on candidates drawn with replacement (one row
    each): percentiles of any function of them give its interval."""
    y = target_values(speedups, hyper.target)
    rng = np.random.default_rng(seed)
    n = len(y)
    draws = np.empty((rounds, X.shape[1]))
    for b in range(rounds):
        pick = rng.integers(0, n, n)
        draws[b] = fit(X[pick], y[pick], hyper)
    return draws
