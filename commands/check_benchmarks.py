"""``check-benchmarks``: build benchmarks with the patched compiler, run each size several
times and check its output and its run length (``dispatcher.build.checks``), one line each."""
from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click

from commands.common import fail
from dispatcher.build.checks import check_benchmark
from dispatcher.build.driver import BuildError
from dispatcher.build.manifest import ManifestError, bundled_benchmarks, resolve_benchmark
from dispatcher.build.toolchain import CompilerNotFound, locate_compiler


@click.command()
@click.argument("benchmarks", nargs=-1)
@click.option("--size", "sizes", multiple=True, default=("quick",), show_default=True,
              help="Manifest size to run (repeatable: --size quick --size full).")
@click.option("--runs", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Runs of each size; the median is printed and checked against its floor.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="Keep build directories here instead of a temporary directory.")
def check_benchmarks(benchmarks: tuple[str, ...], sizes: tuple[str, ...], runs: int,
                     keep: Path | None) -> None:
    """Build BENCHMARKS (default: every bundled one) with decision dumps, run each size RUNS
    times, check every output and refuse a size whose median run is under its floor
    (tiny 0.005 s, quick 0.1 s, full 1 s: benchmarks/README.md); a tiny size over 0.1 s is
    reported, not refused."""
    try:
        benches = [resolve_benchmark(b) for b in benchmarks] or bundled_benchmarks()
        compiler = locate_compiler()
    except (ManifestError, CompilerNotFound) as exc:
        fail(str(exc))
    failed = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="check-benchmarks-") as tmp:
        root = keep or Path(tmp)
        click.echo(f"{'benchmark':16} {'split':9} {'build s':>8} {'decisions':>9} "
                   f"{'inlined':>8}  " + "  ".join(f"{s + ' s':>9}" for s in sizes)
                   + "  output")
        for bench in benches:
            try:
                r = check_benchmark(bench, compiler.ocamlopt, root / bench.name, sizes, runs)
            except (BuildError, ManifestError, subprocess.TimeoutExpired) as exc:
                failed += 1
                click.echo(f"{bench.name:16} error: {str(exc).splitlines()[0]}")
                continue
            failed += not r.ok
            medians = "  ".join(f"{s.median_s:9.3f}" for s in r.sizes)
            verdict = "ok" if all(s.output_ok for s in r.sizes) else "WRONG"
            click.echo(f"{r.name:16} {r.split:9} {r.build_s:8.2f} {r.decisions:9d} "
                       f"{r.inlined:8d}  {medians}  {verdict}")
            for s in r.sizes:
                if s.output_ok and s.too_short:
                    click.echo(f"{bench.manifest_path}: sizes.{s.size}: runs {s.median_s:.3f} s "
                               f"(median of {s.runs}), under the floor of {s.floor_s:g} s for "
                               f"{s.size} (benchmarks/README.md): give it larger arguments",
                               err=True)
                if s.output_ok and s.too_long:
                    click.echo(f"{bench.manifest_path}: sizes.{s.size}: runs {s.median_s:.3f} s "
                               f"(median of {s.runs}), over the ceiling of {s.ceiling_s:g} s for "
                               f"{s.size} (benchmarks/README.md): consider smaller arguments",
                               err=True)
    if failed:
        click.echo(f"{failed} of {len(benches)} benchmarks failed", err=True)
    click.echo(f"checked {len(benches)} benchmark{'s' if len(benches) != 1 else ''} in "
               f"{time.monotonic() - started:.1f} s", err=True)
    if failed:
        sys.exit(1)


def main() -> None:
    check_benchmarks(prog_name="check-benchmarks")
