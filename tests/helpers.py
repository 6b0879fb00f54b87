"""What several test files share: paths, config writers, the two ways to run a command (in
process through click's CliRunner, or as a real ``python -m commands`` process), the training
master's start/kill helpers, small compiler programs, hand-written decision dumps, golden
rundirs cut back, labels tables with planted effects, and the worker agent's client.

Fixtures live in tests/conftest.py; this module holds plain functions and constants, so that
a test file imports what it uses from here rather than from another test file."""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
import yaml

from dispatcher.core.decisions import Decision, DecisionDump, parse_dump, read_dump
from dispatcher.core.tree import Tree, split_key

if TYPE_CHECKING:
    import click.testing
    import pandas as pd

    from analysis.extract import Candidates

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "golden"
V1, V2 = GOLDEN / "rundir-v1", GOLDEN / "rundir-v2"
GOLDEN_LABELS = GOLDEN / "labels-v1"
PLANTED_GRID = REPO / "tests" / "planted" / "grid"  # a program with one site worth 3x
#: The exact metric's tests: cachegrind counts need Valgrind (the quick start installs it).
needs_valgrind = pytest.mark.skipif(shutil.which("valgrind") is None,
                                    reason="valgrind is not installed")
FIRST_CPU = min(os.sched_getaffinity(0))
T = TypeVar("T")
R = TypeVar("R")

# --------------------------------------------------------------------------- configs


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def write_config(tmp_path: Path, **sections: Any) -> Path:
    """``tmp_path/config.yaml``: the local backend on one CPU, 3 quick runs of at most 30 s,
    the store under ``tmp_path``; each keyword replaces that top-level section."""
    data = {"backend": "local", "store": str(tmp_path / "store"),
            "local": {"cpus": [FIRST_CPU]}, "run": {"runs": 3, "timeout": 30, "size": "quick"}}
    return write_yaml(tmp_path / "config.yaml", {**data, **sections})


def search_config(tmp_path: Path, store: Path, measure: dict | None = None,
                  run_size: str = "quick", **search) -> Path:
    """A training master's config: 2 runs a measurement (``run_size``: the manifest size) on
    one CPU, 4 pairs at most, rundirs and batch log under ``tmp_path``; ``search`` keys
    replace the search section's."""
    return write_yaml(tmp_path / "config.yaml", {
        "store": str(store), "local": {"cpus": [FIRST_CPU]},
        "run": {"runs": 2, "timeout": 30, "size": run_size},
        "measure": {"max_pairs": 4, **(measure or {})},
        "search": {"baseline_runs": 3, "remeasure_every": 0, "max_flips": 2,
                   "rundirs": str(tmp_path / "rundirs"),
                   "batch_log": str(tmp_path / "batch.log"), **search}})


def campaign_data(tmp_path: Path) -> tuple[dict, Path]:
    """A campaign file's smallest content (a local config, quick size) and the path it would
    be read from: what the tests of one stage's section add their keys to."""
    cfg = write_yaml(tmp_path / "local.yaml", {"backend": "local",
                                               "store": str(tmp_path / "store")})
    return ({"config": str(cfg), "dir": "camp", "results": "out", "size": "quick"},
            tmp_path / "campaign.yaml")


def tiny_search_config(tmp_path: Path) -> Path:
    """A config for a few quick random-walk steps on one CPU, everything under ``tmp_path``
    (the searches that rewards, plugins and validation tests start from)."""
    return write_yaml(tmp_path / "config.yaml", {
        "store": str(tmp_path / "store"), "local": {"cpus": [FIRST_CPU]},
        "run": {"runs": 2, "timeout": 30, "size": "quick"},
        "measure": {"max_pairs": 2, "canary_every": 0},
        "search": {"algorithm": "random-walk", "baseline_runs": 2, "remeasure_every": 0,
                   "rundirs": str(tmp_path / "rundirs"),
                   "batch_log": str(tmp_path / "batch.log")}})


# --------------------------------------------------------------------------- running commands


def cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None,
        timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m commands ARGS`` as a real process (for what is about processes: signals,
    kills, imports, launchers, a whole command's run), text output captured."""
    return subprocess.run([sys.executable, "-m", "commands", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})})


def invoke(*args: str, cwd: Path | None = None,
           env: dict[str, str] | None = None) -> click.testing.Result:
    """``commands ARGS`` in this process through click's CliRunner: what a bad input's
    one-line error and exit status are, without starting Python again.  ``result.stderr`` is
    stderr alone; ``result.exit_code`` the status.  What a command may change of the process
    is put back (the master confines itself off the worker CPUs, installs signal handlers):
    the tests after it, and the processes they start, must not inherit it."""
    from click.testing import CliRunner

    from commands.__main__ import main
    from dispatcher.running import local
    try:
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]  # click < 8.2
    except TypeError:
        runner = CliRunner()  # click >= 8.2 keeps stderr apart by itself
    old = Path.cwd()
    affinity, confined = os.sched_getaffinity(0), local._confined_from
    handlers = {sig: signal.getsignal(sig) for sig in _HANDLED}
    if cwd is not None:
        os.chdir(cwd)
    try:
        return runner.invoke(main, list(args), env=env, catch_exceptions=False)
    finally:
        os.chdir(old)
        os.sched_setaffinity(0, affinity)
        local._confined_from = confined
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


_HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def one_line_error(result: subprocess.CompletedProcess | click.testing.Result,
                   status: int = 2) -> str:
    """The command failed with ``status`` and exactly one line on stderr (no traceback): that
    line.  Takes a real process's result or CliRunner's."""
    code = result.returncode if isinstance(result, subprocess.CompletedProcess) \
        else result.exit_code
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert code == status, (code, result.stderr)
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


# --------------------------------------------------------------------------- the training master


def training_command(cfg: Path, *args: str) -> list[str]:
    """The argv of a training master (``run_training_experiments``) on ``cfg``."""
    return [sys.executable, "-m", "commands", "run_training_experiments",
            "--config", str(cfg), *args]


def start(cfg: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(training_command(cfg, *args), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def rundirs_in(tmp_path: Path) -> list[Path]:
    """The rundirs made so far (a rundir being created is a hidden staging dir until whole)."""
    where = tmp_path / "rundirs"
    return [p for p in where.iterdir() if not p.name.startswith(".")] if where.is_dir() else []


def only_rundir(tmp_path: Path) -> Path:
    (rundir,) = rundirs_in(tmp_path)
    return rundir


def kill_after(proc: subprocess.Popen, journal: Path, steps: int, deadline_s: float = 120):
    """SIGKILL the master once the journal holds `steps` step events (0: after the baseline)."""
    want = "baseline" if steps == 0 else "step"
    t0 = time.monotonic()
    while time.monotonic() - t0 < deadline_s:
        if journal.exists():
            kinds = [json.loads(line)["event"] for line in journal.read_text().splitlines()
                     if line.strip().endswith("}")]
            if kinds.count(want) >= max(steps, 1):
                break
        if proc.poll() is not None:
            break
        time.sleep(0.01)
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def run_to_end(cfg: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """A training master run to its end (exit 0 asserted); stuck, its threads' stacks fail
    the test."""
    proc = subprocess.Popen(training_command(cfg, *args), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGUSR1)  # the master prints its threads' stacks
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"master stuck; its stacks:\n{err[-6000:]}")
    assert proc.returncode == 0, err
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_training(cfg: Path, *args: str, env: dict | None = None,
                 timeout: float = 120) -> subprocess.CompletedProcess:
    """A training master run to its end, whatever its exit status."""
    return subprocess.run(training_command(cfg, *args), cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under ``directory`` by relative path -> sha256 of its content (but the
    rundirs' lock files, which a master that opens a rundir makes, empty)."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != "master.lock"}


def relocated(golden: Path, tmp_path: Path, keep_steps: int) -> Path:
    """A copy of a golden rundir cut back to just after step ``keep_steps`` (as a crash would
    leave it), pointing at the golden benchmark in this checkout."""
    rundir = tmp_path / golden.name
    shutil.copytree(golden, rundir)
    data = json.loads((rundir / "experiment.json").read_text())
    data["benchmark"] = str(GOLDEN / "tinysum")
    (rundir / "experiment.json").write_text(json.dumps(data))
    kept = []
    for line in (rundir / "journal.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "step" and event["step"] > keep_steps or event["event"] == "finish":
            break
        kept.append(line)
    (rundir / "journal.jsonl").write_text("\n".join(kept) + "\n")
    for d in (rundir / "steps").iterdir():
        if int(d.name) > keep_steps:
            shutil.rmtree(d)
    return rundir


# --------------------------------------------------------------------------- benchmarks


def spin_benchmark(root: Path, iterations: int = 150_000_000) -> Path:
    """A benchmark that runs long enough (~0.3 s) to be killed in the middle of a run."""
    d = root / "spin"
    d.mkdir()
    (d / "work.ml").write_text("let[@inline never] run n = let r = ref 0 in\n"
                               "  for i = 1 to n do r := !r + (i * i) mod 7 done; !r\n")
    (d / "main.ml").write_text("let () = Printf.printf \"%d\\n\" "
                               "(Work.run (int_of_string Sys.argv.(1)))\n")
    n = iterations
    out = 14 * (n // 7) + sum((i * i) % 7 for i in range(1, n % 7 + 1))
    size = {"args": [str(n)], "expected_output": {"text": f"{out}\n"}}
    write_yaml(d / "benchmark.yaml", {
        "name": "spin", "split": "training", "description": "a loop to interrupt",
        "modules": ["work.ml"], "main": "main.ml", "sizes": {"quick": size, "full": size}})
    return d


# --------------------------------------------------------------------------- builds on every CPU


class BundledBuilds:
    """Bundled benchmarks built once a test run, with or without decision dumps (conftest's
    ``bundled_builds``): several test files read the same builds.  ``prefetch`` builds the
    ones not built yet on every CPU at once; ``get`` one, building it if need be.  The builds
    are shared: read them, copy them to change them.

    Under pytest-xdist every worker process has this fixture, and ``root`` is the run's
    directory they share: each build is made once, under a lock of its own, by the first
    worker that asks (a record beside it says it is complete; the others read the record),
    each worker starting at its own place in the list so that they build different ones."""

    def __init__(self, compiler, root: Path, worker: int = 0, workers: int = 1) -> None:
        self.compiler, self.root = compiler, root
        self.worker, self.workers = worker, max(workers, 1)
        self.done: dict[tuple[str, bool], Any] = {}

    def _build(self, job: tuple[Any, bool]) -> Any:
        import fcntl

        from dispatcher.build.driver import BuildResult, build_benchmark
        bench, dumps = job
        out = self.root / ("dumped" if dumps else "plain") / bench.name
        record = out.with_name(bench.name + ".built.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out.with_name(bench.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if record.exists():
                data = json.loads(record.read_text())
                return BuildResult(binary=Path(data["binary"]),
                                   decision_files=[Path(p) for p in data["decision_files"]],
                                   compiler_output=data["compiler_output"],
                                   units_compiled=data["units_compiled"],
                                   units_reused=data["units_reused"])
            shutil.rmtree(out, ignore_errors=True)  # a worker stopped in the middle
            out.mkdir()
            built = build_benchmark(bench, out, self.compiler.ocamlopt, dump_decisions=dumps)
            tmp = record.with_suffix(".tmp")
            tmp.write_text(json.dumps({
                "binary": str(built.binary),
                "decision_files": [str(p) for p in built.decision_files],
                "compiler_output": built.compiler_output,
                "units_compiled": built.units_compiled, "units_reused": built.units_reused}))
            tmp.replace(record)
            return built

    def prefetch(self, benches: Iterable[Any], dumps: bool) -> None:
        todo = {b.name: b for b in benches if (b.name, dumps) not in self.done}
        names = sorted(todo)
        start = len(names) * self.worker // self.workers
        names = names[start:] + names[:start]
        results = on_every_cpu(self._build, [(todo[n], dumps) for n in names])
        self.done.update({(name, dumps): r for name, r in zip(names, results)})

    def get(self, bench: Any, dumps: bool) -> Any:
        self.prefetch([bench], dumps)
        return self.done[(bench.name, dumps)]


def selected_params(request: pytest.FixtureRequest, test: str, name: str) -> list[Any]:
    """The values of parameter ``name`` of the ``test`` items this session runs (what a
    fixture may prepare at once for all of them)."""
    return [item.callspec.params[name] for item in request.session.items
            if getattr(item, "originalname", None) == test and hasattr(item, "callspec")]



def on_every_cpu(work: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """``[work(item) for item in items]``, as many at once as this process has CPUs: for
    independent compiles (each its own ocamlopt process, in its own directory).  The first
    item's exception, in order, is raised."""
    with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
        return list(pool.map(work, items))


# --------------------------------------------------------------------------- compiler programs


def compile_programs(ocamlopt: Path, programs: dict[str, str], directory: Path) -> dict:
    """name -> executable of each ``programs[name]`` source (ocamlopt -O3, in parallel)."""
    procs = {}
    for name, src in programs.items():
        (directory / name).mkdir()
        (directory / name / "prog.ml").write_text(src)
        procs[name] = subprocess.Popen(
            [str(ocamlopt), "-O3", "prog.ml", "-o", "prog.exe"],
            cwd=directory / name, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = {}
    for name, proc in procs.items():
        assert proc.stdout is not None
        log = proc.communicate()[0].decode()
        assert proc.returncode == 0, f"compiling {name}: {log}"
        out[name] = directory / name / "prog.exe"
    return out


UTIL_ML = """\
let add x y = x + y
let scale k v = Array.map (fun x -> k * x) v
"""

# [big] is too large for the heuristic at -O3; [tiny] is always inlined.
MAIN_ML = """\
let big x =
  let a = Array.make 64 x in
  for i = 1 to 63 do a.(i) <- a.(i - 1) * 3 + i land 7 + x done;
  Array.fold_left ( + ) 0 a + Array.fold_left max 0 a
let tiny x = x + 1
let[@inline] h x = big x + tiny x
let[@inline] g x = h (x + 1)
let f1 x = g (x * 2)
let f2 x = g (x * 3)
let () =
  let n = int_of_string Sys.argv.(1) in
  let s = ref 0 in
  for i = 1 to n do s := !s + f1 i + f2 i + Util.add i (tiny i) done;
  Printf.printf "%d %d\\n" !s (Array.fold_left ( + ) 0 (Util.scale 3 [| n; 2 |]))
"""

FEATURES_ML = """\
let tiny x = x + 1
let[@inline never] opt ?(k = 1) x = x * k + tiny x
let rec loop n acc = if n = 0 then acc else loop (n - 1) (acc + tiny n)
let spin n = let i = ref 0 and s = ref 0 in while !i < n do s := !s + tiny !i; incr i done; !s
let () = print_int (loop 10 (tiny 3) + spin 5 + opt 4)
"""


def compile_units(compiler, workdir: Path, units, *, flags=("-O3",), overrides=None,
                  dump=True, env=None, extra=()):
    """Compile units in order with -c; return the CompletedProcess of the last one."""
    for unit in units:
        args = [str(compiler.ocamlopt), *flags, *extra]
        if dump:
            args.append("-dump-inlining-decisions")
        if overrides is not None:
            args += ["-inlining-overrides", str(overrides)]
        args += ["-S", "-c", unit]
        proc = subprocess.run(args, cwd=workdir, capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        # No per-decision chatter: a successful compile prints nothing.
        assert proc.stdout == "" and proc.stderr == "", (proc.stdout, proc.stderr)
    return proc


def link(compiler, workdir: Path, cmxs, exe="main.exe") -> Path:
    subprocess.run([str(compiler.ocamlopt), *cmxs, "-o", exe], cwd=workdir, check=True)
    return workdir / exe


def decisions_by_key(path: Path):
    return {d.key: d for d in read_dump(path).decisions}


def function_asm(asm: str, symbol_prefix: str) -> str:
    """The code of one function: from its label to its .size directive."""
    names = re.findall(rf"\.type\s+({re.escape(symbol_prefix)}_\d+),@function", asm)
    assert len(names) == 1, f"functions named {symbol_prefix}: {names}"
    m = re.search(rf"^{names[0]}:\n(.*?)\.size\s+{names[0]},", asm, re.S | re.M)
    assert m, names[0]
    return m.group(1)


def calls(asm: str, callee_prefix: str) -> int:
    return len(re.findall(rf"\bcall\s+{re.escape(callee_prefix)}_\d+", asm))


def find(decisions: dict, pattern: str):
    hits = [d for k, d in decisions.items() if re.search(pattern, k)]
    assert len(hits) == 1, (pattern, [d.key for d in hits])
    return hits[0]


def assert_subtrees_consistent(by_key: dict) -> None:
    """Every decision below C(..)/I must sit under an inlined call, below /S under a
    specialised one: nothing from a discarded speculation."""
    for key in by_key:
        frames = split_key(key)
        for i, frame in enumerate(frames[:-1]):
            if frame in ("I", "S") and frames[i - 1].startswith("C("):
                parent = "/".join(frames[:i])
                assert parent in by_key, f"{key}: parent call {parent} was not decided"
                want = "inline" if frame == "I" else "specialise"
                assert by_key[parent].action == want, f"{key}: parent {parent} not {want}d"


# --------------------------------------------------------------------------- hand-written dumps

RUN = "C(Main.run@main.ml:10:30-64)"
HELPER_DECL = "D(Main.helper@main.ml:1:11-27)"
RUN_DECL = "D(Main.run@main.ml:4:8-134)"
GO_DECL = RUN_DECL + "/D(Main.go@main.ml:5:2-9)"
MAP = "C(Lib.map@src/lib/a.ml:3:1-9)"  # '/' inside the file name
G = "C(Main.g@main.ml:9:1-4)"

ROWS_0 = [
    # key, callee, action, reason
    (RUN, "Main.run", "inline", "heuristic"),
    (RUN + "/I/C(Main.helper@main.ml:7:18-26)", "Main.helper", "dont_inline", "heuristic"),
    (HELPER_DECL + "/C(Util.add@main.ml:1:15-27)", "Util.add", "inline", "heuristic"),
    (RUN_DECL + "/C(Main.helper@main.ml:7:18-26)", "Main.helper", "dont_inline", "override"),
    (GO_DECL + "/C(Main.go@main.ml:5:5-9)", "Main.go", "dont_inline", "(prevented self_call)"),
    (MAP, "Lib.map", "specialise", "heuristic"),
    (MAP + "/S/C(Lib.f@src/lib/a.ml:2:1-3)", "Lib.f", "inline", "attribute"),
    (MAP + "/S/C(Lib.f@src/lib/a.ml:2:1-3)/I/C(Lib.g@src/lib/a.ml:1:1-3)", "Lib.g",
     "dont_inline", "heuristic"),
    (G, "Main.g", "dont_inline", "heuristic"),
    (G + "#1", "Main.g", "inline", "heuristic"),
    (G + "#1/I/D(Main.k@main.ml:2:1-5)/C(Main.h@main.ml:2:3-5)", "Main.h", "inline",
     "heuristic"),
    (RUN_DECL + "/C(Main.big@main.ml:7:19-28>main.ml:6:19-24)", "Main.big", "inline",
     "heuristic"),
]
ROWS_1 = [
    # the round-0 dont_inline site comes back and is re-decided
    (RUN_DECL + "/C(Main.helper@main.ml:7:18-26)", "Main.helper", "inline", "heuristic"),
    (RUN_DECL + "/C(Main.helper@main.ml:7:18-26)/I/C(Util.add@main.ml:1:15-27)", "Util.add",
     "dont_inline", "heuristic"),
    (G, "Main.g", "dont_inline", "heuristic"),
]


def dump_text(unit: str, round_: int, rows) -> str:
    lines = []
    for key, callee, action, reason in rows:
        extra = " (detail without_subfunctions)" if reason == "heuristic" else ""
        extra += f" (override {action})" if reason == "override" else ""
        lines.append(f'  ((key "{key}") (callee "{callee}") (action {action}) '
                     f'(reason {reason}){extra})')
    body = "\n".join(lines)
    return (f'(inlining_decisions\n (version 1)\n (unit "{unit}")\n (round {round_})\n'
            f' (overrides (entries 0) (matched 0) (unmatched 0) (unmatched_keys ()))\n'
            f' (decisions\n{body}\n ))\n')


def dump(unit: str, round_: int, rows) -> DecisionDump:
    return parse_dump(dump_text(unit, round_, rows))


# --------------------------------------------------------------------------- labels tables

NAN = float("nan")
FASTER = {"effect": 0.05, "low": 0.03, "high": 0.07}
SLOWER = {"effect": -0.05, "low": -0.07, "high": -0.03}
NOTHING = {"effect": 0.004, "low": -0.01, "high": 0.018}
MEASUREMENT = {"pairs": 10, "disturbed_share": 0.0, "runs": 20, "cpu_s": 4.0, "heat": None,
               "decision": None, "trial": "labels", "why": "", "rundir": "labels/run"}


def planted(decision: Decision) -> str:
    """The label the tables below plant: small callees gain from inlining, large ones lose,
    the ones between do not matter."""
    assert decision.features is not None
    size = decision.features.callee_size
    return "inline" if size <= 20 else "dont_inline" if size > 60 else "default"


def sites_table(bench: str, dump_list, *, unreached: int = 5) -> pd.DataFrame:
    """A labels table as measure-sites writes it: per site the flip alone on the heuristic's
    tree, measured with the planted label's effect; the last ``unreached`` sites not reached;
    one site also removed from a winner, disagreeing (the alone row decides)."""
    import pandas as pd

    from analysis.labels import ID_COLUMNS, OUTCOME_COLUMNS
    rows = []
    decisions = [d for dump in dump_list for d in dump.decisions
                 if d.features is not None and d.action != "specialise"]
    for i, d in enumerate(decisions):
        flip = "dont_inline" if d.action == "inline" else "inline"
        want = planted(d)
        effect = FASTER if want == flip else SLOWER if want == d.action else NOTHING
        status = "not_reached" if i >= len(decisions) - unreached else "measured"
        if status != "measured":
            effect = {"effect": NAN, "low": NAN, "high": NAN}
        base = {"benchmark": bench, "unit": d.unit, "round": d.round, "key": d.key,
                "callee": d.callee, "location": "", "heuristic_action": d.action,
                "heuristic_reason": d.reason, **d.features.row()}
        rows.append({**base, "action": flip, "context": "alone", "status": status,
                     **effect, "speedup": math.exp(effect["effect"]), **MEASUREMENT})
        if i == 0:
            rows.append({**base, "action": d.action, "context": "removed",
                         "status": "measured", **SLOWER, "speedup": math.exp(-0.05),
                         **MEASUREMENT})
    table = pd.DataFrame(rows)
    assert set(ID_COLUMNS + OUTCOME_COLUMNS) <= set(table.columns)  # as measure-sites writes
    return table


# --------------------------------------------------------------------------- synthetic rewards
#
# (tests/test_rewards.py's and tests/test_weak_rewards.py's synthetic searches.)
# One function with six call sites g0..g5; g0's inlined body holds one call h.  Planted log
# speedups: inlining g1 +0.10, g2 -0.08, g4 +0.05; h inlined (only possible under g0) +0.12 and
# g0 itself -0.02 (worth it only with h inlined); g3 and g5 do nothing.

PLANTED = {"g0": -0.02, "g1": 0.10, "g2": -0.08, "g3": 0.0, "g4": 0.05, "g5": 0.0}
H_REWARD = 0.12
D = "D(Main.f@main.ml:1:1-90)"


def synthetic_key(i: int) -> str:
    return f"{D}/C(Main.g{i}@main.ml:{i + 2}:1-9)"


H_KEY = f"{synthetic_key(0)}/I/C(Main.h@main.ml:20:1-9)"


def synthetic_tree(choice: dict[str, bool], h_inline: bool) -> Tree:
    decisions = [Decision(unit="Main", round=0, key=synthetic_key(i), callee=f"Main.g{i}",
                          action="inline" if choice[f"g{i}"] else "dont_inline",
                          reason="override") for i in range(6)]
    if choice["g0"]:
        decisions.append(Decision(unit="Main", round=0, key=H_KEY, callee="Main.h",
                                  action="inline" if h_inline else "dont_inline",
                                  reason="override"))
    return Tree.from_dumps([DecisionDump(unit="Main", round=0, decisions=tuple(decisions))])


def planted_log_speedup(choice: dict[str, bool], h_inline: bool) -> float:
    total = sum(r for g, r in PLANTED.items() if choice[g])
    return total + (H_REWARD if choice["g0"] and h_inline else 0.0)


def synthetic_candidates(n: int = 120, noise: float = 0.005, seed: int = 1) -> Candidates:
    import pandas as pd

    from analysis.extract import Candidates, tree_digest
    rng = random.Random(seed)
    rows, trees = [], {}
    for k in range(n):
        choice = {g: rng.random() < 0.5 for g in PLANTED}
        h_inline = rng.random() < 0.5
        tree = synthetic_tree(choice, h_inline)
        digest = tree_digest(tree)
        trees[digest] = tree
        speedup = math.exp(planted_log_speedup(choice, h_inline) + rng.gauss(0, noise))
        rows.append({"benchmark": "synthetic", "chain": f"chain{k % 3}", "step": k,
                     "candidate": 0, "dir": f"steps/{k}", "tree": digest, "sha256": None,
                     "mutation": "synthetic", "failed": False, "error": None,
                     "speedup": speedup, "ci_low": speedup, "ci_high": speedup, "pairs": 10,
                     "confirmed": False})
    return Candidates("synthetic", pd.DataFrame(rows), trees)


# --------------------------------------------------------------------------- the worker agent

# The agent must run on worker hosts with only python3 >= 3.9: point this at another
# interpreter (e.g. a python3.9) to run the whole suite against it.
AGENT_PYTHON = os.environ.get("WORKER_AGENT_PYTHON", sys.executable)

# A program the agent's tests run: allocates a list of argv[1] ints and prints their sum.
SUM_ML = """
let () =
  let n = int_of_string Sys.argv.(1) in
  let l = List.init n (fun i -> i) in
  print_int (List.fold_left ( + ) 0 l);
  print_newline ()
"""


def put(cache_dir: Path, binary: Path) -> str:
    """Place ``binary`` in an agent's cache under its sha256, as the master sends it."""
    sha = hashlib.sha256(binary.read_bytes()).hexdigest()
    shutil.copyfile(binary, cache_dir / sha)
    os.chmod(cache_dir / sha, 0o755)
    return sha


class AgentProc:
    """A worker agent (the zipapp ``agent``) as a real subprocess, spoken to in JSON lines."""

    def __init__(self, cache_dir: Path, *extra: str, agent: Path, env=None):
        self.proc = subprocess.Popen(
            [AGENT_PYTHON, str(agent), "--cache-dir", str(cache_dir), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.proc.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
        self.next_id = 0

    def send_raw(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line)
        self.proc.stdin.flush()

    def recv(self, timeout: float = 30.0) -> dict:
        if not self.sel.select(timeout):
            raise AssertionError(f"no response from agent within {timeout}s")
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.endswith(b"\n"), f"agent closed stdout (got {line!r})"
        return json.loads(line)

    def request(self, **req) -> dict:
        """Send one request (fields as keywords) and return its response."""
        self.next_id += 1
        req.setdefault("id", self.next_id)
        self.send_raw(json.dumps(req).encode() + b"\n")
        resp = self.recv()
        assert resp["id"] == req["id"]
        return resp

    def close(self) -> None:
        if self.proc.poll() is None:
            try:  # EOF first: the agent then kills any child it is still running
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        self.sel.close()


# ---------------------------------------------------------------------- answering slots

class AnsweringAdapter:
    """A blocking test slot seen as an ``AnsweringSlot``: each start runs the slot's ``run``
    on a thread of its own and answers from there, so the scheduler's thread-less runners
    meet the same scripted losses, probes and gates as its runner threads."""

    def __init__(self, slot: Any):
        self._slot = slot

    def __getattr__(self, name: str) -> Any:  # name, worker_class, cpu, depth, probe, close...
        return getattr(self._slot, name)

    def run(self, job: Any) -> Any:
        return self._slot.run(job)

    def start(self, job: Any, answer: Callable[[Any], None]) -> None:
        import threading

        def go() -> None:
            try:
                outcome = self._slot.run(job)
            except BaseException as exc:  # as run raises it: the scheduler tells them apart
                outcome = exc
            answer(outcome)

        threading.Thread(target=go, daemon=True, name=f"answer {self._slot.name}").start()


def answering_scheduler(scheduler_class: type) -> type:
    """``scheduler_class`` whose slots are given to it as ``AnsweringAdapter``s."""
    class Answering(scheduler_class):  # type: ignore[valid-type, misc]
        def __init__(self, slots: Any, *args: Any, **kwargs: Any) -> None:
            super().__init__([AnsweringAdapter(s) for s in slots], *args, **kwargs)
    return Answering
