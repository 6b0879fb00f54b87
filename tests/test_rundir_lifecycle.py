"""The rundir's lifecycle and its crash windows (issue 11): one master per rundir, creation
whole or not at all, a lost journal never overwritten, a re-measurement never repeated,
cumulative times, Ctrl-C within two seconds, read-only disks refused in one line."""
from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from dispatcher.build.service import CompileError, CompileService
from dispatcher.core import rundir as rundir_module
from dispatcher.core.files import current_umask
from dispatcher.core.records import Experiment, FinishEvent, RemeasureEvent, StepEvent
from dispatcher.core.rundir import (
    KILL_HOOK_ENV,
    Rundir,
    RundirError,
    lock_holder,
    read_batch_log,
)
from dispatcher.search.chain import Chain
from dispatcher.storage.store import Store
from tests.helpers import REPO, V2, relocated, run_to_end, rundirs_in, snapshot
from tests.helpers import run_training as run
from tests.helpers import search_config as config
from tests.helpers import training_command as command

TINYSUM = REPO / "tests" / "golden" / "tinysum"
ERR = "run_training_experiments: "  # how a refused input starts its one line


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The command failed with exactly one line on stderr (no traceback): that line."""
    assert proc.returncode not in (0, None), proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def tiny_experiment(path: Path, **changes) -> Experiment:
    data = {**json.loads((V2 / "experiment.json").read_text()),
            "benchmark": str(TINYSUM), "rundir": str(path), **changes}
    return Experiment(**data)


# --------------------------------------------------------------------------- the lock

def test_a_second_master_is_refused_with_the_holders_pid(tmp_path):
    """Two masters on one rundir journal the same steps twice: the second is refused."""
    rundir = relocated(V2, tmp_path, keep_steps=2)
    cfg = config(tmp_path, tmp_path / "store")
    held = Rundir.open(rundir)  # this process is the first master
    journal = (rundir / "journal.jsonl").read_bytes()
    try:
        assert lock_holder(rundir) == os.getpid()
        with pytest.raises(RundirError, match=f"in use by another master \\(pid {os.getpid()}\\)"):
            Rundir.open(rundir)
        line = one_line(run(cfg, "--resume", str(rundir)))
        assert line == (f"{ERR}{rundir}: in use by another master (pid {os.getpid()}); wait for "
                        "it to end or stop it before resuming")
    finally:
        held.close()
    assert (rundir / "journal.jsonl").read_bytes() == journal
    assert lock_holder(rundir) is None  # released: the next master may take it
    Rundir.open(rundir).close()


def test_a_reader_probing_the_lock_does_not_turn_a_master_away(tmp_path):
    """lock_holder holds the lock for an instant: a master taking it then waits that out."""
    rundir = relocated(V2, tmp_path, keep_steps=2)
    fd = os.open(rundir / "master.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_SH)  # a reader in the middle of its probe
    threading.Timer(0.3, os.close, [fd]).start()
    Rundir.open(rundir).close()


# --------------------------------------------------------------------------- creation

def test_a_rundir_is_created_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "rundirs" / "r1"

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(rundir_module, "write_text_atomic", full_disk)  # config.yaml
        with pytest.raises(RundirError, match=r"r1: cannot create \(No space left on device\)$"):
            Rundir.create(path, tiny_experiment(path), {"store": "/nowhere"})
    assert list((tmp_path / "rundirs").iterdir()) == []  # no half rundir, no staging dir

    rd = Rundir.create(path, tiny_experiment(path), {"store": "/nowhere"})
    rd.close()
    assert sorted(p.name for p in path.iterdir()) == [
        "config.yaml", "experiment.json", "journal.jsonl", "master.lock"]
    assert [e.event for e in rd.events()] == ["start"]
    assert path.stat().st_mode & 0o777 == 0o777 & ~current_umask()  # as mkdir makes it


def test_a_kill_inside_creation_leaves_no_rundir_and_the_next_creation_sweeps_it(
        compiler, tmp_path):
    """Killed right after journaling ``start`` (still in the staging dir): no rundir, no batch
    log line; the staging dir goes with the next creation there."""
    cfg = config(tmp_path, tmp_path / "store")
    (tmp_path / "tasks.txt").write_text(f"{TINYSUM}\n")
    proc = run(cfg, "--tasks", str(tmp_path / "tasks.txt"), "--steps", "1",
               env={KILL_HOOK_ENV: "start:1"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert rundirs_in(tmp_path) == []
    (staging,) = (tmp_path / "rundirs").iterdir()
    assert staging.name.startswith(".tinysum-") and staging.name.endswith(".creating")
    assert read_batch_log(tmp_path / "batch.log") == []
    path = tmp_path / "rundirs" / "next"
    Rundir.create(path, tiny_experiment(path), {}).close()
    assert [p.name for p in (tmp_path / "rundirs").iterdir()] == ["next"]


def test_the_sweep_takes_only_dead_creations(tmp_path):
    """A ``.creating`` dir is born locked: a free lock is a dead creator's, a held one a live
    creator's; a ``.new`` dir (killed before it took its lock) is left a while."""
    rundirs = tmp_path / "rundirs"
    dead, live, young = (rundirs / ".a.x1.creating", rundirs / ".b.x2.creating",
                         rundirs / ".c.x3.new")
    for d in (dead, live, young):
        d.mkdir(parents=True)
    (dead / "master.lock").write_text("12345\n")
    (dead / "journal.jsonl").write_text("")
    holder = rundir_module.RundirLock(live)
    try:
        path = rundirs / "new"
        Rundir.create(path, tiny_experiment(path), {}).close()
        assert sorted(p.name for p in rundirs.iterdir()) == [".b.x2.creating", ".c.x3.new",
                                                            "new"]
    finally:
        holder.release()


def test_a_rundir_made_but_not_listed_is_listed_by_its_resume(compiler, tmp_path):
    """A kill between the rename and the batch-log line leaves a whole rundir, unlisted."""
    cfg = config(tmp_path, tmp_path / "store")
    path = tmp_path / "rundirs" / "unlisted"
    Rundir.create(path, tiny_experiment(path, steps=1), {}).close()
    proc = run(cfg, "--resume", str(path), env={KILL_HOOK_ENV: "baseline:1"})
    assert proc.returncode == -signal.SIGKILL
    assert f"{path}: not in the batch log {tmp_path / 'batch.log'}" in proc.stderr
    assert [e.rundir for e in read_batch_log(tmp_path / "batch.log")] == [str(path)]


def test_unusable_rundirs_or_batch_log_fail_in_one_line_before_any_rundir(tmp_path):
    (tmp_path / "tasks.txt").write_text(f"{TINYSUM}\n")
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    cases = [({"rundirs": str(a_file)},
              f"{ERR}{a_file}: search.rundirs must be a directory, and this is not one"),
             ({"rundirs": str(a_file / "sub")},
              f"{ERR}{a_file / 'sub'}: search.rundirs: cannot create rundirs there "
              "(Not a directory)"),
             ({"batch_log": str(tmp_path)},
              f"{ERR}{tmp_path}: search.batch_log must be a file, and this is a directory"),
             ({"batch_log": str(a_file / "batch.log")},
              f"{ERR}{a_file / 'batch.log'}: search.batch_log: cannot write ({a_file} is "
              "not a directory)")]
    for search, expected in cases:
        cfg = config(tmp_path, tmp_path / "store", **search)
        assert one_line(run(cfg, "--tasks", str(tmp_path / "tasks.txt"))) == expected
        assert rundirs_in(tmp_path) == []
        assert not (tmp_path / "rundirs").exists() or not any((tmp_path / "rundirs").iterdir())


# --------------------------------------------------------------------------- the journal

def test_a_lost_journal_is_refused_and_the_steps_are_left_as_they_are(tmp_path):
    """Resuming without the journal would start again at step 1 over the collected steps."""
    cfg = config(tmp_path, tmp_path / "store")
    rundir = relocated(V2, tmp_path, keep_steps=2)
    lines = (rundir / "journal.jsonl").read_text().splitlines(keepends=True)
    for damage, expected in [
            (lambda j: j.unlink(), f"{rundir}: has steps (up to steps/00002) but no journal "
                                   "(journal.jsonl missing or empty)"),
            (lambda j: j.write_text(""), "but no journal (journal.jsonl missing or empty)"),
            # start and baseline only: steps 1 and 2 were journaled, then lost
            (lambda j: j.write_text("".join(lines[:2])),
             f"{rundir / 'journal.jsonl'}: ends at step 0 but steps/00002 exists: journal lines "
             "are lost")]:
        damage(rundir / "journal.jsonl")
        before = snapshot(rundir)
        line = one_line(run(cfg, "--resume", str(rundir)))
        assert expected in line and "refusing to resume over collected data" in line
        assert snapshot(rundir) == before  # not a byte written


def test_resume_removes_what_a_killed_atomic_write_left(tmp_path):
    rundir = relocated(V2, tmp_path, keep_steps=2)
    (rundir / "state.jsonab12cd.tmp").write_text("{")
    (rundir / "steps/00002/remeasure/measurements.jsonxyz.tmp").write_text("[")
    (rundir / ".plot.png.k3j2.png.tmp").write_bytes(b"")
    Rundir.open(rundir).close()
    assert not list(rundir.rglob("*.tmp"))


def test_a_chain_whose_rundir_cannot_be_written_fails_in_one_line(tmp_path):
    """A full or read-only disk under a running chain: the chain fails with one line naming
    the journal, instead of its thread dying with a traceback (and the command exiting 0)."""
    rundir = relocated(V2, tmp_path, keep_steps=2)

    class Unwritable(Rundir):
        def append(self, event) -> None:
            raise OSError(errno.EROFS, "Read-only file system")

    chain = Chain.__new__(Chain)
    chain.rundir = Unwritable(rundir)
    chain.status = type("S", (), {"state": "running", "error": None})()

    def explode() -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    chain._run = explode  # type: ignore[method-assign]
    chain.run()
    assert chain.status.state == "failed"
    assert chain.status.error is not None and "\n" not in chain.status.error
    assert chain.status.error.endswith(f"; {rundir / 'journal.jsonl'}: cannot write (Read-only "
                                       "file system)")


# --------------------------------------------------------------------------- crash windows

def sa_config(tmp_path: Path, store: Path) -> Path:
    """SA that accepts nearly everything (so the incumbent is a candidate and is
    re-measured), on the golden two-unit benchmark, one or two pairs per comparison."""
    return config(tmp_path, store, {"max_pairs": 2}, algorithm="sa", seed=3, t_start=5.0,
                  t_end=5.0, remeasure_every=3, baseline_runs=2)


def test_a_kill_between_remeasure_and_step_does_not_measure_twice_and_times_add_up(
        compiler, tmp_path):
    """The journal of a finished run, cut right after its last ``remeasure`` (as a kill before
    the step's line leaves it), resumes to the same steps with that re-measurement once; the
    journal's elapsed_s and busy_s go on from where they were."""
    (tmp_path / "tasks.txt").write_text(f"{TINYSUM}\n")
    cfg = sa_config(tmp_path, tmp_path / "store")  # the resume shares the store: same pairs
    run_to_end(cfg, "--tasks", str(tmp_path / "tasks.txt"), "--steps", "6")
    (whole,) = rundirs_in(tmp_path)
    events = Rundir(whole).events()
    remeasures = [e for e in events if isinstance(e, RemeasureEvent)]
    assert remeasures, "no re-measurement: the incumbent stayed the baseline"
    cut_step = remeasures[-1].step
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    lines = (whole / "journal.jsonl").read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if json.loads(line)["event"] == "remeasure"
              and json.loads(line)["step"] == cut_step)
    (cut / "journal.jsonl").write_text("".join(lines[:at + 1]))
    for d in (cut / "steps").iterdir():
        if int(d.name) > cut_step:
            shutil.rmtree(d)
    (cut / "plot.png").unlink()
    run_to_end(cfg, "--resume", str(cut))

    resumed = Rundir(cut).events()
    assert [(e.step, e.dir) for e in resumed if isinstance(e, RemeasureEvent)] == \
        [(e.step, e.dir) for e in remeasures]  # none twice
    steps = [e for e in resumed if isinstance(e, StepEvent)]
    original = [e for e in events if isinstance(e, StepEvent)]
    assert [(e.step, e.chosen, e.accepted, e.incumbent, e.best) for e in steps] == \
        [(e.step, e.chosen, e.accepted, e.incumbent, e.best) for e in original]
    # Cumulative: the redone step goes on from the last journaled one's figures.
    before = next(e for e in steps if e.step == cut_step - 1)
    redone = next(e for e in steps if e.step == cut_step)
    assert before.elapsed_s is not None and before.busy_s is not None and before.busy_s > 0
    assert redone.elapsed_s is not None and redone.busy_s is not None
    assert redone.elapsed_s > before.elapsed_s and redone.busy_s >= before.busy_s
    assert [e.elapsed_s for e in steps] == sorted(e.elapsed_s or 0.0 for e in steps)
    assert isinstance(resumed[-1], FinishEvent) and resumed[-1].reason == "completed"


SPIN_MAIN = """\
(* Runs as long as the file named by its argument exists: a run as long as a test wants. *)
let () =
  let flag = Sys.argv.(1) in
  let r = ref 0 in
  while Sys.file_exists flag do
    for k = 1 to 200 do r := (!r + Vec.sum_squares (100 + k)) land 0xffffff done
  done;
  print_string (if !r >= 0 then "ok\\n" else "negative\\n")
"""


def spin_benchmark(tmp_path: Path, flag: Path) -> Path:
    bench = tmp_path / "spin"
    bench.mkdir()
    shutil.copyfile(TINYSUM / "vec.ml", bench / "vec.ml")
    (bench / "main.ml").write_text(SPIN_MAIN)
    size = {"args": [str(flag)], "expected_output": {"text": "ok\n"}}
    (bench / "benchmark.yaml").write_text(yaml.safe_dump({
        "name": "spin", "split": "training", "description": "Runs while its flag file exists.",
        "modules": ["vec.ml"], "main": "main.ml", "sizes": {"quick": size, "full": size}}))
    return bench


def processes_with(word: str) -> list[int]:
    """Pids of the processes whose command line holds ``word``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                if word.encode() in (proc / "cmdline").read_bytes():
                    pids.append(int(proc.name))
            except OSError:
                pass
    return pids


def test_ctrl_c_stops_within_two_seconds_and_resume_completes(compiler, tmp_path):
    """One Ctrl-C while a run is in flight: the run is killed rather than waited for, the
    journal says interrupted, the lock is free, one line says how to resume, and it does."""
    flag = tmp_path / "spin.flag"
    flag.write_text("")
    (tmp_path / "tasks.txt").write_text(f"{spin_benchmark(tmp_path, flag)}\n")
    cfg = config(tmp_path, tmp_path / "store", {"max_pairs": 1}, baseline_runs=1)
    proc = subprocess.Popen(command(cfg, "--tasks", str(tmp_path / "tasks.txt"), "--steps", "1"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while not processes_with(str(flag)):  # the baseline's first run is going on
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    time.sleep(0.5)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 130, err
    assert took < 2.5, f"Ctrl-C took {took:.1f}s"
    (rundir,) = rundirs_in(tmp_path)
    hint = f"interrupted; to continue: run_training_experiments --config {cfg} --resume {rundir}"
    assert err.strip().splitlines()[-1] == hint
    last = Rundir(rundir).events()[-1]
    assert isinstance(last, FinishEvent) and last.reason == "interrupted"
    assert lock_holder(rundir) is None
    deadline = time.monotonic() + 2
    while processes_with(str(flag)):  # the agent killed the binary on its way out
        assert time.monotonic() < deadline, "the binary outlived its master"
        time.sleep(0.05)

    flag.unlink()  # from now on each run ends at once
    run_to_end(cfg, "--resume", str(rundir))
    events = Rundir(rundir).events()
    assert [e.step for e in events if isinstance(e, StepEvent)] == [1]
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == "completed"


def test_a_compile_in_flight_at_ctrl_c_stops_at_its_next_unit(compiler, tmp_path):
    """The process's exit waits for a running compile: it must not go on unit after unit."""
    service = CompileService(Store(tmp_path / "store"), compiler)
    service.close(wait=False)
    with pytest.raises(CompileError, match="stopped"):
        service.units.unit({"command": ["ocamlopt", "-c", "main.ml"]}, tmp_path,
                           lambda: pytest.fail("a unit was compiled after the stop"))


# --------------------------------------------------------------------------- read-only disks

def read_only(directory: Path, *argv: str) -> list[str]:
    """``argv`` run with ``directory`` mounted read-only (a bind mount in a private mount
    namespace: as root, file modes do not stop writes)."""
    script = ('mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"')
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script,
            str(directory), *argv]


def can_mount_read_only(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    try:
        proc = subprocess.run(read_only(probe, "sh", "-c", f"! touch {probe}/x"),
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and not (probe / "x").exists()


def test_a_read_only_rundir_rundirs_or_batch_log_fails_in_one_line(tmp_path):
    if shutil.which("unshare") is None or not can_mount_read_only(tmp_path):
        pytest.skip("needs unshare --mount and a bind mount (root in a mount namespace)")
    ro = tmp_path / "ro"
    ro.mkdir()
    rundir = relocated(V2, ro, keep_steps=2)
    (ro / "rundirs").mkdir()
    (tmp_path / "tasks.txt").write_text(f"{TINYSUM}\n")
    before = snapshot(ro)
    cases = [
        ({}, ["--resume", str(rundir)],
         f"{ERR}{rundir}: cannot write in it (Read-only file system)"),
        ({"rundirs": str(ro / "rundirs")}, ["--tasks", str(tmp_path / "tasks.txt")],
         f"{ERR}{ro / 'rundirs'}: search.rundirs: cannot create rundirs there (Read-only "
         "file system)"),
        ({"batch_log": str(ro / "batch.log")}, ["--tasks", str(tmp_path / "tasks.txt")],
         f"{ERR}{ro / 'batch.log'}: search.batch_log: cannot write (Read-only file system)")]
    for search, args, expected in cases:
        cfg = config(tmp_path, tmp_path / "store", **search)
        proc = subprocess.run(read_only(ro, *command(cfg, *args)), cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert one_line(proc) == expected
        assert rundirs_in(tmp_path) == []
    assert snapshot(ro) == before


def test_lock_holder_is_none_for_a_dead_master(tmp_path):
    """The kernel drops the lock of a master that died, however it died."""
    rundir = relocated(V2, tmp_path, keep_steps=2)
    child = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path; from dispatcher.core.rundir import Rundir; "
        f"Rundir.open(Path({str(rundir)!r})); print('locked', flush=True); time.sleep(60)")],
        cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "locked\n"
    assert lock_holder(rundir) == child.pid
    child.kill()
    child.wait()
    assert lock_holder(rundir) is None
    Rundir.open(rundir).close()
