"""Tests of the worker agent (workers/agent/) with real OCaml binaries built by the real
compiler.

The agent runs as a real subprocess from its zipapp, speaking JSON lines, exactly as the master
uses it (a few tests drive it in-process through the package).
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tests.helpers import AGENT_PYTHON, SUM_ML, AgentProc, compile_programs, put
from workers.zipapp import build_agent_zipapp

PACKAGE = Path(__file__).resolve().parent.parent / "workers" / "agent"
AGENT = Path("/nonexistent")  # the zipapp under test, built once per session (conftest)


@pytest.fixture(scope="session", autouse=True)
def _agent(agent_pyz: Path) -> Path:
    global AGENT
    AGENT = agent_pyz
    return AGENT

PROGRAMS = {
    "sum": SUM_ML,
    "echo": "let () = print_string Sys.argv.(1)\n",
    "affinity": """
let () =
  let ic = open_in "/proc/self/status" in
  let p = "Cpus_allowed_list:" in
  let lp = String.length p in
  (try
     while true do
       let l = input_line ic in
       if String.length l >= lp && String.sub l 0 lp = p then
         print_endline (String.trim (String.sub l lp (String.length l - lp)))
     done
   with End_of_file -> ());
  close_in ic
""",
    "spin": """
let () =
  let r = ref 0 in
  while true do r := !r + 1 done;
  print_int !r
""",
    "segv": "let () = print_int !(Obj.magic 0 : int ref)\n",
    "exit3": 'let () = prerr_endline "bye"; exit 3\n',
    "raise": 'let () = if Array.length Sys.argv < 5 then failwith "boom"\n',
    "trivial": "let () = ()\n",
    # 26 MB to stdout, or to stderr with argument "err"
    "bigout": """
let () =
  let oc = if Array.length Sys.argv > 1 && Sys.argv.(1) = "err" then stderr else stdout in
  let s = String.make 65536 'x' in
  for _ = 1 to 400 do output_string oc s done
""",
    # holds the file $LOCK (created exclusively) for a moment: exit 7 if another run has it
    "exclusive": """
let () =
  let lock = Sys.getenv "LOCK" in
  match open_out_gen [Open_wronly; Open_creat; Open_excl] 0o600 lock with
  | exception Sys_error _ -> exit 7
  | oc ->
    let r = ref 0 in
    for i = 1 to 2_000_000 do r := !r + i done;
    close_out oc;
    Sys.remove lock;
    if !r = 0 then print_string "never"
""",
    # cwd entries (a fresh empty dir each run), then $FOO, $out and $PWD (sh's: no leaks)
    "envcwd": """
let () =
  let n = Array.length (Sys.readdir ".") in
  close_out (open_out "left-behind.txt");
  let get v = try Sys.getenv v with Not_found -> "-" in
  Printf.printf "%d %s %s %s\\n" n (get "FOO") (get "out") (get "PWD")
""",
    # writes to the file $REPORT, NUL-separated: argv[1..], "--env--", its sorted environ,
    # "--status--", the Sig* lines of /proc/self/status, "--fds--", its open fds
    "inspect": """
let read f =
  let ic = open_in_bin f in
  let buf = Buffer.create 4096 and chunk = Bytes.create 4096 in
  let rec go () =
    let n = input ic chunk 0 4096 in
    if n > 0 then (Buffer.add_subbytes buf chunk 0 n; go ()) in
  go (); close_in ic; Buffer.contents buf
let () =
  let b = Buffer.create 4096 in
  let add s = Buffer.add_string b s; Buffer.add_char b '\\000' in
  Array.iteri (fun i a -> if i > 0 then add a) Sys.argv;
  add "--env--";
  let env = List.filter (( <> ) "") (String.split_on_char '\\000' (read "/proc/self/environ")) in
  List.iter add (List.sort compare env);
  add "--status--";
  List.iter (fun l -> if String.length l > 3 && String.sub l 0 3 = "Sig" then add l)
    (String.split_on_char '\\n' (read "/proc/self/status"));
  add "--fds--";
  let fds = Sys.readdir "/proc/self/fd" in
  Array.sort compare fds;
  Array.iter add fds;
  let oc = open_out_bin (Sys.getenv "REPORT") in
  output_string oc (Buffer.contents b);
  close_out oc
""",
}


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def binaries(compiler, tmp_path_factory) -> dict:
    """name -> compiled executable (compiled in parallel with ocamlopt -O3)."""
    d = tmp_path_factory.mktemp("ocaml-progs")
    return compile_programs(compiler.ocamlopt, PROGRAMS, d)


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    d = tmp_path / "cache"
    d.mkdir()
    return d


@pytest.fixture
def agent(cache_dir):
    a = AgentProc(cache_dir, "--worker-class", "test", agent=AGENT)
    yield a
    a.close()


@pytest.fixture(scope="module")
def hello_info(tmp_path_factory) -> dict:
    a = AgentProc(tmp_path_factory.mktemp("hello-cache"), agent=AGENT)
    try:
        return a.request(op="hello")
    finally:
        a.close()


def perf_usable(hello_info) -> bool:
    return bool(hello_info["perf"]["available"])


def test_agent_imports_only_stdlib_and_parses_as_python_3_9():
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    for path in sorted(PACKAGE.glob("*.py")):
        source = path.read_text()
        tree = ast.parse(source, filename=str(path), feature_version=(3, 9))
        # annotations stay strings on 3.9 (``X | None`` would fail there at run time)
        assert len(tree.body) == 1 or "from __future__ import annotations" in source, path.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # within the package, nothing beyond it
                    assert node.level == 1 and (node.module is None or node.module in modules), \
                        (path.name, node.module)
                    continue
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names, f"{path.name}: non-stdlib import {name}"


def test_zipapp_is_deterministic_and_its_sha256_is_the_version(tmp_path):
    a = build_agent_zipapp(tmp_path / "a")
    b = build_agent_zipapp(tmp_path / "b")
    assert a.read_bytes() == b.read_bytes() == AGENT.read_bytes()
    sha = sha256_of(a)
    assert a.name == f"agent-{sha[:16]}.pyz"
    with zipfile.ZipFile(a) as zf:
        infos = zf.infolist()
    names = [i.filename for i in infos]
    assert names == sorted(names) and "__main__.py" in names
    assert sorted(n for n in names if n != "__main__.py") == sorted(
        f"agent/{p.name}" for p in PACKAGE.glob("*.py"))
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    for info in infos:
        assert info.date_time == (1980, 1, 1, 0, 0, 0)
        assert info.external_attr >> 16 == 0o100644
    # a build over a damaged file of the same name repairs it
    a.write_bytes(b"junk")
    assert build_agent_zipapp(tmp_path / "a") == a and sha256_of(a) == sha
    # runnable as python3 FILE, and its hello's version is its sha256
    cache = tmp_path / "cache"
    p = AgentProc(cache, agent=a)
    try:
        assert p.request(op="hello")["agent_version"] == sha
    finally:
        p.close()
    # run from the sources in-process, the version is the one the sources pack into
    from workers.agent.version import agent_version
    assert agent_version() == sha


def test_hello(agent, cache_dir):
    r = agent.request(op="hello")
    assert r["ok"] is True
    assert r["agent_version"] == sha256_of(AGENT)
    if AGENT_PYTHON == sys.executable:
        assert r["python"] == ".".join(map(str, sys.version_info[:3]))
    assert r["hostname"]
    assert r["cpus"] == sorted(os.sched_getaffinity(0))
    assert r["worker_class"] == "test"
    perf = r["perf"]
    assert isinstance(perf["available"], bool)
    assert perf["method"] == "perf_event_open"
    assert set(perf["events"]) >= {"task-clock", "page-faults", "context-switches",
                                   "cpu-migrations", "cycles", "instructions", "branches",
                                   "branch-misses", "cache-misses"}
    assert set(perf["events"].values()) <= {"supported", "unsupported"}
    if perf["available"]:
        assert perf["events"]["task-clock"] == "supported"
    else:
        assert perf["reason"]


def test_importable_in_process(cache_dir, binaries):
    from workers.agent.__main__ import main
    from workers.agent.service import Agent
    assert callable(main)
    a = Agent(str(cache_dir))
    try:
        sha = put(cache_dir, binaries["echo"])
        r = a.handle({"id": 7, "op": "run", "sha256": sha, "args": ["hi"], "runs": 1,
                      "cpu": min(os.sched_getaffinity(0)), "timeout": 10,
                      "expected_output": {"text": "hi"}, "perf": False})
        assert r["id"] == 7 and r["ok"] is True and r["failed"] == 0, r
        assert r["runs"][0]["output_ok"] is True
        # the binary's cwd was a fresh temp dir, removed afterwards
        assert not [p for p in os.listdir(a.runner.scratch) if p.startswith("run-")]
        assert a.handle({"op": "bogus"}) == {
            "id": None, "ok": False, "code": "unknown_op", "error": 'unknown op "bogus"'}
        assert a.handle(["not", "a", "dict"]) == {
            "id": None, "ok": False, "code": "bad_request",
            "error": "request must be a JSON object"}
    finally:
        a.close()


def test_run_records(agent, cache_dir, binaries):
    sha = put(cache_dir, binaries["sum"])
    assert agent.request(op="has", sha256=sha) == {"id": agent.next_id, "ok": True,
                                                   "present": True}
    n = 100000
    r = agent.request(op="run", sha256=sha, args=[str(n)], runs=3, cpu=0, timeout=20,
                      expected_output={"text": f"{n * (n - 1) // 2}\n"}, perf=False)
    assert r["ok"] is True, r
    assert r["sha256"] == sha and r["cpu"] == 0 and r["failed"] == 0
    assert len(r["runs"]) == 3
    for rec in r["runs"]:
        assert rec["failure"] is None
        assert rec["exit_status"] == 0 and rec["signal"] is None
        assert rec["output_ok"] is True
        assert 0 < rec["wall_ns"] < 10e9
        assert 0 <= rec["user_s"] < 10 and 0 <= rec["sys_s"] < 10
        assert rec["user_s"] + rec["sys_s"] > 0
        assert 500 < rec["maxrss_kb"] < 1_000_000
        gc = rec["gc"]
        # a list of 100000 ints is 300000 words, at least
        assert gc["minor_words"] >= 3 * n
        assert gc["minor_collections"] > 0
        assert {"promoted_words", "major_words", "major_collections", "heap_words",
                "top_heap_words", "compactions"} <= set(gc)
        assert all(isinstance(v, int) for v in gc.values())
        assert "minor_words" not in rec["stderr_tail"]
        assert rec["stderr_tail"] == ""
        assert rec["perf"] is None
        assert rec["cpus_allowed"] == "0"


def test_output_check_sha256_and_wrong_output(agent, cache_dir, binaries):
    sha = put(cache_dir, binaries["echo"])
    good = hashlib.sha256(b"hello").hexdigest()
    r = agent.request(op="run", sha256=sha, args=["hello"], runs=1, cpu=0, timeout=10,
                      expected_output={"sha256": good}, perf=False)
    assert r["ok"] and r["failed"] == 0 and r["runs"][0]["output_ok"] is True
    assert r["runs"][0]["stdout_sha256"] == good

    r = agent.request(op="run", sha256=sha, args=["goodbye"], runs=2, cpu=0, timeout=10,
                      expected_output={"sha256": good}, perf=False)
    assert r["ok"] and r["failed"] == 2
    bad = hashlib.sha256(b"goodbye").hexdigest()
    for rec in r["runs"]:
        assert rec["output_ok"] is False
        assert rec["exit_status"] == 0
        assert rec["failure"] == f"wrong output (sha256 {bad[:12]}...)"

    r = agent.request(op="run", sha256=sha, args=["hello"], runs=1, cpu=0, timeout=10,
                      expected_output={"text": "hello!"}, perf=False)
    assert r["runs"][0]["output_ok"] is False and r["runs"][0]["failure"].startswith("wrong output")
    r = agent.request(op="run", sha256=sha, args=["x"], runs=1, cpu=0, timeout=10,
                      expected_output=None, perf=False)
    assert r["runs"][0]["output_ok"] is None and r["runs"][0]["failure"] is None


def test_pinning_seen_by_the_program(agent, cache_dir, binaries):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    sha = put(cache_dir, binaries["affinity"])
    for cpu in cpus[:2]:
        for use_perf in (False, True):
            r = agent.request(op="run", sha256=sha, runs=1, cpu=cpu, timeout=10,
                              expected_output={"text": f"{cpu}\n"}, perf=use_perf)
            rec = r["runs"][0]
            assert rec["failure"] is None and rec["output_ok"] is True, (cpu, use_perf, rec)
            assert rec["cpus_allowed"] == str(cpu)
    # and the check really distinguishes CPUs
    r = agent.request(op="run", sha256=sha, runs=1, cpu=cpus[1], timeout=10,
                      expected_output={"text": f"{cpus[0]}\n"}, perf=False)
    assert r["runs"][0]["output_ok"] is False


def test_timeout_kills_and_agent_keeps_serving(agent, cache_dir, binaries):
    sha = put(cache_dir, binaries["spin"])
    t = time.monotonic()
    r = agent.request(op="run", sha256=sha, runs=2, cpu=0, timeout=0.5)
    elapsed = time.monotonic() - t
    assert r["ok"] is True and r["failed"] == 2
    for rec in r["runs"]:
        assert rec["failure"] == "timeout after 0.5s"
        assert rec["signal"] == 9 and rec["exit_status"] is None
        assert 0.5e9 <= rec["wall_ns"] < 1.5e9
    assert elapsed < 2 * 0.5 + 2.0
    # nothing left spinning (the process group was killed)
    out = subprocess.run(["pgrep", "-f", sha], capture_output=True, text=True)
    assert out.stdout.strip() == ""
    assert agent.request(op="hello")["ok"] is True


@pytest.mark.parametrize("use_perf", [False, True])
def test_crash_and_exit_status(agent, cache_dir, binaries, hello_info, use_perf):
    if use_perf and not perf_usable(hello_info):
        pytest.skip("perf not usable here")
    segv = put(cache_dir, binaries["segv"])
    r = agent.request(op="run", sha256=segv, runs=1, cpu=0, timeout=10, perf=use_perf,
                      expected_output={"text": ""})
    rec = r["runs"][0]
    assert r["failed"] == 1
    assert rec["signal"] == 11 and rec["exit_status"] is None
    assert rec["failure"] == "killed by signal 11 (SIGSEGV)"
    assert (rec["perf"] is not None) is use_perf

    ex3 = put(cache_dir, binaries["exit3"])
    r = agent.request(op="run", sha256=ex3, runs=2, cpu=0, timeout=10, perf=use_perf)
    assert r["failed"] == 2
    for rec in r["runs"]:
        assert rec["exit_status"] == 3 and rec["signal"] is None
        assert rec["failure"] == "exit status 3"
        assert rec["stderr_tail"] == "bye\n"
        assert rec["gc"]["minor_words"] > 0

    rz = put(cache_dir, binaries["raise"])
    r = agent.request(op="run", sha256=rz, runs=1, cpu=0, timeout=10, perf=use_perf)
    rec = r["runs"][0]
    assert rec["exit_status"] == 2 and rec["failure"] == "exit status 2", rec
    assert 'Fatal error: exception Failure("boom")' in rec["stderr_tail"]
    # the same binary succeeds with enough arguments: failures don't stick
    r = agent.request(op="run", sha256=rz, args=["a", "b", "c", "d"], runs=1, cpu=0,
                      timeout=10, perf=use_perf)
    assert r["failed"] == 0


def test_checksum_mismatch_is_refused_and_removed(agent, cache_dir, binaries):
    sha = put(cache_dir, binaries["echo"])
    path = cache_dir / sha
    r = agent.request(op="run", sha256=sha, args=["a"], runs=1, cpu=0, timeout=10, perf=False)
    assert r["ok"] and r["failed"] == 0
    # corrupt it in place (same size, so only the mtime tells the verification cache)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    st = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    r = agent.request(op="run", sha256=sha, args=["a"], runs=1, cpu=0, timeout=10, perf=False)
    assert r["ok"] is False and "checksum mismatch" in r["error"]
    assert r["code"] == "checksum_mismatch"
    assert not path.exists()
    r = agent.request(op="run", sha256=sha, args=["a"], runs=1, cpu=0, timeout=10)
    assert r == {"id": agent.next_id, "ok": False, "code": "not_in_cache",
                 "error": f"binary {sha} not in cache"}
    assert agent.request(op="has", sha256=sha)["present"] is False

    # has verifies too
    other = hashlib.sha256(b"something else").hexdigest()
    shutil.copyfile(binaries["echo"], cache_dir / other)
    assert agent.request(op="has", sha256=other)["present"] is False
    assert not (cache_dir / other).exists()


@pytest.mark.parametrize("bad", ["../../etc/passwd", "abc", "A" * 64, "0" * 63, "0" * 65,
                                 "../" + "0" * 61, 42, None],
                         ids=["dotdot", "short", "upper", "63", "65", "dotdot64", "int", "null"])
def test_bad_sha256_rejected(agent, bad):
    for op in ("has", "run"):
        r = agent.request(op=op, sha256=bad, runs=1, cpu=0, timeout=1)
        assert r["ok"] is False and "invalid sha256" in r["error"]
        assert r["code"] == "bad_request"


def test_bad_requests_get_errors(agent, cache_dir, binaries):
    sha = put(cache_dir, binaries["echo"])
    base = dict(op="run", sha256=sha, args=["x"], runs=1, cpu=0, timeout=5)
    bad_fields = [
        {"args": "x"}, {"args": [1]}, {"runs": 0}, {"runs": True}, {"runs": 10**6},
        {"cpu": 9999}, {"cpu": "0"}, {"cpu": None}, {"timeout": 0}, {"timeout": -1},
        {"timeout": "5"}, {"expected_output": {"md5": "x"}}, {"expected_output": "x"},
        {"env": {"A": 1}}, {"perf": "yes"},
    ]
    for fields in bad_fields:
        r = agent.request(**{**base, **fields})
        assert r["ok"] is False and "\n" not in r["error"] and r["error"], fields
        assert r["code"] == "bad_request", (fields, r)

    agent.send_raw(b"{not json\n")
    r = agent.recv()
    assert r["id"] is None and r["ok"] is False and r["error"].startswith("malformed request")
    assert r["code"] == "bad_request"
    agent.send_raw(b'{"op": "hello"\n')
    r = agent.recv()
    assert r["id"] is None and r["ok"] is False and r["error"].startswith("malformed request")
    agent.send_raw(b"\xff\xfe\n")
    r = agent.recv()
    assert r["id"] is None and r["ok"] is False
    agent.send_raw(b"[1, 2]\n")
    assert agent.recv()["ok"] is False
    assert agent.request(op="frobnicate") == {"id": agent.next_id, "ok": False,
                                              "code": "unknown_op",
                                              "error": 'unknown op "frobnicate"'}
    assert agent.request(op="hello")["ok"] is True


def test_env_and_fresh_cwd(agent, cache_dir, binaries):
    sha = put(cache_dir, binaries["envcwd"])
    r = agent.request(op="run", sha256=sha, runs=2, cpu=0, timeout=10, env={"FOO": "bar"},
                      expected_output={"text": "0 bar - -\n"})
    assert r["failed"] == 0, r
    sha = put(cache_dir, binaries["sum"])
    # an explicit OCAMLRUNPARAM keeps working and GC stats are still collected
    r = agent.request(op="run", sha256=sha, args=["1000"], runs=1, cpu=0, timeout=10,
                      env={"OCAMLRUNPARAM": "s=32k", "FOO": "bar"}, perf=False)
    rec = r["runs"][0]
    assert rec["failure"] is None and rec["gc"]["minor_words"] > 0


def test_perf_counters(agent, cache_dir, binaries, hello_info):
    if not perf_usable(hello_info):
        pytest.skip("perf events not usable here: %s" % hello_info["perf"].get("reason"))
    sha = put(cache_dir, binaries["sum"])
    small = agent.request(op="run", sha256=sha, args=["10"], runs=3, cpu=0, timeout=20)
    big = agent.request(op="run", sha256=sha, args=["1000000"], runs=3, cpu=0, timeout=20)
    assert small["failed"] == 0 and big["failed"] == 0, (small, big)
    for rec in small["runs"] + big["runs"]:
        p = rec["perf"]
        assert isinstance(p["task-clock"]["value"], float) and p["task-clock"]["value"] > 0
        assert p["task-clock"]["unit"] == "msec"
        assert "value" in p["cycles"] or p["cycles"] == {"unsupported": True}
        for e, status in hello_info["perf"]["events"].items():
            if status == "unsupported":
                assert p[e] == {"unsupported": True}
        # the counters are the binary's alone: its CPU time is within its rusage CPU time
        cpu_ms = (rec["user_s"] + rec["sys_s"]) * 1e3
        assert p["task-clock"]["value"] <= rec["wall_ns"] / 1e6
        assert abs(p["task-clock"]["value"] - cpu_ms) < 5 + 0.2 * cpu_ms, rec
        assert rec["stderr_tail"] == "" and rec["exit_status"] == 0
    # a million-element list (24 MB) faults in far more pages than ten elements
    assert (min(r["perf"]["page-faults"]["value"] for r in big["runs"])
            > max(r["perf"]["page-faults"]["value"] for r in small["runs"]) + 1000)
    assert min(r["maxrss_kb"] for r in big["runs"]) > max(r["maxrss_kb"] for r in small["runs"])
    # perf: false -> no perf dict
    r = agent.request(op="run", sha256=sha, args=["10"], runs=1, cpu=0, timeout=20, perf=False)
    assert r["runs"][0]["perf"] is None


def test_exit_status_of_short_runs_is_never_lost(agent, cache_dir, binaries):
    """Regression: under `perf stat` wrapping, ~5% of short runs reported exit status 0."""
    sha = put(cache_dir, binaries["raise"])
    r = agent.request(op="run", sha256=sha, runs=100, cpu=0, timeout=10)
    assert r["failed"] == 100
    assert {rec["exit_status"] for rec in r["runs"]} == {2}


def test_eof_and_shutdown_exit_cleanly(cache_dir):
    a = AgentProc(cache_dir, agent=AGENT)
    try:
        assert a.request(op="shutdown") == {"id": 1, "ok": True}
        assert a.proc.wait(timeout=10) == 0
    finally:
        a.close()
    a = AgentProc(cache_dir, agent=AGENT)
    try:
        a.proc.stdin.close()
        assert a.proc.wait(timeout=10) == 0
        assert a.proc.stdout.read() == b""
    finally:
        a.close()


def _pids_running(pattern: str) -> list:
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True)
    return out.stdout.split()


def _wait_for(predicate, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_no_orphans_when_agent_is_killed(cache_dir, binaries, how):
    """SIGTERM: the agent kills its running child; SIGKILL: RLIMIT_CPU (timeout + 2 s) does."""
    sha = put(cache_dir, binaries["spin"])
    path = str(cache_dir / sha)
    a = AgentProc(cache_dir, agent=AGENT)
    try:
        a.send_raw(json.dumps({"op": "run", "sha256": sha, "runs": 1, "cpu": 0,
                               "timeout": 1}).encode() + b"\n")
        assert _wait_for(lambda: _pids_running(path), 10), "spinner never started"
        servers = _fork_servers(a.proc.pid)
        assert len(servers) == 1, servers
        a.proc.send_signal(getattr(__import__("signal"), how))
        assert a.proc.wait(timeout=10) == (0 if how == "SIGTERM" else -9)
        # SIGKILL: the spinner dies at 3 s of CPU time, which a loaded CPU (other tests, other
        # masters on this machine) may take several times as long to give it
        limit = 1.0 if how == "SIGTERM" else 30.0
        assert _wait_for(lambda: not _pids_running(path), limit), _pids_running(path)
        # the fork server ends too (SIGKILL: on EOF of its request pipe; it may stay a
        # zombie of an init that does not reap)
        assert _wait_for(lambda: not _is_running(servers[0]), 5), servers
    finally:
        a.close()


# A benchmark that leaves two processes behind: a background job in its process group and a
# daemon (double fork, then setsid: a session and group of its own), both sleeping.
DAEMONISE = b"""#!/bin/sh
sleep 300 </dev/null >/dev/null 2>&1 &
( setsid sleep 300 </dev/null >/dev/null 2>&1 & )
echo started
"""


def _with_environ(entry: bytes) -> list:
    """The live (non-zombie) processes whose environment holds ``entry``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if entry in env and _is_running(int(pid)):
            found.append(int(pid))
    return found


@pytest.mark.parametrize("spawn", ["forkserver", "gated", "direct"])
def test_what_a_run_leaves_running_is_killed_and_fails_it(cache_dir, binaries, spawn):
    """Issue 11: a daemonising benchmark left 30 processes after 30 runs.  The agent kills
    everything a run left running when it ends, setsid or not, records how many, and fails
    the run; a well-behaved binary on the same agent is untouched."""
    script = cache_dir / "daemonise"
    script.write_bytes(DAEMONISE)
    sha = sha256_of(script)
    script.rename(cache_dir / sha)
    mark = f"INLINING_TEST_MARK={os.getpid()}-{spawn}-{time.monotonic_ns()}".encode()
    name, value = mark.decode().split("=", 1)
    a = AgentProc(cache_dir, "--spawn", spawn, agent=AGENT)
    try:
        assert a.request(op="hello")["strays_error"] is None
        r = a.request(op="run", sha256=sha, runs=3, cpu=0, timeout=10, perf=False,
                      env={name: value}, expected_output={"text": "started\n"})
        assert r["ok"] and r["spawn"] == spawn and r["failed"] == 3, r
        for rec in r["runs"]:
            assert rec["exit_status"] == 0 and rec["output_ok"] is True, rec
            assert rec["strays"] == 2, rec
            assert rec["failure"] == "left 2 processes running after it exited (killed)"
        assert _wait_for(lambda: not _with_environ(mark), 2), _with_environ(mark)
        echo = put(cache_dir, binaries["echo"])
        r = a.request(op="run", sha256=echo, args=["hi"], runs=2, cpu=0, timeout=10,
                      perf=False, expected_output={"text": "hi"})
        assert r["failed"] == 0 and [rec["strays"] for rec in r["runs"]] == [0, 0], r
        # nothing left below the agent but its fork server, no zombie
        kids = _children(a.proc.pid)
        assert len(kids) == (spawn == "forkserver"), kids
    finally:
        a.close()
    assert not _with_environ(mark)


def test_strays_are_not_looked_for_in_another_programs_process(cache_dir, binaries):
    """In-process (a host's own children are not the agent's to kill): null, not 0."""
    from workers.agent.service import Agent
    a = Agent(str(cache_dir))
    try:
        assert a.handle({"op": "hello"})["strays_error"]
        sha = put(cache_dir, binaries["trivial"])
        r = a.handle({"op": "run", "sha256": sha, "runs": 1, "cpu": 0, "timeout": 10,
                      "perf": False})
        assert r["failed"] == 0 and r["runs"][0]["strays"] is None, r
    finally:
        a.close()


@pytest.mark.parametrize("spawn", ["forkserver", "direct"])
@pytest.mark.parametrize("stream", ["out", "err"])
def test_captured_output_is_bounded(cache_dir, binaries, spawn, stream):
    """Issue 11: a program printing 300 MB put 307 MB in /dev/shm.  Each capture (and any
    file a run writes) stops at the agent's limit and the run fails, saying why."""
    sha = put(cache_dir, binaries["bigout"])
    a = AgentProc(cache_dir, "--spawn", spawn, agent=AGENT)
    try:
        limit = a.request(op="hello")["file_size_limit"]
        assert limit == 16 << 20
        r = a.request(op="run", sha256=sha, args=[stream], runs=2, cpu=0, timeout=10,
                      perf=False)
        assert r["ok"] and r["failed"] == 2, r
        for rec in r["runs"]:
            assert rec["failure"] == f"std{stream} over 16 MiB (the agent keeps at most that)"
            if stream == "err":
                assert rec["stdout_bytes"] == 0, rec
            elif spawn == "forkserver":  # limited before the exec
                assert rec["stdout_bytes"] == limit, rec
            else:  # direct: limited just after the exec, so a binary may write first (a
                # neighbour's load widening the window); the run fails all the same
                assert limit <= rec["stdout_bytes"] <= 25 << 20, rec
        scratch = Path(_scratch_of(a.proc.pid)) if spawn == "forkserver" else None
        if scratch is not None:  # the captures are gone once the run is recorded
            assert sorted(p.name for p in scratch.iterdir()) == ["lock", "script"]
    finally:
        a.close()


@pytest.mark.parametrize("spawn", ["forkserver", "gated", "direct"])
def test_an_output_checked_by_sha256_is_hashed_as_it_streams(cache_dir, binaries, spawn):
    """Issue 20: the cap is for what the agent keeps.  An output checked by sha256 is hashed
    as it streams (a FIFO, nothing kept): 26 MB counts, a wrong hash is a wrong output, and
    the FIFO is gone once the run is recorded."""
    sha = put(cache_dir, binaries["bigout"])
    printed = b"x" * (65536 * 400)
    a = AgentProc(cache_dir, "--spawn", spawn, agent=AGENT)
    try:
        r = a.request(op="run", sha256=sha, runs=2, cpu=0, timeout=20, perf=False,
                      expected_output={"sha256": hashlib.sha256(printed).hexdigest()})
        assert r["ok"] and r["failed"] == 0, r
        for rec in r["runs"]:
            assert rec["output_ok"] is True and rec["stdout_bytes"] == len(printed), rec
        r = a.request(op="run", sha256=sha, runs=1, cpu=0, timeout=20, perf=False,
                      expected_output={"sha256": "0" * 64})
        assert r["runs"][0]["failure"].startswith("wrong output (sha256 "), r
        if spawn == "forkserver":
            scratch = Path(_scratch_of(a.proc.pid))
            assert sorted(p.name for p in scratch.iterdir()) == ["lock", "script"]
    finally:
        a.close()


def test_scratch_of_a_killed_agent_is_swept_by_the_next(cache_dir, tmp_path):
    """Issue 11: killed agents left their scratch directories in /dev/shm.  An agent
    starting removes those whose lock no live agent holds, never a live agent's."""
    shm = tmp_path / "shm"
    shm.mkdir()
    env = dict(os.environ, XDG_RUNTIME_DIR=str(shm))
    legacy = shm / "inlining-agent-abc123"  # an older agent's: no lock, left alone
    legacy.mkdir()
    live = AgentProc(cache_dir, env=env, agent=AGENT)
    doomed = AgentProc(cache_dir, env=env, agent=AGENT)
    try:
        for a in (live, doomed):
            assert a.request(op="hello")["ok"]
        mine = {a: Path(_scratch_of(a.proc.pid)) for a in (live, doomed)}
        assert {p.parent for p in mine.values()} == {shm}
        doomed.proc.kill()
        doomed.proc.wait()
        assert mine[doomed].is_dir()
        fresh = AgentProc(cache_dir, env=env, agent=AGENT)
        try:
            assert fresh.request(op="hello")["ok"]
            assert not mine[doomed].exists()
            assert mine[live].is_dir() and legacy.is_dir()
            assert live.request(op="hello")["ok"]
            ours = {Path(_scratch_of(fresh.proc.pid)), mine[live], legacy}
        finally:
            fresh.close()
    finally:
        live.close()
        doomed.close()
    assert sorted(shm.iterdir()) == [legacy]
    assert ours


@pytest.mark.parametrize("spawn", ["forkserver", "gated", "direct"])
def test_unrunnable_file_is_a_failed_run(cache_dir, spawn):
    junk = cache_dir / "junk"
    junk.write_bytes(b"this is not an executable\n")
    sha = sha256_of(junk)
    junk.rename(cache_dir / sha)  # not even executable: the agent adds the x bit
    a = AgentProc(cache_dir, "--spawn", spawn, agent=AGENT)
    try:
        r = a.request(op="run", sha256=sha, runs=2, cpu=0, timeout=5)
        assert r["ok"] is True and r["failed"] == 2 and r["spawn"] == spawn, r
        for rec in r["runs"]:
            if spawn == "direct":
                assert rec["failure"].startswith("exec failed: [Errno 8] Exec format error"), rec
            else:  # sh runs a non-ELF file as a script: "this: not found"
                assert rec["failure"] == "exit status 127", rec
                assert "not found" in rec["stderr_tail"]
        assert a.request(op="hello")["ok"] is True
    finally:
        a.close()


def test_maxrss_is_the_binarys_own(agent, cache_dir, binaries):
    """Not inflated to the agent's RSS (Linux folds the pre-exec RSS into ru_maxrss)."""
    hello = agent.request(op="hello")
    if not hello["spawn"]["maxrss_exact"]:
        pytest.skip("gated spawning unavailable: %s" % hello["spawn"])
    triv = put(cache_dir, binaries["trivial"])
    r = agent.request(op="run", sha256=triv, runs=3, cpu=0, timeout=10, perf=False)
    assert r["spawn"] == hello["spawn"]["method"] == "forkserver"
    for rec in r["runs"]:
        assert 300 < rec["maxrss_kb"] < 6000, rec  # ~1.8 MB; the agent itself is ~15 MB+
    big = put(cache_dir, binaries["sum"])
    r = agent.request(op="run", sha256=big, args=["1000000"], runs=1, cpu=0, timeout=20,
                      perf=False)
    # a million-element list is 3 M words = 24 MB, all live at once
    assert r["runs"][0]["maxrss_kb"] > 24000


def test_direct_spawn_mode(cache_dir, binaries):
    """The fallback without sh/prctl: same records, maxrss includes the agent's RSS."""
    a = AgentProc(cache_dir, "--spawn", "direct", agent=AGENT)
    try:
        hello = a.request(op="hello")
        assert hello["spawn"]["method"] == "direct" and not hello["spawn"]["maxrss_exact"]
        sha = put(cache_dir, binaries["sum"])
        r = a.request(op="run", sha256=sha, args=["1000"], runs=2, cpu=0, timeout=10,
                      expected_output={"text": "499500\n"})
        assert r["spawn"] == "direct" and r["failed"] == 0, r
        for rec in r["runs"]:
            assert rec["output_ok"] is True and rec["gc"]["minor_words"] > 1000
            assert rec["cpus_allowed"] == "0"
            if hello["perf"]["available"]:
                assert rec["perf"]["task-clock"]["value"] > 0
        segv = put(cache_dir, binaries["segv"])
        rec = a.request(op="run", sha256=segv, runs=1, cpu=0, timeout=10)["runs"][0]
        assert rec["failure"] == "killed by signal 11 (SIGSEGV)"
        spin = put(cache_dir, binaries["spin"])
        rec = a.request(op="run", sha256=spin, runs=1, cpu=0, timeout=0.3)["runs"][0]
        assert rec["failure"] == "timeout after 0.3s" and rec["wall_ns"] < 1.3e9
    finally:
        a.close()


# --------------------------------------------------------------------------- fork server

def _children(pid: int) -> dict:
    """pid -> (state, cmdline) of the processes whose parent is ``pid``."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if int(fields[1]) == pid:
            out[int(entry)] = (fields[0].decode(), cmdline)
    return out


def _is_running(pid: int) -> bool:
    """Exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def _fork_servers(agent_pid: int) -> list:
    """The agent's fork servers.  A run's child is a fork of the server, with the same
    command line until it execs the binary; the first line of its script points its stdout
    at a scratch file, while a server's stdout stays the pipe to the agent."""
    return [pid for pid, (state, cmd) in _children(agent_pid).items()
            if b"inlining-agent fork server" in cmd and state != "Z"
            and _stdout_is_pipe(pid)]


def _stdout_is_pipe(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/fd/1").startswith("pipe:")
    except OSError:
        return False


# Arguments no shell quoting may touch: metacharacters, quotes, spaces, newlines, every
# ASCII byte, non-ASCII characters (including dash's internal control bytes 0x81-0x88 in
# UTF-8) and a raw non-UTF-8 byte (surrogate-escaped in JSON).
NASTY_ARGS = [
    "a b", "'", "''", '"', "'\\''", "$HOME", "${HOME}", "`id`", "$(id)", "\n", "", " ",
    "-n", "-e", "--", "*", "?", "[a]", "~", "#x", "a;b", "a&b", "a|b", "<x", ">x", "!",
    "\\", "a\\'b", "\t\r\x0b", "line1\nline2\n", "".join(map(chr, range(1, 128))),
    "\u00e9\u0081\u0082\u0088\u2603", "\udcff\udc81", "exec 3<&-; exit 7",
]
NASTY_ENV = {
    "FOO": "it's $HOME `x` \"q\"\n$(echo hi)\\",
    "EMPTY": "",
    "SPACES": "  a  b  ",
    "ALLBYTES": "".join(map(chr, range(1, 128))) + "\u0081\udcfe",
    "OLDPWD": "/old 'pwd'",
    "PATH": "/nonexistent:$PATH",
    "CDPATH": "/tmp",
    "BAD NAME": "dash cannot hold this name",
    "BAD-NAME": "nor this",
}


def _inspect(cache_dir, binary, spawn, args, env, agent_env, report) -> dict:
    """Run ``inspect`` once through an agent with ``--spawn spawn`` -> its parsed report."""
    sha = put(cache_dir, binary)
    a = AgentProc(cache_dir, "--spawn", spawn, env=agent_env, agent=AGENT)
    try:
        if report.exists():
            report.unlink()
        r = a.request(op="run", sha256=sha, args=args, runs=1, cpu=0, timeout=10,
                      perf=False, env=env)
        assert r["ok"] and r["failed"] == 0 and r["spawn"] == spawn, r
        parts = report.read_bytes().split(b"\0")
    finally:
        a.close()
    assert parts[-1] == b""
    parts = parts[:-1]
    i, j, k = parts.index(b"--env--"), parts.index(b"--status--"), parts.index(b"--fds--")
    status = [line for line in parts[j + 1:k] if line.split(b":")[0] in (
        b"SigBlk", b"SigIgn", b"SigCgt")]  # not SigQ: signals queued for the whole user
    assert len(status) == 3, parts[j + 1:k]
    return {"argv": parts[:i], "env": parts[i + 1:j], "status": status, "fds": parts[k + 1:]}


def test_forkserver_is_the_default(agent):
    spawn = agent.request(op="hello")["spawn"]
    assert spawn == {"method": "forkserver", "shell": shutil.which("dash") or "/bin/sh",
                     "maxrss_exact": True}


def test_nasty_argv_and_env_pass_unquoted(cache_dir, binaries, tmp_path):
    """argv and environment reach the binary byte for byte, whatever the shell syntax in
    them; the environment is the gated one (and the direct one less names sh can't hold)."""
    report = tmp_path / "report"
    agent_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/h o'me",
                 "LC_ALL": "C.UTF-8", "AGENT_SIDE": "x\ny 'z' $w", "AGENT-BAD": "1",
                 "PWD": "/stale/pwd", "OLDPWD": "/agent/old"}
    env = dict(NASTY_ENV, REPORT=str(report))
    got = {spawn: _inspect(cache_dir, binaries["inspect"], spawn, NASTY_ARGS, env, agent_env,
                           report)
           for spawn in ("forkserver", "gated", "direct")}
    want_argv = [os.fsencode(a) for a in NASTY_ARGS]
    for spawn, rep in got.items():
        assert rep["argv"] == want_argv, spawn
    fs_env = got["forkserver"]["env"]
    for name, value in {**NASTY_ENV, "HOME": "/h o'me", "AGENT_SIDE": "x\ny 'z' $w",
                        "OCAMLRUNPARAM": "v=0x400"}.items():
        entry = os.fsencode(f"{name}={value}")
        assert (entry in fs_env) is (" " not in name and "-" not in name), entry
    assert not [e for e in fs_env if e.startswith(b"PWD=")]
    # the same environment as gated sh gives, signal dispositions and open fds too
    assert got["forkserver"] == got["gated"]
    # direct passes every name; sh drops those it cannot hold
    assert fs_env == [e for e in got["direct"]["env"]
                      if b" " not in e.split(b"=")[0] and b"-" not in e.split(b"=")[0]]
    assert got["forkserver"]["fds"] == [b"0", b"1", b"2", b"3"]  # 3: the readdir itself


def test_nasty_names_in_paths(tmp_path, binaries):
    """A cache directory (so binary path) full of shell syntax works too."""
    cache = tmp_path / "ca'che $(x) `y` \n;&|<>*?"
    cache.mkdir()
    sha = put(cache, binaries["echo"])
    a = AgentProc(cache, agent=AGENT)
    try:
        r = a.request(op="run", sha256=sha, args=["it's"], runs=2, cpu=0, timeout=10,
                      expected_output={"text": "it's"})
        assert r["spawn"] == "forkserver" and r["failed"] == 0, r
    finally:
        a.close()


@pytest.mark.parametrize("spawn", ["forkserver", "gated"])
def test_many_runs_in_a_row(cache_dir, binaries, spawn):
    """500 runs: exit statuses exact, maxrss the binary's own and steady."""
    a = AgentProc(cache_dir, "--spawn", spawn, agent=AGENT)
    try:
        triv = put(cache_dir, binaries["trivial"])
        r = a.request(op="run", sha256=triv, runs=500, cpu=0, timeout=10, perf=False)
        assert r["ok"] and r["failed"] == 0 and r["spawn"] == spawn, r
        rss = sorted(rec["maxrss_kb"] for rec in r["runs"])
        assert {rec["exit_status"] for rec in r["runs"]} == {0}
        assert 300 < rss[0] and rss[-1] < 6000, (rss[0], rss[-1])
        assert rss[-1] - rss[0] < 1000, (rss[0], rss[-1])  # no drift from a growing server
        ex3 = put(cache_dir, binaries["exit3"])
        r = a.request(op="run", sha256=ex3, runs=200, cpu=0, timeout=10, perf=False)
        assert {(rec["exit_status"], rec["stderr_tail"]) for rec in r["runs"]} == {(3, "bye\n")}
        if spawn == "forkserver":
            (server,) = _fork_servers(a.proc.pid)
            with open(f"/proc/{server}/status") as f:
                hwm = [int(line.split()[1]) for line in f if line.startswith("VmHWM:")][0]
            assert hwm < 3000, hwm  # the server stays small
    finally:
        a.close()


def test_fork_server_death_is_survived(cache_dir, binaries):
    """Killing the fork server between or during runs: a fresh one takes over, the run is
    retried once, nothing is left behind."""
    a = AgentProc(cache_dir, agent=AGENT)
    try:
        triv = put(cache_dir, binaries["trivial"])
        r = a.request(op="run", sha256=triv, runs=2, cpu=0, timeout=10, perf=False)
        assert r["failed"] == 0
        (first,) = _fork_servers(a.proc.pid)
        os.kill(first, 9)
        r = a.request(op="run", sha256=triv, runs=2, cpu=0, timeout=10, perf=False)
        assert r["ok"] and r["failed"] == 0, r  # retried with a fresh server
        (second,) = _fork_servers(a.proc.pid)
        assert second != first and not os.path.exists(f"/proc/{first}")
        # found dead when it has to be moved to another CPU too
        os.kill(second, 9)
        last = max(os.sched_getaffinity(0))
        r = a.request(op="run", sha256=triv, runs=2, cpu=last, timeout=10, perf=False)
        assert r["ok"] and r["failed"] == 0, r
        assert {rec["cpus_allowed"] for rec in r["runs"]} == {str(last)}
        (third,) = _fork_servers(a.proc.pid)
        assert third not in (first, second)

        # kill servers while a long request is running
        a.send_raw(json.dumps({"id": 99, "op": "run", "sha256": triv, "runs": 400, "cpu": 0,
                               "timeout": 10, "perf": True}).encode() + b"\n")
        killed = set()
        deadline = time.monotonic() + 20
        while len(killed) < 5 and time.monotonic() < deadline:
            time.sleep(0.03)
            for pid in _fork_servers(a.proc.pid):
                if pid not in killed:
                    os.kill(pid, 9)
                    killed.add(pid)
        r = a.recv(timeout=60)
        assert r["id"] == 99 and r["ok"] is True and len(r["runs"]) == 400, r
        assert len(killed) >= 3, killed
        for rec in r["runs"]:
            assert rec["failure"] is None or rec["failure"].startswith(
                "fork server failed twice"), rec
            if rec["failure"] is None:
                assert rec["exit_status"] == 0 and 300 < rec["maxrss_kb"] < 6000, rec
        assert r["failed"] <= 5, r["failed"]
        r = a.request(op="run", sha256=triv, runs=3, cpu=0, timeout=10, perf=False)
        assert r["failed"] == 0
        # nothing left: one live server, no zombies, the killed servers gone
        assert _wait_for(lambda: not [p for p, (st, _) in _children(a.proc.pid).items()
                                      if st == "Z"], 5), _children(a.proc.pid)
        kids = _children(a.proc.pid)
        assert len(kids) == 1 and b"fork server" in list(kids.values())[0][1], kids
        assert not [p for p in killed if os.path.exists(f"/proc/{p}")]
    finally:
        a.close()


def test_pipelined_requests_answer_in_order_one_run_at_a_time(cache_dir, binaries, tmp_path):
    """Requests sent without waiting: one response each, in request order, whatever their
    kind; the runs never overlap on the CPU (each holds an exclusive lock file while it
    runs), stay pinned, and leave no process, file or directory behind."""
    excl = put(cache_dir, binaries["exclusive"])
    aff = put(cache_dir, binaries["affinity"])
    ex3 = put(cache_dir, binaries["exit3"])
    cpu = max(os.sched_getaffinity(0))
    env = {"LOCK": str(tmp_path / "lock")}
    a = AgentProc(cache_dir, agent=AGENT)
    try:
        reqs = []
        for i in range(6):
            reqs.append({"id": f"x{i}", "op": "run", "sha256": excl, "runs": 3, "cpu": cpu,
                         "timeout": 10, "env": env, "perf": i % 2 == 0})
        reqs.insert(2, {"id": "hello", "op": "hello"})
        reqs.insert(3, {"id": "bad", "op": "run", "sha256": excl, "runs": 0, "cpu": cpu})
        reqs.insert(4, {"id": "aff", "op": "run", "sha256": aff, "runs": 2, "cpu": cpu,
                        "timeout": 10, "expected_output": {"text": f"{cpu}\n"}})
        reqs.insert(6, {"id": "ex3", "op": "run", "sha256": ex3, "runs": 2, "cpu": cpu,
                        "timeout": 10})
        a.send_raw(b"".join(json.dumps(r).encode() + b"\n" for r in reqs) + b"not json\n")
        got = _recv_lines(a, len(reqs) + 1)
        assert [g["id"] for g in got] == [r["id"] for r in reqs] + [None]
        by_id = {g["id"]: g for g in got}
        assert by_id["hello"]["ok"] and by_id["hello"]["spawn"]["method"] == "forkserver"
        assert by_id["bad"]["ok"] is False and "runs must be" in by_id["bad"]["error"]
        assert got[-1]["ok"] is False and "malformed" in got[-1]["error"]
        assert by_id["aff"]["failed"] == 0, by_id["aff"]
        assert {r["cpus_allowed"] for r in by_id["aff"]["runs"]} == {str(cpu)}
        assert [(r["exit_status"], r["stderr_tail"]) for r in by_id["ex3"]["runs"]] == [
            (3, "bye\n")] * 2
        for i in range(6):
            r = by_id[f"x{i}"]
            assert r["ok"] and r["failed"] == 0 and len(r["runs"]) == 3, r
            assert {rec["cpus_allowed"] for rec in r["runs"]} == {str(cpu)}
            assert all((rec["perf"] is not None) == (i % 2 == 0 and bool(
                by_id["hello"]["perf"]["available"])) for rec in r["runs"])
        scratch = [p.name for p in Path(_scratch_of(a.proc.pid)).iterdir()]
        # no gates, captures or directories left; only the run script all runs share
        assert sorted(scratch) in (["lock"], ["lock", "script"]), scratch
        kids = _children(a.proc.pid)
        assert len(kids) == 1 and b"fork server" in list(kids.values())[0][1], kids
    finally:
        a.close()


def _recv_lines(a: AgentProc, n: int, timeout: float = 60.0) -> list:
    """``n`` responses read straight from the pipe (they may come several per read)."""
    fd = a.proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while buf.count(b"\n") < n:
        assert a.sel.select(max(0.0, deadline - time.monotonic())), buf[-300:]
        chunk = os.read(fd, 1 << 16)
        assert chunk, "agent closed stdout after %d responses" % buf.count(b"\n")
        buf += chunk
    return [json.loads(line) for line in buf.splitlines()]


def _scratch_of(agent_pid: int) -> str:
    """The agent's scratch directory: its fork server's cwd."""
    (server,) = _fork_servers(agent_pid)
    return os.readlink(f"/proc/{server}/cwd")


def test_pipelined_jobs_survive_an_agent_death(binaries, tmp_path):
    """Two jobs in flight on a local slot (one running, one queued in the agent) when the
    agent is killed: both are lost with it, run again on a fresh agent, and complete."""
    from dispatcher.config import SchedulerConfig
    from dispatcher.core.jobs import RunJob
    from dispatcher.running.local import LocalBackend
    from dispatcher.running.scheduler import Scheduler

    triv = binaries["trivial"]
    backend = LocalBackend((max(os.sched_getaffinity(0)),), tmp_path / "cache")
    slot = backend.slots[0]
    assert slot.depth == 2
    policy = SchedulerConfig(backoff_s=0.05)
    with Scheduler(backend.slots, policy) as scheduler:
        job = RunJob(sha256_of(triv), triv, (), runs=400, timeout=10, perf=False)
        scheduler.submit(RunJob(job.sha256, triv, (), runs=1, timeout=10)).result()
        first_agent = slot._agent.process
        futures = [scheduler.submit(job) for _ in range(2)]
        # both handed to the slot's runners (on a loaded machine that can take more than a
        # fixed sleep), then a moment for the second to reach the agent's queue
        deadline = time.monotonic() + 30
        while not all(f.running() for f in futures) and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)  # the first job runs (400 runs: longer than this), the second waits
        assert not any(f.done() for f in futures)
        first_agent.kill()
        results = [f.result(timeout=60) for f in futures]
        assert scheduler.lost_jobs == 2
        for r in results:
            assert len(r.records) == 400 and r.failed == 0
        assert slot._agent.process is not first_agent
        # and the slot's busy time counts overlapping jobs once
        assert scheduler.busy_s[slot.name] < 60


# --------------------------------------------------------------------------- the master's side

def test_local_agent_runs_the_zipapp_and_refusals_carry_their_code(cache_dir, binaries):
    """The local backend starts the same zipapp the SSH backend uploads; a refusal reaches
    the master as an AgentError whose ``code`` is the agent's."""
    from dispatcher.running.agent_client import AgentError, LocalAgent, WorkerLost, agent_zipapp
    pyz = agent_zipapp()
    assert pyz.read_bytes() == AGENT.read_bytes()
    agent = LocalAgent("local/test", cache_dir, "local")
    try:
        assert agent.process.args[1] == str(pyz)
        assert agent.connection.request({"op": "hello"})["agent_version"] == sha256_of(pyz)
        sha = sha256_of(binaries["echo"])
        with pytest.raises(AgentError) as err:
            agent.connection.request({"op": "run", "sha256": sha, "cpu": 0})
        assert err.value.code == "not_in_cache" and "not in cache" in str(err.value)
        with pytest.raises(AgentError) as err:
            agent.connection.request({"op": "run", "sha256": put(cache_dir, binaries["echo"]),
                                      "cpu": 0, "runs": 0})
        assert err.value.code == "bad_request"
        with pytest.raises(AgentError) as err:
            agent.connection.request({"op": "nope"})
        assert err.value.code == "unknown_op"
    finally:
        agent.close()
    assert WorkerLost("gone").code is None


def test_ssh_slot_uploads_again_by_code_not_by_message(tmp_path):
    """SshSlot.run re-uploads a binary the agent reports missing or damaged (by code), once;
    other refusals, whatever their wording, are the job's error.  (Against real sshd:
    tests/test_ssh.py, a tampered binary.)"""
    from dispatcher.core.jobs import RunJob
    from dispatcher.running.agent_client import AgentError
    from dispatcher.running.ssh import SshSlot

    class Host:
        name = "h"

        class config:
            worker_class = "c"

        def __init__(self, replies):
            self.calls, self.replies = [], list(replies)

        def start_agent(self, slot_name, cpu):
            return Channel(), Connection(self)

        def acquire_binary(self, sha, local):
            self.calls.append("acquire")

        def release_binary(self, sha):
            self.calls.append("release")

        def forget_binary(self, sha):
            self.calls.append("forget")

    class Channel:
        closed = False

        def exit_status_ready(self):
            return False

        def settimeout(self, t):
            pass

        def close(self):
            pass

    class Connection:  # the slot pipelines: send, then receive by id
        def __init__(self, host):
            self.host = host
            self.sent = 0

        def send(self, message):
            self.sent += 1
            return self.sent

        def receive(self, rid):
            reply = self.host.replies.pop(0)
            if isinstance(reply, Exception):
                raise reply
            return reply

    ok = {"ok": True, "cpu": 3, "runs": []}
    job = RunJob("0" * 64, tmp_path / "b", (), runs=1, timeout=1)
    for code in ("not_in_cache", "checksum_mismatch"):
        host = Host([AgentError("h: whatever it says", code=code), ok])
        assert SshSlot(host, 3).run(job).cpu == 3
        assert host.calls == ["acquire", "forget", "release", "acquire", "release"]
    # the message alone decides nothing; and a second refusal is not retried again
    host = Host([AgentError("h: binary x not in cache; checksum", code="bad_request"), ok])
    with pytest.raises(AgentError):
        SshSlot(host, 3).run(job)
    assert "forget" not in host.calls
    host = Host([AgentError("h: a", code="not_in_cache"), AgentError("h: b", code="not_in_cache")])
    with pytest.raises(AgentError, match="h: b"):
        SshSlot(host, 3).run(job)


def test_a_held_slot_lock_is_the_exit_the_protocol_names(tmp_path):
    """The agent's side of the slot-lock contract: the exit status and the stderr line the
    masters (agent_client.LocalAgent, the Ray actor) recognise, from workers/agent/protocol.py."""
    import fcntl

    from workers.agent.protocol import SLOT_LOCK_BUSY_STATUS, slot_lock_message
    lock = tmp_path / "cpu0.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        out = subprocess.run([AGENT_PYTHON, str(AGENT), "--cache-dir", str(tmp_path / "c"),
                              "--lock", str(lock), "--lock-wait", "0"],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=60)
    assert out.returncode == SLOT_LOCK_BUSY_STATUS
    assert out.stdout == ""
    messages = [slot_lock_message(line) for line in out.stderr.splitlines()]
    assert messages == [f"slot lock {lock} is held by another live agent"], out.stderr
    assert slot_lock_message("agent: something else") is None
