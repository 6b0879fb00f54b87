"""Builds on other machines (Ray nodes, SSH hosts): the contract a remote builder keeps, the
request every one of them sends, and how a reply becomes the master's ``BuildResult`` or the
same ``BuildError`` a build on the master makes.

A remote build is a whole build (no unit cache there): its binary and dumps are the bytes the
master's build makes for the same job, because the building machine proves it runs the
master's compiler (its sha256) before compiling anything (``workers.agent.build``).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dispatcher.build.driver import BuildError, BuildResult, build_commands, build_error
from dispatcher.build.manifest import Benchmark
from dispatcher.build.toolchain import Compiler

BUILD_TIMEOUT_S = 300.0  # one whole build elsewhere, as build_benchmark's budget


class BuilderLost(RuntimeError):
    """A remote builder could not build at all (a node without the compiler or with another
    one, a lost task, an unreachable host): nothing about the candidate, so the master builds
    it itself."""


class Builder(Protocol):
    """Where whole builds run when not on the master: a Ray cluster's compiling nodes, SSH
    hosts with compile seats.  ``build`` is called from up to ``jobs`` threads at once."""

    name: str  # where, for the store's record of each build (a build may name a part of it)
    jobs: int  # builds it runs at once
    # whether the master builds while every seat here is taken (False: a build waits for a
    # seat; a simulated world's builds are the world's, the master's compiler has no part)
    overflow_to_master: bool

    def build(self, bench: Benchmark, outdir: Path, compiler: Compiler, flags: tuple[str, ...],
              overrides: dict[str, Path], dump_decisions: bool) -> tuple[BuildResult, str]:
        """``build_benchmark``'s result, left in ``outdir``, and where it ran; BuildError as
        a build on the master fails; BuilderLost if it cannot build at all."""
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
                  ocamlopt: str | None = None, timeout: float = BUILD_TIMEOUT_S) -> BuildRequest:
    """The request of one build; ``ocamlopt``: the compiler's path on the building machine
    (default: the master's)."""
    names = {unit: f"overrides/{unit}.sexp" for unit in overrides}
    files = {src.name: src.read_bytes() for src in bench.source_files()}
    files.update({names[unit]: path.read_bytes() for unit, path in overrides.items()})
    commands = build_commands(bench, Path(ocamlopt) if ocamlopt else compiler.ocamlopt, flags,
                              names, dump_decisions)
    return BuildRequest(files, commands, bench.binary_name(), timeout, compiler.identity)


def build_result(bench: Benchmark, outdir: Path, reply: Mapping[str, Any], where: str,
                 timeout: float = BUILD_TIMEOUT_S) -> BuildResult:
    """The master's result of a building machine's reply (``workers.agent.build.build``'s),
    written into ``outdir``; the master's BuildError if the build failed; BuilderLost (naming
    ``where``) if the machine could not build, or answered with a name it may not write."""
    if "lost" in reply:
        raise BuilderLost(f"{where}: {reply['lost']}")
    if not reply.get("ok"):
        if reply.get("exit") is None:
            raise BuildError(f"{bench.name}: {reply['what']}: timed out (build budget "
                             f"{timeout:g} s)", reply["output"], lasting=True)
        raise build_error(bench, reply["what"], reply["exit"], reply["text"], reply["output"])
    dumps = reply["dumps"]
    for name in dumps:
        if not isinstance(name, str) or "/" in name or name.startswith(".") or "\0" in name:
            raise BuilderLost(f"{where}: refused dump name {name!r}")
    outdir.mkdir(parents=True, exist_ok=True)
    binary = outdir / bench.binary_name()
    binary.write_bytes(reply["binary"])
    binary.chmod(0o755)
    written = []
    for name, data in dumps.items():
        (outdir / name).write_bytes(data)
        written.append(outdir / name)
    return BuildResult(binary=binary, decision_files=sorted(written),
                       compiler_output=reply["output"], units_compiled=len(bench.units()))
