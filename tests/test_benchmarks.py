"""The bundled benchmark suite, its manifest format and dispatcher.build.manifest.

Builds every bundled benchmark with the compiler under test and checks its quick run;
checks manifest validation on deliberately broken manifests; and checks that a user's
benchmark directory outside the repo behaves exactly like a bundled one.
"""
from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sexpdata

from dispatcher.build.driver import BuildError, build_benchmark
from dispatcher.build.manifest import (
    BUNDLED_DIR,
    Benchmark,
    ExpectedOutput,
    ManifestError,
    bundled_benchmarks,
    check_output,
    load_benchmark,
    resolve_benchmark,
)
from dispatcher.core.decisions import read_sexp
from tests.helpers import selected_params

BUNDLED = bundled_benchmarks()
RUN_TIMEOUT = 60
MIN_DECISIONS = 20
# Programs of different problems that share code or input (benchmarks/README.md, "The split"):
# each group stays on one side.
NEAR_EACH_OTHER = [("fasta", "knucleotide", "revcomp"), ("bdd", "zdd"), ("sorting", "mergesort"),
                   ("rewrite", "boyer"), ("float_functor", "vector_functor"), ("lu", "crout"),
                   ("printf", "pretty"), ("orbit", "nbody")]


@functools.cache
def _supports_decision_dump(ocamlopt: Path) -> bool:
    proc = subprocess.run([str(ocamlopt), "-help"], capture_output=True, text=True, timeout=60)
    return "-dump-inlining-decisions" in proc.stdout + proc.stderr


def _run(binary: Path, args: tuple[str, ...]) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(binary), *args], capture_output=True, timeout=RUN_TIMEOUT, cwd=binary.parent)


# --------------------------------------------------------------------------- the suite


def test_suite_has_enough_benchmarks_per_split():
    training = bundled_benchmarks("training")
    test = bundled_benchmarks("test")
    assert len(training) >= 20, [b.name for b in training]
    assert len(test) >= 24, [b.name for b in test]
    assert [b.name for b in BUNDLED] == sorted(b.name for b in BUNDLED)
    assert {b.name for b in training} | {b.name for b in test} == {b.name for b in BUNDLED}


def test_check_benchmarks_builds_runs_and_checks_each_one_line(compiler, tmp_path):
    """The ``check-benchmarks`` command (dispatcher.build.checks): a header, then one line
    per benchmark with each size's median run, ``ok`` when its output matches the manifest; a
    wrong one fails the command."""
    import sys
    bench = tmp_path / "kahan"
    bench.mkdir()
    for f in (BUNDLED_DIR / "kahan").iterdir():
        (bench / f.name).write_bytes(f.read_bytes())
    command = [sys.executable, "-m", "commands", "check-benchmarks", "--runs", "2", "kahan",
               str(bench)]
    root = Path(__file__).resolve().parent.parent
    good = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr
    lines = good.stdout.splitlines()
    assert lines[0].split() == ["benchmark", "split", "build", "s", "decisions", "inlined",
                                "quick", "s", "output"]
    assert [line.split()[0] for line in lines[1:]] == ["kahan", "kahan"]
    assert all(line.split()[1] == "training" and line.endswith("  ok") for line in lines[1:])
    assert good.stderr.startswith("checked 2 benchmarks in "), good.stderr
    import yaml
    manifest = yaml.safe_load((bench / "benchmark.yaml").read_text())
    manifest["sizes"]["quick"]["expected_output"] = {"text": "wrong\n"}
    (bench / "benchmark.yaml").write_text(yaml.safe_dump(manifest))
    bad = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 1 and bad.stdout.splitlines()[2].endswith("  WRONG"), bad.stdout
    assert bad.stderr.splitlines()[0] == "1 of 2 benchmarks failed", bad.stderr


def test_check_benchmarks_refuses_a_size_under_its_floor_naming_it(compiler, tmp_path):
    """Issue 21: runs too short to compare in pairs are refused, naming the manifest, the size
    and the floor, even when the output is right."""
    import sys

    import yaml
    bench = tmp_path / "kahan"
    bench.mkdir()
    for f in (BUNDLED_DIR / "kahan").iterdir():
        (bench / f.name).write_bytes(f.read_bytes())
    built = build_benchmark(load_benchmark(bench), tmp_path / "b", compiler.ocamlopt)
    assert built.decision_files == []  # a plain build: no dumps asked, none written
    out = subprocess.run([str(built.binary), "10"], capture_output=True, check=True).stdout
    manifest = yaml.safe_load((bench / "benchmark.yaml").read_text())
    manifest["sizes"]["quick"] = {"args": ["10"], "expected_output": {"text": out.decode()}}
    (bench / "benchmark.yaml").write_text(yaml.safe_dump(manifest))
    root = Path(__file__).resolve().parent.parent
    got = subprocess.run([sys.executable, "-m", "commands", "check-benchmarks", "--runs", "3",
                          str(bench)], cwd=root, capture_output=True, text=True, timeout=300)
    assert got.returncode == 1, got.stdout
    assert got.stdout.splitlines()[1].endswith("  ok"), got.stdout  # the output is right
    first = got.stderr.splitlines()[0]
    assert first.startswith(f"{bench / 'benchmark.yaml'}: sizes.quick: runs "), first
    assert "under the floor of 0.1 s for quick" in first, first


def test_every_bundled_program_names_its_origin():
    """Issue 21: the public problem each program implements, and how it differs."""
    missing = [b.name for b in BUNDLED if b.origin is None]
    assert not missing, missing
    assert all(b.origin and len(b.origin.differs) > 20 for b in BUNDLED)


def test_two_programs_of_one_problem_sit_on_one_side_of_the_split():
    """The split rule (benchmarks/README.md): a test program is never a near-copy of a training
    one, so programs implementing the same problem share a side, and so do the groups the
    README names as near each other (the generated-input family of fasta)."""
    sides: dict[str, set[str]] = {}
    for b in BUNDLED:
        assert b.origin is not None
        sides.setdefault(b.origin.problem.lower(), set()).add(b.split)
    mixed = {problem: s for problem, s in sides.items() if len(s) > 1}
    assert not mixed, mixed
    by_name = {b.name: b.split for b in BUNDLED}
    for group in NEAR_EACH_OTHER:
        assert len({by_name[n] for n in group if n in by_name}) <= 1, group


def test_at_least_half_the_benchmarks_have_several_modules():
    multi = [b for b in BUNDLED if len(b.modules) >= 1]
    assert 2 * len(multi) >= len(BUNDLED)


def test_every_bundled_directory_has_a_manifest():
    dirs = sorted(p.name for p in BUNDLED_DIR.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    assert dirs == [b.name for b in BUNDLED]


@pytest.fixture(scope="module")
def builds(request, compiler, bundled_builds):
    """The session's builds, those this module's parametrized tests need built at once: one
    build per program, with its decision dumps where the compiler writes them (the other test
    files read the same; a dump changes no code, and a plain build's lack of dumps is the
    kahan test's above)."""
    dumps = _supports_decision_dump(compiler.ocamlopt)
    bundled_builds.prefetch({b.name: b for t in (
        "test_bundled_benchmark_builds_and_quick_run_matches",
        "test_bundled_benchmark_has_enough_inlining_decisions")
        for b in selected_params(request, t, "bench")}.values(), dumps=dumps)
    return ModuleBuilds(bundled_builds, dumps)


@dataclass(frozen=True)
class ModuleBuilds:
    """The session's bundled builds, and whether this module's carry their dumps."""
    session: Any  # tests.helpers.BundledBuilds
    dumps: bool

    def get(self, bench: Benchmark) -> Any:
        return self.session.get(bench, dumps=self.dumps)


@pytest.mark.parametrize("bench", BUNDLED, ids=[b.name for b in BUNDLED])
def test_bundled_benchmark_builds_and_quick_run_matches(bench: Benchmark, builds):
    result = builds.get(bench)
    folder = "dumped" if builds.dumps else "plain"
    assert result.binary == builds.session.root / folder / bench.name / f"{bench.name}.exe"
    proc = _run(result.binary, bench.size("quick").args)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert check_output(bench, "quick", proc.stdout), proc.stdout.decode(errors="replace")
    assert proc.stdout.count(b"\n") <= 20  # small output


@pytest.mark.parametrize("bench", BUNDLED, ids=[b.name for b in BUNDLED])
def test_bundled_benchmark_has_enough_inlining_decisions(bench: Benchmark, compiler, builds):
    if not _supports_decision_dump(compiler.ocamlopt):
        pytest.skip(f"{compiler.ocamlopt} has no -dump-inlining-decisions option (stock compiler, not the patched one)")
    result = builds.get(bench)
    assert result.decision_files, "no *.decisions.sexp written"
    count = sum(f.read_text(errors="replace").count("(key ") for f in result.decision_files)
    assert count >= MIN_DECISIONS, f"{bench.name}: only {count} inlining decisions"
    for f in result.decision_files:  # the master's fast reader agrees with the general one
        text = f.read_text()
        assert read_sexp(text) == sexpdata.loads(text), f.name


# --------------------------------------------------------------------------- manifests

GOOD_MANIFEST = """\
name: demo
split: training
description: A tiny two-module program.
modules: [util.ml]
main: main.ml
sizes:
  quick:
    args: ["3"]
    expected_output: {text: "9\\n"}
  full:
    args: ["4"]
    expected_output: {text: "16\\n"}
"""

UTIL_ML = "let square x = x * x\nlet apply f x = f x\n"
MAIN_ML = "let () = print_endline (string_of_int (Util.apply Util.square (int_of_string Sys.argv.(1))))\n"


def _make_bench(root: Path, manifest: str = GOOD_MANIFEST, name: str = "demo", files: dict | None = None) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "benchmark.yaml").write_text(manifest)
    for fname, text in (files if files is not None else {"util.ml": UTIL_ML, "main.ml": MAIN_ML}).items():
        (d / fname).write_text(text)
    return d


def _replace(old: str, new: str) -> str:
    assert old in GOOD_MANIFEST, old
    return GOOD_MANIFEST.replace(old, new)


BAD_MANIFESTS = {
    # kind: (manifest text, field expected in the message)
    "yaml-syntax": (GOOD_MANIFEST + "sizes: [unclosed\n", "line "),
    "not-a-mapping": ("- just\n- a list\n", "(top level)"),
    "unknown-key": (GOOD_MANIFEST + "colour: blue\n", "colour"),
    "missing-main": (_replace("main: main.ml\n", ""), "main"),
    "missing-sizes-full": (GOOD_MANIFEST.split("  full:")[0], "sizes.full"),
    "args-not-list": (_replace('args: ["3"]', "args: 3"), "sizes.quick.args"),
    "args-number": (_replace('args: ["3"]', "args: [3]"), "sizes.quick.args[0]"),
    "name-mismatch": (_replace("name: demo", "name: other"), "name"),
    "bad-name": (_replace("name: demo", "name: Demo!"), "name"),
    "bad-split": (_replace("split: training", "split: validation"), "split"),
    "module-missing": (_replace("[util.ml]", "[util.ml, nowhere.ml]"), "modules[1]"),
    "module-not-ml": (_replace("[util.ml]", "[util.c]"), "modules[0]"),
    "module-parent": (_replace("[util.ml]", "[../x.ml]"), "modules[0]"),
    "module-absolute": (_replace("[util.ml]", "[/etc/passwd]"), "modules[0]"),
    "main-in-subdir": (_replace("main: main.ml", "main: sub/main.ml"), "main"),
    "duplicate-module": (_replace("[util.ml]", "[util.ml, util.ml]"), "modules[1]"),
    "expected-neither": (_replace('{text: "9\\n"}', "{}"), "sizes.quick.expected_output"),
    "expected-both": (
        _replace('{text: "9\\n"}', '{text: "9\\n", sha256: "' + "0" * 64 + '"}'),
        "sizes.quick.expected_output",
    ),
    "bad-sha256": (_replace('{text: "9\\n"}', '{sha256: "abc"}'), "sizes.quick.expected_output.sha256"),
    "flags-not-list": (GOOD_MANIFEST + "flags: -O3\n", "flags"),
    "reserved-flag": (GOOD_MANIFEST + "flags: [-O3, -dump-inlining-decisions]\n", "flags[1]"),
    # An allow-list: -pp would run a command on the master at compile time.
    "preprocessor-flag": (GOOD_MANIFEST + 'flags: [-O3, -pp, "touch X; cat"]\n', "flags[1]"),
    "ppx-flag": (GOOD_MANIFEST + "flags: [-ppx, ./rewriter]\n", "flags[0]"),
    "unknown-flag": (GOOD_MANIFEST + "flags: [-O3, -I, /etc]\n", "flags[1]"),
    "flag-value-not-a-number": (GOOD_MANIFEST + 'flags: [-inline, "$(id)"]\n', "flags[1]"),
    "flag-value-missing": (GOOD_MANIFEST + "flags: [-O3, -inline]\n", "flags[2]"),
    "duplicate-key": (GOOD_MANIFEST + "split: test\n", "line "),
    "empty-file": ("", "(top level)"),
    "description-number": (_replace("description: A tiny two-module program.", "description: 42"), "description"),
}


@pytest.mark.parametrize("kind", sorted(BAD_MANIFESTS))
def test_malformed_manifest_is_rejected_with_file_and_field(kind, tmp_path):
    text, field = BAD_MANIFESTS[kind]
    d = _make_bench(tmp_path, text)
    with pytest.raises(ManifestError) as info:
        load_benchmark(d)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(f"{d / 'benchmark.yaml'}: "), msg
    assert field in msg, msg
    assert info.value.field.startswith(field), msg


def test_missing_manifest_file(tmp_path):
    d = tmp_path / "demo"
    d.mkdir()
    with pytest.raises(ManifestError, match=r"benchmark\.yaml: manifest: file not found"):
        load_benchmark(d)
    with pytest.raises(ManifestError, match="no such file or directory"):
        load_benchmark(tmp_path / "absent")


def test_yaml_error_reports_the_line(tmp_path):
    d = _make_bench(tmp_path, "name: demo\nsplit: [training\n")
    with pytest.raises(ManifestError, match=r": line \d+: expected valid YAML"):
        load_benchmark(d)


def test_args_type_error_message_is_exact(tmp_path):
    d = _make_bench(tmp_path, _replace('args: ["3"]', "args: 3"))
    with pytest.raises(ManifestError) as info:
        load_benchmark(d)
    assert str(info.value) == f"{d / 'benchmark.yaml'}: sizes.quick.args: expected a list of strings, got int"


@pytest.mark.parametrize("bad", ["../x.ml", "/etc/passwd", "..", "sub/../main.ml", ".hidden.ml", "a b.ml", "x.ml\\y"])
def test_module_names_that_are_not_plain_file_names_are_rejected(bad, tmp_path):
    d = _make_bench(tmp_path, _replace("[util.ml]", f"[{json.dumps(bad)}]"))
    with pytest.raises(ManifestError, match=r"modules\[0\]: expected"):
        load_benchmark(d)


def test_symlink_escaping_the_directory_is_rejected(tmp_path):
    outside = tmp_path / "outside.ml"
    outside.write_text(UTIL_ML)
    d = _make_bench(tmp_path, _replace("[util.ml]", "[link.ml]"), files={"main.ml": MAIN_ML})
    (d / "link.ml").symlink_to(outside)
    with pytest.raises(ManifestError, match=r"modules\[0\]: expected a file inside"):
        load_benchmark(d)


def test_unlisted_interface_is_rejected_and_listed_one_accepted(tmp_path):
    files = {"util.ml": UTIL_ML, "util.mli": "val square : int -> int\nval apply : (int -> int) -> int -> int\n",
             "main.ml": MAIN_ML}
    d = _make_bench(tmp_path / "a", files=files)
    with pytest.raises(ManifestError, match=r"modules\[0\]: expected util\.mli to be listed"):
        load_benchmark(d)
    d = _make_bench(tmp_path / "b", _replace("[util.ml]", "[util.ml, util.mli]"), files=files)
    with pytest.raises(ManifestError, match="listed after it"):
        load_benchmark(d)
    d = _make_bench(tmp_path / "c", _replace("[util.ml]", "[util.mli, util.ml]"), files=files)
    assert load_benchmark(d).modules == ("util.mli", "util.ml")


def test_unknown_size_is_a_clear_error(tmp_path):
    bench = load_benchmark(_make_bench(tmp_path))
    with pytest.raises(ManifestError, match=r"sizes\.huge: no such size .*known: quick, full"):
        bench.size("huge")


def test_loading_by_directory_or_manifest_path_is_the_same(tmp_path):
    d = _make_bench(tmp_path)
    a = load_benchmark(d)
    b = load_benchmark(d / "benchmark.yaml")
    c = load_benchmark(str(d) + "/")
    assert a == b == c
    assert a.directory == d and a.directory.is_absolute()
    assert a.flags == ("-O3",)
    assert a.source_files() == [d / "util.ml", d / "main.ml"]
    assert a.size("quick").args == ("3",)


def test_source_hash_is_deterministic_and_tracks_sources_and_flags(tmp_path):
    d = _make_bench(tmp_path)
    h1 = load_benchmark(d).source_hash()
    assert h1 == load_benchmark(d).source_hash()
    assert len(h1) == 64
    # a copy elsewhere hashes the same: nothing depends on where the directory is
    copy = _make_bench(tmp_path / "elsewhere")
    assert load_benchmark(copy).source_hash() == h1
    # the description and sizes do not matter for the build
    (d / "benchmark.yaml").write_text(GOOD_MANIFEST.replace("A tiny", "A small"))
    assert load_benchmark(d).source_hash() == h1
    (d / "util.ml").write_text(UTIL_ML + "\n")
    h2 = load_benchmark(d).source_hash()
    assert h2 != h1
    (d / "benchmark.yaml").write_text(GOOD_MANIFEST + "flags: [-O2]\n")
    assert load_benchmark(d).source_hash() != h2


def test_expected_output_matching_and_json():
    text = ExpectedOutput(text="9\n")
    assert text.matches(b"9\n") and not text.matches(b"9") and not text.matches(b"8\n")
    assert text.to_json() == {"text": "9\n"}
    digest = hashlib.sha256(b"hello\n").hexdigest()
    sha = ExpectedOutput(sha256=digest)
    assert sha.matches(b"hello\n") and not sha.matches(b"hello")
    assert sha.to_json() == {"sha256": digest}
    with pytest.raises(ValueError):
        ExpectedOutput()
    with pytest.raises(ValueError):
        ExpectedOutput(text="a", sha256=digest)


def test_uppercase_sha256_is_normalised(tmp_path):
    digest = hashlib.sha256(b"9\n").hexdigest()
    d = _make_bench(tmp_path, _replace('{text: "9\\n"}', f'{{sha256: "{digest.upper()}"}}'))
    bench = load_benchmark(d)
    assert bench.size("quick").expected.sha256 == digest
    assert check_output(bench, "quick", b"9\n")


# --------------------------------------------------------------------------- lookup


def test_resolve_bundled_name_and_path():
    name = BUNDLED[0].name
    assert resolve_benchmark(name) == BUNDLED[0]
    assert resolve_benchmark(str(BUNDLED_DIR / name)) == BUNDLED[0]


def test_resolve_unknown_name_lists_known_names():
    with pytest.raises(ManifestError) as info:
        resolve_benchmark("no_such_benchmark")
    msg = str(info.value)
    assert "no_such_benchmark" in msg and "unknown benchmark" in msg
    for b in BUNDLED:
        assert b.name in msg
    assert "\n" not in msg


def test_resolve_path_that_does_not_exist(tmp_path):
    with pytest.raises(ManifestError, match="no such file or directory"):
        resolve_benchmark(str(tmp_path / "nope"))


def test_bundled_benchmarks_rejects_unknown_split():
    with pytest.raises(ValueError, match="split"):
        bundled_benchmarks("validation")


# --------------------------------------------------------------------------- user benchmarks


def test_user_benchmark_directory_works_like_a_bundled_one(compiler, tmp_path, monkeypatch):
    d = _make_bench(tmp_path / "mine")
    monkeypatch.chdir(tmp_path)  # resolve by path from somewhere else
    bench = resolve_benchmark(str(d))
    assert bench == load_benchmark(d)
    assert bench.name == "demo" and bench.split == "training"
    result = build_benchmark(bench, tmp_path / "out", compiler.ocamlopt)
    assert result.binary.name == "demo.exe"
    assert {p.name for p in (tmp_path / "out").glob("*.cmx")} == {"util.cmx", "main.cmx"}
    for size in ("quick", "full"):
        proc = _run(result.binary, bench.size(size).args)
        assert proc.returncode == 0
        assert check_output(bench, size, proc.stdout)
    # a wrong output is reported as not matching
    assert not check_output(bench, "quick", b"10\n")
    proc = _run(result.binary, bench.size("full").args)
    assert not check_output(bench, "quick", proc.stdout)
    # sources were copied, not modified in place
    assert sorted(p.name for p in d.iterdir()) == ["benchmark.yaml", "main.ml", "util.ml"]


def test_a_bare_name_is_the_bundled_benchmark_whatever_the_working_directory_holds(
        tmp_path, monkeypatch):
    """A folder named like a bundled benchmark in the working directory must not silently
    replace it; the folder is reached by a path."""
    bundled = BUNDLED[0]
    mine = _make_bench(tmp_path, _replace("name: demo", f"name: {bundled.name}"),
                       name=bundled.name)
    monkeypatch.chdir(tmp_path)
    assert resolve_benchmark(bundled.name) == bundled
    for path in (f"./{bundled.name}", str(mine), f"{bundled.name}/", f"./{bundled.name}/"
                 "benchmark.yaml"):
        assert resolve_benchmark(path).directory == mine, path
    monkeypatch.chdir(mine)  # "." and a bare benchmark.yaml are paths too
    assert resolve_benchmark(".").directory == mine
    assert resolve_benchmark("benchmark.yaml").directory == mine


def test_a_bare_name_of_a_local_folder_only_points_to_its_path(tmp_path, monkeypatch):
    _make_bench(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ManifestError) as err:
        resolve_benchmark("demo")
    assert str(err.value).endswith("; for the directory demo here, write ./demo)")
    assert "\n" not in str(err.value)
    assert resolve_benchmark("./demo").directory == tmp_path / "demo"


def test_flags_override_and_rebuild_in_same_directory(compiler, tmp_path):
    bench = load_benchmark(_make_bench(tmp_path))
    out = tmp_path / "out"
    (out).mkdir()
    (out / "stale.0.decisions.sexp").write_text("(old)")
    result = build_benchmark(bench, out, compiler.ocamlopt, flags=["-O2", "-inline", "10"])
    assert "-O2 -inline 10 -c util.ml" in result.compiler_output
    assert result.decision_files == []
    assert not (out / "stale.0.decisions.sexp").exists()
    result = build_benchmark(bench, out, compiler.ocamlopt)
    assert check_output(bench, "quick", _run(result.binary, ("3",)).stdout)


def test_build_error_names_benchmark_and_file(compiler, tmp_path):
    files = {"util.ml": "let square x = x *. \n", "main.ml": MAIN_ML}
    bench = load_benchmark(_make_bench(tmp_path, files=files))
    with pytest.raises(BuildError) as info:
        build_benchmark(bench, tmp_path / "out", compiler.ocamlopt)
    msg = str(info.value)
    assert "demo" in msg and "util.ml" in msg and "\n" not in msg
    assert "Error" in info.value.output


def test_building_into_the_benchmark_directory_is_refused(compiler, tmp_path):
    d = _make_bench(tmp_path)
    with pytest.raises(ValueError, match="benchmark directory"):
        build_benchmark(load_benchmark(d), d, compiler.ocamlopt)


def test_overrides_and_dump_flags_are_passed_only_when_asked(tmp_path):
    # a fake ocamlopt that records its arguments: checks the command lines without
    # needing the patched compiler
    log = tmp_path / "calls.log"
    fake = tmp_path / "fake-ocamlopt"
    fake.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            echo "$@" >> {log}
            for a in "$@"; do last="$a"; done
            case "$*" in
              *-dump-inlining-decisions*-c*) b="${{last%.ml}}"; echo "(key 1)" > "$b.0.decisions.sexp";;
            esac
            case "$*" in *" -o "*) : > "$last";; esac
            exit 0
            """
        )
    )
    fake.chmod(0o755)
    bench = load_benchmark(_make_bench(tmp_path))
    overrides = tmp_path / "ov.sexp"
    overrides.write_text("()")
    build_benchmark(bench, tmp_path / "plain", fake)
    plain = log.read_text().splitlines()
    assert plain == ["-O3 -c util.ml", "-O3 -c main.ml", "-O3 util.cmx main.cmx -o demo.exe"]
    log.unlink()
    result = build_benchmark(bench, tmp_path / "asked", fake, overrides=overrides, dump_decisions=True)
    calls = log.read_text().splitlines()
    assert calls[0] == f"-O3 -inlining-overrides {overrides} -dump-inlining-decisions -c util.ml"
    assert calls[2] == "-O3 util.cmx main.cmx -o demo.exe"
    assert [p.name for p in result.decision_files] == ["main.0.decisions.sexp", "util.0.decisions.sexp"]


def test_per_unit_overrides_and_a_unit_cache(tmp_path):
    """Overrides as a mapping go to their own unit only; a unit cache is asked for every unit
    under inputs that name the overrides by content and include earlier units' .cmi/.cmx."""
    log = tmp_path / "calls.log"
    fake = tmp_path / "fake-ocamlopt"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {log}
        for a in "$@"; do last="$a"; done
        case "$*" in
          *" -c "*) b="${{last%.ml}}"; echo "$*" > "$b.cmx"; echo i > "$b.cmi"; : > "$b.o";;
          *" -o "*) : > "$last";;
        esac
        """))
    fake.chmod(0o755)
    bench = load_benchmark(_make_bench(tmp_path))
    ov = tmp_path / "main.sexp"
    ov.write_text("(main)")

    class Cache:
        def __init__(self):
            self.stored: dict[str, tuple[dict, str]] = {}
            self.asked: list[dict] = []

        def unit(self, inputs, outdir, compile):
            self.asked.append(inputs)
            key = json.dumps(inputs, sort_keys=True)
            if key in self.stored:
                files, output = self.stored[key]
                for name, data in files.items():
                    (outdir / name).write_text(data)
                return list(files), output, True
            names, output = compile()
            self.stored[key] = ({n: (outdir / n).read_text() for n in names}, output)
            return names, output, False

    cache = Cache()
    first = build_benchmark(bench, tmp_path / "a", fake, overrides={"Main": ov}, unit_cache=cache)
    assert log.read_text().splitlines()[:2] == ["-O3 -c util.ml",
                                                f"-O3 -inlining-overrides {ov} -c main.ml"]
    assert (first.units_compiled, first.units_reused) == (2, 0)
    util, main = cache.asked
    assert util["earlier"] == {} and set(main["earlier"]) == {"util.cmi", "util.cmx"}
    assert "-inlining-overrides" in main["command"] and str(ov) not in main["command"]
    # Same inputs elsewhere: both units reused, only the link runs.
    log.unlink()
    again = build_benchmark(bench, tmp_path / "b", fake, overrides={"Main": ov}, unit_cache=cache)
    assert (again.units_compiled, again.units_reused) == (0, 2)
    assert log.read_text().splitlines() == ["-O3 util.cmx main.cmx -o demo.exe"]
    assert (tmp_path / "b" / "main.cmx").is_file()
    # Main's overrides changed (same path, new content): Main only.
    ov.write_text("(main changed)")
    log.unlink()
    third = build_benchmark(bench, tmp_path / "c", fake, overrides={"Main": ov}, unit_cache=cache)
    assert (third.units_compiled, third.units_reused) == (1, 1)
    assert log.read_text().splitlines()[0] == f"-O3 -inlining-overrides {ov} -c main.ml"


def test_benchmark_is_immutable_and_picklable(tmp_path):
    import pickle

    bench = load_benchmark(_make_bench(tmp_path))
    copy = pickle.loads(pickle.dumps(bench))
    assert copy == bench and hash(copy) == hash(bench)
    assert copy.size("full").expected.to_json() == {"text": "16\n"}
    with pytest.raises(TypeError):
        bench.sizes["huge"] = bench.size("quick")  # type: ignore[index]
    err = pickle.loads(pickle.dumps(ManifestError("/x/benchmark.yaml", "name", "expected a name")))
    assert str(err) == "/x/benchmark.yaml: name: expected a name" and err.field == "name"
    berr = pickle.loads(pickle.dumps(BuildError("demo: compiling util.ml failed", "full output")))
    assert str(berr) == "demo: compiling util.ml failed" and berr.output == "full output"


def test_allowed_flags_with_values_are_accepted(tmp_path):
    d = _make_bench(tmp_path, GOOD_MANIFEST + "flags: [-O3, -inline, '100', -rounds, '2', "
                                              "-inline-max-depth, '1=2,2=3', -unsafe]\n")
    assert load_benchmark(d).flags == ("-O3", "-inline", "100", "-rounds", "2",
                                       "-inline-max-depth", "1=2,2=3", "-unsafe")


def test_a_rejected_flag_names_the_allowed_ones_and_runs_nothing(tmp_path):
    d = _make_bench(tmp_path, GOOD_MANIFEST + 'flags: [-O3, -pp, "touch PWNED; cat"]\n')
    with pytest.raises(ManifestError, match=r"flags\[1\]: expected a code-generation or "
                                            r"inlining option \(one of .*-inline.*\), got '-pp'"):
        load_benchmark(d)
    assert not list(tmp_path.rglob("PWNED"))
