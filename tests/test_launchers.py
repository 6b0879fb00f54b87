"""scripts/: a launcher per user command, which bootstraps and runs the installed command in
the caller's working directory (the research tool's users typed ./scripts/run-benchmark)."""
from __future__ import annotations

import configparser
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def console_scripts() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return [line.split("=")[0].strip() for line in lines]


def test_every_command_has_a_launcher():
    commands = console_scripts()
    assert "run-benchmark" in commands and "run_training_experiments" in commands
    for name in commands:
        link = REPO / "scripts" / name
        assert link.is_symlink() and os.readlink(link) == "_launch", name
    launchers = {p.name for p in (REPO / "scripts").iterdir() if p.is_symlink()}
    assert launchers == set(commands)  # none left for a command that is gone


def test_a_launcher_runs_the_command_where_it_is_called(tmp_path):
    for name in ("run-benchmark", "batch-log"):
        proc = subprocess.run([str(REPO / "scripts" / name), "--help"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and proc.stdout.startswith(f"Usage: {name} "), proc.stderr
    # a relative path is the caller's, not the repository's
    launcher = [str(REPO / "scripts" / "batch-log"), "mine.log"]
    proc = subprocess.run(launcher, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "mine.log: batch log not found" in proc.stderr, proc.stderr
    (tmp_path / "mine.log").write_text("")
    proc = subprocess.run(launcher, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "best speedup" in proc.stdout, proc.stderr
