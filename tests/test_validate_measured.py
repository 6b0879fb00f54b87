"""train-policy --validate measured: each fold's policy compiled into the benchmark it never saw
and measured against the heuristic.  The choice (worst held-out speedup best) and the gate on
made-up figures; bad inputs one line before anything is trained; end to end at quick size on
labels tables of three small bundled programs (their real features), the gate passing and
failing by its threshold (no assertion on a measured figure), a rerun answered by the store."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from dispatcher.build.policy_file import read_policy_file
from dispatcher.core.figures import Figure
from pipeline.policy.selection import FoldMeasure, choose_measured, gate_line, worst
from pipeline.policy.validation import scores_with_measures
from tests.helpers import cli as _cli
from tests.helpers import sites_table, tiny_search_config

P = Path("x.policy")


def fold(classifier: str, bench: str, speedup: float | None, width: float = 0.01,
         error: str | None = None) -> FoldMeasure:
    if speedup is None:
        return FoldMeasure(classifier, bench, P, Figure(error=error or "not measured: lost"))
    return FoldMeasure(classifier, bench, P,
                       Figure(speedup, speedup - width, speedup + width, 4))


def test_the_kept_classifier_is_the_one_whose_worst_fold_is_best():
    measures = [fold("logistic", "a", 1.10), fold("logistic", "b", 0.90),   # worst 0.90
                fold("boosted", "a", 1.01), fold("boosted", "b", 0.97),     # worst 0.97
                fold("mlp", "a", 1.30), fold("mlp", "b", None)]             # unknown worst
    assert worst(measures[:2]) == measures[1]
    assert worst(measures[4:]) is None and worst([]) is None
    assert choose_measured(measures, ["logistic", "boosted", "mlp"]) == "boosted"
    # a tie keeps the first given; nothing complete: no choice
    tie = [fold("logistic", "a", 0.97), fold("boosted", "a", 0.97)]
    assert choose_measured(tie, ["boosted", "logistic"]) == "boosted"
    assert choose_measured(measures[4:], ["mlp"]) is None


def test_the_gate_is_one_line_on_the_worst_fold():
    ok, line = gate_line("boosted", [fold("boosted", "a", 1.01), fold("boosted", "b", 0.97)])
    assert ok and line == ("PASS: boosted's worst held-out measured speedup 0.970 [0.960, "
                           "0.980] (b) is at or above the gate 0.95")
    ok, line = gate_line("logistic", [fold("logistic", "a", 1.5),
                                      fold("logistic", "lu", 0.2)])
    assert not ok and line == ("FAIL: logistic's worst held-out measured speedup 0.200 "
                               "[0.190, 0.210] (lu) is below the gate 0.95")
    ok, line = gate_line("mlp", [fold("mlp", "a", 1.3), fold("mlp", "b", None)])
    assert not ok and line.startswith("FAIL: mlp has no measured worst held-out speedup "
                                      "(not measured: b)")
    assert "\n" not in line
    # the threshold is the caller's
    assert gate_line("boosted", [fold("boosted", "a", 0.97)], gate=0.98)[0] is False


def test_the_scores_keep_the_measured_figures():
    scores = pd.DataFrame({"classifier": ["logistic", "logistic"], "held_out": ["a", "b"],
                           "balanced_accuracy": [0.5, 0.7]})
    table = scores_with_measures(scores, [fold("logistic", "a", 1.2),
                                          fold("logistic", "b", None)])
    assert table.loc[0, "measured_speedup"] == 1.2 and table.loc[0, "measured_pairs"] == 4
    assert math.isnan(table.loc[1, "measured_speedup"])


# -- the command ---------------------------------------------------------------------------

BENCHES = ("kahan", "hamming", "bdd")


@pytest.fixture(scope="module")
def labels(bundled_builds, tmp_path_factory):
    """Labels tables named by three bundled programs, each with its own heuristic build's
    sites and features (labels planted by callee size, as tests/test_train_from_labels.py
    plants them)."""
    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.core.decisions import read_dump
    tmp = tmp_path_factory.mktemp("validate-measured")
    for name in BENCHES:
        built = bundled_builds.get(resolve_benchmark(name), dumps=True)
        dumps = [read_dump(p) for p in built.decision_files]
        (tmp / "labels" / name).mkdir(parents=True)
        sites_table(name, dumps).to_csv(tmp / "labels" / name / "sites.csv", index=False)
    return tmp


def test_bad_inputs_are_one_line_before_any_training(tmp_path):
    cfg = tiny_search_config(tmp_path)
    (tmp_path / "labels" / "a").mkdir(parents=True)
    pd.DataFrame({"x": [1]}).to_csv(tmp_path / "labels" / "a" / "sites.csv", index=False)
    cases = [
        (("--labels", "labels", "--size", "quick"),
         "train-policy: --size: only with --validate measured"),
        (("--labels", "labels", "--runs", "2", "--gate", "0.9"),
         "train-policy: --runs, --gate: only with --validate measured"),
        (("--labels", "labels", "--validate", "measured"),
         f"train-policy: {Path('labels') / 'a'}: --validate measured compiles each held-out "
         "benchmark, and a is not the name of a bundled one"),
    ]
    for args, start in cases:
        r = _cli("train-policy", *args, "--config", str(cfg), cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith(start), (args, r.stderr)
        assert "Traceback" not in r.stderr
    r = _cli("train-policy", "--labels", "labels", "--validate", "maybe", cwd=tmp_path)
    assert r.returncode == 2 and "'maybe' is not one of 'labels', 'measured'" in r.stderr


def test_a_size_no_benchmark_has_is_one_line(labels, tmp_path):
    cfg = tiny_search_config(tmp_path)
    r = _cli("train-policy", "--labels", str(labels / "labels"), "--validate", "measured",
             "--size", "huge", "--config", str(cfg), "--out", str(tmp_path / "p.policy"),
             cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "sizes.huge" in r.stderr and \
        "no such size in benchmark" in r.stderr, r.stderr
    assert not (tmp_path / "p.policy").exists()


def test_each_fold_policy_never_saw_its_benchmark(labels, tmp_path):
    """The fold files: one per classifier and benchmark, trained on the others only, with
    the guard rails asked for (what the gate measures is what would be kept)."""
    from analysis.label_training import label_sites, read_sites_table
    from analysis.policy_training import encode, fold_models
    from dispatcher.build.policies import parse_policy
    from pipeline.policy.validation import fold_policies
    parts = []
    for name in BENCHES:
        sites, _ = label_sites(read_sites_table(labels / "labels" / name / "sites.csv"), 0.01)
        parts.append(sites.assign(benchmark=name))
    ts = encode(pd.concat(parts, ignore_index=True))
    folds = fold_policies(ts, ["logistic"], 0.01, tmp_path / "folds", margin=0.3,
                          ranges=False, growth_budget=40)
    assert sorted(folds) == [("logistic", b) for b in sorted(BENCHES)]
    for (_, held_out), fold in folds.items():
        trained = read_policy_file(fold.path)
        # the compile gets the bytes in memory: the file's own, the same store identity
        assert fold.spec.data == fold.path.read_bytes()
        assert fold.spec.identity() == parse_policy(str(fold.path)).identity()
        assert trained.benchmarks == sorted(set(BENCHES) - {held_out})
        assert (trained.margin, trained.ranges, trained.growth_budget) == (0.3, False, 40)
    one = encode(parts[0])
    assert fold_policies(one, ["logistic"], 0.01, tmp_path / "none", margin=0.2,
                         ranges=True, growth_budget=None) == {}
    # the models the label scores fitted, exported instead of fitted again: the same bytes
    models = {("logistic", b): m for b, m in fold_models(ts, "logistic").items()}
    assert sorted(models) == [("logistic", b) for b in sorted(BENCHES)]
    given = fold_policies(ts, ["logistic"], 0.01, tmp_path / "given", margin=0.3, ranges=False,
                          growth_budget=40, models=models)
    fitted = fold_policies(ts, ["logistic"], 0.01, tmp_path / "fitted", margin=0.3, ranges=False,
                           growth_budget=40)
    assert {k: f.spec.data for k, f in given.items()} == \
        {k: f.spec.data for k, f in fitted.items()}
    assert read_policy_file(given[("logistic", "kahan")].path).benchmarks == ["bdd", "hamming"]


def measured_rows(policy: Path) -> pd.DataFrame:
    scores = pd.read_csv(policy.with_name(policy.name + ".scores.csv"))
    return scores.sort_values(["classifier", "held_out"]).reset_index(drop=True)


def test_validate_measured_end_to_end(labels, tmp_path):
    cfg = tiny_search_config(tmp_path)
    policy = tmp_path / "p.policy"
    common = ("train-policy", "--labels", str(labels / "labels"), "--validate", "measured",
              "--config", str(cfg), "--size", "tiny", "--runs", "2", "--max-pairs", "2",
              "--out", str(policy))
    r = _cli(*common, "--gate", "0.01", cwd=tmp_path)  # no build is 100x slower: passes
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(x.startswith("measured, each benchmark held out") for x in lines), r.stdout
    rows = measured_rows(policy)
    assert len(rows) == 3 * len(BENCHES)  # every classifier, every benchmark held out
    assert rows["measured_speedup"].notna().all(), rows
    assert (rows["measured_low"] <= rows["measured_speedup"]).all()
    assert (rows["measured_speedup"] <= rows["measured_high"]).all()
    assert (rows["size_ratio"] > 0).all() and (rows["measured_pairs"] >= 2).all()
    for c in ("logistic", "boosted", "mlp"):
        assert any(x.startswith(f"{c}: worst held-out measured speedup ") for x in lines)
        for bench in BENCHES:
            assert (policy.parent / "p.policy.folds" / f"{c}.{bench}.policy").is_file()
    # the classifier kept: the best worst fold, as the scores file records them
    worst_by = rows.groupby("classifier")["measured_speedup"].min()
    kept = lines[-2].split(" trained on ")[0]
    assert worst_by[kept] == worst_by.max(), (kept, worst_by)
    assert lines[-2] == f"{kept} trained on {', '.join(sorted(BENCHES))}: {policy}"
    assert read_policy_file(policy).benchmarks == sorted(BENCHES)
    # the verdict last, in one line
    assert lines[-1].startswith(f"PASS: {kept}'s worst held-out measured speedup ") and \
        lines[-1].endswith("is at or above the gate 0.01"), r.stdout

    # the gate out of reach: FAIL in one line, exit 3, the file still written; the rerun (of
    # the classifier kept alone: the others' training is the first run's) takes its
    # comparisons from the store, so its figures are the first run's
    policy.unlink()
    again = _cli(*common, "--classifier", kept, "--gate", "100", cwd=tmp_path)
    assert again.returncode == 3, again.stderr
    fail = again.stderr.strip().splitlines()[-1]
    assert fail.startswith(f"FAIL: {kept}'s worst held-out measured speedup ") and \
        fail.endswith("is below the gate 100.00"), again.stderr
    assert policy.is_file()
    assert again.stdout.splitlines()[-1] == lines[-2]
    pd.testing.assert_frame_equal(measured_rows(policy),
                                  rows[rows["classifier"] == kept].reset_index(drop=True))
