"""run-plugin-benchmark --baselines: the global setting tuned on training benchmarks (an
allow-listed grid, the choice recorded and reused, --retune), never-inline and always-inline,
the policy reported against each.  The pure parts on made-up figures; the command at quick size
on two small programs (no assertion on a measured figure: a loaded machine moves them)."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from analysis.policy_training import encode, train
from analysis.result_files import SUMMARY_HEADER, summary_rows
from dispatcher.baselines import (
    GRID,
    RECORD,
    BaselineError,
    check_grid,
    read_record,
    setting_flags,
)
from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.policies import Advice, AlwaysInlinePolicy, parse_policy
from dispatcher.build.policy_file import save_policy_file
from dispatcher.core.figures import Figure, against, geomean_figure
from tests.helpers import cli as _cli
from tests.helpers import tiny_search_config


def test_the_grid_is_allow_listed_and_replaces_the_level_only():
    check_grid(GRID)
    with pytest.raises(ValueError, match="'-pp' is not allow-listed"):
        check_grid({"bad": ("-O3", "-pp", "cat")})
    kahan = resolve_benchmark("kahan")
    assert kahan.flags == ("-O3",)
    assert setting_flags(kahan, GRID["O2"]) == ("-O2",)
    assert setting_flags(kahan, GRID["O3-inline-400"]) == ("-O3", "-inline", "400")
    # other options of a manifest stay; a value the setting sets is replaced
    from dataclasses import replace
    custom = replace(kahan, flags=("-unsafe", "-O3", "-inline", "50", "-g"))
    assert setting_flags(custom, GRID["O3-inline-100"]) == ("-unsafe", "-g", "-O3", "-inline",
                                                            "100")


def test_the_policy_against_a_baseline_is_the_ratio_of_speedups():
    a, b = Figure(1.2, 1.1, 1.3, 5), Figure(1.0, 0.95, 1.05, 4)
    r = against(a, b)
    assert r.speedup == pytest.approx(1.2) and r.pairs == 4
    assert r.low < 1.2 < r.high  # type: ignore[operator]
    # wider than either interval alone (two measurements' uncertainty)
    assert math.log(r.high / r.low) > math.log(1.3 / 1.1)  # type: ignore[operator]
    assert not against(a, Figure(error="x", compiled=False)).ok
    assert Figure(error="x", compiled=False).cell() == "does not compile"
    assert geomean_figure([a, b]) is not None and geomean_figure([a, Figure()]) is None


def test_the_summary_csv_layout():
    p = Figure(1.2, 1.1, 1.3, 5, 1.01)
    rows = summary_rows([("kahan", "test", "p", p, None, p, None),
                         ("kahan", "test", "never-inline", Figure(0.5, 0.4, 0.6, 3, 0.9),
                          Figure(2.4, 2.0, 2.9, 3), None, "why")])
    assert rows[0] == SUMMARY_HEADER
    assert rows[1] == ["kahan", "test", "p", "1.200000", "1.100000", "1.300000", "5",
                       "1.010000", "", "", "", "time", "1.200000", ""]
    assert rows[2][-6:] == ["2.400000", "2.000000", "2.900000", "time", "", "why"]


def test_a_bad_record_is_one_line(tmp_path):
    assert read_record(tmp_path / RECORD) is None
    (tmp_path / RECORD).write_text("{not json")
    with pytest.raises(BaselineError, match=f"{RECORD}: unreadable .*--retune writes it"):
        read_record(tmp_path / RECORD)
    (tmp_path / RECORD).write_text(json.dumps({"version": 1, "chosen": 3}))
    with pytest.raises(BaselineError, match="chosen: Input should be a valid string"):
        read_record(tmp_path / RECORD)
    (tmp_path / RECORD).write_text("[]")
    with pytest.raises(BaselineError, match="not a global-setting record of version 1"):
        read_record(tmp_path / RECORD)


def test_a_recorded_choice_is_reused_only_when_it_chose_on_the_same_terms(tmp_path):
    """Reused without measuring anything (no session is needed); a record that chose nothing,
    or was made on other benchmarks, is tuned again (here: it reaches the measuring)."""
    from dispatcher.baselines import tune
    benches = [resolve_benchmark("kahan"), resolve_benchmark("hamming")]
    record = {"version": 1, "chosen": "O2", "flags": ["-O2"], "benchmarks": ["hamming", "kahan"],
              "size": "quick", "grid": {k: list(v) for k, v in GRID.items()}, "training": {}}
    (tmp_path / RECORD).write_text(json.dumps(record))
    said: list[str] = []
    got = tune(None, tmp_path, benches, {}, "quick", 2, None, False,  # type: ignore[arg-type]
               say=said.append)
    assert got.reused and got.chosen == "O2" and got.flags == ("-O2",) and not said
    for change, why in (({"chosen": None, "flags": []}, "no setting was measured on every tuning "
                                           "benchmark: tuning again"),
                        ({"size": "full"}, "tuned on other benchmarks or size: tuning again")):
        (tmp_path / RECORD).write_text(json.dumps({**record, **change}))
        said.clear()
        with pytest.raises(AttributeError):  # the measuring, with no session
            tune(None, tmp_path, benches, {"kahan": None, "hamming": None},  # type: ignore
                 "quick", 2, None, False, say=said.append)  # type: ignore[arg-type]
        assert said == [f"{tmp_path / RECORD}: {why}"]


def test_always_inline_answers_inline_where_the_heuristic_decided_freely():
    from dispatcher.build.policies import Observation
    features = None  # never read: the answer depends on the heuristic's reason only
    free = Observation(0, "M", 0, "k", "f", "dont_inline", "heuristic", None, None, features)
    forced = Observation(1, "M", 0, "k", "f", "dont_inline", "prevented", "max_depth", None,
                         features)
    assert AlwaysInlinePolicy().decide(free) is Advice.INLINE
    assert AlwaysInlinePolicy().decide(forced) is Advice.DEFAULT
    assert parse_policy("always-inline").identity() == "always-inline"


# -- the command ---------------------------------------------------------------------------

def tiny_policy(path: Path) -> Path:
    """A learned policy on one feature: small callees inline, large ones not (margin 0)."""
    sites = pd.DataFrame({"benchmark": ["x", "x", "y", "y"], "unit": "M", "round": 0,
                          "key": ["a", "b", "c", "d"],
                          "label": ["inline", "dont_inline", "inline", "dont_inline"],
                          "callee_size": [5, 80, 6, 90]})
    save_policy_file(train(encode(sites), "logistic", 0.01, margin=0.0), path)
    return path


def test_baselines_end_to_end(compiler, tmp_path):
    cfg = tiny_search_config(tmp_path)
    policy = tiny_policy(tmp_path / "tiny.policy")
    results = tmp_path / "results"
    common = ("run-plugin-benchmark", str(policy), "kahan", "hamming", "--baselines",
              "--tune-on", "kahan", "--config", str(cfg), "--size",
              "tiny", "--runs", "2", "--max-pairs", "2", "--results", str(results))
    r = _cli(*common, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    record = json.loads((results / RECORD).read_text())
    # tuned on kahan alone (each benchmark tuned on costs a build and a comparison per
    # setting), evaluated on both
    assert record["benchmarks"] == ["kahan"] and record["size"] == "tiny"
    assert set(record["training"]) == set(GRID) and record["chosen"] in GRID
    chosen = record["chosen"]
    # the choice is the best training geometric mean
    means = {k: v["geomean"][0] for k, v in record["training"].items() if v["geomean"]}
    assert means[chosen] == max(means.values())
    lines = r.stdout.splitlines()
    assert any(x.startswith(f"global setting: {chosen} (") and "recorded in" in x
               for x in lines), r.stdout
    assert sum("tuning " in x for x in r.stderr.splitlines()) == len(GRID)
    builds = ["tiny", f"global-{chosen}", "never-inline", "always-inline", "oracle"]
    for bench in ("kahan", "hamming"):
        for build in builds[1:3]:
            assert (results / bench / "plugins" / f"plugin_{build}.csv").is_file()
    with open(results / "plugin_tiny.summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["benchmark"], r["build"]) for r in rows] == [
        (b, x) for b in ("kahan", "hamming") for x in builds]
    for row in rows:
        if row["build"] in builds[:3]:  # these compile: every one has its figure
            assert float(row["low"]) <= float(row["speedup"]) <= float(row["high"]), row
            assert float(row["size_ratio"]) > 0
    assert all(row["policy_vs"] for row in rows if row["build"] in builds[1:3])
    # the oracle: the best of the heuristic, the global setting and always-inline
    for row in (r for r in rows if r["build"] == "oracle"):
        picks = {x["build"]: float(x["counted"]) for x in rows
                 if x["benchmark"] == row["benchmark"] and x["build"] in (builds[1], builds[3])}
        assert float(row["counted"]) == pytest.approx(max(1.0, *picks.values())), rows
        assert row["note"] in ("heuristic", *picks)
    # (a build past a cost guard, compile CPU time over 2x say, is named after the count:
    # which setting is chosen, and how long its builds take, depends on this machine)
    assert any(x.startswith(f"training: global-{chosen}: geometric mean speedup ")
               and "; tiny against it " in x and (x.endswith(" over 2 benchmarks") or (
                   " over 2 benchmarks; counted at the heuristic's figure (1.000): " in x))
               for x in lines), r.stdout

    # reused: no tuning the second time; --retune tunes again, its figures from the store
    again = _cli(*common, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert any("(reused from" in x for x in again.stdout.splitlines())
    assert not any("tuning " in x for x in again.stderr.splitlines())
    retuned = _cli(*common, "--retune", cwd=tmp_path)
    assert retuned.returncode == 0, retuned.stderr
    assert json.loads((results / RECORD).read_text()) == record

    # bad inputs: one line, exit 2
    (results / RECORD).write_text("[]")
    bad = _cli(*common, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines()[-1].startswith(
        f"run-plugin-benchmark: {results / RECORD}: not a global-setting record"), bad.stderr
    for args in (("--retune",), ("--tune-on", "kahan")):
        r2 = _cli("run-plugin-benchmark", "heuristic", "kahan", *args, "--config", str(cfg),
                  cwd=tmp_path)
        assert r2.returncode == 2 and r2.stderr == (
            "run-plugin-benchmark: --tune-on, --retune: only with --baselines\n"), r2.stderr
