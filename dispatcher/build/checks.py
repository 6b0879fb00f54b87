"""A benchmark's health check: build it with decision dumps, run each size several times,
check every output and how long the runs take.

What ``check-benchmarks`` runs on every bundled benchmark (or the directories it is given):
it exercises the patched compiler (decision dumps on), the manifest and output validation
without a store, a backend or a search.  A size whose median run is under its floor
(``RUN_FLOORS_S``, documented in benchmarks/README.md) is refused: runs that short cannot be
compared in pairs (a binary compared with itself came out 3% "slower" at 10 ms).  The ``tiny``
size is for the exact metric (a run under cachegrind, 50-100 times slower than native), not for
timing: its floor only says the program did some work, and a median over its ceiling
(``RUN_CEILINGS_S``) is reported, not refused, since a loaded machine stretches it.
"""
from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dispatcher.build.driver import build_benchmark
from dispatcher.build.manifest import Benchmark, check_output
from dispatcher.core.decisions import read_dumps

RUN_TIMEOUT_S = 120
#: The shortest median run a size may have, in seconds (sizes not named here have none).
RUN_FLOORS_S = {"tiny": 0.005, "quick": 0.1, "full": 1.0}
#: The longest median run a size should have, in seconds: a tiny run much past 0.1 s natively
#: takes many seconds under cachegrind, which defeats its purpose.  Reported, not refused.
RUN_CEILINGS_S = {"tiny": 0.1}


@dataclass(frozen=True)
class SizeCheck:
    size: str
    median_s: float  # of the runs' wall times
    runs: int
    output_ok: bool  # every run's output matched the manifest

    @property
    def floor_s(self) -> float | None:
        return RUN_FLOORS_S.get(self.size)

    @property
    def too_short(self) -> bool:
        return self.floor_s is not None and self.median_s < self.floor_s

    @property
    def ceiling_s(self) -> float | None:
        return RUN_CEILINGS_S.get(self.size)

    @property
    def too_long(self) -> bool:
        """Over its size's ceiling: worth a warning, not a failure (``ok`` ignores it)."""
        return self.ceiling_s is not None and self.median_s > self.ceiling_s


@dataclass(frozen=True)
class CheckResult:
    name: str
    split: str
    build_s: float
    decisions: int
    inlined: int
    sizes: tuple[SizeCheck, ...]

    @property
    def ok(self) -> bool:
        return all(s.output_ok and not s.too_short for s in self.sizes)


def check_benchmark(bench: Benchmark, ocamlopt: Path, workdir: Path, sizes: Sequence[str],
                    runs: int = 5) -> CheckResult:
    """Build ``bench`` in ``workdir`` and run it ``runs`` times at each of ``sizes``.  Raises
    BuildError, ManifestError or subprocess.TimeoutExpired (a run past RUN_TIMEOUT_S)."""
    for size in sizes:
        bench.size(size)  # an unknown size fails before the build
    t0 = time.monotonic()
    built = build_benchmark(bench, workdir, ocamlopt, dump_decisions=True)
    build_s = time.monotonic() - t0
    dumps = read_dumps(built.decision_files)
    decisions = [d for dump in dumps for d in dump.decisions]
    checked = []
    for size in sizes:
        args = bench.size(size).args
        times, ok = [], True
        for _ in range(runs):
            t0 = time.monotonic()
            proc = subprocess.run([str(built.binary), *args], capture_output=True,
                                  timeout=RUN_TIMEOUT_S)
            times.append(time.monotonic() - t0)
            ok = ok and proc.returncode == 0 and check_output(bench, size, proc.stdout)
            if not ok:
                break
        checked.append(SizeCheck(size, statistics.median(times), len(times), ok))
    return CheckResult(bench.name, bench.split, build_s, len(decisions),
                       sum(d.action == "inline" for d in decisions), tuple(checked))
