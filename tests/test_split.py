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


def cal(compile_s: float, run_job_s: float) -> Calibration:
    return Calibration(compile_s=compile_s, run_job_s=run_job_s, benchmarks=("x",))


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
