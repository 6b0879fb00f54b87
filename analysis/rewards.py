"""Reward assignment: from a benchmark's measured candidates to per-decision rewards, the
optimal tree, and the files a user reads.

    <out>/<benchmark>/sources.json                    the benchmark's directory and rundirs
    <out>/<benchmark>/fits.csv                        every configuration's held-out scores
    <out>/<benchmark>/constant-nodes.txt              nodes that never varied (dropped)
    <out>/<benchmark>/<model>/predicted.png           predicted against measured speedup
    <out>/<benchmark>/<model>/<hyper>/optimal.sexp    the optimal tree, an overrides file, or
    <out>/<benchmark>/<model>/<hyper>/no-optimal.txt  why none was written (a weak fit)
    <out>/<benchmark>/<model>/<hyper>/rewards.csv     (and .parquet) one row per node
    <out>/<benchmark>/<model>/<hyper>/rewards.png     the largest rewards with their intervals
    <out>/<benchmark>/<model>/<hyper>/report.txt      the fit, in a few lines

The steps are ``analysis.extract`` -> ``analysis.expanded`` -> ``analysis.models`` ->
``analysis.optimal``; this module runs them for one benchmark and writes the results.

An optimal tree is written only where the data supports it (``withheld``): a held-out R^2 of
at least ``min_r2`` (default 0: the model predicts unseen candidates better than their mean)
and at least ``min_supported`` calls (default 1) whose net reward's bootstrap interval
excludes 0.  Otherwise ``no-optimal.txt`` says why, and a stale ``optimal.sexp`` is removed.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.expanded import ExpandedTree, expand, features, varying
from analysis.extract import Candidates
from analysis.models import (
    KFOLD,
    Hyper,
    Score,
    bootstrap,
    fit,
    held_out,
    predicted_speedups,
    target_values,
    validate,
)
from analysis.optimal import Choice, optimal, to_overrides
from analysis.results import WITHHELD
from analysis.sources import write_sources
from dispatcher.core.decisions import write_overrides
from dispatcher.core.files import atomic_output, write_text_atomic

BOOTSTRAP_ROUNDS = 100  # refits per configuration for the rewards' 95% intervals
MIN_CANDIDATES = 3  # measured trees, the baseline's included, below which nothing is fitted


class RewardError(RuntimeError):
    """Data that cannot be fitted; one line naming the benchmark and what is missing."""


@dataclass
class Fit:
    """One configuration fitted to one benchmark."""

    hyper: Hyper
    scores: list[Score]
    rewards: pd.DataFrame  # one row per node of the expanded tree
    chosen: dict[int, Choice]
    predicted: np.ndarray  # in-sample predicted speedup of each measured candidate
    predicted_optimal: float  # the model's speedup for the optimal tree

    @property
    def held_out(self) -> Score | None:
        """The k-fold score (held-out R^2 and Spearman); None with too few trees."""
        return held_out(self.scores)

    @property
    def supported(self) -> int:
        """Calls whose net reward's 95% bootstrap interval excludes 0."""
        return int(self.rewards["supported"].sum())

    @property
    def varying_calls(self) -> int:
        return int((self.rewards["varies"] & (self.rewards["kind"] == "call")).sum())


@dataclass
class BenchmarkRewards:
    benchmark: str
    directory: str | None  # the benchmark's directory (run-all-benchmarks compiles it)
    expanded: ExpandedTree
    measured: pd.DataFrame  # the rows fitted to
    failed: int  # candidates kept out: no speedup
    constant: list[str]  # nodes whose two columns never varied
    fits: list[Fit] = field(default_factory=list)
    bootstrap_rounds: int = 0  # 0: no intervals, so no reward is supported

    def scores_table(self) -> pd.DataFrame:
        rows = []
        for f in self.fits:
            for s in f.scores:
                rows.append({"model": f.hyper.model, "gamma": f.hyper.gamma,
                             "alpha": f.hyper.alpha, "target": f.hyper.target,
                             "hyperparameters": f.hyper.slug, "split": s.split, "r2": s.r2,
                             "spearman": s.spearman, "n_test": s.n_test, "folds": s.folds,
                             "predicted_optimal": f.predicted_optimal})
        return pd.DataFrame(rows)


def assign(candidates: Candidates, hypers: Sequence[Hyper],
           bootstrap_rounds: int = BOOTSTRAP_ROUNDS,
           seed: int = 0) -> BenchmarkRewards:
    """Fit every configuration of ``hypers`` to ``candidates``."""
    table = candidates.measured
    table = table[table["tree"].notna() & np.isfinite(table["speedup"])
                  & (table["speedup"] > 0)].reset_index(drop=True)
    failed = len(candidates.table) - len(table)
    if table["tree"].nunique() < MIN_CANDIDATES:
        raise RewardError(
            f"{candidates.benchmark}: {table['tree'].nunique()} distinct measured tree(s); "
            f"rewards need at least {MIN_CANDIDATES} (run a longer search)")
    trees = [candidates.trees[t] for t in table["tree"]]
    expanded = expand([candidates.trees[t] for t in dict.fromkeys(table["tree"])])
    speedups = table["speedup"].to_numpy(dtype=float)
    chains = list(table["chain"])
    by_gamma = {}
    for gamma in sorted({h.gamma for h in hypers}):
        X = features(expanded, trees, gamma)
        by_gamma[gamma] = (X, varying(X))
    mask_any = next(iter(by_gamma.values()))[1]  # which columns vary does not depend on gamma
    constant = [f"{n.unit}:{n.round}:{n.key}" for i, n in enumerate(expanded.nodes)
                if not mask_any[2 * i] and not mask_any[2 * i + 1]]
    result = BenchmarkRewards(candidates.benchmark, candidates.directory, expanded, table,
                              failed, constant, bootstrap_rounds=bootstrap_rounds)
    for k, hyper in enumerate(hypers):
        X, mask = by_gamma[hyper.gamma]
        Xv = X[:, mask]
        y = target_values(speedups, hyper.target)
        coef = np.zeros(X.shape[1])
        coef[mask] = fit(Xv, y, hyper)
        draws = np.zeros((max(bootstrap_rounds, 1), X.shape[1]))
        if bootstrap_rounds > 0:
            draws[:, mask] = bootstrap(Xv, speedups, hyper, bootstrap_rounds, seed + k)
        else:
            draws[:, :] = coef
        weights = np.repeat([hyper.gamma ** n.depth for n in expanded.nodes], 2)
        chosen, total = optimal(expanded, coef * weights)
        result.fits.append(Fit(
            hyper=hyper, scores=validate(Xv, speedups, chains, hyper, seed,
                                         trees=list(table["tree"])),
            rewards=_rewards_table(expanded, coef, draws, mask, chosen,
                                   bootstrapped=bootstrap_rounds > 0),
            chosen=chosen, predicted=predicted_speedups(np.asarray(X @ coef), hyper.target),
            predicted_optimal=float(predicted_speedups(np.asarray([total]), hyper.target)[0])))
    return result


def _rewards_table(expanded: ExpandedTree, coef: np.ndarray, draws: np.ndarray,
                   mask: np.ndarray, chosen: dict[int, Choice],
                   bootstrapped: bool = True) -> pd.DataFrame:
    """One row per node: both coefficients with their intervals, and the net reward of
    inlining it (``inline - out``, the quantity the data determines) with its interval;
    ``supported``: that interval excludes 0 (never without a bootstrap: the "interval" is then
    the point itself)."""
    low, high = np.percentile(draws, 2.5, axis=0), np.percentile(draws, 97.5, axis=0)
    net_draws = draws[:, 0::2] - draws[:, 1::2]
    net_low, net_high = np.percentile(net_draws, 2.5, axis=0), np.percentile(net_draws, 97.5,
                                                                              axis=0)
    rows = []
    for i, n in enumerate(expanded.nodes):
        a, b = 2 * i, 2 * i + 1
        varies = bool(mask[a] or mask[b])
        rows.append({"unit": n.unit, "round": n.round, "key": n.key, "kind": n.kind,
                     "name": n.name, "depth": n.depth,
                     "net": coef[a] - coef[b], "low_net": net_low[i], "high_net": net_high[i],
                     "reward_inline": coef[a], "low_inline": low[a], "high_inline": high[a],
                     "reward_out": coef[b], "low_out": low[b], "high_out": high[b],
                     "varies": varies,
                     "supported": bootstrapped and varies and n.kind == "call"
                     and bool(net_low[i] > 0 or net_high[i] < 0),
                     "optimal": chosen[i].action if i in chosen else ""})
    return pd.DataFrame(rows)


def withheld(result: BenchmarkRewards, f: Fit, min_r2: float = 0.0,
             min_supported: int = 1) -> str | None:
    """Why ``f`` gets no optimal.sexp, in one phrase with its figures (None: it gets one): a
    held-out R^2 below ``min_r2`` or none at all, fewer than ``min_supported`` supported
    calls."""
    reasons = []
    s = f.held_out
    if s is None:
        reasons.append("no held-out fit (fewer than 3 distinct trees)")
    elif math.isnan(s.r2):
        reasons.append("no held-out R^2 (the measured speedups do not vary)")
    elif s.r2 < min_r2:
        why = ("the model predicts worse than the mean" if min_r2 == 0
               else "below --min-r2")
        reasons.append(f"held-out R^2 {s.r2:.3f} < {min_r2:g} ({why})")
    if f.supported < min_supported:
        if result.bootstrap_rounds == 0:
            reasons.append("no call's net reward is supported (--bootstrap 0: no intervals)")
        elif min_supported == 1:
            reasons.append(f"no call's net reward is supported (its 95% bootstrap interval "
                           f"holds 0 for all {f.varying_calls} varying calls)")
        else:
            reasons.append(f"{f.supported} call(s) with a supported net reward < "
                           f"{min_supported} (--min-supported)")
    return "; ".join(reasons) or None


def fit_figures(f: Fit) -> str:
    """The held-out fit in a few words, printed beside every prediction."""
    s = f.held_out
    if s is None:
        return "no held-out fit: fewer than 3 distinct trees"
    return (f"held-out R^2 {_fmt(s.r2)}, Spearman {_fmt(s.spearman)}: {s.folds}-fold by tree "
            f"over {s.n_test} candidates")


@dataclass(frozen=True)
class Written:
    """What ``write`` did with one fit's optimal tree."""

    fit: Fit
    optimal: Path | None  # the optimal.sexp written, or None
    withheld: str | None  # why none was written

    def line(self, benchmark: str) -> str:
        """The fit's one line for the user: the prediction with its held-out fit, or why no
        optimal tree was written."""
        h = self.fit.hyper
        head = f"{benchmark} {h.model} {h.slug}"
        if self.optimal is None:
            return f"{head}: no optimal.sexp: {self.withheld}"
        return (f"{head}: optimal tree predicted speedup {self.fit.predicted_optimal:.3f} "
                f"({fit_figures(self.fit)}); {self.fit.supported} call(s) with a supported "
                f"net reward -> {self.optimal}")


def write(result: BenchmarkRewards, out: Path, min_r2: float = 0.0,
          min_supported: int = 1, plots: bool = True) -> list[Written]:
    """Write the layout of the module's docstring under ``out``; -> what became of each fit's
    optimal tree (written, or withheld and why).  ``plots`` False: no figure is drawn (most of
    the command's CPU: one per configuration) and any of an earlier run is removed, so none
    stale stays beside the tables."""
    from analysis.plots import plot_predicted, plot_rewards
    bench_dir = out / result.benchmark
    bench_dir.mkdir(parents=True, exist_ok=True)
    write_sources(bench_dir, result.benchmark, result.directory,
                  sorted(set(result.measured["chain"])))
    with atomic_output(bench_dir / "fits.csv") as tmp:
        result.scores_table().to_csv(tmp, index=False)
    write_text_atomic(bench_dir / "constant-nodes.txt",
                      "".join(line + "\n" for line in result.constant))
    measured = result.measured["speedup"].to_numpy(dtype=float)
    done = []
    for model in sorted({f.hyper.model for f in result.fits}):
        fits = [f for f in result.fits if f.hyper.model == model]
        if plots:
            plot_predicted(bench_dir / model / "predicted.png", result.benchmark, model,
                           measured, {f"{f.hyper.slug} (held-out R^2 {_fmt(_r2_of(f))})":
                                      f.predicted for f in fits})
        else:
            (bench_dir / model / "predicted.png").unlink(missing_ok=True)
        for f in fits:
            d = bench_dir / model / f.hyper.slug
            d.mkdir(parents=True, exist_ok=True)
            reason = withheld(result, f, min_r2, min_supported)
            if reason is None:
                path: Path | None = write_overrides(d / "optimal.sexp",
                                                    to_overrides(result.expanded, f.chosen))
                (d / WITHHELD).unlink(missing_ok=True)
            else:  # a stale tree of an earlier run would be measured as if it were this one
                path = None
                (d / "optimal.sexp").unlink(missing_ok=True)
                write_text_atomic(d / WITHHELD, f"no optimal.sexp: {reason}\n")
            with atomic_output(d / "rewards.csv") as tmp:
                f.rewards.to_csv(tmp, index=False)
            with atomic_output(d / "rewards.parquet") as tmp:
                f.rewards.to_parquet(tmp, index=False)
            if plots:
                plot_rewards(d / "rewards.png", result.benchmark, f.hyper.slug, f.rewards)
            else:
                (d / "rewards.png").unlink(missing_ok=True)
            write_text_atomic(d / "report.txt", report(result, f, reason))
            done.append(Written(f, path, reason))
    return done


def _r2_of(f: Fit) -> float:
    s = f.held_out
    return math.nan if s is None else s.r2


def report(result: BenchmarkRewards, f: Fit, withheld_reason: str | None = None) -> str:
    r = f.rewards
    inline = sum(c.action == "inline" for c in f.chosen.values())
    lines = [
        f"benchmark {result.benchmark}, model {f.hyper.model}, {f.hyper.slug}",
        f"candidates: {len(result.measured)} measured ({result.measured['tree'].nunique()} "
        f"distinct trees, {result.measured['chain'].nunique()} chain(s)), "
        f"{result.failed} left out (failed or unmeasured)",
        f"expanded tree: {len(result.expanded.nodes)} nodes, {int(r['varies'].sum())} varying, "
        f"{len(result.constant)} constant (dropped)",
        f"calls whose net reward the data supports (95% bootstrap interval excludes 0): "
        f"{f.supported}" + ("" if result.bootstrap_rounds else " (no bootstrap: no intervals)"),
    ]
    for s in f.scores:
        how = (f"{s.folds}-fold by tree" if s.split == KFOLD
               else f"{s.split} split, {s.folds} folds")
        lines.append(f"held out ({how}, {s.n_test} rows): R^2 {_fmt(s.r2)}, "
                     f"Spearman {_fmt(s.spearman)}")
    lines.append(f"optimal tree: {len(f.chosen)} calls pinned ({inline} inline, "
                 f"{len(f.chosen) - inline} out of line); predicted speedup "
                 f"{f.predicted_optimal:.3f} ({fit_figures(f)})")
    if withheld_reason is not None:
        lines.append(f"no optimal.sexp: {withheld_reason}")
    lines.append(best_measured(result.measured))
    return "\n".join(lines) + "\n"


def best_measured(measured: pd.DataFrame) -> str:
    """The best measured candidate in one line, by confirmed figures: the confirmation is the
    figure of a chain's best, and the search's own (its first pairs, chosen as the best of
    many) runs high.  A confirmed best not above 1, or whose interval holds 1, says that no
    candidate beat the heuristic; an unconfirmed figure above it is named as such."""
    rows = measured[measured["mutation"] != "baseline"]
    if not len(rows):
        return "best measured candidate: none (only the baseline was measured)"

    def figure(row) -> str:
        ci = "" if pd.isna(row["ci_low"]) else f" [{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
        return f"{row['speedup']:.3f}{ci}, {int(row['pairs'])} pairs"

    confirmed = rows[rows["confirmed"].astype(bool)]
    top = rows.loc[rows["speedup"].idxmax()]
    if not len(confirmed):
        return (f"best measured candidate: speedup {figure(top)} (not confirmed: the "
                "search's figure)")
    best = confirmed.loc[confirmed["speedup"].idxmax()]
    beats = best["speedup"] > 1.0 and not pd.isna(best["ci_low"]) and best["ci_low"] > 1.0
    line = (f"best measured candidate: speedup {figure(best)}, confirmed" if beats else
            f"best measured candidate: none beat the heuristic (confirmed best {figure(best)})")
    if top["speedup"] > best["speedup"] and not top["confirmed"]:
        line += f"; highest unconfirmed figure {figure(top)} (the search's, not confirmed)"
    return line


def _fmt(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"

