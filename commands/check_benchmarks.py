"""``check-benchmarks``: build benchmarks with the patched compiler and check their output
(``dispatcher.build.checks``), one line each."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import click

from dispatcher.build.checks import check_benchmark
from dispatcher.build.driver import BuildError
from dispatcher.build.manifest import ManifestError, bundled_benchmarks, resolve_benchmark
from dispatcher.build.toolchain import CompilerNotFound, locate_compiler


@click.command()
@click.argument("benchmarks", nargs=-1)
@click.option("--size", default="quick", show_default=True, help="Manifest size to run.")
@click.option("--keep", type=click.Path(file_okay=False, path_type=Path),
              help="Keep build directories here instead of a temporary directory.")
def check_benchmarks(benchmarks: tuple[str, ...], size: str, keep: Path | None) -> None:
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


def main() -> None:
    check_benchmarks(prog_name="check-benchmarks")
