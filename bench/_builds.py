"""What the exact-metric bench scripts share (``bench/tiny_agreement``,
``bench/metric_agreement``): a benchmark built under a policy or a global setting with the
patched compiler, one run of a binary counted under cachegrind, and rank statistics.

Imported after ``_venv`` (the repository on the path)."""
from __future__ import annotations

import math
import statistics
import subprocess
from collections.abc import Sequence
from pathlib import Path

from dispatcher.build.driver import PolicyChannel, PolicyFile, build_benchmark
from dispatcher.build.manifest import Benchmark
from dispatcher.build.policies import PolicySpec, compiler_policy_file, policy_of_spec
from dispatcher.build.policy_host import PolicyHost
from dispatcher.build.service import compiler_file
from workers.agent import cachegrind
from workers.agent.proc import set_aslr

BUILD_TIMEOUT_S = 300  # the first campaign's build budget
RUN_TIMEOUT_S = 900


def build(bench: Benchmark, build_name: str, outdir: Path, ocamlopt: Path, *,
          flags: Sequence[str] | None = None, timeout: float = BUILD_TIMEOUT_S) -> Path:
    """The benchmark built under ``build_name`` (``heuristic``: no policy at all; a policy
    spec such as ``always-inline``: as the compile service builds a job naming that policy)
    or, given ``flags``, at those flags and no policy (a global setting: ``flags`` in place
    of the manifest's, ``dispatcher.baselines.setting_flags``).  ``timeout`` bounds the whole
    build (BuildError past it)."""
    if flags is not None or build_name == "heuristic":
        return build_benchmark(bench, outdir, ocamlopt, flags=flags, timeout=timeout).binary
    spec = PolicySpec(build_name)
    data = compiler_policy_file(spec)
    if data is not None:  # always-inline: the compiler evaluates the constant file itself
        with compiler_file(data) as path:
            return build_benchmark(bench, outdir, ocamlopt, timeout=timeout,
                                   policy=PolicyFile(path, spec.identity())).binary
    with PolicyHost(policy_of_spec(spec)) as host:
        return build_benchmark(bench, outdir, ocamlopt, timeout=timeout,
                               policy=PolicyChannel(host.base, spec.identity())).binary


def run_counts(valgrind: str, bench: Benchmark, binary: Path, size: str, scratch: Path,
               timeout: float = RUN_TIMEOUT_S) -> dict[str, int]:
    """Cachegrind's counts (``workers.agent.cachegrind.EVENTS``) of one run of ``binary`` at
    ``size``; RuntimeError (one line) if it fails, runs past ``timeout`` or prints the wrong
    output."""
    set_aslr(False)  # this thread and the run it starts
    argv = cachegrind.wrap(valgrind, [str(binary), *bench.size(size).args], str(scratch))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=cachegrind.exact_env({}, {}), cwd=scratch)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise RuntimeError(f"ran past {timeout:g} s under cachegrind") from None
    counts, why = cachegrind.collect(str(scratch), proc.pid)
    if proc.returncode != 0:
        raise RuntimeError(f"exit status {proc.returncode}")
    if not bench.size(size).expected.matches(out):
        raise RuntimeError("wrong output")
    if counts is None:
        raise RuntimeError(why or "no counts")
    return counts


def ranks(xs: Sequence[float]) -> list[float]:
    """Ranks from 1, ties given their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's correlation; None under 3 pairs or when one side is constant."""
    if len(xs) < 3:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxy = sum((a - mx) * (b - my) for a, b in zip(xs, ys))
    sxx = sum((a - mx) ** 2 for a in xs)
    syy = sum((b - my) ** 2 for b in ys)
    return sxy / math.sqrt(sxx * syy) if sxx and syy else None


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks); None under 3 pairs or when one
    side has a single rank."""
    return pearson(ranks(xs), ranks(ys)) if len(xs) >= 3 else None


def sign(r: float) -> int:
    """Of a ratio: +1 above 1, -1 below, 0 at exactly 1."""
    return (r > 1) - (r < 1)
