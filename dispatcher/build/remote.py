"""Builds on other machines (Ray nodes, SSH hosts): the contract a remote builder keeps, the
request every one of them sends, and how a reply becomes the master's ``BuildResult`` or the
same ``BuildError`` a build on the master makes.

A remote build's binary and dumps are the bytes the master's build makes for the same job,
because the building machine proves it runs the master's compiler (its sha256) before
compiling anything (``workers.agent.build``).  The master's unit cache serves remote builds
too: the leading units it holds go with the request, compiled (``reused_units``), and the
units the machine compiled come back with the reply and are stored there (``keep_units``), so
a candidate that flips one unit is one unit's compile and a link wherever it is built.  Only
a leading run of units can be sent: a unit's key names the interfaces the units before it
left, which the master knows only for the units it holds.
"""
from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dispatcher.build.driver import (
    BuildError,
    BuildResult,
    CompiledUnit,
    build_commands,
    build_error,
    read_by_later_units,
    unit_inputs,
)
from dispatcher.build.manifest import Benchmark
from dispatcher.build.toolchain import Compiler
from dispatcher.storage.store import UnitEntry

BUILD_TIMEOUT_S = 300.0  # one whole build elsewhere, as build_benchmark's budget


class BuilderLost(RuntimeError):
    """A remote builder could not build at all (a node without the compiler or with another
    one, a lost task, an unreachable host): nothing about the candidate, so the master builds
    it itself."""


class UnitStore(Protocol):
    """The master's unit cache as remote builds use it (``service.StoreUnitCache``)."""

    def lookup(self, inputs: dict, outdir: Path) -> UnitEntry | None: ...

    def record(self, inputs: dict, outdir: Path, names: list[str], output: str,
               cpu_s: float | None = None) -> None: ...


@dataclass(frozen=True)
class UnitReuse:
    """The leading units of a benchmark a remote build need not compile: their files, sent
    with the request, and what each one's compile wrote and said."""

    units: tuple[CompiledUnit, ...] = ()
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return len(self.units)


NO_REUSE = UnitReuse()


def _inputs(bench: Benchmark, flags: Sequence[str], overrides: Mapping[str, Path],
            dump_decisions: bool, index: int, earlier: Mapping[str, str]) -> dict:
    unit = bench.units()[index]
    source = bench.directory / unit.source
    return unit_inputs(flags, unit, overrides.get(unit.module) if unit.is_impl else None,
                       dump_decisions, hashlib.sha256(source.read_bytes()).hexdigest(),
                       [f.name for f in bench.source_files()], earlier)


def _earlier(names: Sequence[str], read: Mapping[str, bytes] | Path, earlier: dict[str, str]
             ) -> None:
    for name in names:
        if read_by_later_units(name):
            data = read[name] if isinstance(read, Mapping) else (read / name).read_bytes()
            earlier[name] = hashlib.sha256(data).hexdigest()


def reused_units(bench: Benchmark, flags: Sequence[str], overrides: Mapping[str, Path],
                 dump_decisions: bool, cache: UnitStore) -> UnitReuse:
    """The leading units of the build that ``cache`` holds, up to the first it does not."""
    units: list[CompiledUnit] = []
    files: dict[str, bytes] = {}
    earlier: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="inlining-reuse-") as scratch:
        for index in range(len(bench.units())):
            entry = cache.lookup(_inputs(bench, flags, overrides, dump_decisions, index,
                                         earlier), Path(scratch))
            if entry is None or not all(map(_file_name, entry.files)):
                break  # not stored (or named past its directory): built there
            names = sorted(entry.files)
            for name in names:
                files[name] = (Path(scratch) / name).read_bytes()
            _earlier(names, files, earlier)
            units.append(CompiledUnit(tuple(names), entry.output, entry.cpu_s))
    return UnitReuse(tuple(units), files)


def keep_units(bench: Benchmark, flags: Sequence[str], overrides: Mapping[str, Path],
               dump_decisions: bool, cache: UnitStore, result: BuildResult,
               reuse: UnitReuse) -> int:
    """Store in ``cache`` the units a remote build compiled (``result.remote_units``, their
    files in the build directory beside the binary) -> how many."""
    outdir = result.binary.parent
    earlier: dict[str, str] = {}
    for reused in reuse.units:
        _earlier(reused.names, outdir, earlier)
    for offset, unit in enumerate(result.remote_units):
        index = reuse.count + offset
        cache.record(_inputs(bench, flags, overrides, dump_decisions, index, earlier), outdir,
                     list(unit.names), unit.output, unit.cpu_s)
        _earlier(unit.names, outdir, earlier)
    return len(result.remote_units)


class Builder(Protocol):
    """Where whole builds run when not on the master: a Ray cluster's compiling nodes, SSH
    hosts with compile seats.  ``build`` is called from up to ``jobs`` threads at once."""

    name: str  # where, for the store's record of each build (a build may name a part of it)
    jobs: int  # builds it runs at once
    # whether the master builds while every seat here is taken (False: a build waits for a
    # seat; a simulated world's builds are the world's, the master's compiler has no part)
    overflow_to_master: bool
    # whether its builds compile real units, which the master's unit cache serves and keeps
    shares_unit_cache: bool

    def build(self, bench: Benchmark, outdir: Path, compiler: Compiler, flags: tuple[str, ...],
              overrides: dict[str, Path], dump_decisions: bool,
              reuse: UnitReuse = NO_REUSE) -> tuple[BuildResult, str]:
        """``build_benchmark``'s result, left in ``outdir``, and where it ran; BuildError as
        a build on the master fails; BuilderLost if it cannot build at all.  ``reuse``: the
        leading units not to compile (their files sent with the request)."""
        ...


@dataclass(frozen=True)
class BuildRequest:
    """What a building machine needs: the files of the build directory (relative names),
    its commands, the binary's name, the budget and the master compiler's sha256."""

    files: dict[str, bytes]
    commands: list[tuple[list[str], str]]
    binary_name: str
    timeout: float
    compiler_identity: str

    def arguments(self) -> dict[str, Any]:
        """``workers.agent.build.build``'s keyword arguments."""
        return {"files": self.files, "commands": self.commands,
                "binary_name": self.binary_name, "timeout": self.timeout,
                "compiler_identity": self.compiler_identity}


def build_request(bench: Benchmark, compiler: Compiler, flags: tuple[str, ...],
                  overrides: Mapping[str, Path], dump_decisions: bool,
                  ocamlopt: str | None = None, timeout: float = BUILD_TIMEOUT_S,
                  reuse: UnitReuse = NO_REUSE) -> BuildRequest:
    """The request of one build; ``ocamlopt``: the compiler's path on the building machine
    (default: the master's); ``reuse``: its leading units, compiled already."""
    names = {unit: f"overrides/{unit}.sexp" for unit in overrides}
    files = {src.name: src.read_bytes() for src in bench.source_files()}
    files.update({names[unit]: path.read_bytes() for unit, path in overrides.items()})
    files.update(reuse.files)
    commands = build_commands(bench, Path(ocamlopt) if ocamlopt else compiler.ocamlopt, flags,
                              names, dump_decisions)[reuse.count:]
    return BuildRequest(files, commands, bench.binary_name(), timeout, compiler.identity)


def _reused_log(bench: Benchmark, reuse: UnitReuse) -> str:
    """What the master's own build says of the units it reused, for those of a remote one."""
    lines = []
    for unit, reused in zip(bench.units(), reuse.units):
        lines.append(f"# {unit.source}: reused from the unit cache")
        if reused.output:
            lines.append(reused.output)
    return "".join(line + "\n" for line in lines)


def _file_name(name: Any) -> bool:
    return (isinstance(name, str) and bool(name) and "/" not in name
            and not name.startswith(".") and "\0" not in name)


def _malformed(reply: Mapping[str, Any]) -> str | None:
    """What makes ``reply`` not a build reply (None: it is one).  A Ray task's reply comes as
    the task returned it, an SSH host's through ``workers.agent.build.reply_of``: both are
    checked here before any of it is used."""
    if "lost" in reply:
        return None if isinstance(reply["lost"], str) else "lost: expected a line"
    if not isinstance(reply.get("output"), str):
        return "output: expected text"
    if not reply.get("ok"):
        ok = (isinstance(reply.get("what"), str) and isinstance(reply.get("text"), str)
              and (reply.get("exit") is None or isinstance(reply.get("exit"), int)))
        return None if ok else "a failed build without what, exit and text"
    if not isinstance(reply.get("binary"), bytes):
        return "binary: expected bytes"
    files = [reply.get("dumps"), *(u.get("files") if isinstance(u, dict) else None
                                   for u in reply.get("units") or [])]
    if not isinstance(reply.get("units", []), list) or not all(
            isinstance(f, dict) and all(isinstance(v, bytes) for v in f.values())
            for f in files):
        return "dumps and units: expected files by name"
    if not all(isinstance(u.get("output"), str) for u in reply.get("units") or []):
        return "units: expected each one's output"
    seconds = [reply.get("link_cpu_s"), *(u.get("cpu_s") for u in reply.get("units") or [])]
    if not all(x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)
                             and x >= 0) for x in seconds):
        return "cpu_s: expected CPU seconds"
    return None


def build_result(bench: Benchmark, outdir: Path, reply: Mapping[str, Any], where: str,
                 timeout: float = BUILD_TIMEOUT_S, reuse: UnitReuse = NO_REUSE) -> BuildResult:
    """The master's result of a building machine's reply (``workers.agent.build.build``'s),
    written into ``outdir`` with the files of the units it compiled; the master's BuildError
    if the build failed; BuilderLost (naming ``where``) if the machine could not build, or
    answered with a name it may not write."""
    wrong = _malformed(reply)
    if wrong is not None:
        raise BuilderLost(f"{where}: not a build reply ({wrong})")
    if "lost" in reply:
        raise BuilderLost(f"{where}: {reply['lost']}")
    before = _reused_log(bench, reuse)
    if not reply.get("ok"):
        if reply.get("exit") is None:
            raise BuildError(f"{bench.name}: {reply['what']}: timed out (build budget "
                             f"{timeout:g} s)", before + reply["output"], lasting=True)
        raise build_error(bench, reply["what"], reply["exit"], reply["text"],
                          before + reply["output"])
    dumps = reply["dumps"]
    units = reply.get("units") or []
    names = [*dumps, *(n for u in units for n in u["files"])]
    for name in names:
        if not _file_name(name):
            raise BuilderLost(f"{where}: refused file name {name!r}")
    if len(units) != len(bench.units()) - reuse.count:
        raise BuilderLost(f"{where}: {len(units)} units compiled, "
                          f"{len(bench.units()) - reuse.count} expected")
    outdir.mkdir(parents=True, exist_ok=True)
    for name, data in reuse.files.items():
        (outdir / name).write_bytes(data)
    for unit in units:
        for name, data in unit["files"].items():
            (outdir / name).write_bytes(data)
    binary = outdir / bench.binary_name()
    binary.write_bytes(reply["binary"])
    binary.chmod(0o755)
    written = []
    for name, data in dumps.items():
        (outdir / name).write_bytes(data)
        written.append(outdir / name)
    compiled = tuple(CompiledUnit(tuple(sorted(u["files"])), u["output"], u.get("cpu_s"))
                     for u in units)
    # as a build on the master counts it: each unit's compile (a reused unit's as recorded
    # when it was compiled) and the link; None where one is not known
    parts = [u.cpu_s for u in (*reuse.units, *compiled)] + [reply.get("link_cpu_s")]
    cpu = None if any(p is None for p in parts) else sum(p for p in parts if p is not None)
    return BuildResult(binary=binary, decision_files=sorted(written),
                       compiler_output=before + reply["output"],
                       units_compiled=len(units), units_reused=reuse.count, cpu_s=cpu,
                       remote_units=compiled)
