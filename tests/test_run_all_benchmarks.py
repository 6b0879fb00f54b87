"""run-all-benchmarks: the regret and choice logic on made-up speedups, the CSV lines of a
comparison, a real search through assign-rewards to measured optimal trees, and one-line
errors for bad inputs."""
from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest

from analysis.result_files import csv_rows, pairs_by_worker
from analysis.results import Outcome, choose, per_benchmark, print_tables, regrets, total_regrets
from dispatcher.core.comparison import Comparison
from dispatcher.core.decisions import Override, write_overrides
from dispatcher.core.figures import Figure
from dispatcher.core.records import RunRecord, RunResult
from tests.helpers import cli as _cli
from tests.helpers import tiny_search_config


def made_up(bench: str, hyper: str, speedup: float | None, low: float | None = None,
            high: float | None = None, pairs: int = 0, worker: str | None = None,
            stopped: str = "") -> Outcome:
    """An outcome with a made-up figure."""
    return Outcome(bench, hyper, Figure(speedup, low, high, pairs), worker, stopped)


REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
FIRST_CPU = min(os.sched_getaffinity(0))

# --------------------------------------------------------------------------- regret and choice

# Made-up speedups: h1 is best on a but poor on b; h2 is never far from the best; h3 is good on
# a and missing on b (charged b's worst regret); c measured nothing (no part in the regret).
MADE_UP = [
    made_up("a", "h1", 1.10, 1.05, 1.15, 5, "w0"),
    made_up("a", "h2", 1.00, 0.98, 1.02, 5, "w0"),
    made_up("a", "h3", 1.05, 0.99, 1.11, 5, "w0"),
    made_up("b", "h1", 0.90, 0.85, 0.95, 5, "w1"),
    made_up("b", "h2", 1.00, 0.97, 1.03, 5, "w1"),
    made_up("c", "h1", None, pairs=0, stopped="failed"),
]


def test_regret_is_the_log_shortfall_from_each_benchmarks_best_and_a_missing_hyper_pays_the_worst():
    table = regrets(MADE_UP)
    assert set(table) == {"a", "b"}  # c has no speedup
    assert table["a"]["h1"] == 0.0 and table["a"]["h2"] == pytest.approx(math.log(1.10))
    assert table["a"]["h3"] == pytest.approx(math.log(1.10 / 1.05))
    assert table["b"]["h2"] == 0.0 and table["b"]["h1"] == pytest.approx(math.log(1 / 0.90))
    assert table["b"]["h3"] == table["b"]["h1"]  # missing on b: b's worst regret
    ranked = total_regrets(MADE_UP)
    assert [r.hyper for r in ranked] == ["h2", "h1", "h3"]
    assert ranked[0].total == pytest.approx(math.log(1.10))
    assert ranked[1].total == pytest.approx(math.log(1 / 0.90))
    assert ranked[2].total == pytest.approx(math.log(1.10 / 1.05) + math.log(1 / 0.90))
    assert ranked[2].measured == 1 and ranked[2].missing == ("b",)
    assert choose(MADE_UP) == ranked[0]


def test_best_and_median_per_benchmark_with_ties_listed():
    rows = per_benchmark(MADE_UP + [made_up("b", "h4", 1.00)])
    a, b = rows
    assert (a.benchmark, a.best, a.median, a.best_hypers, a.measured) == \
        ("a", 1.10, 1.05, ("h1",), 3)
    assert (b.best, b.median, b.best_hypers, b.measured) == (1.00, 1.00, ("h2", "h4"), 3)


def test_a_tie_in_regret_goes_to_the_hyper_measured_on_more_benchmarks():
    outcomes = [made_up("a", "x", 1.0), made_up("a", "y", 1.0), made_up("b", "y", 1.0),
                made_up("b", "z", 1.0)]
    assert [r.hyper for r in total_regrets(outcomes)] == ["y", "x", "z"]
    assert choose([]) is None and choose([made_up("a", "x", None)]) is None


def test_significance_is_an_interval_that_excludes_one():
    assert made_up("a", "h", 1.1, 1.01, 1.2).figure.significant is True
    assert made_up("a", "h", 0.9, 0.8, 0.99).figure.significant
    assert made_up("a", "h", 1.0, 0.9, 1.1).figure.significant is False
    assert made_up("a", "h", 1.0).figure.significant is None


def test_the_printed_tables_and_the_choice_line():
    out = io.StringIO()
    print_tables(MADE_UP, out)
    lines = out.getvalue().splitlines()
    row = next(ln for ln in lines if ln.split()[:2] == ["a", "h1"])
    assert "1.100 [1.050, 1.150]" in row and row.split()[5] == "yes"
    assert next(ln for ln in lines if ln.split()[:2] == ["b", "h2"]).split()[5] == "no"
    assert "- (failed)" in next(ln for ln in lines if ln.split()[:2] == ["c", "h1"])
    summary = next(ln for ln in lines if ln.split()[:2] == ["a", "1.100"])
    assert summary.split() == ["a", "1.100", "1.050", "3", "h1"]
    regret = next(ln for ln in lines if ln.split()[:1] == ["h3"])
    assert regret.split()[1:] == [f"{math.log(1.10 / 1.05) + math.log(1 / 0.90):.4f}", "1/2",
                                  "b"]
    # h2 has least regret but gains nowhere; h1, faster on a, is slower on b: none to use
    assert lines[-1] == (
        "no hyperparameters to recommend: every setting measured significantly faster somewhere "
        "is significantly slower elsewhere; e.g. h1: faster on a 1.100 [1.050, 1.150], 5 pairs, "
        "slower on b 0.900 [0.850, 0.950], 5 pairs")


# --------------------------------------------------------------------------- CSV lines


def _result(worker: str, wall_s: float | None, failure: str | None = None,
            disturbed: str | None = None) -> RunResult:
    rec = RunRecord(wall_ns=None if wall_s is None else int(wall_s * 1e9), user_s=0.0,
                    sys_s=0.0, maxrss_kb=1, exit_status=0, output_ok=failure is None,
                    failure=failure, disturbed=disturbed)
    return RunResult(sha256="0" * 64, args=(), worker=worker, worker_class="local", cpu=0,
                     records=(rec,))


def test_csv_lines_hold_each_workers_pairs_and_the_heuristics():
    # rounds (reference, candidate, candidate, reference): one on w0 with a disturbed
    # reference run (one pair kept), one split over two slots (dropped), one on w1
    rounds = [("w0", [1.0, 0.5, 0.6, None]), ("w0", [2.0, 2.1, 2.2, 2.3]),
              ("w1", [3.0, 3.1, 3.2, 3.3])]
    results = []
    for worker, times in rounds:
        for t in times:
            results.append(_result(worker, 9.9 if t is None else t,
                                   disturbed="migrated" if t is None else None))
    results[5] = _result("w1", 2.1)  # the second round moved half-way: no pairs
    c = Comparison(worker="w1", reference_times=[1.0, 3.0, 3.3], candidate_times=[0.5, 3.1, 3.2],
                   results=results, stopped="budget", dropped=3)
    assert pairs_by_worker(c) == {"w0": ([1.0], [0.5]), "w1": ([3.0, 3.3], [3.1, 3.2])}
    rows = csv_rows(c, "r/b/ridge/h/optimal.sexp", ("/runs/one", "/runs/two"))
    assert rows == [
        ["worker", "overrides", "rundirs", "run_1", "run_2"],
        ["w0", "r/b/ridge/h/optimal.sexp", "/runs/one;/runs/two", "0.500000", ""],
        ["w0", "heuristic", "", "1.000000", ""],
        ["w1", "r/b/ridge/h/optimal.sexp", "/runs/one;/runs/two", "3.100000", "3.200000"],
        ["w1", "heuristic", "", "3.000000", "3.300000"]]
    # pairs no round accounts for go on the comparison's last slot
    odd = Comparison(worker="w1", reference_times=[1.0], candidate_times=[2.0], results=[],
                     stopped="budget")
    assert pairs_by_worker(odd) == {"w1": ([1.0], [2.0])}
    none = Comparison(worker="w1", reference_times=[], candidate_times=[], results=[],
                      stopped="failed", failed=1)
    assert csv_rows(none, "x.sexp", ()) == [["worker", "overrides", "rundirs"],
                                            ["w1", "x.sexp", ""], ["w1", "heuristic", ""]]


# --------------------------------------------------------------------------- end to end


_config = tiny_search_config


def test_a_real_search_to_measured_optimal_trees_and_the_hyperparameters_to_use(compiler,
                                                                                tmp_path):
    bench = tmp_path / "tinysum"
    shutil.copytree(GOLDEN / "tinysum", bench)
    cfg = _config(tmp_path)
    (tmp_path / "tasks").write_text(f"{bench}\n")
    run = _cli("run_training_experiments", "--config", str(cfg), "--tasks",
               str(tmp_path / "tasks"), "--steps", "8", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    # eight quick steps are weak data: the optimal trees are asked for whatever the fit
    done = _cli("assign-rewards", "--batch-log", str(tmp_path / "batch.log"), "--out", "rewards",
                "--model", "ridge", "--gamma", "0.8", "--alpha", "0.01,0.1", "--target", "log",
                "--bootstrap", "10", "--min-r2=-inf", "--min-supported", "0", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    hypers = ["gamma0.8-alpha0.01-log", "gamma0.8-alpha0.1-log"]
    rundir = str(next((tmp_path / "rundirs").iterdir()))

    measured = _cli("run-all-benchmarks", "ridge", "--config", str(cfg), "--runs", "2",
                    "--max-pairs", "2", cwd=tmp_path)
    assert measured.returncode == 0, measured.stderr
    assert "Traceback" not in measured.stderr
    for h in hypers:
        path = tmp_path / "results" / "tinysum" / "ridge" / f"{h}.csv"
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        assert rows[0] == ["worker", "overrides", "rundirs", "run_1", "run_2"]
        assert [r[:3] for r in rows[1:]] == [
            [f"local/cpu{FIRST_CPU}", f"rewards/tinysum/ridge/{h}/optimal.sexp", rundir],
            [f"local/cpu{FIRST_CPU}", "heuristic", ""]]
        assert all(float(t) > 0 for r in rows[1:] for t in r[3:]) and len(rows[1]) == 5
        # stderr is a pipe here: each comparison's line says when it ended
        assert re.search(rf"^\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d tinysum/ridge/{h}: speedup ",
                         measured.stderr, re.MULTILINE), measured.stderr
    lines = measured.stdout.splitlines()
    rows = {ln.split()[1]: ln.split() for ln in lines if ln.split()[:1] == ["tinysum"]
            and ln.split()[1:2] != [] and ln.split()[1].startswith("gamma")}
    assert set(rows) == set(hypers)
    for row in rows.values():  # speedup [low, high] significant pairs worker
        float(row[2]), float(row[3].strip("[,")), float(row[4].strip("]"))
        assert row[5] in ("yes", "no") and row[6] == "2" and row[7] == f"local/cpu{FIRST_CPU}"
    summary = next(ln.split() for ln in lines if ln.split()[:1] == ["tinysum"]
                   and not ln.split()[1].startswith("gamma"))
    assert float(summary[1]) >= float(summary[2]) and summary[3] == "2"
    # a recommendation only with a significant gain (which two quick pairs rarely show)
    significant = [row[1] for row in rows.values()
                   if row[5] == "yes" and float(row[3].strip("[,")) > 1]
    choice = lines[-1]
    if significant:
        assert choice.startswith("hyperparameters to use in general: gamma0.8-alpha0.")
        assert choice.split()[5] in significant and "over 1 benchmark " in choice
        assert "measured significantly faster than the heuristic on tinysum " in choice
    else:
        assert choice.startswith("no hyperparameters to recommend: "), choice

    # a rerun measures nothing again: the same pairs come from the store
    before = {h: (tmp_path / "results" / "tinysum" / "ridge" / f"{h}.csv").read_text()
              for h in hypers}
    again = _cli("run-all-benchmarks", "ridge", "tinysum", "--config", str(cfg), "--runs", "2",
                 "--max-pairs", "2", "--hyper", hypers[1], cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "results" / "tinysum" / "ridge" / f"{hypers[1]}.csv").read_text() == \
        before[hypers[1]]
    assert hypers[0] not in again.stdout and hypers[1] in again.stdout


def _rewards(tmp_path: Path, directory: str | None, overrides: tuple[Override, ...] = ()) -> Path:
    """A hand-made assign-rewards output for tinysum: one optimal.sexp for ridge."""
    rewards = tmp_path / "rewards"
    d = rewards / "tinysum" / "ridge" / "gamma0.8-alpha0.01-log"
    d.mkdir(parents=True)
    write_overrides(d / "optimal.sexp", overrides)
    sources = {"benchmark": "tinysum", "rundirs": ["/runs/r1"]}
    if directory is not None:
        sources["directory"] = directory
    (rewards / "tinysum" / "sources.json").write_text(json.dumps(sources))
    return rewards


@pytest.mark.parametrize("case", ["no_rewards", "no_model", "unknown_bench", "unknown_hyper",
                                  "directory_gone", "bad_sexp"])
def test_bad_inputs_are_one_line(tmp_path, case):
    bench = tmp_path / "tinysum"
    shutil.copytree(GOLDEN / "tinysum", bench)
    cfg = _config(tmp_path)
    rewards = _rewards(tmp_path, str(bench))
    sexp = rewards / "tinysum" / "ridge" / "gamma0.8-alpha0.01-log" / "optimal.sexp"
    args = ["ridge"]
    if case == "no_rewards":
        args += ["--rewards", str(tmp_path / "nope")]
        expected = f"{tmp_path / 'nope'}: no such rewards directory (assign-rewards --out " \
                   "writes one)"
    elif case == "no_model":
        args = ["lasso"]
        expected = "no optimal.sexp for model lasso under rewards (models there: ridge)"
    elif case == "unknown_bench":
        args += ["tinysum", "kahan"]
        expected = "unknown benchmark kahan: no rewards/kahan (benchmarks there: tinysum)"
    elif case == "unknown_hyper":
        args += ["--hyper", "gamma1-alpha1-log"]
        expected = ("no optimal.sexp for model ridge with hyperparameters gamma1-alpha1-log "
                    "under rewards (found: gamma0.8-alpha0.01-log)")
    elif case == "directory_gone":
        shutil.rmtree(bench)
        expected = (f"tinysum: the benchmark directory {bench} (from "
                    "rewards/tinysum/sources.json) no longer exists")
    else:
        sexp.write_text("(inlining_overrides (version 1) (overrides ((unit")
        expected = None
    r = _cli("run-all-benchmarks", *args, "--config", str(cfg), cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.splitlines()
    if expected is None:
        assert line.startswith(f"run-all-benchmarks: {sexp.relative_to(tmp_path)}: ")
    else:
        assert line == f"run-all-benchmarks: {expected}"
    assert r.stdout == "" and not (tmp_path / "results").exists()


def test_an_optimal_tree_the_compiler_refuses_is_one_line(compiler, tmp_path):
    bench = tmp_path / "tinysum"
    shutil.copytree(GOLDEN / "tinysum", bench)
    _rewards(tmp_path, str(bench), (Override("Nosuch", 0, "C(Main.f@main.ml:1:2-3)", "inline"),))
    r = _cli("run-all-benchmarks", "ridge", "--config", str(_config(tmp_path)), cwd=tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [
        "run-all-benchmarks: rewards/tinysum/ridge/gamma0.8-alpha0.01-log/optimal.sexp: "
        "override 0: unit Nosuch: tinysum has no such unit (its units: Vec, Main)"]
    assert r.stdout == "" and not (tmp_path / "results").exists()


def test_rewards_without_a_recorded_directory_are_for_the_bundled_benchmark(tmp_path):
    from commands.run_all_benchmarks import collect
    from dispatcher.build.manifest import BUNDLED_DIR
    rewards = _rewards(tmp_path, None)
    shutil.move(rewards / "tinysum", rewards / "kahan")
    (target,), skipped = collect(rewards, "ridge", (), ())
    assert skipped == []
    assert target.bench.directory == BUNDLED_DIR / "kahan" and target.rundirs == ("/runs/r1",)
    assert [t.hyper for t in target.trees] == ["gamma0.8-alpha0.01-log"]
    assert target.trees[0].overrides == ()
