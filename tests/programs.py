"""Small OCaml test programs, compiled with the patched compiler for the agent's tests."""
from __future__ import annotations

import subprocess
from pathlib import Path


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
        log = proc.communicate()[0].decode()
        assert proc.returncode == 0, f"compiling {name}: {log}"
        out[name] = directory / name / "prog.exe"
    return out
