"""``check-benchmarks``: build benchmarks with the patched compiler and check their output.

Until data generation lands this is the project's main local job: it exercises the compiler
(decision dumps on), the manifests and output validation on every bundled benchmark, or on
benchmark directories given on the command line.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click

from dispatcher.build.driver import BuildError, build_benchmark
from dispatcher.build.manifest import (
    Benchmark,
    ManifestError,
    bundled_benchmarks,
    check_output,
    resolve_benchmark,
)
from dispatcher.build.toolchain import CompilerNotFound, locate_compiler
from dispatcher.core.decisions import read_dumps


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
    t0 = time.monotonic()
    built = build_benchmark(bench, workdir, ocamlopt, dump_decisions=True)
    build_s = time.monotonic() - t0
    dumps = read_dumps(built.decision_files)
    decisions = [d for dump in dumps for d in dump.decisions]
    args = bench.size(size).args
    t0 = time.monotonic()
    proc = subprocess.run([str(built.binary), *args], capture_output=True, timeout=120)
    run_s = time.monotonic() - t0
    ok = proc.returncode == 0 and check_output(bench, size, proc.stdout)
    return CheckResult(bench.name, bench.split, build_s, len(decisions),
                       sum(d.action == "inline" for d in decisions), run_s, ok)


@click.command()
@click.argument("benchmarks", nargs=-1)
@click.option("--size", default="quick", show_default=True, help="Manifest size to run.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="Keep build directories here instead of a temporary directory.")
def main(benchmarks: tuple[str, ...], size: str, keep: Path | None) -> None:
    """Build BENCHMARKS (default: every bundled one) with decision dumps and check output."""
    try:
        benches = [resolve_benchmark(b) for b in benchmarks] or bundled_benchmarks()
        compiler = locate_compiler()
    except (ManifestError, CompilerNotFound) as exc:
        raise click.ClickException(str(exc)) from None
    failed = 0
    with tempfile.TemporaryDirectory(prefix="check-benchmarks-") as tmp:
        root = keep or Path(tmp)
        click.echo(f"{'benchmark':16} {'split':9} {'build s':>8} {'decisions':>9} "
                   f"{'inlined':>8} {'run s':>7}  output")
        for bench in benches:
            try:
                r = check_benchmark(bench, compiler.ocamlopt, root / bench.name, size)
            except (BuildError, ManifestError, subprocess.TimeoutExpired) as exc:
                failed += 1
                click.echo(f"{bench.name:16} error: {str(exc).splitlines()[0]}")
                continue
            failed += not r.output_ok
            click.echo(f"{r.name:16} {r.split:9} {r.build_s:8.2f} {r.decisions:9d} "
                       f"{r.inlined:8d} {r.run_s:7.3f}  {'ok' if r.output_ok else 'WRONG'}")
    if failed:
        click.echo(f"{failed} of {len(benches)} benchmarks failed", err=True)
        sys.exit(1)
