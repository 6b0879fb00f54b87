"""Benchmark programs: manifests, lookup, building and output checking.

A benchmark is a directory holding OCaml sources and a ``benchmark.yaml`` manifest (format:
``benchmarks/README.md``). Bundled benchmarks live in ``<repo>/benchmarks``; a user's
directory anywhere on disk is loaded and built by exactly the same code, so nothing here
special-cases the bundled ones.

Manifests are validated strictly, because a silently misread manifest (a number where a
string was meant, a misspelt key, a module path pointing outside the directory) would
produce timings for the wrong program. Every problem is a one-line ``ManifestError``
naming the file and the field.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dispatcher.core.validation import KeyPathError, Reader, load_strict

REPO_ROOT = Path(__file__).resolve().parents[2]
BUNDLED_DIR = REPO_ROOT / "benchmarks"
MANIFEST_NAME = "benchmark.yaml"

SPLITS = ("training", "test")
REQUIRED_SIZES = ("quick", "full")
DEFAULT_FLAGS = ("-O3",)

#: Options that build_benchmark manages itself; a manifest may not set them.
RESERVED_FLAGS = ("-o", "-c", "-inlining-overrides", "-dump-inlining-decisions",
                  "-inlining-policy-channel", "-inlining-policy-timeout")

#: The compiler options a manifest may give: code generation and Flambda's inlining knobs,
#: nothing that runs a program (-pp, -ppx), reads or writes other files, or loads code.  An
#: allow-list: a manifest comes from a user's directory and its flags reach ocamlopt.
ALLOWED_FLAGS = frozenset((
    "-O2", "-O3", "-Oclassic", "-unsafe", "-g", "-nodynlink", "-function-sections",
    "-remove-unused-arguments", "-no-float-const-prop", "-unbox-closures",
    "-no-unbox-free-vars-of-closures", "-no-unbox-specialised-args", "-no-insn-sched",
))
#: Options that take one argument, a number or Flambda's per-round list ("1=10,2=20").
ALLOWED_VALUE_FLAGS = frozenset((
    "-inline", "-inline-toplevel", "-inline-call-cost", "-inline-alloc-cost",
    "-inline-prim-cost", "-inline-branch-cost", "-inline-indirect-cost",
    "-inline-lifting-benefit", "-inline-branch-factor", "-inline-max-depth",
    "-inline-max-unroll", "-rounds", "-unbox-closures-factor",
))
FLAG_VALUE_RE = re.compile(r"^(?:[0-9]+(?:\.[0-9]+)?|[0-9]+=[0-9]+(?:\.[0-9]+)?"
                           r"(?:,[0-9]+=[0-9]+(?:\.[0-9]+)?)*)$")

NAME_RE = re.compile(r"^[a-z0-9_-]+$")
SIZE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
SOURCE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.mli?$")
SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")

_TOP_KEYS = ("name", "split", "description", "origin", "modules", "main", "flags", "sizes")
_ORIGIN_KEYS = ("suite", "problem", "differs")
_TOP_REQUIRED = ("name", "split", "description", "main", "sizes")
_SIZE_KEYS = ("args", "expected_output")
_EXPECTED_KEYS = ("text", "sha256")

# Bump when the meaning of source_hash changes, so old cache keys are never reused.
_HASH_VERSION = "benchmark-source-v1"


class _FrozenDict(dict):
    """A read-only dict: keeps a frozen Benchmark immutable yet picklable (unlike
    MappingProxyType), so benchmarks can be sent to worker processes."""

    def _readonly(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("benchmark sizes are read-only")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _readonly  # type: ignore[assignment]
    __ior__ = _readonly  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return (_FrozenDict, (dict(self),))


class ManifestError(ValueError):
    """A benchmark manifest (or a name meant to find one) is unusable.

    The message is one line, ``"<file>: <field>: <what was expected>"``, so it can be shown
    as-is in logs and CLI errors.
    """

    def __init__(self, file: Path | str, field: str, expected: str) -> None:
        self.file = str(file)
        self.field = field
        self.expected = " ".join(str(expected).split())
        super().__init__(f"{self.file}: {self.field}: {self.expected}")

    def __reduce__(self) -> tuple:  # picklable across worker processes
        return (type(self), (self.file, self.field, self.expected))


@dataclass(frozen=True)
class ExpectedOutput:
    """What a run must print, either literally or as a sha256 of stdout.

    Exactly one of ``text`` and ``sha256`` is set; ``sha256`` is lowercase hex.
    """

    text: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.sha256 is None):
            raise ValueError("ExpectedOutput needs exactly one of text and sha256")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError(f"ExpectedOutput.sha256: not 64 lowercase hex digits: {self.sha256!r}")

    def matches(self, stdout: bytes) -> bool:
        """True when ``stdout`` is exactly the expected output (byte for byte)."""
        if self.text is not None:
            return stdout == self.text.encode("utf-8")
        return hashlib.sha256(stdout).hexdigest() == self.sha256

    def to_json(self) -> dict[str, str]:
        """A plain dict (``{"text": ...}`` or ``{"sha256": ...}``) a stdlib-only worker can
        check."""
        if self.text is not None:
            return {"text": self.text}
        assert self.sha256 is not None
        return {"sha256": self.sha256}


@dataclass(frozen=True)
class Size:
    """One problem size: command-line arguments and the output they must produce."""

    name: str
    args: tuple[str, ...]
    expected: ExpectedOutput


@dataclass(frozen=True)
class Unit:
    """One file compiled by one ``ocamlopt -c``: an interface (``.mli``) or an implementation."""

    source: str  # file name in the benchmark directory, e.g. "series.ml"

    @property
    def module(self) -> str:
        """The compilation unit's name, as overrides and dumps spell it: series.ml -> Series."""
        stem = self.source.rsplit(".", 1)[0]
        return stem[:1].upper() + stem[1:]  # OCaml's String.capitalize_ascii

    @property
    def is_impl(self) -> bool:
        return self.source.endswith(".ml")


@dataclass(frozen=True)
class Origin:
    """The public benchmark problem a program implements (its code is this project's own):
    the suite and the problem's name there, and how this version differs."""

    suite: str
    problem: str
    differs: str


@dataclass(frozen=True)
class Benchmark:
    """A loaded, validated benchmark; ``directory`` is absolute."""

    name: str
    split: str
    directory: Path
    description: str
    modules: tuple[str, ...]
    main: str
    flags: tuple[str, ...]
    sizes: Mapping[str, Size] = field(hash=False)
    origin: Origin | None = None  # optional for a user's benchmark; every bundled one has it

    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST_NAME

    def source_files(self) -> list[Path]:
        """The sources in compilation order: modules, then main."""
        return [self.directory / f for f in (*self.modules, self.main)]

    def units(self) -> tuple[Unit, ...]:
        """The compilation units in compilation order (the manifest's): modules, then main."""
        return tuple(Unit(f) for f in (*self.modules, self.main))

    def source_hash(self) -> str:
        """sha256 identifying everything that determines the build output.

        Covers the name (it names the binary), modules, main, the manifest's flags and every
        source file's name and contents; not the description or sizes, which do not change
        the binary. Deterministic across machines and runs.
        """
        h = hashlib.sha256()
        header = {
            "version": _HASH_VERSION,
            "name": self.name,
            "modules": list(self.modules),
            "main": self.main,
            "flags": list(self.flags),
        }
        h.update(json.dumps(header, sort_keys=True).encode("utf-8"))
        for path in self.source_files():
            data = path.read_bytes()
            h.update(b"\0file\0" + path.name.encode("utf-8") + b"\0")
            h.update(str(len(data)).encode("ascii") + b"\0")
            h.update(data)
        return h.hexdigest()

    def size(self, name: str) -> Size:
        """The size called ``name``; a ManifestError listing the known sizes otherwise."""
        try:
            return self.sizes[name]
        except KeyError:
            known = ", ".join(self.sizes)
            raise ManifestError(
                self.manifest_path, f"sizes.{name}",
                f"no such size in benchmark {self.name} (known: {known})"
            ) from None

    def binary_name(self) -> str:
        """File name of the linked executable inside a build directory: ``<name>.exe``."""
        return f"{self.name}.exe"


# --------------------------------------------------------------------------- loading


def _read_manifest(file: Path) -> Any:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ManifestError(file, "manifest", "file not found (expected a benchmark directory "
                            "containing benchmark.yaml)") from None
    except UnicodeDecodeError as e:
        raise ManifestError(file, "manifest",
                            f"expected UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise ManifestError(file, "manifest", f"cannot read ({e.strerror or e})") from None
    try:
        return load_strict(text)
    except KeyPathError as e:
        if e.duplicate:  # worded as before the strict loader was shared with configs
            raise ManifestError(file, f"line {e.line}",
                                f"expected valid YAML (found duplicate key {e.value!r})") from None
        raise ManifestError(file, e.key, e.message) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "yaml"
        problem = getattr(e, "problem", None) or str(e)
        raise ManifestError(file, where, f"expected valid YAML ({problem})") from None


def _check_source_name(c: Reader, directory: Path, value: Any, field_name: str, *,
                       main: bool) -> str:
    name = c.string(value, field_name)
    if "/" in name or "\\" in name or name.startswith("."):
        raise c.fail(field_name, "a plain file name in the benchmark directory", name)
    if not SOURCE_RE.fullmatch(name):
        raise c.fail(field_name, f"a file name matching {SOURCE_RE.pattern}", name)
    if main and not name.endswith(".ml"):
        raise c.fail(field_name, "an .ml file", name)
    path = directory / name
    real_dir = directory.resolve()
    try:
        real = path.resolve(strict=True)
    except (FileNotFoundError, RuntimeError):
        raise c.error(field_name, f"expected an existing file, {path} does not exist") from None
    if real.parent != real_dir:
        raise c.error(field_name, f"expected a file inside {directory}, {name} resolves to {real}")
    if not real.is_file():
        raise c.error(field_name, f"expected a regular file, {path} is not one")
    return name


def _unit_name(file_name: str) -> str:
    """The OCaml module name of a source file (foo.ml -> Foo), case-folded for comparison.

    Case-folded because Foo.ml and foo.ml collide on case-insensitive file systems.
    """
    return file_name.rsplit(".", 1)[0].lower()


def _check_flags(c: Reader, flags: Sequence[str]) -> None:
    """Only allow-listed options, each value-taking one followed by a plain value."""
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in RESERVED_FLAGS:
            raise c.error(f"flags[{i}]", f"expected a compiler flag other than {flag} "
                         "(build_benchmark sets it)")
        if flag in ALLOWED_VALUE_FLAGS and i + 1 < len(flags) and \
                FLAG_VALUE_RE.match(flags[i + 1]):
            i += 2
            continue
        if flag in ALLOWED_VALUE_FLAGS:
            got = repr(flags[i + 1]) if i + 1 < len(flags) else "nothing"
            raise c.error(f"flags[{i + 1}]", f"expected a number (or round=number,...) after "
                         f"{flag}, got {got}")
        if flag not in ALLOWED_FLAGS:
            raise c.error(f"flags[{i}]", f"expected a code-generation or inlining option "
                         f"(one of {', '.join(sorted(ALLOWED_FLAGS | ALLOWED_VALUE_FLAGS))}), "
                         f"got {flag!r}")
        i += 1


def _check_sources(c: Reader, directory: Path, modules_raw: Any,
                   main_raw: Any) -> tuple[tuple[str, ...], str]:
    if not isinstance(modules_raw, list):
        raise c.fail_kind("modules", "a list of file names", modules_raw)
    modules = tuple(
        _check_source_name(c, directory, m, f"modules[{i}]", main=False)
        for i, m in enumerate(modules_raw)
    )
    main = _check_source_name(c, directory, main_raw, "main", main=True)
    seen_files: dict[str, str] = {}
    seen_units: dict[tuple[str, str], str] = {}
    for i, name in enumerate((*modules, main)):
        fname = "main" if i == len(modules) else f"modules[{i}]"
        if name in seen_files:
            raise c.error(fname, f"expected each file once, {name} is also {seen_files[name]}")
        seen_files[name] = fname
        key = (_unit_name(name), name.rsplit(".", 1)[1])
        if key in seen_units:
            raise c.error(fname, f"expected distinct module names, {name} and "
                         f"{seen_units[key]} name the same module")
        seen_units[key] = name
        if name.endswith(".ml"):
            mli = name + "i"
            if (directory / mli).exists() and mli not in seen_files:
                where = "listed after it" if mli in (*modules, main) else "not listed"
                raise c.error(fname, f"expected {mli} to be listed in modules before {name} "
                             f"({mli} exists but is {where})")
    return modules, main


def _check_expected(c: Reader, value: Any, field_name: str) -> ExpectedOutput:
    d = c.mapping(value, field_name, _EXPECTED_KEYS, ())
    if ("text" in d) == ("sha256" in d):
        raise c.error(field_name, "expected exactly one of text and sha256")
    if "text" in d:
        return ExpectedOutput(text=c.string(d["text"], f"{field_name}.text", nonempty=False))
    sha = c.string(d["sha256"], f"{field_name}.sha256")
    if not SHA256_RE.fullmatch(sha):
        raise c.fail(f"{field_name}.sha256", "64 hex digits", sha)
    return ExpectedOutput(sha256=sha.lower())


def _check_sizes(c: Reader, value: Any) -> Mapping[str, Size]:
    if not isinstance(value, dict):
        raise c.fail_kind("sizes", "a mapping of size names", value)
    sizes: dict[str, Size] = {}
    for name, spec in value.items():
        if not isinstance(name, str) or not SIZE_NAME_RE.fullmatch(name):
            raise c.error(f"sizes.{name}", f"expected a size name matching {SIZE_NAME_RE.pattern}")
        f = f"sizes.{name}"
        d = c.mapping(spec, f, _SIZE_KEYS, _SIZE_KEYS)
        args = c.string_list(d["args"], f"{f}.args")
        expected = _check_expected(c, d["expected_output"], f"{f}.expected_output")
        sizes[name] = Size(name=name, args=args, expected=expected)
    for required in REQUIRED_SIZES:
        if required not in sizes:
            raise c.error(f"sizes.{required}", "missing required size")
    return _FrozenDict(sizes)


def load_benchmark(path: Path | str) -> Benchmark:
    """Load and validate the benchmark in ``path`` (a directory, or its benchmark.yaml)."""
    p = Path(os.path.abspath(path))
    if p.is_dir():
        directory, file = p, p / MANIFEST_NAME
    elif p.name == MANIFEST_NAME:
        directory, file = p.parent, p
    elif p.exists():
        raise ManifestError(p, "manifest", f"expected a benchmark directory or its {MANIFEST_NAME}")
    else:
        raise ManifestError(p, "manifest",
                            "no such file or directory (expected a benchmark directory)")
    c = Reader(file, ManifestError)
    raw = _read_manifest(file)
    if raw is None:
        raise c.error("(top level)", "expected a mapping, the file is empty")
    d = c.mapping(raw, "(top level)", _TOP_KEYS, _TOP_REQUIRED)

    name = c.string(d["name"], "name")
    if not NAME_RE.fullmatch(name):
        raise c.fail("name", f"a name matching {NAME_RE.pattern}", name)
    if name != directory.name:
        raise c.fail("name", f"the directory name {directory.name!r}", name)
    split = c.string(d["split"], "split")
    if split not in SPLITS:
        raise c.fail("split", f"one of {', '.join(SPLITS)}", split)
    description = c.string(d["description"], "description")
    modules, main = _check_sources(c, directory, d.get("modules", []), d["main"])
    if "flags" in d:
        flags = c.string_list(d["flags"], "flags")
        _check_flags(c, flags)
    else:
        flags = DEFAULT_FLAGS
    sizes = _check_sizes(c, d["sizes"])
    origin = None
    if "origin" in d:
        o = c.mapping(d["origin"], "origin", _ORIGIN_KEYS, _ORIGIN_KEYS)
        origin = Origin(*(" ".join(c.string(o[k], f"origin.{k}").split()) for k in _ORIGIN_KEYS))
    return Benchmark(
        name=name,
        split=split,
        directory=directory,
        description=description.strip(),
        modules=modules,
        main=main,
        flags=flags,
        sizes=sizes,
        origin=origin,
    )


def _bundled_names() -> list[str]:
    if not BUNDLED_DIR.is_dir():
        return []
    return sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / MANIFEST_NAME).is_file())


def bundled_benchmarks(split: str | None = None) -> list[Benchmark]:
    """Every benchmark shipped in ``<repo>/benchmarks`` (optionally one split), sorted by name."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    benches = [load_benchmark(BUNDLED_DIR / n) for n in _bundled_names()]
    return [b for b in benches if split is None or b.split == split]


def is_benchmark_path(name_or_path: str) -> bool:
    """Whether a benchmark argument is a path: it holds a slash (``./kahan``, ``/x/kahan``)
    or is ``.``, ``..`` or ``benchmark.yaml``.  Anything else is a bundled benchmark's name,
    whatever the working directory holds."""
    s = str(name_or_path)
    return "/" in s or os.sep in s or s in (".", "..", MANIFEST_NAME)


def resolve_benchmark(name_or_path: str) -> Benchmark:
    """A benchmark from a directory path, or else a bundled benchmark's name.

    A bare name always means the bundled benchmark, never a folder of that name in the working
    directory (which would silently give another program under the same name): a directory is
    given as a path (``is_benchmark_path``).
    """
    s = str(name_or_path)
    if is_benchmark_path(s):
        return load_benchmark(s)
    names = _bundled_names()
    if s in names:
        return load_benchmark(BUNDLED_DIR / s)
    local = (f"; for the directory {s} here, write ./{s}"
             if Path(s).is_dir() else "; or give the path of a benchmark directory")
    raise ManifestError(
        BUNDLED_DIR,
        s,
        f"unknown benchmark (known: {', '.join(names) or 'none'}{local})",
    )


def check_output(bench: Benchmark, size_name: str, stdout: bytes) -> bool:
    """True when ``stdout`` is what the manifest expects for that size."""
    return bench.size(size_name).expected.matches(stdout)


# --------------------------------------------------------------------------- building
