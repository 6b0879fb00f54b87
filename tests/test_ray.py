"""The Ray backend against a real two-node cluster in a private network namespace
(tests/raylab.py): nothing listens outside it and no packet leaves it."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from dispatcher.config import ConfigError, load_config, parse_config
from dispatcher.core.files import sha256_file
from dispatcher.core.records import StepEvent
from dispatcher.core.rundir import Rundir
from dispatcher.running.agent_client import agent_zipapp
from tests.helpers import REPO, spin_benchmark, write_yaml
from tests.raylab import LabUnavailable, RayLab, lab_unavailable_reason

NODES = ("n1", "n2")

needs_lab = pytest.mark.skipif(lab_unavailable_reason() is not None,
                               reason=lab_unavailable_reason() or "")


# -- config (no cluster needed)

def test_the_actors_copies_of_the_agent_contract_are_protocols():
    """actor.py travels to the nodes by value and imports nothing of the project, so it
    copies the agent-master contract from workers/agent/protocol.py: the copies must agree."""
    from dispatcher.running.ray import actor
    from workers.agent import protocol
    for name in ("LOCK_DIR_ENV", "DEFAULT_LOCK_DIR", "CPU_LOCK_NAME", "SLOT_LOCK_BUSY_STATUS",
                 "STDERR_PREFIX", "SLOT_LOCK_LINES"):
        assert getattr(actor, name) == getattr(protocol, name), name
    source = Path(actor.__file__).read_text()
    assert "import dispatcher" not in source and "from dispatcher" not in source
    assert "import workers" not in source and "from workers" not in source


@pytest.mark.parametrize("ray, message", [
    ({"address": "ray://head:10001"}, "ray.address: expected auto or the head's host:port (the master runs on a node"),
    ({"address": "head"}, "ray.address: expected auto or the head's host:port, got 'head'"),
    ({"address": "a b:1"}, "ray.address: expected auto or the head's host:port"),
    ({"auth": "password"}, "ray.auth: expected token or none, got 'password'"),
    ({"auth": "none", "token_file": "t"}, "ray.token_file: expected no token file with ray.auth: none"),
    ({"resource_prefix": "cpu-"}, "ray.resource_prefix: expected a resource name prefix"),
    ({"slots": 0}, "ray.slots: expected a positive integer"),
    ({"slots": "many"}, "ray.slots: expected a positive integer"),
    ({"worker_class": ""}, "ray.worker_class: expected a non-empty string"),
    ({"cache_dir": "relative/dir"}, "ray.cache_dir: expected an absolute directory on the nodes"),
    ({"namespace": "a b"}, "ray.namespace: expected a name of letters"),
    ({"start_timeout": 0}, "ray.start_timeout: expected a positive number of seconds"),
    ({"compile_resource": "my compile"}, "ray.compile_resource: expected a resource name of"),
    ({"compile_resource": 3}, "ray.compile_resource: expected a resource name of"),
    ({"colour": "blue"}, "ray.colour: expected one of address, auth"),
])
def test_bad_ray_config_is_one_clear_line(ray, message):
    with pytest.raises(ConfigError) as err:
        parse_config({"backend": "ray", "ray": ray}, Path("/etc/cfg.yaml"))
    assert str(err.value).startswith("/etc/cfg.yaml: " + message), str(err.value)
    assert "\n" not in str(err.value)


def test_ray_section_defaults_and_example():
    config = parse_config({"backend": "ray"}, Path("/etc/cfg.yaml"))
    ray = config.backend_settings
    assert (ray.address, ray.auth, ray.resource_prefix, ray.slots, ray.worker_class) == \
        ("auto", "token", "inlining_cpu_", None, "ray")
    assert config.compile_jobs == (os.cpu_count() or 1)  # the master keeps every CPU
    example = load_config(REPO / "configs" / "example-ray.yaml")
    assert example.backend == "ray" and example.backend_settings.auth == "token"
    assert example.backend_settings.address == "10.0.0.1:6379"


def test_actor_code_needs_nothing_of_ours_on_the_node(tmp_path):
    """The actor travels by value: it loads and serves where neither ``dispatcher`` nor
    ``workers`` can be imported (a node has Ray and a python, nothing of this project)."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    from dispatcher.running.ray import actor as ray_actor
    cloudpickle.register_pickle_by_value(ray_actor)
    payload = tmp_path / "actor.pickle"
    payload.write_bytes(cloudpickle.dumps(ray_actor.AgentHost))
    zipapp = agent_zipapp().read_bytes()
    binary = shutil.which("true") or "/bin/true"
    sha = sha256_file(binary)
    cache = tmp_path / "node-cache"
    (cache / "binaries").mkdir(parents=True)
    shutil.copy(binary, cache / "binaries" / sha)
    script = textwrap.dedent(f"""
        import json, sys
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("dispatcher", "workers", "commands", "analysis"):
                    raise ImportError("not on a node: " + name)
        sys.meta_path.insert(0, Refuse())
        import ray.cloudpickle as cp
        AgentHost = cp.loads(open({str(payload)!r}, "rb").read())
        host = AgentHost("ray/test/cpu{min(os.sched_getaffinity(0))}", {min(os.sched_getaffinity(0))}, "ray",
                         {str(tmp_path / "config-cache")!r}, "agent-test.pyz",
                         open({str(agent_zipapp())!r}, "rb").read(), 5.0)
        started = host.start()
        request = {{"op": "run", "sha256": {sha!r}, "args": [], "runs": 2,
                    "cpu": {min(os.sched_getaffinity(0))}, "timeout": 10, "expected_output": None,
                    "perf": False, "env": {{}}, "aslr": False}}
        reply = host.run(request)
        host.close()
        print(json.dumps({{"started": started, "reply": reply, "dispatcher": "dispatcher" in sys.modules}}))
    """)
    env = {**os.environ, "INLINING_ORCHESTRATOR_RAY_CACHE": str(cache),
           "INLINING_ORCHESTRATOR_LOCK_DIR": str(tmp_path / "locks"), "PYTHONPATH": ""}
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["started"]["ok"], out
    assert out["started"]["hello"]["agent_version"] == hashlib.sha256(zipapp).hexdigest()
    assert out["started"]["cached"] == [sha]
    assert out["reply"]["ok"] and len(out["reply"]["runs"]) >= 2, out["reply"]
    assert not out["dispatcher"]
    assert (cache / "agent-test.pyz").read_bytes() == zipapp  # the node's cache, not the config's
    assert not (tmp_path / "config-cache").exists()


def _in_private_net(argv: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["unshare", "--net", "--", "sh", "-c",
                           'ip link set lo up && exec "$0" "$@"', *argv],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@needs_lab
def test_no_token_or_no_cluster_is_one_line(compiler, tmp_path):
    data = {"backend": "ray", "store": str(tmp_path / "store"),
            "ray": {"address": "127.0.0.1:9"}, "run": {"size": "quick"}}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(data))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)  # no ~/.ray/auth_token either
    env["INLINING_COMPILER_PREFIX"] = str(compiler.prefix)
    command = [sys.executable, "-m", "commands", "run-benchmark", "kahan", "--config", str(cfg)]
    proc = _in_private_net(command, env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "run-benchmark: ray: token authentication is on (ray.auth) but there is no token"), \
        proc.stderr
    proc = _in_private_net(command, {**env, "RAY_AUTH_TOKEN": "0" * 32})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "run-benchmark: ray: cannot connect to the cluster at 127.0.0.1:9"), proc.stderr


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
    assert not lab.leftovers(), leftover_log  # every raylet, GCS and worker is gone


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("store")  # shared: each benchmark compiles once


def write_config(path: Path, lab: RayLab, store: Path, **sections) -> Path:
    data = {"backend": "ray", "store": str(store),
            "ray": {"address": lab.address, "start_timeout": 60},
            "run": {"runs": 2, "timeout": 60, "size": "quick"},
            "scheduler": {"backoff_s": 0.2}, **sections}
    return write_yaml(path, data)


def cli(lab: RayLab, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(lab.command([sys.executable, "-m", "commands", *args]), cwd=REPO,
                          env=lab.env(), capture_output=True, text=True, timeout=timeout)


def start_cli(lab: RayLab, *args: str) -> subprocess.Popen:
    return subprocess.Popen(lab.command([sys.executable, "-m", "commands", *args]), cwd=REPO,
                            env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def csv_lines(stdout: str) -> list[list[str]]:
    return [line.split(",") for line in stdout.splitlines() if line.startswith("ray/")]


def check_disturbed_reruns(lines: list[list[str]], err: str, runs: int) -> None:
    """Each worker's cells: its ``runs`` timed runs, each a time or "disturbed".  A run
    disturbed on a loaded machine is made again, once, by each side: the agent (a run that
    migrated: at most ``runs`` more) and then the master (one more job of the runs still
    missing, which the agent may lengthen as it did the first): 4N at most.  A worker left
    with fewer than ``runs`` times is named unresolved in the warning line."""
    for line in lines:
        cells = line[2:]
        assert runs <= len(cells) <= 4 * runs, line
        assert all(t == "disturbed" or float(t) > 0 for t in cells), line
        if sum(t != "disturbed" for t in cells) < runs:
            assert f"unresolved on {line[0]}" in err, err


def stored_results(store: Path, sha256: str) -> list[dict]:
    """Every result stored for the binary ``sha256``, whatever its job."""
    return [r for path in (store / "measurements").rglob("*.json")
            for r in json.loads(path.read_text())["results"] if r["sha256"] == sha256]


@needs_lab
def test_run_benchmark_on_two_nodes_ships_each_binary_once_per_node(lab, compiler, store,
                                                                    tmp_path):
    cfg = write_config(tmp_path / "c.yaml", lab, store)
    first = cli(lab, "run-benchmark", "kahan", "--config", str(cfg), "--runs", "2")
    assert first.returncode == 0, first.stderr
    lines = csv_lines(first.stdout)
    assert sorted(line[0] for line in lines) == [f"ray/{n}/cpu{lab.cpu}" for n in NODES]
    assert all(line[1] == "heuristic" and len(line) == 4 for line in lines)
    assert all(float(t) > 0 for line in lines for t in line[2:])
    zipapp = agent_zipapp().read_bytes()
    binaries = []
    for node in NODES:
        (agent,) = lab.cache(node).glob("agent-*.pyz")
        assert agent.read_bytes() == zipapp
        (binary,) = (lab.cache(node) / "binaries").iterdir()  # through the object store
        assert binary.name == sha256_file(binary)
        binaries.append(binary)
    stamps = [b.stat().st_mtime_ns for b in binaries]
    again = cli(lab, "run-benchmark", "kahan", "--config", str(cfg), "--runs", "2",
                "--remeasure")
    assert again.returncode == 0, again.stderr
    assert [b.stat().st_mtime_ns for b in binaries] == stamps  # once per sha256 per node
    assert len(stored_results(store, binaries[0].name)) == 4


@needs_lab
def test_a_node_builds_with_the_masters_units_and_gives_back_its_own(lab, compiler, tmp_path):
    """The heuristic's build on the compiling node sends its units back into the master's
    cache; a flip in the last unit then goes with the two units before it, compiled, and
    only it is compiled there; both record their compilers' CPU."""
    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.build.service import CompileJob, CompileService
    from dispatcher.core.decisions import Override, write_overrides
    from dispatcher.storage.store import Store
    bench = resolve_benchmark("kahan")
    local = CompileService(Store(tmp_path / "local"), compiler)
    try:
        base = local.compile(CompileJob(bench))
    finally:
        local.close()
    last = bench.units()[-1].module
    first = next(d for d in base.artifact.dumps() if d.unit == last).decisions[0]
    flip = write_overrides(tmp_path / "flip.sexp", [Override(
        last, 0, first.key, "dont_inline" if first.action == "inline" else "inline")])
    store = tmp_path / "store"
    cfg = write_config(tmp_path / "c.yaml", lab, store)
    # the builds of a session whose workers started (run-benchmark compiles before it
    # connects: a compile error is said without a cluster)
    script = textwrap.dedent(f"""
        from dispatcher.build.manifest import resolve_benchmark
        from dispatcher.build.service import CompileJob
        from dispatcher.config import load_config
        from dispatcher.core.decisions import read_overrides
        from dispatcher.session import Session
        bench = resolve_benchmark("kahan")
        with Session(load_config({str(cfg)!r})) as session:
            session.start_workers()
            session.builds.compile(CompileJob(bench))
            session.builds.compile(CompileJob(bench, tuple(read_overrides({str(flip)!r}))))
        """)
    proc = subprocess.run(lab.command([sys.executable, "-c", script]), cwd=REPO, env=lab.env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    metas = {m["overrides"]: m for m in (json.loads(p.read_text())
                                          for p in (store / "compiled").rglob("meta.json"))}
    assert sorted(metas) == [0, 1]
    for overrides, reused in ((0, 0), (1, 2)):
        meta = metas[overrides]
        assert (meta["built_on"], meta["units_reused"]) == ("ray/compile", reused), meta
        assert meta["cpu_s"] > 0


@needs_lab
def test_a_wrong_token_is_refused_in_one_line(lab, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", lab, tmp_path / "store")
    proc = subprocess.run(lab.command([sys.executable, "-m", "commands", "run-benchmark",
                                       "kahan", "--config", str(cfg)]),
                          cwd=REPO, env={**lab.env(), "RAY_AUTH_TOKEN": "f" * 32,
                                         "RAY_gcs_server_port_wait_time_s": "2"},  # not 20 s
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"run-benchmark: ray: cannot connect to the cluster at {lab.address}: "), \
        proc.stderr
    assert last.endswith("(AuthenticationError: RPC error: InvalidAuthToken: Authentication "
                         "token is missing or incorrect)"), last
    assert "ray/" not in proc.stdout


@needs_lab
def test_short_search_across_two_nodes(lab, compiler, store, tmp_path):
    cfg = write_config(tmp_path / "c.yaml", lab, store,
                       measure={"max_pairs": 3, "canary_every": 0, "confirm": False},
                       search={"baseline_runs": 2, "remeasure_every": 0,
                               "rundirs": str(tmp_path / "rundirs"),
                               "batch_log": str(tmp_path / "batch.log")})
    (tmp_path / "tasks").write_text("kahan\n")
    proc = cli(lab, "run_training_experiments", "--config", str(cfg), "--tasks",
               str(tmp_path / "tasks"), "--steps", "2", "--size", "quick")
    assert proc.returncode == 0, proc.stderr
    (rundir,) = (tmp_path / "rundirs").iterdir()
    run = Rundir(rundir)
    assert [e.step for e in run.events_of(StepEvent)] == [1, 2]
    assert run.finished_completed()
    measured = [r for p in rundir.rglob("measurements.json") for r in json.loads(p.read_text())]
    assert {r["worker"] for r in measured} == {f"ray/{n}/cpu{lab.cpu}" for n in NODES}
    assert all(rec["failure"] is None for r in measured for rec in r["records"])
    # the candidates were compiled by a Ray task on the node offering the compile resource,
    # or on the master while that node's one seat was taken (the heuristic build may come
    # from run-benchmark's test, which compiles first)
    metas = [json.loads(p.read_text()) for p in (store / "compiled").rglob("meta.json")]
    built_on = [m["built_on"] for m in metas if m["overrides"]]
    assert len(built_on) >= 2 and set(built_on) <= {"ray/compile", "master"}, built_on
    assert "ray/compile" in built_on, built_on


@needs_lab
def test_dead_actor_mid_job_the_job_runs_again_and_the_slot_comes_back(lab, compiler,
                                                                      tmp_path):
    bench = spin_benchmark(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", lab, tmp_path / "store")
    lab.send("kill-actor-when-running n2")
    master = start_cli(lab, "run-benchmark", str(bench), "--config", str(cfg), "--runs", "3")
    killed = lab.reply()
    out, err = master.communicate(timeout=300)
    assert killed.startswith("killed "), (killed, lab.log_tail())
    assert master.returncode == 0, err
    lines = csv_lines(out)
    assert len(lines) == 2, out
    check_disturbed_reruns(lines, err, runs=3)
    assert f"ray/n2/cpu{lab.cpu}: lost a job" in err
    assert "out of service" not in err and "unavailable" not in err  # a new actor took over
    (result_file,) = (tmp_path / "store" / "measurements").rglob("*.json")
    results = json.loads(result_file.read_text())["results"]
    assert len(results) == 2  # none lost, none doubled
    lost = [r for r in results if r.get("lost_on")]
    assert len(lost) == 1 and lost[0]["lost_on"][0].startswith(f"ray/n2/cpu{lab.cpu}: ")


@needs_lab
def test_node_removed_mid_job_the_other_slot_finishes_it(lab, compiler, tmp_path):
    # Last in this module: n2 does not come back.
    bench = spin_benchmark(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", lab, tmp_path / "store")
    lab.send("remove-when-running n2")
    master = start_cli(lab, "run-benchmark", str(bench), "--config", str(cfg), "--runs", "3")
    removed = lab.reply()
    out, err = master.communicate(timeout=300)
    assert removed.startswith("removed n2"), (removed, lab.log_tail())
    assert master.returncode == 0, err
    lines = csv_lines(out)
    survivor = f"ray/n1/cpu{lab.cpu}"
    assert [line[0] for line in lines] == [survivor, survivor], out
    check_disturbed_reruns(lines, err, runs=3)
    assert f"ray/n2/cpu{lab.cpu}: out of service" in err
    (result_file,) = (tmp_path / "store" / "measurements").rglob("*.json")
    results = json.loads(result_file.read_text())["results"]
    assert len(results) == 2  # none lost, none doubled
    assert {r["worker"] for r in results} == {survivor}
    assert [len(r.get("lost_on", ())) for r in results].count(1) == 1


@needs_lab
def test_a_build_on_a_compiling_node_is_the_build_on_the_master(lab, compiler, tmp_path):
    """The same binary and decision dumps, byte for byte, as the master builds (with its
    unit cache) for the same overrides; a compile error is the master's one line."""
    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.build.service import CompileJob
    from dispatcher.core.decisions import Override
    from dispatcher.session import Session
    bench = resolve_benchmark("kahan")
    local = Session(load_config(write_config(tmp_path / "l.yaml", lab, tmp_path / "s1",
                                             backend="local", local={"cpus": [lab.cpu]})))
    with local:
        base = local.builds.compile(CompileJob(bench))
        first = base.artifact.dumps()[0].decisions[0]
        flip = Override(unit=base.artifact.dumps()[0].unit, round=0, key=first.key,
                        action="dont_inline" if first.action == "inline" else "inline")
        want = local.builds.compile(CompileJob(bench, (flip,)))
        want_dumps = want.artifact.decision_texts()
        from dispatcher.build.service import CompileError
        with pytest.raises(CompileError) as local_error:
            local.builds.compile(CompileJob(bench, flags=("-O3", "-no-such-flag")))
    script = textwrap.dedent(f"""
        import json, sys
        from dispatcher.build.manifest import resolve_benchmark
        from dispatcher.build.service import CompileJob, CompileError
        from dispatcher.config import load_config
        from dispatcher.core.decisions import Override
        from dispatcher.session import Session
        bench = resolve_benchmark("kahan")
        flip = Override(unit={flip.unit!r}, round=0, key={flip.key!r}, action={flip.action!r})
        with Session(load_config(sys.argv[1])) as s:
            s.start_workers()
            got = s.builds.compile(CompileJob(bench, (flip,)))
            try:
                s.builds.compile(CompileJob(bench, flags=("-O3", "-no-such-flag")))
                error = None
            except CompileError as exc:
                error = str(exc)
            print(json.dumps({{"sha256": got.sha256, "dumps": got.artifact.decision_texts(),
                              "meta": json.loads((got.artifact.directory / "meta.json")
                                                 .read_text()), "error": error}}))
    """)
    cfg = write_config(tmp_path / "r.yaml", lab, tmp_path / "s2")
    proc = subprocess.run(lab.command([sys.executable, "-c", script, str(cfg)]), cwd=REPO,
                          env=lab.env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["meta"]["built_on"] == "ray/compile"
    assert got["sha256"] == want.sha256 and got["dumps"] == want_dumps
    assert got["error"] == str(local_error.value)
    assert got["error"].startswith("kahan: compiling summation.ml failed (exit 2): ")
