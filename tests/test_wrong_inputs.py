"""The last wrong inputs of issue 20, each through the command that took it: a crafted policy
pickle (refused unread), Ctrl-C during the imports, unmatched overrides, a corrupt batch log, a deleted
baseline step, a threshold that is not a number, a binary that deletes itself, an output
checked by hash larger than the agent keeps, and Ctrl-C during a comparison."""
from __future__ import annotations

import hashlib
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers import (
    REPO,
    V2,
    cli,
    invoke,
    one_line_error,
    relocated,
    search_config,
    snapshot,
    tiny_search_config,
    write_config,
)


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The command failed with exactly one line on stderr and no traceback."""
    assert proc.returncode not in (0, -2), (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- SECURITY: a crafted .policy runs nothing

class _Touch:
    """Unpickled, runs ``touch PATH``: what a crafted policy file would do."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


@pytest.mark.parametrize("command", ["run-plugin-benchmark", "run-benchmark"])
def test_a_pickled_policy_runs_nothing_and_is_one_line(tmp_path, command):
    """A .policy file is data now: a pickle (an old policy file, or a crafted one) is refused
    in one line without being unpickled."""
    marker = tmp_path / "ran"
    evil = tmp_path / "evil.policy"
    evil.write_bytes(pickle.dumps({"format": "inlining-policy", "version": 1,
                                   "model": _Touch(marker)}))
    config = write_config(tmp_path)
    args = ([str(evil), "kahan"] if command == "run-plugin-benchmark"
            else ["kahan", "--policy", str(evil)])
    line = one_line_error(invoke(command, *args, "--config", str(config), cwd=REPO))
    assert not marker.exists()
    assert line.endswith(f"policy {evil}: a pickled policy from an older version; retrain "
                         "it with train-policy"), line


def test_help_says_a_policy_file_is_data():
    for command in ("run-plugin-benchmark", "run-benchmark"):
        text = " ".join(invoke(command, "--help").stdout.split())
        assert "pickle" not in text and "plain data" in text, text
    readme = " ".join((REPO / "README.md").read_text().lower().split())
    assert "a `.policy` file is a pickle" not in readme and "a `.policy` file is plain data" \
        in readme


# -- TRACEBACK: Ctrl-C while the imports run

def _default_sigint() -> None:
    """In the child: SIGINT as a terminal delivers it.  A suite started in the background of
    a non-interactive shell inherits SIGINT ignored, which Python (and bash) then keep: the
    Ctrl-C under test would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _interrupt_at(command: list[str], delay: float, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _names_project_code(stderr: str) -> bool:
    """Whether a traceback has a frame in the project's own packages (not the console script
    pip writes into the venv, which only imports them)."""
    return any(f'File "{REPO / package}' in stderr
               for package in ("commands", "dispatcher", "analysis", "workers"))


def test_a_ctrl_c_an_import_swallowed_still_ends_the_command(monkeypatch, capsys):
    """A library's bare ``except:`` around an import of its own takes the KeyboardInterrupt
    the guard raised; the command must not then run as if no Ctrl-C came (seen once in a
    clean-clone CI: run-benchmark interrupted 0.3 s in ran to its end and exited 0)."""
    from commands import entry
    monkeypatch.setattr(entry, "_ctrl_c_seen", [])
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as ended:
            with entry.quiet_interrupt("demo"):
                try:  # an import that swallows whatever it raised
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(5)
                except BaseException:  # noqa: BLE001 (what the library does)
                    pass
    finally:
        signal.signal(signal.SIGINT, before)
    assert ended.value.code == 130
    assert capsys.readouterr().err == "demo: interrupted\n"


def test_a_ctrl_c_in_a_weakref_callback_is_one_line(monkeypatch, capsys):
    """The import system releases a module's lock from a weakref callback, and Python prints
    an exception raised there as "Exception ignored ..." with a traceback, then goes on (seen
    once in CI: a Ctrl-C 0.3 s into run_training_experiments).  The guard prints one line."""
    import weakref

    from commands import entry
    monkeypatch.setattr(entry, "_ctrl_c_seen", [])
    # Python's own hook, not pytest's (which keeps what it catches off stderr); the guard's
    # stays set after it ends the command, and monkeypatch puts pytest's back
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    before = signal.getsignal(signal.SIGINT)

    class Lock:
        pass
    try:
        with pytest.raises(SystemExit) as ended:
            with entry.quiet_interrupt("demo"):
                lock = Lock()
                kept = weakref.ref(lock, lambda _: entry._raise_interrupt(signal.SIGINT, None))
                del lock  # the callback runs here, and its KeyboardInterrupt is unraisable
                assert kept() is None
    finally:
        signal.signal(signal.SIGINT, before)
    assert ended.value.code == 130
    assert capsys.readouterr().err == "demo: interrupted\n"


@pytest.mark.parametrize("delay", [0.1, 0.15, 0.3])
def test_ctrl_c_during_the_imports_is_one_line_and_not_lost(tmp_path, delay):
    """Through the installed command, its launcher in scripts/ (where a Ctrl-C during
    bootstrap was lost: the run went on and exited 0) and run_training_experiments: exit 130
    with one line while the imports run (or click's "Aborted!" once the command runs on a
    fast machine), never a traceback, never a run that ends as if nothing happened.  (A
    Ctrl-C while the interpreter itself starts, before any code of the project's runs, is
    Python's: not tested.)"""
    config = write_config(tmp_path)
    (tmp_path / "tasks").write_text("kahan\n")
    bin_dir = Path(sys.executable).parent
    for command in ([str(bin_dir / "run-benchmark"), "kahan", "--config", str(config),
                     "--remeasure"],
                    [str(REPO / "scripts" / "run-benchmark"), "kahan", "--config",
                     str(config), "--remeasure"],
                    [str(bin_dir / "run_training_experiments"), "--config", str(config),
                     "--tasks", "tasks", "--steps", "1"]):
        for attempt in range(10):
            # the interpreter's own start (site, .pth files), before any code of ours, can
            # outlast the delay on a loaded machine: that try says nothing of the commands,
            # so try again a little later each time
            got = _interrupt_at(command, delay + 0.05 * attempt, tmp_path)
            # (and a launcher killed before its first line set its trap: bash's own start; or
            # an interrupt while the import system still looks for the package, whose
            # traceback names no file of the project's: only pip's generated wrapper)
            if "init_import_site" not in got.stderr and not (
                    got.returncode == -signal.SIGINT and got.stderr == "") and not (
                    "Traceback" in got.stderr and not _names_project_code(got.stderr)):
                break
        assert got.returncode in (130, 1), (command, got.returncode, got.stderr)
        assert "Traceback" not in got.stderr, got.stderr
        if "interrupted; to continue: run_training_experiments" in got.stderr:
            continue  # on a quiet machine the search had started: its own Ctrl-C, exit 130
        line = one_line(got)
        if line == "interrupted before any work started":  # the search's own Ctrl-C, before
            assert got.returncode == 130  # its first rundir: nothing to continue
            continue
        assert line.endswith(": interrupted") or line == "Aborted!", (command, line)


# -- SILENT / MISLEADING: a batch log whose only line is corrupt

@pytest.mark.parametrize("text", ["{garbage\n", "{garbage"])
@pytest.mark.parametrize("command", ["batch-log", "assign-rewards"])
def test_a_batch_log_whose_only_line_is_corrupt_is_one_line(tmp_path, command, text):
    """Not an empty table or "lists no experiment": the line is corrupt, named by file and
    line.  (A torn tail, the start of a line an interrupted append left, is still ignored.)"""
    log = tmp_path / "batch.log"
    log.write_text(text)
    args = [str(log)] if command == "batch-log" else ["--batch-log", str(log)]
    line = one_line_error(invoke(command, *args, cwd=tmp_path))
    assert line == f"{command}: {log}:1: corrupt line (batch log)"
    log.write_text('{"rundir": "x", "ta')
    torn = invoke("batch-log", str(log), cwd=tmp_path)
    assert torn.exit_code == 0 and torn.stderr == ""


# -- SILENT: train-policy --threshold nan

@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_threshold_that_is_not_a_finite_number_is_refused(tmp_path, value):
    result = invoke("train-policy", "--threshold", value, "--rewards", str(tmp_path),
                    cwd=tmp_path)
    assert result.exit_code == 2 and "Traceback" not in result.stderr
    assert f"Invalid value for '--threshold': '{value}' is not a finite number." in result.stderr


# -- REGRESSION: an output checked by sha256 is hashed as it streams, whatever its size

def _printer(root: Path, name: str, main: str, expected: dict) -> Path:
    d = root / name
    d.mkdir()
    (d / "main.ml").write_text(main)
    (d / "benchmark.yaml").write_text(yaml.safe_dump({
        "name": name, "split": "training", "description": "test program", "modules": [],
        "main": "main.ml",
        "sizes": {size: {"args": ["360000"], "expected_output": expected}
                  for size in ("quick", "full")}}))
    return d


_LINE = "x" * 99


def test_an_output_over_the_capture_cap_checked_by_sha256_runs(tmp_path):
    """36 MB printed, checked by sha256: every run counts (the cap is for what the agent
    keeps, and a hashed output is not kept); a wrong hash is still a wrong output."""
    digest = hashlib.sha256(f"{_LINE}\n".encode() * 360000).hexdigest()
    main = ('let () = let n = int_of_string Sys.argv.(1) in\n'
            f'  for _ = 1 to n do print_string "{_LINE}\\n" done\n')
    bench = _printer(tmp_path, "loud", main, {"sha256": digest})
    config = write_config(tmp_path)
    proc = cli("run-benchmark", str(bench), "--config", str(config), "--runs", "2")
    assert proc.returncode == 0, proc.stderr  # (runs of a busy CPU are disturbed, not failed)
    assert " 0 failed" in proc.stderr and "failed run" not in proc.stderr, proc.stderr
    wrong = _printer(tmp_path, "wrong", main, {"sha256": "0" * 64})
    proc = cli("run-benchmark", str(wrong), "--config", str(config), "--runs", "1")
    assert proc.returncode == 1 and "failed run: wrong output (sha256 " in proc.stderr, \
        proc.stderr


# -- MISLEADING: a benchmark that deletes its own binary

def test_a_binary_that_deletes_itself_is_reported_gone(tmp_path):
    main = 'let () = Sys.remove Sys.executable_name; print_string "ok\\n"\n'
    bench = _printer(tmp_path, "selfdelete", main, {"text": "ok\n"})
    config = write_config(tmp_path)
    proc = cli("run-benchmark", str(bench), "--config", str(config), "--runs", "3")
    assert proc.returncode == 1, proc.stderr
    assert "failed run: the binary is gone: " in proc.stderr, proc.stderr
    assert "exit status 127" not in proc.stderr


# -- SILENT: overrides that reach nothing, or not the code that runs

def _copied(root: Path) -> Path:
    """A.f calls A.g; Main inlines A.f, so A's call to g has a copy in Main."""
    d = root / "copy"
    d.mkdir()
    (d / "a.ml").write_text("let g x = x * 3 + 1\nlet f x = g x + 2\n")
    (d / "main.ml").write_text(
        "let () = print_int (A.f (int_of_string Sys.argv.(1))); print_newline ()\n")
    (d / "benchmark.yaml").write_text(yaml.safe_dump({
        "name": "copy", "split": "training", "description": "test program",
        "modules": ["a.ml"], "main": "main.ml",
        "sizes": {s: {"args": ["5"], "expected_output": {"text": "18\n"}}
                  for s in ("quick", "full")}}))
    return d


_KEPT_IN_A = "D(A.f@a.ml:2:6-17)/C(A.g@a.ml:2:10-13)"


def _unreaching() -> list:
    from dispatcher.core.decisions import Override
    return [Override("Main", 0, "C(Main.nothing@main.ml:1:1-2)", "inline"),
            *(Override("A", r, _KEPT_IN_A, "dont_inline") for r in (0, 1, 2))]


def _reach_line(stderr: str, source: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith(f"warning: {source}: ")]
    assert line.count("matched no call site") == 1
    assert ("1 override(s) matched no call site (first: Main round 0 "
            "C(Main.nothing@main.ml:1:1-2))") in line
    assert ("3 overridden site(s) whose code was inlined into another unit and decided again "
            f"there (first: A round 0 {_KEPT_IN_A} (dont_inline): inline in Main round 0") in line
    return line


def test_run_benchmark_says_which_overrides_reached_nothing(tmp_path):
    from dispatcher.core.decisions import write_overrides
    bench = _copied(tmp_path)
    ov = write_overrides(tmp_path / "ov.sexp", _unreaching())
    config = write_config(tmp_path)
    proc = cli("run-benchmark", str(bench), str(ov), "--config", str(config), "--runs", "1",
               "--no-compare")
    assert proc.returncode == 0, proc.stderr
    _reach_line(proc.stderr, str(ov))
    fine = write_overrides(tmp_path / "fine.sexp", _unreaching()[1:2])  # round 0 only:
    proc = cli("run-benchmark", str(bench), str(fine), "--config", str(config), "--runs", "1",
               "--no-compare")  # A decides again in round 1, in A: not reported
    assert proc.returncode == 0 and "warning: " + str(fine) not in proc.stderr, proc.stderr


def test_run_all_benchmarks_says_which_overrides_reached_nothing(tmp_path):
    import json

    from dispatcher.core.decisions import write_overrides
    bench = _copied(tmp_path)
    tree = tmp_path / "rewards" / "copy" / "ridge" / "gamma0.8-alpha0.01-log"
    tree.mkdir(parents=True)
    write_overrides(tree / "optimal.sexp", _unreaching())
    (tmp_path / "rewards" / "copy" / "sources.json").write_text(json.dumps(
        {"benchmark": "copy", "rundirs": ["/runs/r1"], "directory": str(bench)}))
    proc = cli("run-all-benchmarks", "ridge", "--config", str(tiny_search_config(tmp_path)),
               "--runs", "2", "--max-pairs", "2", cwd=tmp_path)
    assert "Traceback" not in proc.stderr and proc.returncode in (0, 1), proc.stderr
    _reach_line(proc.stderr, "rewards/copy/ridge/gamma0.8-alpha0.01-log/optimal.sexp")


# -- SILENT: a resume after the baseline step's directory was deleted

def test_a_resume_without_a_step_the_journal_lists_is_refused(tmp_path):
    import shutil

    cfg = search_config(tmp_path, tmp_path / "store")
    rundir = relocated(V2, tmp_path, keep_steps=2)
    for step, whose in ((0, "the baseline's"), (1, "step 1's")):
        kept = tmp_path / f"kept{step}"
        shutil.move(rundir / "steps" / f"{step:05d}", kept)
        before = snapshot(rundir)
        line = one_line_error(invoke("run_training_experiments", "--config", str(cfg),
                                     "--resume", str(rundir), cwd=REPO))
        assert f"{rundir}: steps/{step:05d}/c0 is gone ({whose} data, which the journal " \
               "lists); refusing to resume without it" in line, line
        assert snapshot(rundir) == before  # not a byte written
        shutil.move(kept, rundir / "steps" / f"{step:05d}")
