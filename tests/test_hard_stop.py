"""The hard stop (issue 36 item 5): a second Ctrl-C still ends with the ``--resume`` line and
exit 130 (not click's "Aborted!", exit 1, which a campaign takes for a failed stage), and the
chains the abort tore down journal nothing: "scheduler stopped during the job (the agent
exited)" is what the abort did to them, not a failure of the search.  A real master on
simulated workers, two SIGINTs: a few seconds."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.helpers import REPO, rundirs_in


def _config(tmp: Path) -> Path:
    data = {"backend": "simulated", "store": str(tmp / "store"),
            "simulated": {"slots": 2, "time_scale": 0.05, "compile_jobs": 2,
                          "cache_dir": str(tmp / "sim-cache"),
                          "model": {"default": {"run_s": 1.0, "compile_s": 0.5}}},
            "scheduler": {"backoff_s": 0.01, "backoff_max_s": 0.05},
            "search": {"rundirs": str(tmp / "rundirs"), "batch_log": str(tmp / "batch.log"),
                       "focus": "uniform"}}
    path = tmp / "sim.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _events(rundir: Path) -> list[dict]:
    lines = (rundir / "journal.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip().endswith("}")]


def test_a_second_ctrl_c_prints_the_resume_line_exits_130_and_journals_no_failure(tmp_path):
    cfg = _config(tmp_path)
    tasks = tmp_path / "tasks"
    tasks.write_text("kahan\nlu\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "commands", "run_training_experiments", "--config", str(cfg),
         "--tasks", str(tasks), "--steps", "40", "--runs", "2", "--max-pairs", "2",
         "--size", "quick"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            rundirs = rundirs_in(tmp_path)
            if len(rundirs) == 2 and all(
                    any(e["event"] == "step" for e in _events(r))
                    for r in rundirs if (r / "journal.jsonl").exists()):
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGINT)  # the graceful stop ...
        time.sleep(0.02)
        os.kill(proc.pid, signal.SIGINT)  # ... and, before it is done, the hard one
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert "Aborted!" not in err and "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    rundirs = sorted(rundirs_in(tmp_path))
    assert last.startswith("interrupted; to continue: run_training_experiments --config "), last
    for r in rundirs:
        assert f"--resume {r}" in last, last
    assert "worker slots busy" not in err  # the hard stop: no report
    for r in rundirs:
        finishes = [e["reason"] for e in _events(r) if e["event"] == "finish"]
        assert all(reason == "interrupted" for reason in finishes), (r, finishes)


def test_the_seal_lasts_for_the_hard_stops_way_out_only(tmp_path):
    """The hard stop seals this process's journals as it raises; a block that then ends
    otherwise than by the exit (a test catching the KeyboardInterrupt) journals again."""
    from dispatcher.core import rundir as rundir_module
    from pipeline.longrun import GracefulStop
    with GracefulStop("stopping") as stop:
        stop.arm()
        os.kill(os.getpid(), signal.SIGINT)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass
        assert rundir_module._sealed.is_set()
        assert stop.hard_stop().resume_line("x", None) == "interrupted before any work started"
    assert not rundir_module._sealed.is_set()
