"""scripts/: a launcher per user command, which bootstraps and runs the installed command in
the caller's working directory (the research tool's users typed ./scripts/run-benchmark)."""
from __future__ import annotations

import ast
import configparser
import importlib
import os
import signal
import subprocess
from pathlib import Path

from commands.registry import COMMANDS, entry_point

REPO = Path(__file__).resolve().parent.parent


def imported(module: str):
    """``module``, imported with pytest's Ctrl-C handler kept (commands.entry sets its own)."""
    handler = signal.getsignal(signal.SIGINT)
    try:
        return importlib.import_module(module)
    finally:
        signal.signal(signal.SIGINT, handler)


def console_scripts() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = cfg["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict((part.strip() for part in line.split("=")) for line in lines)


def test_setup_cfg_installs_the_registrys_commands():
    """setup.cfg cannot read the registry: it must name the same commands, each through its
    entry point."""
    assert "run-benchmark" in COMMANDS and "run_training_experiments" in COMMANDS
    assert console_scripts() == {name: f"commands.entry:{entry_point(name)}" for name in COMMANDS}


def test_every_command_has_its_entry_point_and_click_command():
    """Each entry point exists; each registered module defines the click command named and the
    ``main`` the entry point calls (read on the source: importing every command is slow)."""
    entry = imported("commands.entry")
    for name, target in COMMANDS.items():
        assert callable(getattr(entry, entry_point(name))), name
        module, function = target.split(":")
        path = REPO / (module.replace(".", "/") + ".py")
        defined = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef):
                defined.add(node.name)
            elif isinstance(node, ast.Assign):
                defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        assert {function, "main"} <= defined, (name, path)


def test_every_command_has_a_launcher():
    for name in COMMANDS:
        link = REPO / "scripts" / name
        assert link.is_symlink() and os.readlink(link) == "_launch", name
    launchers = {p.name for p in (REPO / "scripts").iterdir() if p.is_symlink()}
    assert launchers == set(COMMANDS)  # none left for a command that is gone


def test_python_m_commands_lists_the_registry():
    from click.testing import CliRunner

    result = CliRunner().invoke(imported("commands.__main__").main, ["--help"])
    assert result.exit_code == 0
    listed = result.output.split("Commands:")[1].split()
    assert set(COMMANDS) <= set(listed)


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
