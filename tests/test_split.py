"""The automatic CPU split (dispatcher.cpu_split): the choice is the best bound; the calibration
compiles and runs the real benchmarks; a config with ``cpus: auto`` is split, others are not."""
from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from dispatcher.build.manifest import resolve_benchmark
from dispatcher.config import load_config
from dispatcher.cpu_split import Calibration, bound, calibrate, choose_split, split_config
from dispatcher.running.local import LocalConfig
from dispatcher.session import Session


def cal(compile_s: float, run_job_s: float, exact: bool = False) -> Calibration:
    return Calibration(compile_s=compile_s, run_job_s=run_job_s, benchmarks=("x",),
                       exact=exact)


def test_the_split_of_the_issue_figures():
    """16 CPUs at 0.32 s per compile and 0.47 s per run job (quick sizes): 7 compile, 9 time
    runs; at full size (a run job of seconds) one compile CPU is enough."""
    quick = choose_split(range(16), cal(0.32, 0.47))
    assert quick.compilers == tuple(range(7)) and quick.workers == tuple(range(7, 16))
    assert quick.bound == min(7 / 0.32, 9 / 0.47)
    full = choose_split(range(16), cal(0.4, 12.0))
    assert full.compilers == (0,) and len(full.workers) == 15


@given(st.integers(2, 64), st.floats(0.01, 100), st.floats(0.01, 100))
def test_no_other_split_allows_more(n, compile_s, run_job_s):
    c = cal(compile_s, run_job_s)
    split = choose_split(range(n), c)
    assert split.workers and split.compilers
    assert sorted(split.workers + split.compilers) == list(range(n))
    assert all(bound(k, n - k, c) <= split.bound for k in range(1, n))


def test_fewer_than_two_cpus_cannot_be_split():
    with pytest.raises(ValueError):
        choose_split([3], cal(1, 1))


def test_counting_the_compile_cpus_count_too_and_the_fewest_keep_pace():
    """In an exact metric all 16 CPUs share compile and count: at 1 s per compile and 0.5 s
    per count, 16 / 1.5 candidates a second, which 11 compile CPUs keep pace with (10 do
    not); at 0.5 s and 20 s (a count at full size) one compile CPU is enough, and the bound
    is above timing's, whose 15 slots alone run the jobs."""
    heavy = choose_split(range(16), cal(1.0, 0.5, exact=True))
    assert heavy.compilers == tuple(range(11)) and heavy.bound == pytest.approx(16 / 1.5)
    light = choose_split(range(16), cal(0.5, 20.0, exact=True))
    assert light.compilers == (0,) and light.bound == pytest.approx(16 / 20.5)
    assert choose_split(range(16), cal(0.5, 20.0)).bound == pytest.approx(15 / 20)
    line = light.describe(cal(0.5, 20.0, exact=True))
    assert line.startswith("automatic split: 1 CPUs compile (0) and count when idle, 15 "
                           "count and time runs (1,2,") and "20 s per count" in line


@given(st.integers(2, 64), st.floats(0.05, 30), st.floats(0.05, 300))
def test_counting_the_split_is_the_fewest_compile_cpus_at_the_best_bound(n, compile_s, count_s):
    c = cal(compile_s, count_s, exact=True)
    split = choose_split(range(n), c)
    k = len(split.compilers)
    assert split.bound == max(bound(j, n - j, c) for j in range(1, n))
    assert k == 1 or bound(k - 1, n - k + 1, c) < split.bound


def write(tmp_path, **sections):
    data = {"store": str(tmp_path / "store"), "run": {"runs": 2, "timeout": 30,
                                                      "size": "quick"}, **sections}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def test_calibration_compiles_a_candidate_and_times_a_run_job(compiler, tmp_path):
    config = write(tmp_path, local={"cpus": "auto"})
    benches = [resolve_benchmark("kahan"), resolve_benchmark("lens")]
    with Session(config) as session:
        c = calibrate(session.builds, benches, "quick", 2, 30)
        assert c.benchmarks == ("kahan", "lens")
        # per benchmark: its baseline and a candidate one proposal away
        assert len(session.store.artifact_keys()) == 4
    assert 0 < c.compile_s < 60 and 0 < c.run_job_s < 60


def test_calibration_in_an_exact_metric_counts_under_cachegrind(compiler, tmp_path):
    config = write(tmp_path, local={"cpus": "auto"})
    benches = [resolve_benchmark("kahan")]
    with Session(config) as session:
        timed = calibrate(session.builds, benches, "tiny", 2, 30)
        counted = calibrate(session.builds, benches, "tiny", 2, 30, exact=True)
    assert counted.exact and not timed.exact
    # one count under cachegrind (a tool start of its own, then some 50x slower) against
    # one of the four plain runs of the timed job
    assert counted.run_job_s > timed.run_job_s / 4


def test_split_config_splits_auto_and_leaves_the_rest(compiler, tmp_path):
    bench = [resolve_benchmark("kahan")]
    auto = write(tmp_path, local={"cpus": "auto"})
    split, line = split_config(auto, bench, "quick", 2, cpus=range(8))
    local = split.backend_settings
    assert isinstance(local, LocalConfig)
    assert line is not None and line.startswith("automatic split: ") and "kahan" in line
    workers = local.cpus
    assert workers and workers == tuple(range(8 - len(workers), 8))  # the highest CPUs
    assert split.compile_jobs == 8 - len(workers)
    assert f"{len(workers)} CPUs time runs" in line

    jobs = write(tmp_path, local={"cpus": "auto"}, compile={"jobs": 3})
    assert split_config(jobs, bench, "quick", 2, cpus=range(8))[0].compile_jobs == 3

    listed = write(tmp_path, local={"cpus": [0]})
    assert split_config(listed, bench, "quick", 2, cpus=range(8)) == (listed, None)
    assert split_config(auto, bench, "quick", 2, cpus=range(2)) == (auto, None)


def test_a_benchmark_that_cannot_be_calibrated_leaves_the_default(compiler, tmp_path):
    bench = [resolve_benchmark("kahan")]
    broken = write(tmp_path, local={"cpus": "auto"}, run={"runs": 2, "timeout": 0.001,
                                                         "size": "quick"})
    kept, line = split_config(broken, bench, "quick", 2, cpus=range(4))
    assert kept == broken
    assert line is not None and line.startswith("cannot calibrate the automatic CPU split "
                                                "(kahan: ") and "every CPU but one" in line
