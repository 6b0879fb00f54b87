"""The ``tiny`` size of every bundled benchmark: the exact metric's size (a run under cachegrind,
50-100 times slower than native), about 10-50 ms natively, the same hot code as ``quick`` on a
smaller problem, its output checked like the other sizes' (benchmarks/README.md)."""
from __future__ import annotations

import shutil

import yaml

from dispatcher.build.checks import (
    RUN_CEILINGS_S,
    RUN_FLOORS_S,
    CheckResult,
    SizeCheck,
    check_benchmark,
)
from dispatcher.build.manifest import BUNDLED_DIR, bundled_benchmarks, load_benchmark

BUNDLED = bundled_benchmarks()


def test_every_bundled_manifest_has_a_tiny_size_with_an_expected_output():
    missing = [b.name for b in BUNDLED if "tiny" not in b.sizes]
    assert not missing, f"no tiny size in: {', '.join(missing)}"
    for b in BUNDLED:
        tiny, quick = b.size("tiny"), b.size("quick")
        assert tiny.args, b.name  # every bundled program takes its size from its arguments
        assert (tiny.expected.text is None) != (tiny.expected.sha256 is None), b.name
        assert tiny.args != quick.args, f"{b.name}: tiny runs the quick size's arguments"


def test_tiny_floor_and_ceiling():
    """A tiny size needs 5 ms (it must do some work) and is reported past 0.1 s (under
    cachegrind it would take many seconds), which does not fail the check."""
    assert RUN_FLOORS_S["tiny"] == 0.005 and RUN_CEILINGS_S["tiny"] == 0.1
    short, fine, long = (SizeCheck("tiny", s, 5, True) for s in (0.002, 0.03, 0.4))
    assert short.too_short and not short.too_long
    assert not fine.too_short and not fine.too_long
    assert long.too_long and not long.too_short
    assert CheckResult("x", "test", 0.1, 0, 0, (long,)).ok
    assert not CheckResult("x", "test", 0.1, 0, 0, (short,)).ok
    assert not SizeCheck("quick", 9.0, 5, True).too_long  # quick and full have no ceiling


def test_a_small_benchmark_builds_and_its_tiny_run_prints_what_the_manifest_expects(
        compiler, tmp_path):
    """tak (one small module, built in about a second) at its tiny size: the output matches and
    the run is over the tiny floor."""
    bench = load_benchmark(BUNDLED_DIR / "tak")
    got = check_benchmark(bench, compiler.ocamlopt, tmp_path / "tak", ["tiny"], runs=3)
    (tiny,) = got.sizes
    assert tiny.output_ok, "tak's tiny output differs from its manifest"
    assert not tiny.too_short, tiny.median_s
    assert got.ok


def test_check_benchmarks_reports_a_tiny_size_over_its_ceiling_without_failing(
        compiler, tmp_path):
    """A tiny size that runs as long as quick is reported, naming the manifest and the
    ceiling; the check still passes (a loaded machine stretches short runs)."""
    from tests.helpers import invoke

    bench = tmp_path / "tak"
    shutil.copytree(BUNDLED_DIR / "tak", bench)
    manifest = yaml.safe_load((bench / "benchmark.yaml").read_text())
    manifest["sizes"]["tiny"] = manifest["sizes"]["quick"]
    (bench / "benchmark.yaml").write_text(yaml.safe_dump(manifest))
    got = invoke("check-benchmarks", "--size", "tiny", "--runs", "1", str(bench))
    assert got.exit_code == 0, got.output
    first = got.stderr.splitlines()[0]
    assert first.startswith(f"{bench / 'benchmark.yaml'}: sizes.tiny: runs "), first
    assert "over the ceiling of 0.1 s for tiny" in first, first
