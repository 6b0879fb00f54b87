"""The worker agent's exact metric: a run under cachegrind, its counts in the record.

Counts are asserted equal run to run and request to request (they do not depend on load or on
the agent's environment), proportional to the work the program does, and the agent refuses
an exact run in one line where valgrind is missing.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import SUM_ML, AgentProc, compile_programs, put
from workers.agent import cachegrind

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None,
                                reason="valgrind is not installed")

PROGRAMS = {
    "sum": SUM_ML,
    "segv": "let () = print_int !(Obj.magic 0 : int ref)\n",
}

SUMMARY = """desc: I1 cache:         32768 B, 64 B, 8-way associative
cmd: ./prog 10
events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw Bc Bcm Bi Bim
fl=prog.c
fn=main
3 10 1 1 0 0 0 0 0 0 0 0 0 0
summary: 100 2 1 30 4 3 20 2 1 10 3 1 1
"""


@pytest.fixture(scope="module")
def binaries(compiler, tmp_path_factory) -> dict:
    return compile_programs(compiler.ocamlopt, PROGRAMS, tmp_path_factory.mktemp("exact"))


@pytest.fixture
def agent(tmp_path, agent_pyz):
    (tmp_path / "cache").mkdir()
    a = AgentProc(tmp_path / "cache", agent=agent_pyz)
    yield a
    a.close()


def _exact_run(agent: AgentProc, sha: str, n: int, runs: int = 1) -> dict:
    return agent.request(op="run", sha256=sha, args=[str(n)], runs=runs, cpu=0, timeout=120,
                         expected_output={"text": f"{n * (n - 1) // 2}\n"}, perf=False,
                         metric="cachegrind")


def test_the_summary_line_is_read_by_event_name():
    counts = cachegrind.parse_counts(SUMMARY)
    assert counts == dict(zip(cachegrind.EVENTS, (100, 2, 1, 30, 4, 3, 20, 2, 1, 10, 3, 1, 1)))
    with pytest.raises(ValueError, match="expected Ir"):
        cachegrind.parse_counts(SUMMARY.replace("Bi Bim", "Bi"))
    with pytest.raises(ValueError, match="no events/summary"):
        cachegrind.parse_counts("desc: nothing\n")


def test_counts_are_the_same_run_to_run_and_grow_with_the_work(agent, binaries, tmp_path):
    sha = put(tmp_path / "cache", binaries["sum"])
    first = _exact_run(agent, sha, 20000, runs=2)
    assert first["ok"] is True, first
    records = first["runs"]
    assert len(records) == 2 and first["failed"] == 0 and first["disturbed"] == 0
    for rec in records:
        assert rec["failure"] is None and rec["output_ok"] is True
        assert set(rec["counts"]) == set(cachegrind.EVENTS)
        assert rec["disturbed"] is None
        assert rec["gc"]["minor_words"] >= 3 * 20000  # the GC report still comes through
    again = _exact_run(agent, sha, 20000)
    assert records[0]["counts"] == records[1]["counts"] == again["runs"][0]["counts"]
    base = _exact_run(agent, sha, 1)["runs"][0]["counts"]
    bigger = _exact_run(agent, sha, 80000)["runs"][0]["counts"]
    # a list of 20000 ints is some 100k instructions of work at least, 80000 more again
    assert base["Ir"] + 100_000 < records[0]["counts"]["Ir"] < bigger["Ir"] - 300_000
    assert not list((tmp_path / "cache").glob("*grind.*"))


def test_a_crash_under_cachegrind_is_a_failed_run(agent, binaries, tmp_path):
    sha = put(tmp_path / "cache", binaries["segv"])
    r = agent.request(op="run", sha256=sha, args=[], runs=1, cpu=0, timeout=120, perf=False,
                      metric="cachegrind")
    assert r["ok"] is True and r["failed"] == 1, r
    assert r["runs"][0]["failure"] is not None


def test_hello_says_whether_exact_runs_work(agent):
    info = agent.request(op="hello", exact=True)["exact"]
    assert info["available"] is True and info["version"]
    assert info["identity"] == cachegrind.identity()
    assert "exact" not in agent.request(op="hello")


def test_an_unknown_metric_is_a_bad_request(agent, binaries, tmp_path):
    sha = put(tmp_path / "cache", binaries["sum"])
    r = agent.request(op="run", sha256=sha, args=["1"], cpu=0, metric="cycles")
    assert r["ok"] is False and r["code"] == "bad_request" and "metric" in r["error"]


def test_without_valgrind_an_exact_run_is_refused_in_one_line(tmp_path, agent_pyz, binaries):
    (tmp_path / "cache").mkdir()
    env = dict(os.environ, PATH=str(tmp_path))  # no valgrind on this PATH
    a = AgentProc(tmp_path / "cache", agent=agent_pyz, env=env)
    try:
        sha = put(tmp_path / "cache", binaries["sum"])
        assert a.request(op="hello", exact=True)["exact"]["available"] is False
        r = a.request(op="run", sha256=sha, args=["1"], cpu=0, metric="cachegrind")
        assert r["ok"] is False and r["code"] == "exact_unavailable"
        assert "valgrind" in r["error"] and "\n" not in r["error"]
    finally:
        a.close()


def test_the_fixed_geometry_is_what_cachegrind_simulated(binaries, tmp_path):
    """cachegrind sizes its last level after the host's L3 unless told: the wrapped command
    must override all three caches (its own desc: lines say what it simulated)."""
    import subprocess
    argv = cachegrind.wrap(shutil.which("valgrind") or "", [str(binaries["sum"]), "10"],
                           str(tmp_path))
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    (out,) = list(Path(tmp_path).glob("cachegrind.*"))
    desc = [ln for ln in out.read_text().splitlines() if ln.startswith("desc:")]
    size, assoc, line = cachegrind.GEOMETRY["LL"]
    assert any(f"LL cache: {size} B, {line} B, {assoc}-way" in " ".join(d.split())
               for d in desc), desc


def test_the_master_reads_the_events_the_agent_counts():
    """workers/ cannot import dispatcher/: the two lists of events are kept equal here."""
    from dispatcher.core import cycles
    assert cycles.EVENTS == cachegrind.EVENTS


def test_estimated_cycles_charge_each_event_its_weight():
    from dispatcher.core.cycles import CycleModel, metric_value
    counts = cachegrind.parse_counts(SUMMARY)
    model = CycleModel(l1=10, ll=100, branch=15, indirect=20)
    # Ir 100; L1 misses 2 + 4 + 2; LL misses 1 + 3 + 1; Bcm 3; Bim 1
    assert model.cycles(counts) == 100 + 10 * 8 + 100 * 5 + 15 * 3 + 20 * 1
    assert metric_value("instructions", counts) == 100
    with pytest.raises(ValueError, match="not an exact metric"):
        metric_value("time", counts)


def test_a_run_record_keeps_its_counts_and_an_older_one_reads_as_before():
    from dispatcher.core.records import RunRecord
    plain = RunRecord(wall_ns=1, user_s=0.0, sys_s=0.0, maxrss_kb=1)
    assert "counts" not in plain.to_json()
    counted = RunRecord(wall_ns=1, user_s=0.0, sys_s=0.0, maxrss_kb=1, counts={"Ir": 3})
    assert RunRecord.model_validate(counted.to_json()).counts == {"Ir": 3}

