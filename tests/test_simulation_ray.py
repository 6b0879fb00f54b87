"""Simulated slots hosted by Ray actors (``simulated.ray``, dispatcher/running/simulated/
ray_hosts.py) on a real two-node cluster in a private network namespace (tests/raylab.py):
nothing listens outside it and no packet leaves it.  The master runs in the namespace, as a
subprocess; it prints what the test checks as one JSON line."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dispatcher.config import ConfigError, parse_config
from tests.helpers import REPO
from tests.raylab import LabUnavailable, RayLab, lab_unavailable_reason

# -- config (no cluster needed)

@pytest.mark.parametrize("ray, message", [
    ({"actors": 0}, "simulated.ray.actors: expected a positive integer"),
    ({"actors": 5}, "simulated.ray.actors: expected at most simulated.slots (4), got 5"),
    ({"address": "head"}, "simulated.ray.address: expected auto or the head's host:port"),
    ({"auth": "password"}, "simulated.ray.auth: expected token or none"),
    ({"auth": "none", "token_file": "t"}, "simulated.ray.token_file: expected no token file"),
    ({"start_timeout": 0}, "simulated.ray.start_timeout: expected a positive number"),
    ({"colour": 1}, "simulated.ray.colour: expected one of actors, address"),
    (3, "simulated.ray: expected a mapping, got 3"),
])
def test_bad_ray_hosts_config_is_one_line(ray, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"backend": "simulated", "simulated": {"slots": 4, "ray": ray}},
                     Path("c.yaml"))
    assert str(err.value).startswith("c.yaml: " + message), str(err.value)
    assert "\n" not in str(err.value)


def test_ray_hosts_defaults_and_local_without_them():
    def settings(section: dict):
        return parse_config({"backend": "simulated", "simulated": section},
                            Path("c.yaml")).backend_settings
    assert settings({"slots": 4}).ray is None
    hosts = settings({"slots": 4, "ray": {}}).ray
    assert (hosts.address, hosts.actors, hosts.auth) == ("auto", 4, "token")
    assert settings({"slots": 64, "ray": {"address": "127.0.0.1:6379"}}).ray.actors == 8


# -- against a real cluster (one for the module: it takes seconds to start)

@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    if lab_unavailable_reason():
        pytest.skip(lab_unavailable_reason() or "")
    root = tmp_path_factory.mktemp("raylab")
    try:
        with RayLab(root) as lab:
            yield lab
            leftover_log = lab.log_tail()
    except LabUnavailable as exc:
        pytest.skip(str(exc))
    assert not lab.leftovers(), leftover_log  # every raylet, GCS and actor is gone


PRELUDE = textwrap.dedent("""
    import json, os, sys, threading, time
    from pathlib import Path
    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.build.service import CompileJob
    from dispatcher.config import parse_config
    from dispatcher.core.jobs import RunJob
    from dispatcher.session import Session
    address, tmp = sys.argv[1], Path(sys.argv[2])
    LU = resolve_benchmark("lu")

    def config(name, slots, actors, time_scale=0.002, depth=2, **sections):
        simulated = {"slots": slots, "time_scale": time_scale, "compile_jobs": 2,
                     "depth": depth, "cache_dir": str(tmp / "sim-cache"),
                     "model": {"noise": {"lost": 0}}}
        if actors:
            simulated["ray"] = {"address": address, "actors": actors, "start_timeout": 60}
        return parse_config({"backend": "simulated", "store": str(tmp / name / "store"),
                             "simulated": simulated,
                             "scheduler": {"backoff_s": 0.01, "backoff_max_s": 0.05},
                             "search": {"rundirs": str(tmp / name / "rundirs"),
                                        "batch_log": str(tmp / name / "batch.log"),
                                        "focus": "uniform"}, **sections}, None)
""")


def in_lab(lab: RayLab, tmp: Path, body: str, timeout: float = 120) -> dict:
    script = PRELUDE + textwrap.dedent(body)
    proc = subprocess.run(lab.command([sys.executable, "-c", script, lab.address, str(tmp)]),
                          cwd=REPO, env=lab.env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(lab_unavailable_reason() is not None, reason=lab_unavailable_reason() or "")
def test_a_search_runs_over_slots_in_actors_with_the_local_draws(lab, tmp_path):
    got = in_lab(lab, tmp_path, """
        from dispatcher.planning import Overrides, plan_chains
        from dispatcher.search.chain import Chain
        cfg = config("search", slots=4, actors=2, search={
            "rundirs": str(tmp / "rundirs"), "batch_log": str(tmp / "batch.log"),
            "focus": "uniform", "steps": 4, "mode": "async"})
        with Session(cfg) as session:
            measurements = session.start_workers()
            plan = plan_chains(cfg, [LU], [], Overrides(runs=3, max_pairs=4),
                               {"simulated": 4}, session.builds.toolchain, "t")
            chain = Chain.of_rundir(plan.chains[0].rundir, LU, cfg, session.builds,
                                    measurements, "simulated", threading.Event())
            chain.run()
            stats = session.backend.host_stats()
            workers = sorted(session.scheduler.busy_s)
        # the same jobs, one at a time on one slot, locally and in an actor: the same draws
        walls = {}
        for name, actors in (("local", 0), ("ray", 1)):
            with Session(config(name, slots=1, actors=actors, depth=1)) as s:
                s.start_workers()
                base = s.builds.compile(CompileJob(LU))
                job = RunJob(sha256=base.sha256, binary=base.binary, args=("1",), runs=3,
                             timeout=60)
                walls[name] = [rec.wall_s for _ in range(3)
                               for rec in s.scheduler.submit(job).result(timeout=60).records]
        print(json.dumps({"state": chain.status.state, "error": chain.status.error,
                          "steps": chain.status.step, "stats": stats, "workers": workers,
                          "master": os.getpid(), "walls": walls}))
    """)
    assert got["state"] == "finished", got["error"]
    assert got["steps"] == 4
    assert got["workers"] == [f"sim/cpu{i}" for i in range(4)]
    pids = [s["pid"] for s in got["stats"]]
    assert len(set(pids)) == 2 and got["master"] not in pids  # two actor processes
    assert all(s["jobs"] > 0 for s in got["stats"])  # each ran its slots' jobs
    assert all(s["fetched"] >= 1 for s in got["stats"])  # the binaries came to each
    assert got["walls"]["ray"] == got["walls"]["local"] and len(got["walls"]["ray"]) == 9


@pytest.mark.skipif(lab_unavailable_reason() is not None, reason=lab_unavailable_reason() or "")
def test_a_killed_actor_loses_its_jobs_which_run_again_and_it_comes_back(lab, tmp_path):
    got = in_lab(lab, tmp_path, """
        import signal
        with Session(config("kill", slots=4, actors=2, time_scale=0.02)) as s:
            s.start_workers()
            base = s.builds.compile(CompileJob(LU))
            job = RunJob(sha256=base.sha256, binary=base.binary, args=("1",), runs=5,
                         timeout=60)  # 5 runs of 1 model second: 0.1 s per job
            host = s.backend.host_list[0]
            before = host.stats()["pid"]
            futures = [s.scheduler.submit(job) for _ in range(24)]
            futures[0].result(timeout=60)
            os.kill(before, signal.SIGKILL)  # mid-run: its slots hold jobs
            first = [f.result(timeout=120) for f in futures]
            deadline = time.monotonic() + 60
            while host.starts < 2 and time.monotonic() < deadline:  # a probe restarts it
                time.sleep(0.1)
            second = [f.result(timeout=60)
                      for f in [s.scheduler.submit(job) for _ in range(16)]]
            after = host.stats()
            print(json.dumps({
                "lost_on": [list(r.lost_on) for r in first if r.lost_on],
                "records": [len(r.records) for r in first + second],
                "before": before, "after": after, "starts": host.starts,
                "lost_jobs": s.scheduler.lost_jobs,
                "quarantined": sorted(s.scheduler.quarantined)}))
    """)
    assert got["lost_on"], "no job was in flight on the killed actor"
    assert got["lost_jobs"] == len(got["lost_on"])
    assert all(len(why) == 1 and why[0].startswith(f"sim/cpu{i}: ") and
               "actor sim-host0 lost" in why[0]
               for why in got["lost_on"] for i in [int(why[0].split("/cpu")[1].split(":")[0])])
    assert got["records"] == [5] * 40  # none lost, none short
    assert got["starts"] == 2 and got["after"]["pid"] != got["before"]
    assert got["after"]["jobs"] > 0  # the new actor serves its slots again
    assert got["quarantined"] == []


@pytest.mark.skipif(lab_unavailable_reason() is not None, reason=lab_unavailable_reason() or "")
def test_slots_in_actors_count_as_the_local_ones_and_lend_no_cpu(lab, tmp_path):
    """In an exact session the actors' slots say they count and answer a comparison in cycles
    with the local slots' counts (one count of each binary); none is lent (as the Ray
    backend's)."""
    got = in_lab(lab, tmp_path, """
        from dispatcher.running.exact import exact_job
        from dispatcher.running.measurement import PairingPolicy
        out = {}
        for name, actors in (("local", 0), ("ray", 2)):
            with Session(config(name, slots=2, actors=actors,
                                measure={"metric": "cycles"})) as s:
                m = s.start_workers()
                base = s.builds.compile(CompileJob(LU))
                job = RunJob(sha256=base.sha256, binary=base.binary, args=("1",), runs=1,
                             timeout=60)
                counted = s.scheduler.submit(exact_job(job)).result(timeout=60)
                compared = m.compare(job, job, "simulated", PairingPolicy(5, 20, 0.01),
                                     metric="cycles").result(timeout=60)
                out[name] = {"counts": counted.records[0].counts,
                             "classes": [x.worker_class for x in s.backend.slots],
                             "identity": m.exact_identity, "stopped": compared.stopped,
                             "times": [compared.reference_times, compared.candidate_times]}
        print(json.dumps(out))
    """)
    local, ray = got["local"], got["ray"]
    assert ray["counts"] == local["counts"] and ray["counts"]["Ir"] > 0
    assert ray["identity"] == local["identity"] and ray["identity"].endswith("simulated")
    assert ray["classes"] == ["simulated"] * 2
    assert local["classes"] == ["simulated"] * 2 + ["exact-only"] * 2  # 2 compile jobs lent
    assert ray["stopped"] == "exact" and [len(t) for t in ray["times"]] == [1, 1]
