"""The SSH backend against real OpenSSH servers in private network namespaces (tests/sshhosts.py).

Every host is a network namespace with its own sshd; nothing listens outside them and no
traffic leaves the machine."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatcher.config import ConfigError, parse_config
from dispatcher.core.files import sha256_file
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import BaselineEvent, FinishEvent, StepEvent
from dispatcher.core.rundir import Rundir
from dispatcher.running.agent_client import agent_zipapp
from dispatcher.running.backend import PermanentLoss
from dispatcher.running.scheduler import Scheduler
from dispatcher.running.ssh import HostError, SshBackend, WorkerHost, fingerprint, remote_path
from tests.helpers import REPO, cli, spin_benchmark, write_yaml
from tests.sshhosts import LabUnavailable, SshLab, lab_unavailable_reason

CPU = max(os.sched_getaffinity(0))
# The hosts' builds, apart from CPU: another CPU of the machine (a test run pinned to one CPU
# by taskset still has it; none on a one-CPU machine, where the hosts build nothing).
COMPILE_CPUS = [c for c in range(os.cpu_count() or 1) if c != CPU][:1]

needs_lab = pytest.mark.skipif(lab_unavailable_reason() is not None,
                               reason=lab_unavailable_reason() or "")


@pytest.fixture
def lab(tmp_path):
    try:
        with SshLab(tmp_path / "lab", hosts=2) as lab:
            yield lab
    except LabUnavailable as exc:
        pytest.skip(str(exc))


# A search's comparisons stop at 3 pairs (the default is 20): what these tests check is where
# the runs go, not how close the speedups are.
FEW_PAIRS = {"max_pairs": 3, "canary_every": 0}


def write_config(path: Path, data: dict, **sections) -> Path:
    """The lab's config (``data``) with two quick runs a measurement."""
    return write_yaml(path, {**data, "run": {"runs": 2, "timeout": 30, "size": "quick"},
                             **sections})


# -- config (no servers needed)

@pytest.mark.parametrize("ssh, message", [
    (None, "ssh.hosts: expected a non-empty list of hosts"),
    ({"hosts": []}, "ssh.hosts: expected a non-empty list of hosts"),
    ({"hosts": [{"host": "a b", "user": "u", "rundir": "r", "cpus": [1]}]},
     "ssh.hosts[0].host: expected a host name or address, got 'a b'"),
    ({"hosts": [{"host": "w1", "rundir": "r", "cpus": [1]}]},
     "ssh.hosts[0].user: expected a user name"),
    ({"hosts": [{"host": "w1", "user": "u", "rundir": "../elsewhere", "cpus": [1]}]},
     "ssh.hosts[0].rundir: expected a directory on the worker"),
    ({"hosts": [{"host": "w1", "user": "u", "rundir": "r", "cpus": [1, 1]}]},
     "ssh.hosts[0].cpus: expected a list of distinct CPU numbers"),
    ({"hosts": [{"host": "w1", "user": "u", "rundir": "r", "cpus": [1], "shell": "x"}]},
     "ssh.hosts[0].shell: expected one of"),
    ({"hosts": [{"host": "w1", "user": "u", "rundir": "r", "cpus": [1]},
                {"host": "w1", "user": "u", "rundir": "r", "cpus": [2]}]},
     "ssh.hosts[1].name: expected a name no other host has, got 'w1'"),
    ({"trust_on_first_use": "yes", "hosts": [{"host": "w1", "user": "u", "rundir": "r",
                                              "cpus": [1]}]},
     "ssh.trust_on_first_use: expected true or false"),
    ({"hosts": [{"host": "w1", "user": "u", "rundir": "r", "cpus": [1, 2],
                 "compile_cpus": [0, 2]}]},
     "ssh.hosts[0].compile_cpus: expected CPUs none of which is in cpus (a build beside a "
     "measured run would disturb it), got [0, 2]"),
    ({"hosts": [{"host": "w1", "user": "u", "rundir": "r", "cpus": [1], "compile_cpus": 4}]},
     "ssh.hosts[0].compile_cpus: expected a list of distinct CPU numbers, got 4"),
    ({"hosts": [{"host": "w1", "user": "u", "rundir": "r", "cpus": [1], "compile_cpus": [0],
                 "ocamlopt": "bin/ocamlopt.opt"}]},
     "ssh.hosts[0].ocamlopt: expected the absolute path of the patched ocamlopt.opt on the "
     "worker, got 'bin/ocamlopt.opt'"),
])
def test_bad_ssh_config_is_one_clear_line(ssh, message):
    data = {"backend": "ssh"}
    if ssh is not None:
        data["ssh"] = ssh
    with pytest.raises(ConfigError) as err:
        parse_config(data, Path("/etc/cfg.yaml"))
    assert str(err.value).startswith("/etc/cfg.yaml: " + message), str(err.value)


def test_example_ssh_config_is_valid():
    from dispatcher.config import load_config
    config = load_config(REPO / "configs" / "example-ssh.yaml")
    assert config.backend == "ssh" and len(config.backends["ssh"].hosts) >= 2
    assert not config.backends["ssh"].trust_on_first_use


def test_remote_paths_stay_in_the_rundir():
    assert remote_path("~/w", "cache", "ab") == "w/cache/ab"
    assert remote_path("/srv/x y", "locks") == "/srv/x y/locks"
    for bad in ("..", "a/b", "", "."):
        with pytest.raises(ValueError):
            remote_path("/srv", bad)


# -- against real sshd

@needs_lab
def test_run_benchmark_over_ssh_uploads_once_and_measures_on_every_host(lab, compiler,
                                                                        tmp_path):
    cfg = write_config(tmp_path / "c.yaml", lab.config(cpus=[CPU]))
    first = cli("run-benchmark", "kahan", "--config", str(cfg), "--runs", "2", "--size", "tiny")
    assert first.returncode == 0, first.stderr
    lines = [line.split(",") for line in first.stdout.splitlines()]
    assert sorted(line[0] for line in lines) == [f"ssh/h0/cpu{CPU}", f"ssh/h1/cpu{CPU}"]
    assert all(line[1] == "heuristic" and len(line) == 4 for line in lines)
    assert all(float(t) > 0 for line in lines for t in line[2:])
    for host in lab.hosts:
        agents = list(host.rundir.glob("agent-*.pyz"))
        assert len(agents) == 1 and agents[0].read_bytes() == \
            agent_zipapp().read_bytes()
        (binary,) = (host.rundir / "cache").iterdir()
        assert binary.name == sha256_file(binary)
    mtime = binary.stat().st_mtime_ns
    again = cli("run-benchmark", "kahan", "--config", str(cfg), "--runs", "2", "--remeasure",
                "--size", "tiny")
    assert again.returncode == 0, again.stderr
    assert binary.stat().st_mtime_ns == mtime  # travelled once per sha256


@needs_lab
def test_short_annealing_run_over_ssh(lab, compiler, tmp_path):
    # tiny runs: what is asserted is where they ran and were built, and that the steps were
    # journaled
    data = lab.config(cpus=[CPU])
    for host in data["ssh"]["hosts"]:
        host["compile_cpus"] = COMPILE_CPUS
    cfg = write_config(tmp_path / "c.yaml", data, measure=FEW_PAIRS,
                       run={"runs": 2, "timeout": 30, "size": "tiny"}, search={
        "baseline_runs": 2, "remeasure_every": 2, "rundirs": str(tmp_path / "rundirs"),
        "batch_log": str(tmp_path / "batch.log")})
    (tmp_path / "tasks").write_text("kahan\n")
    proc = cli("run_training_experiments", "--config", str(cfg), "--tasks",
               str(tmp_path / "tasks"), "--steps", "3", "--algorithm", "sa")
    assert proc.returncode == 0, proc.stderr
    (rundir,) = (tmp_path / "rundirs").iterdir()
    steps = [e.step for e in Rundir(rundir).events_of(StepEvent)]
    assert steps == [1, 2, 3]
    measured = [r for p in rundir.rglob("measurements.json") for r in json.loads(p.read_text())]
    assert measured and {r["worker"] for r in measured} <= {f"ssh/h0/cpu{CPU}",
                                                             f"ssh/h1/cpu{CPU}"}
    assert all(rec["failure"] is None for r in measured for rec in r["records"])
    # the hosts built the candidates, the master only when both seats were taken
    metas = [json.loads(p.read_text()) for p in (lab.root / "store" / "compiled")
             .rglob("meta.json")]
    built_on = [m["built_on"] for m in metas]
    assert set(built_on) <= {"ssh/h0", "ssh/h1", "master"}, built_on
    assert sum(b.startswith("ssh/") for b in built_on) >= (2 if COMPILE_CPUS else 0), built_on


@needs_lab
@pytest.mark.skipif(not COMPILE_CPUS, reason="one CPU: a host's builds need a CPU of their own")
def test_a_build_on_a_host_is_the_build_on_the_master(lab, compiler, tmp_path, caplog):
    """The same binary and decision dumps, byte for byte, as the master builds for the same
    overrides; a compile error is the master's one line; a host whose compiler is another
    builds nothing (said once) and the master builds instead."""
    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.build.service import CompileError, CompileJob, CompileService
    from dispatcher.config import load_config
    from dispatcher.session import Session
    from dispatcher.storage.store import Store
    from tests.test_remote_build import flipped
    bench = resolve_benchmark("kahan")
    local = CompileService(Store(tmp_path / "s1"), compiler)
    try:
        flip = flipped(local, bench)
        want = local.compile(CompileJob(bench, (flip,)))
        with pytest.raises(CompileError) as local_error:
            local.compile(CompileJob(bench, flags=("-O3", "-no-such-flag")))
    finally:
        local.close()
    other = tmp_path / "other-ocamlopt.opt"  # another compiler: one byte more
    other.write_bytes(compiler.ocamlopt.read_bytes() + b"\0")
    other.chmod(0o755)
    data = lab.config(cpus=[CPU], store=tmp_path / "s2")
    h0, h1 = data["ssh"]["hosts"]
    h0["compile_cpus"] = COMPILE_CPUS
    h1.update(compile_cpus=COMPILE_CPUS, ocamlopt=str(other))
    data["ssh"]["hosts"] = [h0]
    with Session(load_config(write_config(tmp_path / "h0.yaml", data))) as session:
        session.start_workers()
        # the heuristic's build, on the host: its units come back into the master's cache,
        # and the flip (in the last unit) then sends the two before it, compiled
        base = session.builds.compile(CompileJob(bench))
        got = session.builds.compile(CompileJob(bench, (flip,)))
        with pytest.raises(CompileError) as remote_error:
            session.builds.compile(CompileJob(bench, flags=("-O3", "-no-such-flag")))
    assert flip.unit == bench.units()[-1].module
    for result, reused in ((base, 0), (got, 2)):
        meta = json.loads((result.artifact.directory / "meta.json").read_text())
        assert (meta["built_on"], meta["units_reused"]) == ("ssh/h0", reused), meta
        assert meta["cpu_s"] > 0  # the compile-time guard's clock, as on the master
    assert got.sha256 == want.sha256
    assert got.artifact.decision_texts() == want.artifact.decision_texts()
    assert str(remote_error.value) == str(local_error.value)
    data.update(store=str(tmp_path / "s3"))
    data["ssh"]["hosts"] = [h1]
    with Session(load_config(write_config(tmp_path / "h1.yaml", data))) as session:
        session.start_workers()
        got = session.builds.compile(CompileJob(bench, (flip,)))
        again = session.builds.compile(CompileJob(bench, flags=("-O2",)))
    for result in (got, again):
        meta = json.loads((result.artifact.directory / "meta.json").read_text())
        assert meta["built_on"] == "master"
    assert got.sha256 == want.sha256
    refusals = [r.getMessage() for r in caplog.records if "builds nothing" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert refusals[0].startswith(f"ssh/h1: builds nothing for the rest of this run: the "
                                  f"compiler {other} on node ")
    assert "is not the master's" in refusals[0]


@needs_lab
def test_each_chain_keeps_to_its_worker_class(lab, compiler, tmp_path):
    """Hosts of two classes: each chain's baseline and candidates are all timed on its own
    class (before, every chain was given the first slot's class, and a job could run on any
    host and be stored under the wrong class)."""
    data = lab.config(cpus=[CPU])
    for host, cls in zip(data["ssh"]["hosts"], ("fast", "slow")):
        host["worker_class"] = cls
    cfg = write_config(tmp_path / "c.yaml", data, measure=FEW_PAIRS, search={
        "baseline_runs": 2, "remeasure_every": 2, "rundirs": str(tmp_path / "rundirs"),
        "batch_log": str(tmp_path / "batch.log")})
    (tmp_path / "tasks").write_text("kahan\n")
    proc = cli("run_training_experiments", "--config", str(cfg), "--tasks",
               str(tmp_path / "tasks"), "--steps", "2", "--chains", "2", "--size", "tiny")
    assert proc.returncode == 0, proc.stderr
    rundirs = sorted((tmp_path / "rundirs").iterdir())
    classes = {Rundir(r).experiment.worker_class: r for r in rundirs}
    assert set(classes) == {"fast", "slow"}
    host_of = {"fast": "h0", "slow": "h1"}
    for cls, rundir in classes.items():
        results = [r for p in sorted(rundir.rglob("measurements.json"))
                   for r in Rundir.read_measurements(p.parent)]
        assert results
        assert {r.worker_class for r in results} == {cls}
        assert {r.worker for r in results} == {f"ssh/{host_of[cls]}/cpu{CPU}"}


def running_benchmark(host) -> bool:
    """Is a benchmark binary from the host's cache running inside the host's namespace?"""
    for pid in host.pids():
        try:
            if os.readlink(f"/proc/{pid}/exe").startswith(str(host.rundir / "cache")):
                return True
        except OSError:
            pass
    return False


@needs_lab
def test_host_dying_mid_job_the_experiment_goes_on(lab, compiler, tmp_path):
    bench = spin_benchmark(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", lab.config(cpus=[CPU]), measure=FEW_PAIRS, search={
        "baseline_runs": 2, "remeasure_every": 0, "rundirs": str(tmp_path / "rundirs"),
        "batch_log": str(tmp_path / "batch.log")})
    (tmp_path / "tasks").write_text(f"{bench}\n")
    proc = subprocess.Popen([sys.executable, "-m", "commands", "run_training_experiments",
                             "--config", str(cfg), "--tasks", str(tmp_path / "tasks"),
                             "--steps", "4", "--algorithm", "random-walk"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    victim = lab.hosts[0]
    deadline = time.monotonic() + 120
    while not running_benchmark(victim):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.01)
    lab.kill(victim)  # sshd, the session and the agent, in the middle of a run
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    (rundir,) = (tmp_path / "rundirs").iterdir()
    events = Rundir(rundir).events()
    assert [e.step for e in events if isinstance(e, StepEvent)] == [1, 2, 3, 4]
    assert sum(isinstance(e, BaselineEvent) for e in events) == 1
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == "completed"
    assert "h0" in err and "runs again elsewhere" in err, err
    # The retry is recorded with the measurement it produced, in the rundir (the first run
    # on h0 may be the baseline's profile job: profile.json records its retry).
    measured = [r for p in rundir.rglob("measurements.json") for r in json.loads(p.read_text())]
    measured.append(json.loads((rundir / "profile.json").read_text()))
    lost = [r for r in measured if r["lost_on"]]
    assert lost and all(r["lost_on"][0].startswith(f"ssh/h0/cpu{CPU}: ") and
                        r["worker"] == f"ssh/h1/cpu{CPU}" for r in lost), lost
    assert re.search(r"^ssh/h0/cpu\d+: (out of service|unavailable at the end): h0: ", err,
                     re.M), err  # h0 never came back: reported


@needs_lab
def test_run_past_its_deadline_is_retried_on_another_slot(lab, compiler, tmp_path, monkeypatch):
    """An agent that stops answering (here: stopped with SIGSTOP) loses its job to another."""
    import dispatcher.running.ssh as ssh_module
    monkeypatch.setattr(ssh_module, "JOB_SLACK_S", 1.0)
    config = parse_config(lab.config(cpus=[CPU]), tmp_path / "c.yaml")
    backend = SshBackend(config.backends["ssh"])
    binary = Path("/bin/sleep")
    job = RunJob(sha256_file(binary), binary, ("0.2",), runs=1, timeout=0.5, perf=False)
    h0_slot = backend.slots[0]
    h0_slot.probe()
    stopped = [pid for pid in lab.hosts[0].pids()
               if b"agent-" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert stopped
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    try:
        with Scheduler(backend.slots, config.scheduler) as scheduler:
            t0 = time.monotonic()
            result = scheduler.submit(job, slot=h0_slot.name).result(timeout=60)
            elapsed = time.monotonic() - t0
            resume(stopped)  # the stale agent may go now, and its slot lock with it
            assert result.worker == backend.slots[1].name and result.failed == 0
            assert scheduler.lost_jobs == 1
            assert elapsed < 10  # the deadline: 1.5 x the run timeout + JOB_SLACK_S
    finally:
        resume(stopped)
        backend.close()


def resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


@needs_lab
def test_host_keys_are_pinned(lab, compiler, tmp_path):
    host = lab.hosts[0]
    data = lab.config(cpus=[CPU], hosts=[host])
    # A changed key: known_hosts holds another host's key under h0's address.
    other = lab.hosts[1].host_key_line
    lab.known_hosts.write_text(f"{host.address} {other}\n")
    bad = cli("run-benchmark", "kahan", "--config", str(write_config(tmp_path / "c.yaml", data)))
    assert bad.returncode == 2
    assert "h0: host key CHANGED" in bad.stderr and "SHA256:" in bad.stderr, bad.stderr
    # An unknown host is refused too, naming its fingerprint...
    lab.known_hosts.write_text("")
    unknown = cli("run-benchmark", "kahan", "--config", str(tmp_path / "c.yaml"))
    assert unknown.returncode == 2 and "h0: unknown host key ssh-ed25519 SHA256:" \
        in unknown.stderr, unknown.stderr
    # ...unless the config opts in to trust on first use, which records the key.
    data["ssh"]["trust_on_first_use"] = True
    tofu = cli("run-benchmark", "kahan", "--config",
               str(write_config(tmp_path / "c.yaml", data)))
    assert tofu.returncode == 0, tofu.stderr
    assert lab.known_hosts.read_text().split() == \
        [host.address, *host.host_key_line.split()]
    # From then on the key is pinned: a server with another key is refused.
    lab.known_hosts.write_text(f"{host.address} {other}\n")
    again = cli("run-benchmark", "kahan", "--config", str(tmp_path / "c.yaml"), "--remeasure")
    assert again.returncode == 2 and "host key CHANGED" in again.stderr


@needs_lab
def test_fingerprint_matches_ssh_keygen(lab):
    import paramiko
    key_file = lab.hosts[0].root / "ssh_host_ed25519_key.pub"
    out = subprocess.run(["ssh-keygen", "-lf", str(key_file)], capture_output=True, text=True,
                         check=True).stdout.split()[1]
    key = paramiko.Ed25519Key(filename=str(key_file.with_suffix("")))
    assert fingerprint(key) == out


@needs_lab
def test_unreachable_host_is_reported_and_the_others_work(lab, compiler, tmp_path):
    lab.kill(lab.hosts[0])  # nothing listens there any more: connection refused
    cfg = write_config(tmp_path / "c.yaml", lab.config(cpus=[CPU]))
    proc = cli("run-benchmark", "kahan", "--config", str(cfg), "--size", "tiny")
    assert proc.returncode == 0, proc.stderr
    assert [line.split(",")[0] for line in proc.stdout.splitlines()] == \
        [f"ssh/h1/cpu{CPU}"] * 2  # h0's share of the work ran on h1
    # Reported at the end: out of service, or still backing off when the work was done.
    assert re.search(rf"^ssh/h0/cpu{CPU}: (out of service|unavailable at the end): h0: cannot "
                     rf"connect to {re.escape(lab.hosts[0].address)} port 22: Connection refused$",
                     proc.stderr, re.M), proc.stderr
    # Only unreachable hosts: a clear one-line error, non-zero exit.
    only = write_config(tmp_path / "only.yaml", lab.config(cpus=[CPU], hosts=[lab.hosts[0]]))
    proc = cli("run-benchmark", "kahan", "--config", str(only), "--remeasure")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "run-benchmark: no worker slot left"), \
        proc.stderr


@needs_lab
def test_missing_python3_names_the_host(tmp_path, compiler):
    # h1's sessions have a PATH without python3 in it: exactly a host without python3.
    try:
        lab = SshLab(tmp_path / "lab", hosts=2,
                     sshd_options={1: ["SetEnv PATH=/nonexistent"]}).__enter__()
    except LabUnavailable as exc:
        pytest.skip(str(exc))
    try:
        cfg = write_config(tmp_path / "c.yaml", lab.config(cpus=[CPU], hosts=[lab.hosts[1]]))
        proc = cli("run-benchmark", "kahan", "--config", str(cfg))
        assert proc.returncode == 2
        assert "h1: cannot run python3 as 'python3' on the worker" in proc.stderr, proc.stderr
    finally:
        lab.close()


@needs_lab
def test_names_full_of_shell_metacharacters_stay_names(lab, tmp_path):
    nasty = "w $(touch PWNED1); `touch PWNED2` 'q\" & | > < * ~"
    rundir = lab.hosts[0].root / nasty
    data = lab.config(cpus=[CPU], hosts=[lab.hosts[0]])
    data["ssh"]["hosts"][0]["rundir"] = str(rundir)
    data["ssh"]["hosts"][0]["worker_class"] = "c; touch PWNED3 #"
    config = parse_config(data, tmp_path / "c.yaml")
    backend = SshBackend(config.backends["ssh"])
    binary = Path("/bin/echo")
    job = RunJob(sha256_file(binary), binary, ("$(touch PWNED4)", "; touch PWNED5"), runs=1,
                 timeout=10, perf=False, expected_output={"text": "$(touch PWNED4) ; touch "
                                                          "PWNED5\n"})
    try:
        with Scheduler(backend.slots, config.scheduler) as scheduler:
            result = scheduler.submit(job).result(timeout=60)
    finally:
        backend.close()
    assert result.failed == 0 and result.records[0].output_ok is True
    assert result.worker_class == "c; touch PWNED3 #"
    assert (rundir / "cache" / job.sha256).is_file()
    # The login shell starts in the home directory; the agent runs binaries in scratch dirs.
    places = (Path.home(), lab.hosts[0].root, rundir, REPO, Path("/tmp"), Path("/dev/shm"))
    assert [p for d in places for p in d.glob("PWNED*")] == []


@needs_lab
def test_binary_cache_is_bounded_and_checked(lab, tmp_path):
    data = lab.config(cpus=[CPU], hosts=[lab.hosts[0]])
    data["ssh"]["hosts"][0]["cache_limit_mb"] = 1
    config = parse_config(data, tmp_path / "c.yaml")
    host = WorkerHost(config.backends["ssh"].hosts[0], config.backends["ssh"])
    binaries = []
    for i in range(3):  # 600 KB each: two do not fit in 1 MB
        b = tmp_path / f"b{i}"
        b.write_bytes(bytes([i]) * 600_000)
        binaries.append((sha256_file(b), b))
    cache = lab.hosts[0].rundir / "cache"
    try:
        host.acquire_binary(*binaries[0])
        host.acquire_binary(*binaries[1])  # both in use: neither may go
        assert sorted(p.name for p in cache.iterdir()) == sorted([binaries[0][0],
                                                                  binaries[1][0]])
        host.release_binary(binaries[0][0])
        host.release_binary(binaries[1][0])
        host.acquire_binary(*binaries[2])  # evicts the least recently used, down to the bound
        assert [p.name for p in cache.iterdir()] == [binaries[2][0]]
        assert host.cached() == [binaries[2][0]]
        host.release_binary(binaries[2][0])
    finally:
        host.close()
    # A binary damaged on the worker is refused by the agent, uploaded again, and runs.
    config = parse_config(lab.config(cpus=[CPU], hosts=[lab.hosts[0]]), tmp_path / "c.yaml")
    backend = SshBackend(config.backends["ssh"])
    true = Path("/bin/true")
    job = RunJob(sha256_file(true), true, (), runs=1, timeout=10, perf=False)
    try:
        with Scheduler(backend.slots, config.scheduler) as scheduler:
            assert scheduler.submit(job).result(timeout=60).failed == 0
            (cache / job.sha256).write_bytes(b"#!/bin/sh\necho tampered\n")
            result = scheduler.submit(job).result(timeout=60)
    finally:
        backend.close()
    assert result.failed == 0 and sha256_file(cache / job.sha256) == job.sha256


@needs_lab
def test_a_crashed_masters_lock_does_not_block_the_next_run(lab, compiler, tmp_path):
    bench = spin_benchmark(tmp_path)
    cfg = write_config(tmp_path / "c.yaml", lab.config(cpus=[CPU], hosts=[lab.hosts[0]]))
    master = subprocess.Popen([sys.executable, "-m", "commands", "run-benchmark", str(bench),
                               "--config", str(cfg), "--runs", "3"], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not running_benchmark(lab.hosts[0]):
        assert master.poll() is None and time.monotonic() < deadline, master.communicate()
        time.sleep(0.01)
    master.kill()  # kill -9: its lock file stays behind on the worker
    master.wait()
    assert (lab.hosts[0].rundir / "locks" / f"cpu{CPU}.lock").exists()
    t0 = time.monotonic()
    proc = cli("run-benchmark", str(bench), "--config", str(cfg), "--runs", "1", "--remeasure")
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - t0 < 60
    assert proc.stdout.startswith(f"ssh/h0/cpu{CPU},heuristic,")


def test_unreachable_address_fails_fast_with_the_host_named(tmp_path):
    """No server at all (nothing is sent beyond loopback): a one-line HostError."""
    data = {"backend": "ssh", "ssh": {
        "known_hosts": str(tmp_path / "kh"), "key_file": str(tmp_path / "key"),
        "connect_timeout": 2,
        "hosts": [{"name": "nowhere", "host": "127.0.0.1", "port": 9, "user": "u",
                   "rundir": "w", "cpus": [0]}]}}
    config = parse_config(data, tmp_path / "c.yaml")
    host = WorkerHost(config.backends["ssh"].hosts[0], config.backends["ssh"])
    with pytest.raises(HostError) as err:
        host.transport()
    assert str(err.value).startswith("nowhere: cannot connect to 127.0.0.1 port 9")
    assert not isinstance(err.value, PermanentLoss)  # may come back: re-probed with back-off


@needs_lab
def test_dead_agent_and_rebooted_host_come_back_into_service(lab, tmp_path):
    """A killed agent is replaced on the next probe; a host that went away and came back
    (sshd restarted, new connection) serves again after its back-off."""
    data = lab.config(cpus=[CPU])
    data["scheduler"]["quarantine_after"] = 50
    config = parse_config(data, tmp_path / "c.yaml")
    backend = SshBackend(config.backends["ssh"])
    binary = Path("/bin/true")
    job = RunJob(sha256_file(binary), binary, (), runs=1, timeout=10, perf=False)
    h0, h1 = backend.slots
    victim = lab.hosts[0]

    def agents():
        return [pid for pid in victim.pids()
                if b"agent-" in Path(f"/proc/{pid}/cmdline").read_bytes()]

    try:
        with Scheduler(backend.slots, config.scheduler) as scheduler:
            assert scheduler.submit(job, slot=h0.name).result(timeout=60).worker == h0.name
            (agent,) = agents()
            os.kill(agent, signal.SIGKILL)  # the agent alone dies; sshd and the link live on
            result = scheduler.submit(job, slot=h0.name).result(timeout=60)
            # Lost with the agent and run elsewhere, or (if the agent's exit status came
            # back first) run by a fresh agent on h0: either way measured once.
            assert result.failed == 0 and scheduler.lost_jobs in (0, 1)
            deadline = time.monotonic() + 30
            while scheduler.submit(job, slot=h0.name).result(timeout=60).worker != h0.name:
                assert time.monotonic() < deadline  # back in service after its back-off
            assert agents() and agents()[0] != agent

            lab.kill(victim)  # the host goes down: its jobs run on h1
            for _ in range(3):
                assert scheduler.submit(job, slot=h0.name).result(timeout=60).worker == h1.name
            lab.start_sshd(victim)  # ...and comes back: re-probed, reconnected, used again
            deadline = time.monotonic() + 60
            while scheduler.submit(job, slot=h0.name).result(timeout=60).worker != h0.name:
                assert time.monotonic() < deadline
            assert not scheduler.quarantined
    finally:
        backend.close()
