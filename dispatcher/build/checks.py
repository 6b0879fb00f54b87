"""A benchmark's health check: build it with decision dumps, run it once, check its output.

What ``check-benchmarks`` runs on every bundled benchmark (or the directories it is given):
it exercises the patched compiler (decision dumps on), the manifest and output validation
without a store, a backend or a search.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from dispatcher.build.driver import build_benchmark
from dispatcher.build.manifest import Benchmark, check_output
from dispatcher.core.decisions import read_dumps

RUN_TIMEOUT_S = 120


@dataclass(frozen=True)
class CheckResult:
    name: str
    split: str
    build_s: float
    decisions: int
    inlined: int
    run_s: float
    output_ok: bool


def check_benchmark(bench: Benchmark, ocamlopt: Path, workdir: Path, size: str) -> CheckResult:
    """Build ``bench`` in ``workdir`` and run it at ``size``.  Raises BuildError,
    ManifestError or subprocess.TimeoutExpired (after RUN_TIMEOUT_S)."""
    t0 = time.monotonic()
    built = build_benchmark(bench, workdir, ocamlopt, dump_decisions=True)
    build_s = time.monotonic() - t0
    dumps = read_dumps(built.decision_files)
    decisions = [d for dump in dumps for d in dump.decisions]
    args = bench.size(size).args
    t0 = time.monotonic()
    proc = subprocess.run([str(built.binary), *args], capture_output=True,
                          timeout=RUN_TIMEOUT_S)
    run_s = time.monotonic() - t0
    ok = proc.returncode == 0 and check_output(bench, size, proc.stdout)
    return CheckResult(bench.name, bench.split, build_s, len(decisions),
                       sum(d.action == "inline" for d in decisions), run_s, ok)
