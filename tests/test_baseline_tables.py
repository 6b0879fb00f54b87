"""Issue 35, item 1: baselines that bound the problem.  The aggressive grid (allow-listed, a
record of the old grid refused unless --retune), a baseline build that fails counted at the
heuristic's figure and said so, and the per-program oracle of the baselines as a row of every
evaluation table.  Made-up figures, no compiler (one fake compiler that outlasts its budget)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from analysis.result_files import SUMMARY_HEADER
from dispatcher.baselines import (
    BUDGET_WORDS,
    GRID,
    ORACLE,
    RECORD,
    BaselineError,
    Cell,
    Tuning,
    check_grid,
    choose,
    counted_line,
    oracle_cell,
    read_record,
    table_cells,
    training_table,
    tune,
)
from dispatcher.build.driver import BuildError, build_benchmark
from dispatcher.build.manifest import resolve_benchmark
from dispatcher.core.figures import Figure, geomean_figure

#: The grid every record before issue 35 was tuned on.
OLD_GRID = {"O2": ["-O2"], "O3-inline-100": ["-O3", "-inline", "100"],
            "O3-inline-400": ["-O3", "-inline", "400"],
            "O3-max-depth-3": ["-O3", "-inline-max-depth", "3"],
            "O3-max-unroll-2": ["-O3", "-inline-max-unroll", "2"],
            "O3-unbox-closures": ["-O3", "-unbox-closures"]}

PAST = Figure(error="does not compile: crout: compiling crout.ml: timed out (build budget "
                    "300 s)", compiled=False)
REFUSED = Figure(error="does not compile: crout: compiling crout.ml failed (exit 2)",
                 compiled=False)


def test_the_grid_reaches_the_aggressive_end_and_is_allow_listed():
    check_grid(GRID)
    assert 10 <= len(GRID) <= 14  # a build and a comparison per setting and program
    assert len({tuple(v) for v in GRID.values()}) == len(GRID)
    flat = [" ".join(v) for v in GRID.values()]
    for wanted in ("-inline 1000", "-inline-max-depth 5", "-inline-max-unroll 3",
                   "-unbox-closures", "-rounds 4", "-inline-call-cost"):
        assert any(wanted in f for f in flat), wanted
    assert {k: list(v) for k, v in GRID.items()} != OLD_GRID


def test_a_record_of_the_old_grid_is_refused_in_one_line_unless_retuned(tmp_path):
    benches = [resolve_benchmark("kahan"), resolve_benchmark("hamming")]
    record = {"version": 1, "chosen": "O3-max-depth-3",
              "flags": ["-O3", "-inline-max-depth", "3"], "benchmarks": ["hamming", "kahan"],
              "size": "quick", "grid": OLD_GRID, "training": {}}
    (tmp_path / RECORD).write_text(json.dumps(record))
    assert read_record(tmp_path / RECORD) is not None  # a sound record, of another grid
    with pytest.raises(BaselineError) as err:
        tune(None, tmp_path, benches, {}, "quick", 2, None, False)  # type: ignore[arg-type]
    assert str(err.value) == (f"{tmp_path / RECORD}: tuned on another grid (6 settings; this "
                              f"one has {len(GRID)}, {len(GRID) - 6} new or changed, 0 gone): "
                              "--retune tunes this grid and rewrites the record")
    with pytest.raises(AttributeError):  # --retune: the measuring, with no session
        tune(None, tmp_path, benches, {"kahan": None, "hamming": None},  # type: ignore
             "quick", 2, None, True)  # type: ignore[arg-type]
    assert json.loads((tmp_path / RECORD).read_text()) == record  # untouched so far


def test_a_failed_baseline_build_counts_at_the_heuristic_figure_and_says_so():
    figures = {("p", "crout"): Figure(1.10, 1.05, 1.15, 4, 1.0),
               ("p", "lu"): Figure(0.90, 0.85, 0.95, 4, 1.0),
               ("always-inline", "crout"): PAST,
               ("always-inline", "lu"): Figure(1.50, 1.40, 1.60, 4, 1.2),
               ("never-inline", "crout"): REFUSED,
               ("never-inline", "lu"): Figure(error="not measured: a worker was lost")}
    cells = table_cells(figures, "p", ["never-inline", "always-inline"], ["crout", "lu"])
    past = cells[("always-inline", "crout")]
    assert past.measured is PAST and past.counted.speedup == 1.0
    assert past.note == "past the build budget: counted at the heuristic's figure"
    assert cells[("never-inline", "crout")].note.startswith("does not compile: counted")
    # a figure missing for another reason stays missing: no mean hides it
    assert cells[("never-inline", "lu")].counted.speedup is None
    g = geomean_figure(cells[("always-inline", n)].counted for n in ("crout", "lu"))
    assert g is not None and g.speedup == pytest.approx(math.sqrt(1.0 * 1.5))
    assert geomean_figure(cells[("never-inline", n)].counted for n in ("crout", "lu")) is None
    assert counted_line(cells, "always-inline", ["crout", "lu"]) == (
        "counted at the heuristic's figure (1.000): crout past the build budget")
    assert counted_line(cells, "p", ["crout", "lu"]) is None
    # the policy's own failure is an error of the run, never a fallback
    failed_policy = table_cells({("p", "lu"): REFUSED}, "p", [], ["lu"])
    assert failed_policy[("p", "lu")].counted.speedup is None


def test_the_oracle_is_the_best_of_heuristic_global_and_always_inline():
    figures = {("p", "a"): Figure(1.0, 0.9, 1.1, 4), ("p", "b"): Figure(1.0, 0.9, 1.1, 4),
               ("p", "c"): Figure(1.0, 0.9, 1.1, 4),
               ("global-O2", "a"): Figure(1.20, 1.10, 1.30, 4, 1.0),
               ("global-O2", "b"): Figure(0.95, 0.90, 1.00, 4, 1.0),
               ("global-O2", "c"): Figure(1.05, 1.00, 1.10, 4, 1.0),
               ("never-inline", "a"): Figure(3.0, 2.9, 3.1, 4),  # a floor, never a pick
               ("never-inline", "b"): Figure(3.0, 2.9, 3.1, 4),
               ("never-inline", "c"): Figure(3.0, 2.9, 3.1, 4),
               ("always-inline", "a"): Figure(1.10, 1.00, 1.20, 4, 2.0),
               ("always-inline", "b"): Figure(0.80, 0.70, 0.90, 4, 2.0),
               ("always-inline", "c"): PAST}
    others = ["global-O2", "never-inline", "always-inline"]
    cells = table_cells(figures, "p", others, ["a", "b", "c"], "cycles")
    a, b, c = (cells[(ORACLE, n)] for n in ("a", "b", "c"))
    assert (a.note, a.counted.speedup, a.counted.low) == ("global-O2", 1.20, 1.10)
    # every baseline slower: the heuristic, exactly 1, its own size
    assert (b.note, b.counted.speedup, b.counted.low, b.counted.size_ratio) == (
        "heuristic", 1.0, 1.0, 1.0)
    assert b.counted.metric == "cycles"
    # always-inline past its budget is the heuristic's figure: global-O2's 1.05 wins
    assert (c.note, c.counted.speedup) == ("global-O2", 1.05)
    g = geomean_figure(cells[(ORACLE, n)].counted for n in ("a", "b", "c"))
    assert g is not None and g.speedup == pytest.approx((1.2 * 1.0 * 1.05) ** (1 / 3))
    # a baseline with no figure: no ceiling (a best of fewer is not one)
    missing = oracle_cell({"global-O2": cells[("global-O2", "a")],
                           "always-inline": Cell(Figure(), Figure())})
    assert missing.counted.speedup is None and missing.counted.error == \
        "always-inline has no figure"
    # no baseline to pick among (no --baselines, or none tuned and no always-inline): no row
    assert not any(k[0] == ORACLE for k in table_cells(figures, "p", ["never-inline"],
                                                          ["a"]))


def test_the_summary_rows_carry_what_the_means_count(tmp_path):
    from pipeline.evaluation import write_summary
    benches = [resolve_benchmark("kahan")]
    figures = {("p", "kahan"): Figure(1.1, 1.0, 1.2, 4, 1.0),
               ("global-O2", "kahan"): Figure(1.05, 1.0, 1.1, 4, 1.0),
               ("always-inline", "kahan"): PAST}
    path = write_summary(tmp_path, "p", ["global-O2", "always-inline"], benches, figures)
    rows = [line.split(",") for line in path.read_text().splitlines()]
    assert rows[0] == SUMMARY_HEADER and rows[0][-2:] == ["counted", "note"]
    by_build = {r[2]: dict(zip(SUMMARY_HEADER, r)) for r in rows[1:]}
    assert list(by_build) == ["p", "global-O2", "always-inline", ORACLE]
    assert by_build["always-inline"]["speedup"] == ""
    assert by_build["always-inline"]["counted"] == "1.000000"
    assert by_build["always-inline"]["note"].startswith("past the build budget")
    assert by_build["always-inline"]["policy_vs"] == "1.100000"  # against the fallback
    assert (by_build[ORACLE]["speedup"], by_build[ORACLE]["note"]) == ("1.050000",
                                                                       "global-O2")
    assert by_build["p"]["policy_vs"] == "" and by_build["p"]["counted"] == "1.100000"


def test_a_setting_that_fails_somewhere_still_competes_at_the_heuristic_figure():
    table = training_table({
        "fast-but-fragile": {"x": Figure(1.30, 1.30, 1.30, 1, 1.0, metric="cycles"),
                             "y": PAST},
        "steady": {"x": Figure(1.05, 1.05, 1.05, 1, 1.0, metric="cycles"),
                   "y": Figure(1.05, 1.05, 1.05, 1, 1.0, metric="cycles")},
        "unmeasured": {"x": Figure(2.0, 2.0, 2.0, 1), "y": Figure(error="not measured")},
    }, "cycles")
    assert table["fast-but-fragile"]["failed"] == {"y": "past the build budget"}
    assert table["fast-but-fragile"]["geomean"][0] == pytest.approx(math.sqrt(1.3))
    assert table["unmeasured"]["geomean"] is None and "failed" not in table["steady"]
    assert choose(table) == "fast-but-fragile"
    assert choose({"a": {"geomean": None}}) is None
    from commands.run_plugin_benchmark import grid_lines
    lines = grid_lines(Tuning("fast-but-fragile", (), ("x", "y"), "tiny", table,
                              metric="cycles"))
    assert lines[0].startswith("global settings tuned on 2 benchmarks at size tiny, in cycles")
    assert lines[1].split() == ["fast-but-fragile", "1.140", "[1.140,", "1.140]", "(chosen);",
                                "counted", "at", "the", "heuristic's", "figure:", "y", "past",
                                "the", "build", "budget"]
    assert lines[3].split()[1:] == ["-", "(a", "benchmark", "has", "no", "figure)"]


def test_a_build_past_its_budget_is_worded_as_the_tables_read_it(tmp_path):
    """The words the tables look for are the driver's (a fake compiler that outlasts 0.3 s)."""
    fake = tmp_path / "ocamlopt"
    fake.write_text("#!/bin/sh\nexec sleep 5\n")
    fake.chmod(0o755)
    with pytest.raises(BuildError) as err:
        build_benchmark(resolve_benchmark("kahan"), tmp_path / "out", fake, timeout=0.3)
    assert BUDGET_WORDS in str(err.value) and err.value.lasting


def test_a_tampered_failed_list_is_refused_in_one_line(tmp_path):
    path: Path = tmp_path / RECORD
    path.write_text(json.dumps({
        "version": 1, "chosen": None, "flags": [], "benchmarks": ["kahan"], "size": "tiny",
        "grid": {k: list(v) for k, v in GRID.items()},
        "training": {"O2": {"geomean": None, "benchmarks": {}, "failed": {"kahan": 3}}}}))
    with pytest.raises(BaselineError) as err:
        read_record(path)
    assert str(err.value) == (f"{path}: training.O2.failed.kahan: Input should be a valid "
                              "string; --retune writes it again")
