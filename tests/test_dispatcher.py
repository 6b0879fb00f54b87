"""The master's core: config, store, compile service, scheduler, and run-benchmark end to end."""
from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from dispatcher.build.driver import BuildError, BuildInterrupted, build_benchmark
from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.service import CompileError, CompileJob, CompileService, OverridesMismatch
from dispatcher.build.toolchain import Compiler
from dispatcher.config import (
    MAX_ATTEMPTS,
    MAX_BACKOFF_S,
    MAX_CHAINS,
    MAX_PARALLEL,
    MAX_RUNS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    ConfigError,
    load_config,
)
from dispatcher.core.decisions import Override, read_dumps, write_overrides
from dispatcher.core.jobs import RunJob
from dispatcher.core.outputs import unpack
from dispatcher.core.tree import Tree, to_overrides
from dispatcher.running.local import LocalBackend
from dispatcher.running.scheduler import Scheduler
from dispatcher.running.ssh import MAX_CACHE_MB
from dispatcher.storage.gc import Needs, collect
from dispatcher.storage.store import Store
from tests.helpers import FIRST_CPU, REPO, cli, invoke, one_line_error, write_config


@pytest.fixture
def store(tmp_path):
    return Store(tmp_path / "store")


def small_benchmark(root: Path, name: str = "tiny") -> Path:
    """A user benchmark directory, anywhere on disk."""
    d = root / name
    d.mkdir()
    (d / "arith.ml").write_text("let step acc i = acc + (i * i) mod 7\n"
                                "let[@inline never] run n = let r = ref 0 in\n"
                                "  for i = 1 to n do r := step !r i done; !r\n")
    (d / "main.ml").write_text("let () = Printf.printf \"%d\\n\" "
                               "(Arith.run (int_of_string Sys.argv.(1)))\n")
    out = sum((i * i) % 7 for i in range(1, 1001))
    (d / "benchmark.yaml").write_text(yaml.safe_dump({
        "name": name, "split": "training", "description": "test program",
        "modules": ["arith.ml"], "main": "main.ml",
        "sizes": {"quick": {"args": ["1000"], "expected_output": {"text": f"{out}\n"}},
                  "full": {"args": ["1000"], "expected_output": {"text": f"{out}\n"}}}}))
    return d


# -- config

def test_default_config_loads():
    config = load_config()
    assert config.backend == "local" and config.backend_settings.cpus
    assert set(config.backend_settings.cpus) <= os.sched_getaffinity(0)


@pytest.mark.parametrize("text, message", [
    ("backend: carrier-pigeon\n", "backend: expected local or ssh or ray or simulated, got 'carrier-pigeon'"),
    ("ssh: [a, b]\n", "ssh: expected a mapping"),
    ("run:\n  runs: 0\n", "run.runs: expected a positive integer"),
    ("run:\n  timeout: soon\n", "run.timeout: expected a positive number"),
    ("local:\n  cpus: [99999]\n", "local.cpus: expected CPUs of this machine"),
    ("local:\n  cpus: many\n", "local.cpus: expected auto or a list"),
    ("colour: blue\n", "colour: expected a known key"),
    ("run: [1, 2]\n", "run: expected a mapping"),
    ("run:\n  runs: 3\n  bogus: 1\n", "run.bogus: expected one of"),
    ("backend: local\n  nested: : :\n", "YAML syntax error"),
    ("search:\n  mode: eventually\n", "search.mode: expected sync or async, got 'eventually'"),
    ("search:\n  in_flight: lots\n", "search.in_flight: expected a positive integer"),
    ("search:\n  in_flight: 0\n", "search.in_flight: expected a positive integer"),
    # the cost guards (dispatcher.core.guards)
    ("policy:\n  max_size_ratio: 0.5\n", "policy.max_size_ratio: expected a ratio"),
    ("policy:\n  max_compile_ratio: twice\n", "policy.max_compile_ratio: expected a ratio"),
    ("policy:\n  max_compile_ratio: .nan\n", "policy.max_compile_ratio: expected a finite"),
    ("policy:\n  max_size: 2\n", "policy.max_size: expected one of"),
    ("policy: 2\n", "policy: expected a mapping"),
])
def test_bad_config_is_one_clear_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    # the file first (with the line and column of a YAML syntax error), then what is wrong
    assert re.match(rf"{re.escape(str(path))}(:\d+:\d+)?: ", str(err.value)), str(err.value)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("run:\n  timeout: .nan\n", "run.timeout: expected a finite number, got .nan"),
    ("run:\n  timeout: .inf\n", "run.timeout: expected a finite number, got .inf"),
    ("scheduler:\n  backoff_s: -.inf\n",
     "scheduler.backoff_s: expected a finite number, got -.inf"),
    ("run:\n  timeout: 1.0e+999\n", "run.timeout: expected a finite number, got 1.0e+999"),
    ("run:\n  timeout: !!float 1e999\n", "run.timeout: expected a finite number, got 1e999"),
    ("ssh:\n  hosts:\n    - host: a\n      port: .NaN\n",
     "ssh.hosts[0].port: expected a finite number, got .NaN"),
    ("colour: .inf\n", "colour: expected a finite number, got .inf"),  # before unknown keys
    (".nan\n", "(top level): expected a finite number, got .nan"),
    ("run:\n  runs: 3\nbackend: local\nrun:\n  runs: 4\n", "run: duplicate key (line 4)"),
    ("run:\n  runs: 3\n  timeout: 5\n  runs: 4\n", "run.runs: duplicate key (line 4)"),
    ("ssh:\n  hosts:\n    - host: a\n      host: b\n",
     "ssh.hosts[0].host: duplicate key (line 4)"),
    ("run: {runs: 3, runs: 3}\n", "run.runs: duplicate key (line 1)"),
    ("run:\n  timeout: 1" + "0" * 400 + "\n", "run.timeout: expected a positive number of "
     "seconds, at most 86400, got 1" + "0" * 400),  # an int too large for a float
])
def test_duplicate_keys_and_non_finite_numbers_are_one_exact_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {message}"


def test_a_config_that_is_not_utf8_is_one_line(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("run:\n  runs: 3  # tr\xe8s peu\n".encode("latin-1"))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: expected UTF-8 text (invalid continuation byte at "
                              "byte 20, line 2)")


# Every count and duration of the config, as (section, key, bound, what the error expects).
_BOUNDED = [
    ("run", "timeout", MAX_SECONDS, "a positive number of seconds, at most 86400"),
    ("run", "runs", MAX_RUNS, "a positive integer, at most 10000"),
    ("compile", "jobs", MAX_PARALLEL, "a positive integer, at most 1024"),
    ("scheduler", "attempts", MAX_ATTEMPTS, "a positive integer, at most 100"),
    ("scheduler", "quarantine_after", MAX_CHAINS, "a positive integer, at most 1000"),
    ("scheduler", "backoff_s", MAX_BACKOFF_S, "a positive number of seconds, at most 3600"),
    ("scheduler", "backoff_max_s", MAX_SECONDS, "a positive number of seconds, at most 86400"),
    ("measure", "max_pairs", MAX_RUNS, "a positive integer, at most 10000"),
    ("measure", "canary_every", MAX_STEPS, "a number of steps from 0 (never) to 1000000"),
    ("search", "steps", MAX_STEPS, "a positive integer, at most 1000000"),
    ("search", "chains", MAX_CHAINS, "a positive integer, at most 1000"),
    ("search", "baseline_runs", MAX_RUNS, "a positive integer, at most 10000"),
    ("search", "candidates_per_step", MAX_PARALLEL, "a positive integer, at most 1024"),
    ("search", "in_flight", MAX_PARALLEL, "a positive integer, at most 1024"),
    ("search", "remeasure_every", MAX_STEPS, "a number of steps from 0 (never) to 1000000"),
    ("search", "max_flips", MAX_CHAINS, "a positive integer, at most 1000"),
    ("search", "seed", MAX_SEED, f"an integer from -{MAX_SEED} to {MAX_SEED}"),
    ("ssh", "connect_timeout", MAX_BACKOFF_S, "a positive number of seconds, at most 3600"),
    ("local", "lock_wait", 86400, "seconds in 0..86400"),
]
_SSH_HOST = {"host": "a", "rundir": "r", "cpus": [1]}


@pytest.mark.parametrize("section, key, bound, expected", _BOUNDED,
                         ids=[f"{s}.{k}" for s, k, *_ in _BOUNDED])
def test_counts_and_durations_have_a_documented_upper_bound(tmp_path, section, key, bound,
                                                            expected):
    """A million seconds (or a zero too many) is refused in one line naming the file and key,
    not found when a job reaches a worker; the bound itself is accepted and documented."""
    path = tmp_path / "c.yaml"

    def config(value):
        data = {section: {key: value}}
        if section == "ssh":
            data["ssh"].update(user="u", hosts=[_SSH_HOST])
        path.write_text(yaml.safe_dump(data))
        return load_config(path)

    config(bound)
    for value in (bound + 1, 1_000_000_000, 1e6, 2 ** 64):
        if value <= bound or (isinstance(value, float) and "seconds" not in expected):
            continue
        with pytest.raises(ConfigError) as err:
            config(value)
        assert str(err.value) == f"{path}: {section}.{key}: expected {expected}, got {value!r}"
    docs = (REPO / "configs" / ("example-ssh.yaml" if section == "ssh" else "local.yaml"))
    # The key's line and the comment lines that continue it.
    documented = re.search(rf"^ *{key}:.*#.*(?:\n +#.*)*", docs.read_text(), re.MULTILINE)
    documented = documented and re.search(rf"\b(?:at most|to) {bound}\b", documented[0])
    assert documented or key in ("seed", "lock_wait"), f"{key}: bound not in {docs}"


def test_an_ssh_hosts_cache_limit_is_bounded(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"ssh": {"user": "u", "hosts": [
        {**_SSH_HOST, "cache_limit_mb": MAX_CACHE_MB + 1}]}}))
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (f"{path}: ssh.hosts[0].cache_limit_mb: expected a positive "
                              f"integer, at most {MAX_CACHE_MB}, got {MAX_CACHE_MB + 1}")


def test_merge_keys_and_finite_floats_are_not_refused(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("run:\n  timeout: 1.5e+2\nssh:\n  user: u\n  hosts:\n"
                    "    - &h {host: a, rundir: r, cpus: [1], cache_limit_mb: 64}\n"
                    "    - <<: *h\n      host: b\n")
    config = load_config(path)
    assert config.run.timeout == 150.0
    hosts = config.backends["ssh"].hosts
    assert [(h.name, h.cache_limit_bytes) for h in hosts] == [("a", 64 << 20), ("b", 64 << 20)]


def test_bundled_configs_load_strictly():
    for path in sorted((REPO / "configs").glob("*.yaml")):
        if path.name.startswith("campaign"):  # a campaign file: tests/test_campaign.py
            continue
        assert load_config(path).path == path


@pytest.mark.parametrize("text, message", [
    ("run:\n  timeout: .nan\n", "run.timeout: expected a finite number, got .nan"),
    ("backend: local\nrun:\n  runs: 3\nrun:\n  runs: 4\n", "run: duplicate key (line 4)"),
])
def test_cli_reports_a_strict_config_error_in_one_line(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = invoke("run-benchmark", "hamming", "--config", str(path), cwd=REPO)
    assert one_line_error(result) == f"run-benchmark: {path}: {message}"


# -- store and compile service

def test_compile_cache_hit_and_override_miss(compiler, store):
    bench = resolve_benchmark("kahan")
    service = CompileService(store, compiler, jobs=2)
    try:
        first = service.compile(CompileJob(bench))
        assert not first.cached and first.binary.is_file()
        dumps = first.artifact.dumps()
        assert dumps and all(d.unit for d in dumps)
        again = service.compile(CompileJob(bench))
        assert again.cached and again.artifact.key == first.artifact.key
        # A changed override is a different candidate.
        inlined = next(d for dump in dumps for d in dump.decisions if d.action == "inline")
        flipped = service.compile(CompileJob(bench, (
            Override(inlined.unit, inlined.round, inlined.key, "dont_inline"),)))
        assert not flipped.cached and flipped.artifact.key != first.artifact.key
        assert flipped.artifact.overrides_text and not first.artifact.overrides_text
        # Object files are not kept, only what analysis needs, packed.
        assert sorted(p.name for p in flipped.artifact.directory.iterdir()) == [
            "binary", "meta.json", "outputs.tar.gz"]
    finally:
        service.close()


def test_a_stored_build_is_not_queued_behind_running_compiles(compiler, store, tmp_path):
    """One compile job, busy with a long build (always-inline's can take the 300 s budget):
    a build already in the store is answered at once, not after it (run-plugin-benchmark's
    comparisons waited there for their heuristic builds, stored minutes before)."""
    import threading
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    service = CompileService(store, compiler, jobs=1)
    release = threading.Event()
    try:
        stored = service.compile(CompileJob(bench))
        busy = service._pool.submit(release.wait, 60)  # the only compile job, taken
        got = service.submit(CompileJob(bench))
        assert got.done() and got.result().cached
        assert got.result().artifact.key == stored.artifact.key
        assert not busy.done()
    finally:
        release.set()
        service.close()


def test_identical_jobs_in_flight_compile_once(compiler, store, tmp_path):
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    service = CompileService(store, compiler, jobs=2)
    try:
        futures = [service.submit(CompileJob(bench)) for _ in range(4)]
        assert len({id(f) for f in futures}) == 1  # one compile, shared
        assert not futures[0].result().cached
        assert service.compile(CompileJob(bench)).cached
    finally:
        service.close()


def test_compile_failure_is_reported(compiler, store, tmp_path):
    d = small_benchmark(tmp_path, "broken")
    (d / "arith.ml").write_text("let run n = n +. 1\n")
    service = CompileService(store, compiler)
    try:
        with pytest.raises(CompileError) as err:
            service.compile(CompileJob(resolve_benchmark(str(d))))
        assert "broken" in str(err.value) and "arith.ml" in str(err.value)
        assert "Error" in err.value.output
    finally:
        service.close()


@pytest.mark.parametrize("sig", ["INT", "TERM", "HUP"])
def test_a_compiler_stopped_by_a_ctrl_c_is_an_interruption_not_a_failed_build(tmp_path, sig):
    """Ctrl-C reaches a compiler started in the instant before it leaves the terminal's
    process group: it dies of SIGINT.  That says nothing about what it compiled, so it is
    not a failed build (a search would record its candidate as "compile failed")."""
    fake = tmp_path / "ocamlopt"
    # as a terminal delivers it: a suite run by nohup, or in the background of a script,
    # inherits SIGHUP or SIGINT ignored, which sh cannot undo
    fake.write_text(f"#!{sys.executable}\nimport os, signal\n"
                    f"signal.signal(signal.SIG{sig}, signal.SIG_DFL)\n"
                    f"os.kill(os.getpid(), signal.SIG{sig})\n")
    fake.chmod(0o755)
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    with pytest.raises(BuildInterrupted, match=f"tiny: compiling arith.ml: stopped by SIG{sig}"):
        build_benchmark(bench, tmp_path / "out", fake)


def test_a_compiler_dies_with_the_master_that_started_it(tmp_path):
    """A master killed mid-build (SIGKILL: no handler runs) does not leave its compiler
    running to the end of its build budget: the compiler is started so that it is killed when
    the thread that started it ends (util-linux's setpriv, PR_SET_PDEATHSIG)."""
    import signal
    import textwrap
    import time
    if shutil.which("setpriv") is None:
        pytest.skip("no setpriv (util-linux) on this machine")
    pid_file = tmp_path / "compiler.pid"
    master = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import threading
        from pathlib import Path
        from dispatcher.build.driver import run_counted
        threading.Thread(target=run_counted, args=(
            ["sh", "-c", "echo $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file} && "
             "exec sleep 60"], Path("."), {{}}, 120)).start()
        threading.Event().wait()
        """)], cwd=Path(__file__).resolve().parent.parent)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert master.poll() is None and time.monotonic() < deadline, "no compile started"
            time.sleep(0.05)
        compiler = Path("/proc") / pid_file.read_text().strip()
        assert compiler.exists(), "the compiler is not running"
        master.send_signal(signal.SIGKILL)
        master.wait(30)
        deadline = time.monotonic() + 30
        while compiler.exists() and (compiler / "cmdline").read_bytes().startswith(b"sleep"):
            assert time.monotonic() < deadline, "the compiler outlived its master"
            time.sleep(0.05)
    finally:
        master.kill()
        master.wait()


def test_a_killed_masters_compile_scratch_is_swept(tmp_path, monkeypatch):
    """A compile's scratch directory is named after its master's pid, so one that a master
    killed mid-compile left (SIGKILL runs no cleanup) is removed by the next master; a live
    master's, its own and one named before the pid was in the name are left alone."""
    import time

    from dispatcher.core.files import sweep_orphans
    gone = subprocess.Popen(["true"])
    gone.wait()
    names = {"dead": f"ocamlopt-{gone.pid}-a1b2c3d4", "live": f"ocamlopt-{os.getppid()}-e5f6",
             "own": f"ocamlopt-{os.getpid()}-g7h8", "old": "ocamlopt-i9j0k1l2"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "camlasm1234.s").write_text("")
    assert sweep_orphans("ocamlopt-", tmp_path) == 0  # all changed just now
    old = time.time() - 2 * 3600
    for name in names.values():
        os.utime(tmp_path / name, (old, old))
    assert sweep_orphans("ocamlopt-", tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        n for k, n in names.items() if k != "dead")
    # and a build's compiles run in a scratch directory named so
    seen = tmp_path / "tmpdirs"
    compiler = fake_compiler(tmp_path / "c", f'echo "$TMPDIR" >> {shlex.quote(str(seen))}; '
                                             'exit 2')
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "caller"))  # gettempdir's
    (tmp_path / "caller").mkdir()
    with pytest.raises(BuildError):
        build_benchmark(resolve_benchmark(str(small_benchmark(tmp_path))), tmp_path / "out",
                        compiler.ocamlopt)
    scratch = Path(seen.read_text().split()[0])
    assert scratch.parent == tmp_path / "caller"
    assert scratch.name.startswith(f"ocamlopt-{os.getpid()}-") and not scratch.exists()


def test_a_compiler_that_crashes_is_a_failed_build(tmp_path):
    fake = fake_compiler(tmp_path, "kill -s SEGV $$").ocamlopt
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    with pytest.raises(BuildError, match="compiling arith.ml failed .exit -11."):
        build_benchmark(bench, tmp_path / "out", fake)


def fake_compiler(root: Path, script: str) -> Compiler:
    """A compiler prefix whose ocamlopt.opt is ``script`` (sh), counting its runs in
    ``root/runs``."""
    prefix = root / "prefix"
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    ocamlopt = prefix / "bin" / "ocamlopt.opt"
    ocamlopt.write_text(f"#!/bin/sh\necho run >> {shlex.quote(str(root / 'runs'))}\n{script}\n")
    ocamlopt.chmod(0o755)
    return Compiler(prefix)


def runs_of(root: Path) -> int:
    return len((root / "runs").read_text().splitlines()) if (root / "runs").exists() else 0


def test_a_compile_that_fails_for_good_is_remembered_until_store_gc(tmp_path):
    """A candidate the compiler refuses (or one past the build budget: 300 s each time) is
    not compiled again to fail again: the store remembers why, with the whole output, in
    another process too; store-gc forgets it (a fixed compiler is another compiler anyway)."""
    compiler = fake_compiler(tmp_path, 'echo "Error: this candidate is refused"; exit 2')
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    root = tmp_path / "store"
    messages: list[str] = []
    for attempt in range(2):
        service = CompileService(Store(root), compiler)
        try:
            with pytest.raises(CompileError) as err:
                service.compile(CompileJob(bench))
        finally:
            service.close()
            service.store.close()
        assert "compiling arith.ml failed (exit 2): Error: this candidate is refused" \
            in str(err.value)
        assert "Error: this candidate is refused" in err.value.output
        messages.append(str(err.value))
        assert runs_of(tmp_path) == 1  # the second time from the store, without a compile
        assert (err.value.remembered is not None) == (attempt == 1)
    assert messages[0] == messages[1]  # word for word: a table run again reads the same
    report = collect(root, Needs())
    assert report.failures == 1
    service = CompileService(Store(root), compiler)
    try:
        with pytest.raises(CompileError, match="exit 2") as err:
            service.compile(CompileJob(bench))
        assert runs_of(tmp_path) == 2 and err.value.remembered is None
    finally:
        service.close()


def test_a_compile_killed_by_a_signal_is_not_remembered(tmp_path, store):
    """Killed (the OOM killer, a user's kill): nothing says the same inputs fail again."""
    compiler = fake_compiler(tmp_path, "kill -s KILL $$")
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    service = CompileService(store, compiler)
    try:
        for tries in (1, 2):
            with pytest.raises(CompileError, match="exit -9"):
                service.compile(CompileJob(bench))
            assert runs_of(tmp_path) == tries
        assert store.failure_keys() == []
    finally:
        service.close()


def test_entries_the_compiler_would_pass_over_are_refused(compiler, store):
    """A unit spelt in another case, or a round the compiler does not run, would be dropped
    without a word (the dump says ``(entries 0)``): refused, naming the entry.  A search's
    pins, taken from the compiler's dumps, always pass."""
    bench = resolve_benchmark("kahan")
    units = [u.module for u in bench.units() if u.is_impl]
    service = CompileService(store, compiler)
    try:
        base = service.compile(CompileJob(bench))
        tree = Tree.from_dumps(base.artifact.dumps())
        pins = tuple(to_overrides(tree))
        assert {o.unit for o in pins} == set(units)
        assert service.compile(CompileJob(bench, pins)).sha256  # every unit and round: fine
        # Units taken from the unit cache bring their dumps: their rounds are seen too.
        extra = Override("Main", 0, "C(Main.nowhere@main.ml:1:0-1)", "inline")
        again = service.compile(CompileJob(bench, pins + (extra,)))
        assert again.units_reused == len(units) - 1
        pin = next(o for o in pins if o.unit == "Main")
        rounds = sorted(tree.rounds("Main"))
        assert rounds == list(range(len(rounds))) and len(rounds) > 1  # -O3: several
        with pytest.raises(OverridesMismatch) as err:
            service.compile(CompileJob(bench, (pin, replace(pin, unit="main"))))
        assert str(err.value) == (f"override 1: unit main: kahan has no such unit (did you "
                                  f"mean Main? its units: {', '.join(units)})")
        with pytest.raises(OverridesMismatch) as err:
            service.compile(CompileJob(bench, (Override("Nowhere", 0, pin.key, "inline"),)))
        assert str(err.value) == (f"override 0: unit Nowhere: kahan has no such unit (its "
                                  f"units: {', '.join(units)})")
        late = Override("Main", len(rounds), pin.key, pin.action)
        with pytest.raises(OverridesMismatch) as err:
            service.compile(CompileJob(bench, (pin, late)))
        assert str(err.value) == (f"override 1: unit Main round {len(rounds)}: the compiler "
                                  f"ran rounds 0 to {len(rounds) - 1} of Main (flags: "
                                  f"{' '.join(bench.flags)})")
        # The rounds are the compiler's: fewer under -O2, one without -O flags.
        o2 = Override("Main", 1, pin.key, pin.action)
        assert service.compile(CompileJob(bench, (o2,), flags=("-O2",))).sha256
        with pytest.raises(OverridesMismatch, match=r"ran round 0 of Main \(flags: -g\)$"):
            service.compile(CompileJob(bench, (o2,), flags=("-g",)))
        # Nothing of a refused candidate is kept: four candidates stored, no staging left.
        assert len(list(store.compiled.glob("*/*"))) == 4
        assert not list(store.compiled.glob("*/.*")) and not list(store.compiled.glob(".*"))
    finally:
        service.close()


# -- unit-level incremental compiles (beneath the whole-candidate cache)

def _sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _flip(dumps, unit: str, k: int = 0) -> Override:
    d = [d for dump in dumps if dump.unit == unit for d in dump.decisions
         if d.action == "inline"][k]
    return Override(d.unit, d.round, d.key, "dont_inline")


def _whole_build(bench, compiler, tmp: Path, overrides):
    """The reference: one overrides file for every unit, nothing cached."""
    ov = write_overrides(tmp / "overrides.sexp", overrides) if overrides else None
    return build_benchmark(bench, tmp / "build", compiler.ocamlopt, overrides=ov,
                           dump_decisions=True)


def test_units_are_reused_and_dependents_rebuilt_identically_to_a_whole_build(
        compiler, store, tmp_path):
    bench = resolve_benchmark("kahan")  # summation.ml, series.ml, main.ml
    service = CompileService(store, compiler)
    try:
        base = service.compile(CompileJob(bench))
        assert (base.units_compiled, base.units_reused) == (3, 0)
        dumps = base.artifact.dumps()
        # Overrides of Main only: Summation and Series come from the unit cache.
        in_main = (_flip(dumps, "Main"),)
        main_only = service.compile(CompileJob(bench, in_main))
        assert (main_only.units_compiled, main_only.units_reused) == (1, 2)
        assert "main.ml" in main_only.artifact.compiler_output
        assert "# summation.ml: reused from the unit cache" in main_only.artifact.compiler_output
        # Overrides of Summation, the first unit: its .cmx changes (Main inlines from it), so
        # every unit after it is compiled again; a stale Main would give another binary.
        in_summation = (_flip(dumps, "Summation"),)
        first = service.compile(CompileJob(bench, in_summation))
        assert (first.units_compiled, first.units_reused) == (3, 0)
        for i, (job_overrides, result) in enumerate([((), base), (in_main, main_only),
                                                     (in_summation, first)]):
            whole = _whole_build(bench, compiler, tmp_path / f"whole{i}", list(job_overrides))
            assert _sha(result.binary) == _sha(whole.binary)
            assert {name: hashlib.sha256(text.encode()).hexdigest()
                    for name, text in result.artifact.decision_texts().items()} == \
                {f.name: _sha(f) for f in whole.decision_files}
        assert len({base.sha256, main_only.sha256, first.sha256}) == 3
        # Both changes at once: Summation and Series as in the last candidate, only Main new.
        both = service.compile(CompileJob(bench, in_main + in_summation))
        assert (both.units_compiled, both.units_reused) == (1, 2)
        # Entries for no unit of the program are refused before anything is compiled.
        with pytest.raises(OverridesMismatch):
            service.compile(CompileJob(bench, (Override("Nowhere", 0, "C(x)", "inline"),)))
        assert (service.units.misses, service.units.hits) == (3 + 1 + 3 + 1, 2 + 2)
    finally:
        service.close()


def test_a_unit_needed_by_concurrent_compiles_is_compiled_once(compiler, store, tmp_path):
    bench = resolve_benchmark("kahan")
    dumps = read_dumps(_whole_build(bench, compiler, tmp_path, []).decision_files)
    service = CompileService(store, compiler, jobs=3)  # fresh store: nothing cached
    try:
        jobs = [CompileJob(bench, (_flip(dumps, "Main", k),)) for k in range(3)]
        results = [f.result() for f in [service.submit(j) for j in jobs]]
        assert len({r.sha256 for r in results}) == 3
        # Summation and Series once (the others waited for them), Main three times.
        assert sum(r.units_compiled for r in results) == 5
        assert (service.units.misses, service.units.hits) == (5, 4)
    finally:
        service.close()


def test_a_damaged_unit_entry_is_compiled_again(compiler, store, tmp_path):
    import json
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    service = CompileService(store, compiler)
    try:
        base = service.compile(CompileJob(bench))
        (arith,) = [m.parent / "files.tar.gz" for m in store.units.glob("*/*/meta.json")
                    if "arith.cmx" in m.read_text()]
        arith.write_bytes(arith.read_bytes()[:len(arith.read_bytes()) // 2])  # cut short
        shutil.rmtree(base.artifact.directory)  # the candidate gone, its units kept
        again = service.compile(CompileJob(bench))
        # Arith compiled again; its .cmx is the same as before, so Main is still reused.
        assert (again.units_compiled, again.units_reused) == (1, 1)
        assert again.sha256 == base.sha256
        # An unreadable entry (meta.json cut short) is replaced.
        (main_meta,) = [m for m in store.units.glob("*/*/meta.json")
                        if "main.cmx" in m.read_text()]
        main_meta.write_text('{"files": {"main.cm')
        shutil.rmtree(again.artifact.directory)
        third = service.compile(CompileJob(bench))
        assert (third.units_compiled, third.units_reused) == (1, 1)
        assert third.sha256 == base.sha256
        for meta in store.units.glob("*/*/meta.json"):
            files = unpack(meta.parent / "files.tar.gz")
            for name, digest in json.loads(meta.read_text())["files"].items():
                assert hashlib.sha256(files[name]).hexdigest() == digest
    finally:
        service.close()


# -- scheduler on the local backend

def test_scheduler_runs_jobs_on_local_agents(compiler, store, tmp_path):
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    service = CompileService(store, compiler)
    compiled = service.compile(CompileJob(bench))
    service.close()
    size = bench.size("quick")
    job = RunJob(compiled.sha256, compiled.binary, size.args, runs=3, timeout=10,
                 expected_output=size.expected.to_json())
    backend = LocalBackend((FIRST_CPU,), store.worker_cache)
    with Scheduler(backend.slots) as scheduler:
        results = [f.result() for f in [scheduler.submit(job) for _ in range(3)]]
    for r in results:
        assert r.cpu == FIRST_CPU and len(r.records) == 3 and r.failed == 0
        assert all(rec.output_ok for rec in r.records)
    assert scheduler.busy_s[backend.slots[0].name] > 0
    # The binary travelled once, under its sha256.
    assert [p.name for p in store.worker_cache.iterdir()] == [compiled.sha256]


# -- run-benchmark end to end

def run_cli(*args, cwd=REPO):
    return cli("run-benchmark", *args, cwd=cwd)


def test_run_benchmark_bundled(tmp_path):
    config = write_config(tmp_path)
    proc = run_cli("hamming", "--config", str(config), "--runs", "3")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    worker, label, *times = lines[0].split(",")
    assert worker == f"local/cpu{FIRST_CPU}" and label == "heuristic" and len(times) == 3
    assert all(float(t) > 0 for t in times)
    assert "median" in proc.stderr and "inlined" in proc.stderr


def test_run_benchmark_user_dir_overrides_and_measured_once(compiler, tmp_path):
    bench_dir = small_benchmark(tmp_path)
    config = write_config(tmp_path)
    proc = run_cli(str(bench_dir), "--config", str(config), "--summary")
    assert proc.returncode == 0, proc.stderr
    assert "decisions:" in proc.stdout
    store = Store(tmp_path / "store")
    artifact = store.artifact(next(store.compiled.glob("*/*")).name)
    assert artifact is not None
    dumps = artifact.dumps()
    # Two decision files that pin different units' decisions as the heuristic took them
    # give the same binary: measured once.
    decisions = [d for dump in dumps for d in dump.decisions]
    assert decisions
    a = write_overrides(tmp_path / "a.sexp", [Override(d.unit, d.round, d.key, d.action)
                                              for d in decisions[:1]])
    b = write_overrides(tmp_path / "b.sexp", [Override(d.unit, d.round, d.key, d.action)
                                              for d in decisions[-1:]])
    outs = [run_cli(str(bench_dir), str(f), "--config", str(config), "--csv") for f in (a, b)]
    assert all(o.returncode == 0 for o in outs), [o.stderr for o in outs]
    assert len(list(store.compiled.glob("*/*"))) == 3  # three candidates compiled
    measured = list(store.measurements.glob("*/*.json"))
    assert len(measured) == 1  # one binary, one measurement entry
    times = [o.stdout.split(",", 2)[2] for o in outs]
    assert times[0] == times[1]  # the second reused the first's measurement


_PIN = '((unit Main) (round 0) (key "C(Main.f@main.ml:1:2-3)") (action inline))'
_BAD_OVERRIDES = {  # case: (file contents, what the one line must say)
    "conflict": (f"{_PIN}\n{_PIN.replace('inline', 'dont_inline')}",
                 "ov.sexp: override 1: conflicting actions for key "
                 "'C(Main.f@main.ml:1:2-3)' in unit Main round 0: dont_inline here, inline in "
                 "override 0"),
    "not_utf8_key": (_PIN.replace("Main.f", "Main.\udcff"), "ov.sexp: expected UTF-8 text"),
    "number_key": ("((unit Main) (round 0) (key 42) (action inline))",
                   "ov.sexp: override 0: key: expected a call-site key in double quotes, got "
                   "the number 42"),
    "wrong_case_unit": (_PIN.replace("unit Main", "unit main"),
                        "ov.sexp: override 0: unit main: hamming has no such unit (did you mean "
                        "Main? its units: Lstream, Smooth, Main)"),
    "missing_round": (_PIN.replace("round 0", "round 3"),
                      "ov.sexp: override 0: unit Main round 3: the compiler ran rounds 0 to 2 "
                      "of Main (flags: -O3)"),
}


@pytest.mark.parametrize("case", ["unknown_bench", "bad_sexp", "missing_sexp", "bad_config",
                                  "config_not_utf8", "compile_failure", *_BAD_OVERRIDES])
def test_run_benchmark_bad_input(tmp_path, case):
    config = write_config(tmp_path)
    args = ["hamming"]
    if case == "unknown_bench":
        args = ["no-such-benchmark"]
    elif case == "bad_sexp":
        (tmp_path / "bad.sexp").write_text("(inlining_overrides (version 1) (overrides ((unit")
        args.append(str(tmp_path / "bad.sexp"))
    elif case == "missing_sexp":
        args.append(str(tmp_path / "nope.sexp"))
    elif case == "bad_config":
        config.write_text("run:\n  runs: -1\n")
    elif case == "config_not_utf8":
        config.write_bytes(config.read_bytes() + "# d\xe9j\xe0 vu\n".encode("latin-1"))
    elif case == "compile_failure":
        d = small_benchmark(tmp_path, "broken")
        (d / "main.ml").write_text("let () = print_int \"x\"\n")
        args = [str(d)]
    elif case in _BAD_OVERRIDES:
        text = f"(inlining_overrides (version 1)\n (overrides\n{_BAD_OVERRIDES[case][0]}))\n"
        (tmp_path / "ov.sexp").write_bytes(text.encode("utf-8", "surrogateescape"))
        args.append(str(tmp_path / "ov.sexp"))
    proc = run_cli(*args, "--config", str(config))
    assert proc.returncode != 0
    err = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("run-benchmark: "), proc.stderr
    assert "Traceback" not in proc.stderr
    expected = {"unknown_bench": "no-such-benchmark", "bad_sexp": "bad.sexp",
                "missing_sexp": "nope.sexp", "bad_config": "config.yaml",
                "config_not_utf8": "config.yaml: expected UTF-8 text (invalid continuation "
                                   "byte at byte",
                "compile_failure": "broken",
                **{k: v[1] for k, v in _BAD_OVERRIDES.items()}}[case]
    assert expected in err[0]
    assert not proc.stdout  # nothing was run
    if case == "compile_failure":  # asked again: the same line, without compiling again
        again = run_cli(*args, "--config", str(config))
        lines = [line for line in again.stderr.splitlines() if line.strip()]
        assert again.returncode == proc.returncode and lines[-1] == err[0], again.stderr
        assert len(lines) == 2 and "broken: not compiled again: it failed on " in lines[0]


def test_submit_survives_a_compile_that_finishes_at_once(compiler, store, tmp_path):
    """A compile can end before submit registers its callback; the callback then runs in
    the submitting thread and must not deadlock on the service's lock, and the compile is
    not in flight any more once the service next takes its lock."""
    import threading
    from concurrent.futures import Future

    service = CompileService(store, compiler)

    def finished_at_once(fn, *args):
        f: Future = Future()
        f.set_exception(CompileError("failed at once", ""))
        return f

    service._pool.submit = finished_at_once
    bench = resolve_benchmark(str(small_benchmark(tmp_path)))
    t = threading.Thread(target=service.submit, args=(CompileJob(bench),), daemon=True)
    t.start()
    t.join(5)
    assert not t.is_alive(), "submit deadlocked"
    service.release(set())
    assert not service._inflight  # forgotten once done


def test_compiles_stay_off_the_worker_cpus(compiler, store):
    """Processes started by compile threads inherit the master's CPUs, not the workers'."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    service = CompileService(store, compiler, jobs=2, cpus=frozenset(cpus[:1]))
    try:
        status = service._pool.submit(lambda: subprocess.run(
            ["cat", "/proc/self/status"], capture_output=True, text=True).stdout).result()
    finally:
        service.close()
    allowed = next(line.split()[1] for line in status.splitlines()
                   if line.startswith("Cpus_allowed_list"))
    assert allowed == str(cpus[0])


def test_master_threads_stay_off_worker_cpus_but_agents_may_use_them(tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    worker = cpus[-1]
    script = f"""
import os, threading
from pathlib import Path
from dispatcher.running.local import keep_master_off
from dispatcher.running.agent_client import LocalAgent
from dispatcher.running.local import agent_cpus
keep_master_off(({worker},))
seen = []
t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
t.start(); t.join()
agent = LocalAgent("t", Path({str(tmp_path)!r}), "local", cpus=agent_cpus())
hello = agent.connection.request({{"op": "hello"}})
agent.close()
print({worker} in os.sched_getaffinity(0), {worker} in seen[0], {worker} in hello["cpus"])
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.split() == ["False", "False", "True"], out.stderr


def test_the_agents_cpus_are_read_when_asked_not_at_import():
    """Importing the local backend reads no machine state: the agents' CPUs are this
    process's when asked, until the master confines itself (then those it had before)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    script = f"""
import os
from dispatcher.running.local import agent_cpus, keep_master_off
os.sched_setaffinity(0, {{{cpus[0]}}})
print(sorted(agent_cpus()))
os.sched_setaffinity(0, {{{cpus[0]}, {cpus[1]}}})
keep_master_off(({cpus[1]},))
print(sorted(os.sched_getaffinity(0)), sorted(agent_cpus()))
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.splitlines() == [f"[{cpus[0]}]",
                                       f"[{cpus[0]}] [{cpus[0]}, {cpus[1]}]"], out.stderr


def test_a_session_starts_its_workers_only_when_asked(compiler, tmp_path):
    """Reading a Session's backend, scheduler or measurement service never starts them: it is
    an error until ``start_workers``, which starts them once.  (In a subprocess: starting the
    local backend confines the master's threads.)"""
    config = write_config(tmp_path)
    script = f"""
import pytest
from dispatcher.config import load_config
from dispatcher.session import Session, WorkersNotStarted
with Session(load_config({str(config)!r})) as session:
    for name in ("backend", "scheduler", "measurements"):
        with pytest.raises(WorkersNotStarted, match="before start_workers"):
            getattr(session, name)
    assert session.lost_workers() == []
    measurements = session.start_workers()
    assert session.start_workers() is measurements is session.measurements
    assert measurements.scheduler is session.scheduler
    assert [s.name for s in session.scheduler.slots] == [s.name for s in session.backend.slots]
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.split() == ["ok"], out.stderr


# -- run-benchmark: what a cached verdict is reused for

def _set_expected(bench_dir: Path, text: str) -> None:
    manifest = yaml.safe_load((bench_dir / "benchmark.yaml").read_text())
    for size in manifest["sizes"].values():
        size["expected_output"] = {"text": text}
    (bench_dir / "benchmark.yaml").write_text(yaml.safe_dump(manifest))


def test_run_benchmark_measures_again_once_the_expected_output_is_fixed(compiler, tmp_path):
    """A wrong expected output fails every run; once the user fixes it, the same binary is
    measured again (no --remeasure) and passes: the verdict belonged to the old output."""
    bench_dir = small_benchmark(tmp_path)
    right = yaml.safe_load((bench_dir / "benchmark.yaml").read_text())[
        "sizes"]["quick"]["expected_output"]["text"]
    _set_expected(bench_dir, "wrong\n")
    config = write_config(tmp_path)
    wrong = run_cli(str(bench_dir), "--config", str(config), "--runs", "2")
    assert wrong.returncode == 1 and "failed,failed" in wrong.stdout, wrong.stderr
    again = run_cli(str(bench_dir), "--config", str(config), "--runs", "2")
    assert again.returncode == 1 and "cached:" in again.stderr  # same job: reused
    _set_expected(bench_dir, right)
    fixed = run_cli(str(bench_dir), "--config", str(config), "--runs", "2")
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "failed" not in fixed.stdout and "cached:" not in fixed.stderr
    assert "Traceback" not in wrong.stderr + again.stderr + fixed.stderr
    # Both verdicts are kept, each under its own job.
    assert len(list(Path(tmp_path / "store").glob("measurements/*/*.json"))) == 2


def test_run_benchmark_runs_n_shows_n_runs_from_the_cache(compiler, tmp_path):
    bench_dir = small_benchmark(tmp_path)
    config = write_config(tmp_path)
    three = run_cli(str(bench_dir), "--config", str(config), "--runs", "3")
    assert three.returncode == 0, three.stderr
    one = run_cli(str(bench_dir), "--config", str(config), "--runs", "1")
    assert one.returncode == 0, one.stderr
    worker, _, *times = one.stdout.strip().split(",")
    first = three.stdout.strip().split(",")[2:]
    assert times == first[:1]  # the first run of the stored job, not all three
    assert "cached: the first 1 run per worker" in one.stderr
    assert "runs: 1 ok" in one.stderr
    # More runs than were stored: measured afresh, all of them shown.
    five = run_cli(str(bench_dir), "--config", str(config), "--runs", "5")
    # (a run disturbed on a loaded machine, one that migrated between CPUs, is shown as
    # "disturbed" and run again, once: the line shows at least the 5 runs asked for)
    shown = five.stdout.strip().split(",")[2:]
    assert five.returncode == 0 and 5 <= len(shown) <= 10, five.stdout
    assert sum(f != "disturbed" for f in shown) >= 1, five.stdout
    assert "cached:" not in five.stderr


def test_run_benchmark_with_decisions_prints_its_paired_speedup_over_the_heuristic(
        compiler, tmp_path):
    """The summary's speedup is measured as the search measures a candidate: in pairs with
    the heuristic build on one worker CPU, with its 95% interval."""
    bench_dir = small_benchmark(tmp_path)
    config = write_config(tmp_path, measure={"max_pairs": 6})
    first = run_cli(str(bench_dir), "--config", str(config), "--csv")
    assert first.returncode == 0, first.stderr
    store = Store(tmp_path / "store")
    stored = store.artifact(next(store.compiled.glob("*/*")).name)
    assert stored is not None
    dumps = stored.dumps()
    d = next(d for dump in dumps for d in dump.decisions if not d.prevented)
    flipped = write_overrides(tmp_path / "f.sexp", [Override(
        d.unit, d.round, d.key, "dont_inline" if d.action == "inline" else "inline")])
    proc = run_cli(str(bench_dir), str(flipped), "--config", str(config), "--runs", "2",
                   "--summary")
    assert proc.returncode == 0, proc.stderr
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("speedup over")]
    assert re.fullmatch(r"speedup over the heuristic: \d+\.\d{3} \[\d+\.\d{3}, \d+\.\d{3}\] "
                        rf"\(95% interval, \d+ pairs on local/cpu{FIRST_CPU}, stopped: "
                        r"(target|budget)\)", line), line
    assert list(store.root.glob("comparisons/*/*.json"))  # stored: asked again, not rerun
    again = run_cli(str(bench_dir), str(flipped), "--config", str(config), "--runs", "2",
                    "--summary")
    assert line in again.stdout.splitlines()
    skipped = run_cli(str(bench_dir), str(flipped), "--config", str(config), "--runs", "2",
                      "--summary", "--no-compare")
    assert "speedup over" not in skipped.stdout
