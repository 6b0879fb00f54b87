"""Labels that teach: assign-rewards writes an optimal tree only where its held-out fit and the
rewards' intervals support one, and prints the fit beside every prediction; run-all-benchmarks
recommends hyperparameters only when a measurement shows a significant gain, and skips what
assign-rewards withheld."""
from __future__ import annotations

import io
import json
import math
import random
import re
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from analysis.extract import Candidates
from analysis.models import KFOLD, Hyper
from analysis.results import WITHHELD, Outcome, choose, print_tables, recommend
from analysis.rewards import assign, withheld, write
from dispatcher.core.decisions import write_overrides
from dispatcher.core.figures import Figure
from tests.helpers import synthetic_candidates, tiny_search_config


def made_up(bench: str, hyper: str, speedup: float | None, low: float | None = None,
            high: float | None = None, pairs: int = 0, worker: str | None = None,
            stopped: str = "") -> Outcome:
    """An outcome with a made-up figure."""
    return Outcome(bench, hyper, Figure(speedup, low, high, pairs), worker, stopped)


RIDGE = Hyper("ridge", 1.0, 1e-4, "log")
HEAD = re.escape("noise ridge gamma1-alpha0.0001-log: ")


def noise_candidates(seed: int = 3) -> Candidates:
    """The synthetic trees of tests/test_rewards.py with speedups that owe nothing to them."""
    planted = synthetic_candidates(n=60)
    rng = random.Random(seed)
    table = planted.table.copy()
    table["speedup"] = [math.exp(rng.gauss(0, 0.02)) for _ in range(len(table))]
    table["benchmark"] = "noise"
    return Candidates("noise", table, planted.trees)


# --------------------------------------------------------------------------- assign-rewards


def test_a_fit_to_noise_predicts_worse_than_the_mean_and_writes_no_optimal_tree(tmp_path):
    result = assign(noise_candidates(), [RIDGE], bootstrap_rounds=30)
    (fit,) = result.fits
    assert fit.held_out is not None and fit.held_out.split == KFOLD
    assert fit.held_out.r2 < 0  # what the gate is for: this is not a model of anything
    d = tmp_path / "noise" / "ridge" / RIDGE.slug
    d.mkdir(parents=True)
    write_overrides(d / "optimal.sexp", ())  # a stale tree from an earlier run
    (written,) = write(result, tmp_path)
    assert written.optimal is None and not (d / "optimal.sexp").exists()
    r2 = f"{fit.held_out.r2:.3f}"
    assert re.fullmatch(HEAD + re.escape(
        f"no optimal.sexp: held-out R^2 {r2} < 0 (the model predicts worse than the mean)")
        + r"(; no call's net reward is supported .*)?", written.line("noise")), written.line(
        "noise")
    # the reason is kept beside the rewards, which are still written
    assert (d / WITHHELD).read_text() == written.line("noise")[len("noise ridge "
                                                                   f"{RIDGE.slug}: "):] + "\n"
    for name in ("rewards.csv", "rewards.parquet", "report.txt"):
        assert (d / name).is_file(), name
    report = (d / "report.txt").read_text()
    assert f"predicted speedup {fit.predicted_optimal:.3f} (held-out R^2 {r2}, " in report
    assert f"\nno optimal.sexp: held-out R^2 {r2} < 0" in report


def test_a_fit_with_signal_writes_its_tree_and_prints_its_fit_beside_the_prediction(tmp_path):
    result = assign(synthetic_candidates(n=60), [RIDGE], bootstrap_rounds=30)
    (fit,) = result.fits
    d = tmp_path / "synthetic" / "ridge" / RIDGE.slug
    d.mkdir(parents=True)
    (d / WITHHELD).write_text("no optimal.sexp: stale\n")
    (written,) = write(result, tmp_path)
    assert written.optimal == d / "optimal.sexp" and written.optimal.is_file()
    assert not (d / WITHHELD).exists()
    s = fit.held_out
    assert s is not None and s.r2 > 0.9 and fit.supported >= 3
    assert written.line("synthetic") == (
        f"synthetic ridge {RIDGE.slug}: optimal tree predicted speedup "
        f"{fit.predicted_optimal:.3f} (held-out R^2 {s.r2:.3f}, Spearman {s.spearman:.3f}: "
        f"{s.folds}-fold by tree over 60 candidates); {fit.supported} call(s) with a "
        f"supported net reward -> {d / 'optimal.sexp'}")
    assert s.folds == 5 and s.n_test == 60


def test_the_held_out_folds_keep_a_trees_rows_together():
    """A tree measured twice is never on both sides of a fold: a model that memorised it would
    look as if it generalised.  Here ten trees are measured three times each, with no signal:
    holding out rows, not trees, would score each row by its own twins."""
    from analysis.expanded import expand, features
    from analysis.models import validate
    base = noise_candidates()
    table = base.table.drop_duplicates("tree").head(10)
    twice = pd.concat([table, table, table], ignore_index=True)
    twice["speedup"] *= [math.exp(random.Random(k).gauss(0, 0.001)) for k in range(30)]
    trees = [base.trees[t] for t in twice["tree"]]
    X = features(expand([base.trees[t] for t in table["tree"]]), trees, 1.0)
    y = twice["speedup"].to_numpy(dtype=float)
    (by_tree,) = validate(X, y, ["c"] * len(y), RIDGE, trees=list(twice["tree"]))
    (by_row,) = validate(X, y, ["c"] * len(y), RIDGE)
    assert by_row.r2 > 0.5 > by_tree.r2  # the twins leak when rows, not trees, are held out


@pytest.mark.parametrize("case", ["bootstrap0", "min_r2", "min_supported", "constant"])
def test_each_reason_is_said_with_its_figure(case):
    candidates = synthetic_candidates(n=60)
    rounds, min_r2, min_supported = 30, 0.0, 1
    if case == "bootstrap0":
        rounds = 0
    elif case == "min_r2":
        min_r2 = 0.999
    elif case == "min_supported":
        min_supported = 50
    else:
        candidates.table["speedup"] = 1.05
    result = assign(candidates, [RIDGE], bootstrap_rounds=rounds)
    (fit,) = result.fits
    reason = withheld(result, fit, min_r2, min_supported)
    s = fit.held_out
    assert s is not None
    if case == "bootstrap0":
        assert fit.supported == 0  # no intervals, no support: not every nonzero reward
        assert reason == "no call's net reward is supported (--bootstrap 0: no intervals)"
    elif case == "min_r2":
        assert reason == f"held-out R^2 {s.r2:.3f} < 0.999 (below --min-r2)"
    elif case == "min_supported":
        assert reason == (f"{fit.supported} call(s) with a supported net reward < 50 "
                          "(--min-supported)")
    else:
        assert reason is not None and reason.startswith(
            "no held-out R^2 (the measured speedups do not vary)")
    # the permissive thresholds write any tree with a held-out R^2 at all
    assert (withheld(result, fit, -math.inf, 0) is None) == (case != "constant")


def _run_assign(monkeypatch, tmp_path, candidates: dict[str, Candidates], *args: str):
    """assign-rewards in this process on made-up candidates (the rundirs' extraction is
    replaced: tests/test_rewards.py runs the real one end to end)."""
    import analysis.extract
    from commands.assign_rewards import assign_rewards
    monkeypatch.setattr(analysis.extract, "extract", lambda paths, counted=False: candidates)
    for c in candidates.values():
        c.table["unresolved"] = False
        c.table["metric"] = "time"  # extract's column: the metric each figure is in
    return CliRunner().invoke(assign_rewards, ["unused-rundir", "--out", str(tmp_path / "out"),
                                               "--bootstrap", "30", "--no-plots", *args])


def test_assign_rewards_prints_one_line_per_setting_the_fit_beside_each_prediction(
        monkeypatch, tmp_path):
    r = _run_assign(monkeypatch, tmp_path,
                    {"noise": noise_candidates(), "synthetic": synthetic_candidates(n=60)},
                    "--model", "ridge", "--gamma", "1", "--alpha", "0.0001", "--target", "log")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"noise: 60 candidates, 8 nodes \(1 constant\), 0 optimal trees in "
                        r".*/out/noise \(1 withheld: weak fit, below\); best held-out .*",
                        lines[0]), lines[0]
    (noise,) = [ln for ln in lines if ln.startswith("noise ridge ")]
    assert re.match(HEAD + r"no optimal\.sexp: held-out R\^2 -\d\.\d{3} < 0 \(the model "
                    r"predicts worse than the mean\)", noise), noise
    (signal,) = [ln for ln in lines if ln.startswith("synthetic ridge ")]
    assert re.fullmatch(r"synthetic ridge gamma1-alpha0\.0001-log: optimal tree predicted "
                        r"speedup 1\.\d{3} \(held-out R\^2 0\.9\d\d, Spearman 0\.9\d\d: 5-fold "
                        r"by tree over 60 candidates\); \d call\(s\) with a supported net "
                        r"reward -> .*/optimal\.sexp", signal), signal
    # every line naming a prediction names the held-out fit too
    assert all("held-out R^2" in ln for ln in lines if "predict" in ln)
    assert not (tmp_path / "out" / "noise" / "ridge" / RIDGE.slug / "optimal.sexp").exists()
    assert (tmp_path / "out" / "synthetic" / "ridge" / RIDGE.slug / "optimal.sexp").is_file()

    # the thresholds are options: a permissive run writes the noise's tree too, a strict one
    # withholds the signal's
    r = _run_assign(monkeypatch, tmp_path, {"noise": noise_candidates()}, "--model", "ridge",
                    "--gamma", "1", "--alpha", "0.0001", "--target", "log", "--min-r2=-inf",
                    "--min-supported", "0")
    assert r.exit_code == 0 and "1 optimal trees" in r.stdout, r.output
    assert (tmp_path / "out" / "noise" / "ridge" / RIDGE.slug / "optimal.sexp").is_file()
    assert not (tmp_path / "out" / "noise" / "ridge" / RIDGE.slug / WITHHELD).exists()


def test_a_bad_min_r2_is_one_line(monkeypatch, tmp_path):
    r = _run_assign(monkeypatch, tmp_path, {"noise": noise_candidates()}, "--min-r2", "2")
    assert r.exit_code == 2 and r.stderr == ("assign-rewards: --min-r2 2.0: expected a number "
                                             "at most 1\n")


# --------------------------------------------------------------------------- recommendation


def test_no_gain_no_recommendation_though_least_regret_names_one():
    """The case seen: one setting measured, no better than the heuristic, regret 0."""
    flat = [made_up("lens", "h", 1.002, 0.991, 1.013, 8, "w0")]
    assert choose(flat) is not None and choose(flat).total == 0.0
    rec = recommend(flat)
    assert rec.hyper is None and rec.line() == (
        "no hyperparameters to recommend: no optimal tree measured significantly faster than "
        "the heuristic (95% interval above 1); the fastest: h on lens 1.002 [0.991, 1.013], "
        "8 pairs")


def test_the_recommendation_is_the_least_regret_of_the_settings_a_gain_supports():
    outcomes = [
        made_up("a", "h1", 1.04, 1.01, 1.07, 6, "w0"),   # a gain
        made_up("a", "h2", 1.06, 0.98, 1.14, 2, "w0"),   # the best on a, not significant
        made_up("b", "h1", 1.00, 0.98, 1.02, 6, "w0"),
        made_up("b", "h2", 1.03, 0.99, 1.07, 6, "w0"),
        made_up("b", "h3", 1.03, 1.01, 1.05, 6, "w0"),   # a gain; missing on a: a's worst
        made_up("c", "h1", None, stopped="no optimal.sexp: held-out R^2 -0.420 < 0 (...)"),
    ]
    assert choose(outcomes).hyper == "h2"  # least regret (0), but no significant gain
    rec = recommend(outcomes)
    assert rec.hyper == "h3" and rec.support == (outcomes[4],) and rec.eligible == 2
    assert rec.regret is not None
    assert rec.regret.total == pytest.approx(math.log(1.06 / 1.04))  # h1's, on a
    assert rec.line().startswith(
        "hyperparameters to use in general: h3 (measured significantly faster than the "
        "heuristic on b 1.030 [1.010, 1.050], 6 pairs; least total regret ")
    assert " over 2 benchmarks of the 2 settings measured significantly faster somewhere " \
        "and slower nowhere; " in rec.line()
    assert rec.line().endswith("; h2 has less total regret "
                               f"({choose(outcomes).total:.4f}) but was measured "
                               "significantly faster nowhere")
    # an interval touching 1 is no gain; a speedup without an interval neither
    assert recommend([made_up("a", "h", 1.05, 1.0, 1.1, 4)]).hyper is None
    assert recommend([made_up("a", "h", 1.05)]).hyper is None


def test_a_gain_that_is_a_loss_elsewhere_is_no_recommendation_nor_is_nothing_measured():
    outcomes = [made_up("a", "h", 1.05, 1.02, 1.08, 6), made_up("b", "h", 0.95, 0.93, 0.97, 6),
                made_up("a", "k", 1.0, 0.99, 1.01, 6)]
    assert recommend(outcomes).line() == (
        "no hyperparameters to recommend: every setting measured significantly faster "
        "somewhere is significantly slower elsewhere; e.g. h: faster on a 1.050 [1.020, 1.080], "
        "6 pairs, slower on b 0.950 [0.930, 0.970], 6 pairs")
    skipped = [made_up("a", "h", None, stopped="no optimal.sexp: held-out R^2 -1.000 < 0")]
    assert recommend(skipped).line() == ("no hyperparameters to recommend: no optimal tree "
                                         "was measured")
    out = io.StringIO()
    print_tables(skipped, out)
    lines = out.getvalue().splitlines()
    assert "- (no optimal.sexp: held-out R^2 -1.000 < 0)" in next(
        ln for ln in lines if ln.split()[:2] == ["a", "h"])
    assert lines[-1] == "no hyperparameters to recommend: no optimal tree was measured"


# --------------------------------------------------------------------------- run-all-benchmarks


def _withheld_rewards(tmp_path: Path, with_tree: bool) -> Path:
    """A hand-made assign-rewards output for kahan: one setting withheld, and (``with_tree``)
    one with an optimal.sexp."""
    rewards = tmp_path / "rewards"
    weak = rewards / "kahan" / "ridge" / "gamma0.8-alpha0.1-log"
    weak.mkdir(parents=True)
    (weak / WITHHELD).write_text("no optimal.sexp: held-out R^2 -0.420 < 0 (the model predicts "
                                 "worse than the mean)\n")
    if with_tree:
        d = rewards / "kahan" / "ridge" / "gamma0.8-alpha0.01-log"
        d.mkdir(parents=True)
        write_overrides(d / "optimal.sexp", ())
    (rewards / "kahan" / "sources.json").write_text(json.dumps(
        {"benchmark": "kahan", "directory": None, "rundirs": ["/runs/r1"]}))
    return rewards


def test_a_setting_without_an_optimal_tree_is_skipped_with_its_reason(tmp_path):
    from commands.run_all_benchmarks import collect
    rewards = _withheld_rewards(tmp_path, with_tree=True)
    (target,), skipped = collect(rewards, "ridge", (), ())
    assert [t.hyper for t in target.trees] == ["gamma0.8-alpha0.01-log"]
    assert skipped == [made_up("kahan", "gamma0.8-alpha0.1-log", None, stopped=(
        "no optimal.sexp: held-out R^2 -0.420 < 0 (the model predicts worse than the mean)"))]
    # naming the withheld setting is no error: nothing to measure, one skip
    targets, skipped = collect(rewards, "ridge", ("kahan",), ("gamma0.8-alpha0.1-log",))
    assert targets == [] and len(skipped) == 1
    # a directory emptied by hand says so
    (rewards / "kahan" / "ridge" / "gamma0.8-alpha0.1-log" / WITHHELD).unlink()
    _, (gone,) = collect(rewards, "ridge", (), ())
    assert gone.stopped == (f"no optimal.sexp in {rewards}/kahan/ridge/"
                            "gamma0.8-alpha0.1-log")


def test_run_all_benchmarks_with_every_tree_withheld_skips_them_and_recommends_nothing(
        tmp_path):
    from tests.helpers import cli as _cli
    _withheld_rewards(tmp_path, with_tree=False)
    r = _cli("run-all-benchmarks", "ridge", "--config", str(tiny_search_config(tmp_path)),
             cwd=tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [
        "run-all-benchmarks: kahan/ridge/gamma0.8-alpha0.1-log: skipped: no optimal.sexp: "
        "held-out R^2 -0.420 < 0 (the model predicts worse than the mean)"]
    lines = r.stdout.splitlines()
    assert lines[-1] == "no hyperparameters to recommend: no optimal tree was measured"
    row = next(ln for ln in lines if ln.split()[:2] == ["kahan", "gamma0.8-alpha0.1-log"])
    assert "- (no optimal.sexp: held-out R^2 -0.420 < 0" in row
    assert not (tmp_path / "results").exists()
