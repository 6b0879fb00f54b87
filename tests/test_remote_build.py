"""Builds on other machines: the agent's build mode (what a Ray node or an SSH host runs) and
the compile service's seats (a remote builder's first, the master's when they are taken).

The SSH hosts' builds end to end are in tests/test_ssh.py, the Ray nodes' in tests/test_ray.py."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.remote import BuilderLost, build_request, build_result
from dispatcher.build.service import CompileError, CompileJob, CompileService
from dispatcher.core.decisions import Override
from dispatcher.running.agent_client import agent_zipapp
from dispatcher.storage.store import Store
from workers.agent.build import reply_of, request_json


def agent_build(request: bytes, *args: str) -> dict:
    """``python3 agent.pyz build ARGS`` with ``request`` on stdin -> its reply."""
    proc = subprocess.run([sys.executable, str(agent_zipapp()), "build", *args], input=request,
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()
    return reply_of(proc.stdout)


def flipped(service: CompileService, bench) -> Override:
    base = service.compile(CompileJob(bench))
    first = base.artifact.dumps()[0].decisions[0]
    return Override(unit=base.artifact.dumps()[0].unit, round=0, key=first.key,
                    action="dont_inline" if first.action == "inline" else "inline")


def test_the_agents_build_mode_makes_the_masters_bytes(compiler, tmp_path):
    """A whole build through the zipapp's build mode, pinned to one CPU: the same binary and
    dumps, byte for byte, as the master's build (with its unit cache) of the same overrides;
    a failing command is the master's one line."""
    bench = resolve_benchmark("kahan")
    service = CompileService(Store(tmp_path / "store"), compiler)
    try:
        flip = flipped(service, bench)
        want = service.compile(CompileJob(bench, (flip,)))
        overrides = tmp_path / "flip.sexp"
        overrides.write_text(CompileJob(bench, (flip,)).unit_overrides()[flip.unit])
        request = build_request(bench, compiler, CompileJob(bench).effective_flags,
                                {flip.unit: overrides}, dump_decisions=True)
        reply = agent_build(request_json(**request.arguments()), "--cpus", "0")
        got = build_result(bench, tmp_path / "out", reply, "test")
        assert got.binary.read_bytes() == want.binary.read_bytes()
        # its compilers' CPU, as a build on the master counts it (the compile-time guard's)
        assert got.cpu_s is not None and got.cpu_s > 0 and got.units_compiled == 3
        assert {p.name: p.read_text() for p in got.decision_files} == \
            want.artifact.decision_texts()
        with pytest.raises(CompileError) as local_error:
            service.compile(CompileJob(bench, flags=("-O3", "-no-such-flag")))
    finally:
        service.close()
    bad = build_request(bench, compiler, ("-O3", "-no-such-flag"), {}, dump_decisions=True)
    from dispatcher.build.driver import BuildError
    with pytest.raises(BuildError) as remote_error:
        build_result(bench, tmp_path / "bad", agent_build(request_json(**bad.arguments())),
                     "test")
    assert str(local_error.value) == str(remote_error.value)


def test_a_machine_with_another_compiler_builds_nothing(compiler, tmp_path):
    bench = resolve_benchmark("kahan")
    request = build_request(bench, compiler, (), {}, dump_decisions=True)
    other = request.arguments() | {"compiler_identity": "0" * 64}
    reply = agent_build(request_json(**other))
    assert reply["lost"].startswith(f"the compiler {compiler.ocamlopt} on node ")
    assert "is not the master's (sha256 " in reply["lost"]
    with pytest.raises(BuilderLost, match=r"^h9: the compiler .* is not the master's"):
        build_result(bench, tmp_path / "out", reply, "h9")
    assert not (tmp_path / "out").exists()
    missing = request.arguments() | {"commands": [(["/nonexistent/ocamlopt.opt"], "x")]}
    assert agent_build(request_json(**missing))["lost"].startswith(
        "no compiler at /nonexistent/ocamlopt.opt on node ")


def test_the_compilers_sha256_is_kept_from_one_build_to_the_next(compiler, tmp_path):
    """An SSH host starts a process per build: ``--identity-cache`` keeps the compiler's
    sha256 under its path, inode, size and mtime, and the next build believes it."""
    bench = resolve_benchmark("kahan")
    request = request_json(**build_request(bench, compiler, (), {}, True).arguments())
    cache = tmp_path / "identity.json"
    assert agent_build(request, "--identity-cache", str(cache))["ok"]
    ((key, sha),) = json.loads(cache.read_text()).items()
    assert sha == compiler.identity and key.startswith(f"{compiler.ocamlopt}|")
    cache.write_text(json.dumps({key: "0" * 64}))  # believed: the build is refused
    assert "is not the master's (sha256 0000" in agent_build(
        request, "--identity-cache", str(cache))["lost"]
    cache.write_text(json.dumps({key.rsplit("|", 1)[0] + "|1": "0" * 64}))  # another mtime
    assert agent_build(request, "--identity-cache", str(cache), "--cpus", "0")["ok"]


@pytest.mark.parametrize("request_bytes, why", [
    (b"not json", "refused build request: not JSON"),
    (b"[1]", "refused build request: not a JSON object"),
    (json.dumps({"files": {}, "commands": [], "binary_name": "a", "timeout": 1}).encode(),
     "refused build request: commands: expected a list of [argv, what]"),
    (json.dumps({"files": {"a": "!!"}, "commands": [[["x"], "y"]], "binary_name": "a",
                 "timeout": 1}).encode(), "refused build request: files['a']: "),
    (json.dumps({"files": {}, "commands": [[["x"], "y"]], "binary_name": "../a",
                 "timeout": 1}).encode(), "refused build request: binary_name: expected"),
    (json.dumps({"files": {"../up": ""}, "commands": [[["/bin/true"], "y"]],
                 "binary_name": "a", "timeout": 1}).encode(),
     "refused file name '../up'"),
])
def test_a_bad_build_request_is_refused_in_one_line(request_bytes, why):
    reply = agent_build(request_bytes)
    assert reply["lost"].startswith(why), reply


@pytest.mark.parametrize("dumps, units", [
    ({"../escape.decisions.sexp": b""}, [{"files": {}, "output": ""}] * 3),
    ({}, [{"files": {"../escape.cmx": b""}, "output": ""}] * 3),
])
def test_a_file_name_that_would_leave_the_build_is_refused(compiler, tmp_path, dumps, units):
    bench = resolve_benchmark("kahan")
    reply = {"ok": True, "binary": b"x", "dumps": dumps, "units": units, "output": ""}
    with pytest.raises(BuilderLost, match=r"refused file name '\.\./escape"):
        build_result(bench, tmp_path / "out", reply, "h9")
    assert not list(tmp_path.glob("escape*"))


@pytest.mark.parametrize("reply, why", [
    ({"ok": False, "output": ""}, "a failed build without what, exit and text"),
    ({"ok": True, "output": 3}, "output: expected text"),
    ({"ok": True, "output": "", "binary": "x", "dumps": {}}, "binary: expected bytes"),
    ({"ok": True, "output": "", "binary": b"x", "dumps": {"a": "text"}},
     "dumps and units: expected files by name"),
    ({"ok": True, "output": "", "binary": b"x", "dumps": {}, "units": [{"files": {}}]},
     "units: expected each one's output"),
    ({"lost": 7}, "lost: expected a line"),
    ({"ok": True, "output": "", "binary": b"x", "dumps": {}, "link_cpu_s": "1"},
     "cpu_s: expected CPU seconds"),
    ({"ok": True, "output": "", "binary": b"x", "dumps": {},
      "units": [{"files": {}, "output": "", "cpu_s": -1.0}]}, "cpu_s: expected CPU seconds"),
])
def test_a_reply_that_is_not_one_is_a_lost_builder_in_one_line(tmp_path, reply, why):
    """A Ray task's reply is used as it came back: its shape is checked before any of it."""
    with pytest.raises(BuilderLost) as lost:
        build_result(resolve_benchmark("kahan"), tmp_path / "out", reply, "h9")
    assert str(lost.value) == f"h9: not a build reply ({why})"
    assert not (tmp_path / "out").exists()


class AgentBuilder:
    """A remote builder that is the agent's build mode on this machine (the code a Ray node
    or an SSH host runs), with the master's unit cache."""

    name, jobs, overflow_to_master, shares_unit_cache = "agent", 1, True, True

    def __init__(self):
        self.requests = []

    def build(self, bench, outdir, compiler, flags, overrides, dump_decisions, reuse):
        request = build_request(bench, compiler, flags, overrides, dump_decisions, reuse=reuse)
        self.requests.append(request)
        reply = agent_build(request_json(**request.arguments()))
        return build_result(bench, outdir, reply, self.name, reuse=reuse), self.name


def test_remote_builds_share_the_masters_unit_cache(compiler, tmp_path):
    """A flip in the last unit, built remotely after the master built the heuristic's tree:
    the two units before it go with the request, compiled, and only it is compiled there (the
    same bytes as the master's build); the unit it compiled lands in the master's cache, from
    which the master's next build of it takes every unit."""
    from dispatcher.build.driver import build_benchmark
    from dispatcher.build.remote import reused_units
    bench = resolve_benchmark("kahan")
    service = CompileService(Store(tmp_path / "store"), compiler, jobs=1)
    builder = AgentBuilder()
    try:
        base = service.compile(CompileJob(bench))  # on the master: its units cached
        last = bench.units()[-1].module
        dump = next(d for d in base.artifact.dumps() if d.unit == last)
        first = dump.decisions[0]
        flip = Override(unit=last, round=0, key=first.key,
                        action="dont_inline" if first.action == "inline" else "inline")
        service.use_builder(builder)
        got = service.compile(CompileJob(bench, (flip,)))
        meta = json.loads((got.artifact.directory / "meta.json").read_text())
        assert meta["built_on"] == "agent"
        assert (meta["units_reused"], meta["units_compiled"]) == (2, 1)
        assert meta["cpu_s"] > 0  # the two units' as recorded, the third's and the link's
        (request,) = builder.requests
        assert [what for _, what in request.commands] == ["compiling main.ml",
                                                          "linking kahan.exe"]
        assert {"summation.cmx", "series.cmx"} <= set(request.files)
        overrides = tmp_path / "flip.sexp"
        overrides.write_text(CompileJob(bench, (flip,)).unit_overrides()[last])
        flags = CompileJob(bench).effective_flags
        assert reused_units(bench, flags, {last: overrides}, True, service.units).count == 3
        again = build_benchmark(bench, tmp_path / "again", compiler.ocamlopt, flags=flags,
                                overrides={last: overrides}, dump_decisions=True,
                                unit_cache=service.units)
        assert (again.units_reused, again.units_compiled) == (3, 0)
        assert again.cpu_s is not None and again.cpu_s > 0  # the host's unit kept its CPU
        assert again.binary.read_bytes() == got.binary.read_bytes()
    finally:
        service.close()
    fresh = CompileService(Store(tmp_path / "fresh"), compiler)  # no cache, no builder
    try:
        want = fresh.compile(CompileJob(bench, (flip,)))
    finally:
        fresh.close()
    assert got.binary.read_bytes() == want.binary.read_bytes()
    assert got.artifact.decision_texts() == want.artifact.decision_texts()


class HeldBuilder:
    """A remote builder of one seat whose builds wait for ``release`` and are the master's
    builds underneath (so the binaries are real)."""

    name = "held"
    jobs = 1
    shares_unit_cache = False

    def __init__(self, overflow_to_master=True):
        self.overflow_to_master = overflow_to_master
        self.release = threading.Event()
        self.started = threading.Event()
        self.built: list[str] = []

    def build(self, bench, outdir, compiler, flags, overrides, dump_decisions, reuse):
        from dispatcher.build.driver import build_benchmark
        self.started.set()
        assert self.release.wait(120)
        self.built.append(bench.name)
        return build_benchmark(bench, outdir, compiler.ocamlopt, flags=flags,
                               overrides=overrides, dump_decisions=dump_decisions), "held/1"


def test_builds_take_the_builders_seats_first_then_the_masters(compiler, tmp_path):
    bench = resolve_benchmark("kahan")
    store = Store(tmp_path / "store")
    service = CompileService(store, compiler, jobs=1)
    builder = HeldBuilder()
    try:
        flip = flipped(service, bench)  # built before the builder: on the master
        service.use_builder(builder)
        held = service.submit(CompileJob(bench, (flip,)))
        assert builder.started.wait(60)
        # its one seat is taken: the next build is the master's, and does not wait
        other = service.compile(CompileJob(bench, flags=("-O2",)))
        assert not held.done()
        builder.release.set()
        result = held.result(timeout=120)
        meta = json.loads((result.artifact.directory / "meta.json").read_text())
        assert meta["built_on"] == "held/1" and builder.built == ["kahan"]
        meta = json.loads((other.artifact.directory / "meta.json").read_text())
        assert meta["built_on"] == "master"
    finally:
        builder.release.set()
        service.close()


def test_a_builder_that_keeps_its_builds_makes_the_next_wait_for_its_seat(compiler, tmp_path):
    bench = resolve_benchmark("kahan")
    service = CompileService(Store(tmp_path / "store"), compiler, jobs=1)
    builder = HeldBuilder(overflow_to_master=False)  # as the simulated world's builder
    try:
        service.use_builder(builder)
        first = service.submit(CompileJob(bench, flags=("-O2",)))
        assert builder.started.wait(60)
        second = service.submit(CompileJob(bench, flags=("-O3",)))
        assert not second.done()  # the master's seat is free, and still it waits
        builder.release.set()
        for result in (first.result(timeout=120), second.result(timeout=120)):
            meta = json.loads((result.artifact.directory / "meta.json").read_text())
            assert meta["built_on"] == "held/1"
        assert builder.built == ["kahan", "kahan"]
    finally:
        builder.release.set()
        service.close()


def test_a_lost_builder_leaves_the_build_to_the_master(compiler, tmp_path, caplog):
    class Lost:
        name, jobs, overflow_to_master, shares_unit_cache = "gone", 2, True, True

        def build(self, *args):
            raise BuilderLost("gone: no compiling host can build now")

    bench = resolve_benchmark("kahan")
    service = CompileService(Store(tmp_path / "store"), compiler, jobs=1)
    try:
        service.use_builder(Lost())
        result = service.compile(CompileJob(bench))
        meta = json.loads((result.artifact.directory / "meta.json").read_text())
        assert meta["built_on"] == "master"
        assert "kahan: built on the master instead: gone: no compiling host" in caplog.text
    finally:
        service.close()


def test_the_worker_side_needs_nothing_of_ours(tmp_path):
    """The build mode travels to Ray nodes by value and to SSH hosts in the zipapp: the
    standard library only."""
    source = (Path(__file__).parents[1] / "workers" / "agent" / "build.py").read_text()
    imports = [line.split()[1] for line in source.splitlines()
               if line.startswith(("import ", "from "))]
    assert set(imports) <= {"__future__", "base64", "hashlib", "json", "os", "resource", "subprocess",
                            "sys", "tempfile", "time", "typing"}, imports
