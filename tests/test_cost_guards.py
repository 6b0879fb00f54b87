"""Issue 35, item 5: cost guards.  A policy's (or a baseline's) build more than
``policy.max_compile_ratio`` times the heuristic's compile CPU time, or whose binary is more
than ``policy.max_size_ratio`` times the heuristic's, is counted at the heuristic's figure
with one line.  The rule on made-up ratios; the compile time recorded by the compile service
(and kept by a cached build); the command with the real compiler, a tiny limit forcing it."""
from __future__ import annotations

import csv
import shutil

import pytest
import yaml

from dispatcher.baselines import ORACLE, counted_line, table_cells, training_table
from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.service import CompileJob, CompileService
from dispatcher.config import load_config
from dispatcher.core.figures import Figure
from dispatcher.core.guards import CostGuard, over_guard
from dispatcher.storage.store import Store
from pipeline.policy.selection import FoldMeasure, gate_line, worst
from tests.helpers import cli, needs_valgrind, tiny_search_config

GUARD = CostGuard(max_compile_ratio=2.0, max_size_ratio=1.5)


def test_the_rule_names_the_ratio_and_the_limit():
    assert over_guard(1.99, 1.49, GUARD) is None
    assert over_guard(2.0, 1.5, GUARD) is None  # at the limit is within it
    assert over_guard(2.5, 1.0, GUARD) == ("compile time 2.500x the heuristic's, over the "
                                           "limit 2x (policy.max_compile_ratio)")
    assert over_guard(1.0, 1.6, GUARD) == ("binary size 1.600x the heuristic's, over the "
                                           "limit 1.5x (policy.max_size_ratio)")
    assert over_guard(3.0, 3.0, GUARD).startswith("compile time 3.000x")  # type: ignore
    # a compile time not recorded: judged on the size alone
    assert over_guard(None, 1.2, GUARD) is None
    assert over_guard(None, 1.7, GUARD).startswith("binary size")  # type: ignore
    assert over_guard(9.0, 9.0, None) is None  # no guard


def fig(speedup: float, size: float, cpu: float | None, metric: str = "cycles") -> Figure:
    return Figure(speedup, speedup, speedup, 0, size, metric=metric, compile_ratio=cpu)


def test_a_build_past_the_guard_is_counted_at_the_heuristics_figure():
    figures = {("p", "a"): fig(1.3, 1.6, 1.1), ("p", "b"): fig(1.1, 1.0, 1.0),
               ("always-inline", "a"): fig(1.2, 1.1, 1.2),
               ("always-inline", "b"): fig(1.4, 1.2, 2.4)}
    cells = table_cells(figures, "p", ["always-inline"], ["a", "b"], "cycles", GUARD)
    a = cells[("p", "a")]
    assert a.measured.speedup == 1.3 and a.counted.speedup == 1.0  # the policy falls back
    assert a.counted.size_ratio == 1.0 and a.fallback is not None
    assert a.note == f"{a.fallback}: counted at the heuristic's figure"
    assert "binary size 1.600x" in a.note and "limit 1.5x" in a.note
    assert cells[("p", "b")].counted.speedup == 1.1 and cells[("p", "b")].fallback is None
    b = cells[("always-inline", "b")]
    assert b.counted.speedup == 1.0 and "compile time 2.400x" in (b.note or "")
    # the oracle picks among counted figures: always-inline's 1.4 on b is not there to take
    assert cells[(ORACLE, "b")].counted.speedup == 1.0
    assert cells[(ORACLE, "a")].note == "always-inline"
    assert counted_line(cells, "p", ["a", "b"]) == (
        "counted at the heuristic's figure (1.000): a binary size 1.600x the heuristic's, "
        "over the limit 1.5x (policy.max_size_ratio)")
    # no guard: as before, the policy as measured
    plain = table_cells(figures, "p", ["always-inline"], ["a", "b"], "cycles")
    assert plain[("p", "a")].counted.speedup == 1.3 and plain[("p", "a")].note is None


def test_a_split_line_gives_both_builds_as_measured_where_both_compiled():
    """A baseline counted at the heuristic's figure somewhere: the split's line also gives both
    builds as measured over the programs where both compiled (issue 35's "where both build"),
    a program whose baseline does not compile left out; none counted so: no such clause."""
    from commands.run_plugin_benchmark import _split_line
    figures = {("p", "a"): fig(1.2, 1.0, 1.0), ("p", "b"): fig(1.1, 1.0, 1.0),
               ("p", "c"): fig(1.05, 1.0, 1.0),
               ("always-inline", "a"): fig(1.5, 1.1, 1.2),
               ("always-inline", "b"): fig(1.4, 1.2, 2.4),  # past the compile guard
               ("always-inline", "c"): Figure(error="past the build budget", compiled=False,
                                              metric="cycles")}
    names = ["a", "b", "c"]
    cells = table_cells(figures, "p", ["always-inline"], names, "cycles", GUARD)
    line = _split_line(cells, "p", "always-inline", "test", names)
    assert "counted at the heuristic's figure (1.000): b compile time 2.400x" in line
    a, p, vs = ((1.5 * 1.4) ** 0.5, (1.2 * 1.1) ** 0.5, (1.2 / 1.5 * 1.1 / 1.4) ** 0.5)
    assert line.endswith(  # exact counts: each interval is its point
        f"; as measured where both compiled (2 of 3, the cost guards aside): always-inline "
        f"{a:.3f} [{a:.3f}, {a:.3f}], p {p:.3f} [{p:.3f}, {p:.3f}], p against it "
        f"{vs:.3f} [{vs:.3f}, {vs:.3f}]"), line
    within = table_cells(figures, "p", ["always-inline"], ["a"], "cycles", GUARD)
    assert "as measured" not in _split_line(within, "p", "always-inline", "test", ["a"])


def test_the_tuning_counts_a_setting_past_the_guard_at_the_heuristics_figure():
    table = training_table({"big": {"a": fig(1.5, 2.0, 1.0), "b": fig(1.1, 1.0, 1.0)}},
                           "cycles", GUARD)
    assert table["big"]["geomean"][0] == pytest.approx(1.1 ** 0.5)
    assert table["big"]["failed"]["a"].startswith("binary size 2.000x")


def test_a_fold_past_the_guard_is_judged_at_the_heuristics_figure(tmp_path):
    over = FoldMeasure("logistic", "a", tmp_path / "p", fig(1.3, 1.0, 5.0, "time"),
                       fallback="compile time 5.000x the heuristic's, over the limit 2x")
    slow = FoldMeasure("logistic", "b", tmp_path / "p", fig(0.97, 1.0, 1.0, "time"))
    assert over.speedup == 1.0 and over.figure.speedup == 1.3
    assert "counted at the heuristic's figure" in over.text()
    assert worst([over, slow]) is slow
    passed, line = gate_line("logistic", [over, FoldMeasure(
        "logistic", "b", tmp_path / "p", fig(1.2, 1.0, 1.0, "time"))], gate=1.05)
    assert not passed and "(a)" in line  # the fold that fell back is the worst, at 1.000


def test_the_limits_default_and_read(tmp_path):
    assert load_config().policy == CostGuard(2.0, 1.5)
    path = tmp_path / "c.yaml"
    path.write_text("policy:\n  max_size_ratio: 1.0001\n")
    assert load_config(path).policy == CostGuard(2.0, 1.0001)


def test_a_build_records_its_compile_cpu_time_and_keeps_it_cached(compiler, tmp_path):
    """Each unit's CPU time is recorded with it; a build's is the sum with the link's, kept
    in the store, so a cached build (and a build of reused units) judges the same ratio."""
    kahan = resolve_benchmark("kahan")
    service = CompileService(Store(tmp_path / "store"), compiler)
    try:
        first = service.compile(CompileJob(kahan))
        assert first.cpu_s is not None and 0 < first.cpu_s < first.seconds * 4
        assert service.compile(CompileJob(kahan)).cpu_s == first.cpu_s  # a cache hit
    finally:
        service.close()
    again = CompileService(Store(tmp_path / "store"), compiler)
    try:
        assert again.compile(CompileJob(kahan)).cpu_s == first.cpu_s  # another process
        # the build forgotten, its units not: every unit from the unit cache counts at its
        # recorded time, so the figure is still a whole build's, not the link's alone
        shutil.rmtree(again.store.compiled)
        rebuilt = again.compile(CompileJob(kahan))
        assert not rebuilt.cached and rebuilt.units_compiled == 0
        assert rebuilt.cpu_s is not None and rebuilt.cpu_s > 0.5 * first.cpu_s
    finally:
        again.close()




@needs_valgrind
def test_a_tiny_size_limit_makes_always_inline_fall_back(compiler, tmp_path):
    """kahan's always-inline binary is larger than its heuristic's (by about 0.5%): under
    ``max_size_ratio: 1.0001`` it falls back, in one line and in the summary CSV."""
    cfg = tiny_search_config(tmp_path)
    data = yaml.safe_load(cfg.read_text())
    data["policy"] = {"max_size_ratio": 1.0001, "max_compile_ratio": 1e6}
    cfg.write_text(yaml.safe_dump(data))
    results = tmp_path / "results"
    r = cli("run-plugin-benchmark", "always-inline", "kahan", "--config", str(cfg),
            "--size", "tiny", "--metric", "cycles", "--results", str(results), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if "over the limit" in x]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("run-plugin-benchmark: kahan: always-inline: binary size ")
    assert ("limit 1.0001x (policy.max_size_ratio): falls back to the heuristic's decisions, "
            "counted at the heuristic's figure (1.000)") in lines[0]
    with open(results / "plugin_always-inline.summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(row["benchmark"], row["build"]) for row in rows] == [("kahan", "always-inline")]
    row = rows[0]
    assert float(row["size_ratio"]) > 1.0001 and float(row["counted"]) == 1.0
    assert row["note"].startswith("binary size ") and float(row["speedup"]) > 0
    assert any(x.startswith("kahan ") and "fell back" in x for x in r.stdout.splitlines())
    assert "geometric mean speedup 1.000 [1.000, 1.000] over 1 benchmark" in r.stdout
    assert "counted at the heuristic's figure (1.000): kahan binary size" in r.stdout
