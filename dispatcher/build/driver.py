"""The ocamlopt build driver: a benchmark's units compiled one by one (each through the unit
cache when one is given), then linked, with the decision dumps collected.

Manifests (what to build) live in ``dispatcher.build.manifest``; this module only builds.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from dispatcher.build.manifest import Benchmark, Unit
from dispatcher.core.files import owned_prefix, sweep_orphans
from workers.agent.build import snapshot


@dataclass(frozen=True)
class CompiledUnit:
    """One unit's compile as the unit cache keeps it: the files it wrote, what it said, its
    CPU seconds (None: not recorded)."""

    names: tuple[str, ...]
    output: str
    cpu_s: float | None = None


@dataclass
class BuildResult:
    """A built benchmark: its executable, the decision dumps, and everything ocamlopt said."""

    binary: Path
    decision_files: list[Path]
    compiler_output: str
    units_compiled: int = 0  # units this build ran ``ocamlopt -c`` for
    units_reused: int = 0  # units restored from the unit cache instead
    # CPU seconds (user + system) of the compiler processes the build is made of: each unit's
    # ``ocamlopt -c`` (a reused unit's as recorded when it was compiled) and the link; None
    # when a unit's is not known (a unit cache entry written before they were recorded).
    # Unlike the wall time, it does not grow with the machine's load or a warm unit cache.
    cpu_s: float | None = None
    # Built on another machine: the units it compiled, in order (their files left beside the
    # binary), for the master's unit cache.
    remote_units: tuple[CompiledUnit, ...] = ()


class BuildInterrupted(KeyboardInterrupt):
    """The compiler was stopped by a signal meant for the user's command, not by its input:
    Ctrl-C reaches a compiler started in the instant before it leaves the terminal's process
    group (CPython's subprocess drops the master's handlers, then calls ``setsid``).  A Ctrl-C,
    so nothing is recorded about the candidate; a resume compiles it again."""


# --------------------------------------------------------------------------- compile scratch

#: A compile's temporary directory: ``ocamlopt-<pid of the master>-<random>``, so that one a
#: killed master left (SIGKILL runs no cleanup) is removed by a later master.
SCRATCH_PREFIX = "ocamlopt-"
_swept = threading.Lock()  # held for good once this process has swept
SCRATCH_AGE_S = 900.0  # unchanged this long (3 build budgets) and its master gone: stale


def scratch_prefix() -> str:
    return owned_prefix(SCRATCH_PREFIX)


def sweep_stale_scratch() -> int:
    """Once per process: the compile scratch directories of masters that are gone, removed."""
    if not _swept.acquire(blocking=False):
        return 0
    return sweep_orphans(SCRATCH_PREFIX, min_age_s=SCRATCH_AGE_S)


# What a terminal or a user's kill sends to stop a command, never a compiler's own failure.
_INTERRUPTING = {-signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP}


class BuildError(RuntimeError):
    """Compiling or linking a benchmark failed; ``output`` holds the full compiler output.
    ``lasting``: the same inputs would fail the same way again (the compiler said no, or ran
    past the build budget), not a failure of the moment (a tool that could not be started, a
    compiler killed by a signal, a policy host that failed)."""

    def __init__(self, summary: str, output: str, lasting: bool = False) -> None:
        super().__init__(" ".join(summary.split()))
        self.output = output
        self.lasting = lasting

    def __reduce__(self) -> tuple:  # picklable across worker processes
        return (type(self), (str(self), self.output, self.lasting))


@dataclass(frozen=True)
class PolicyChannel:
    """A policy host's channel for ``build_benchmark`` (``dispatcher.build.policy_host``): ``base``
    goes to every ``.ml`` compile; ``identity``, what determines the policy's answers, to each
    unit's cache key in its place (the channel's path changes from build to build)."""

    base: Path
    identity: str
    timeout: float | None = None  # seconds the compiler waits for an answer (None: its 60)


@dataclass(frozen=True)
class PolicyFile:
    """A policy file for ``build_benchmark``, evaluated by the compiler itself
    (``-inlining-policy``): ``path`` goes to every ``.ml`` compile; ``identity`` (the file's
    content hash) to each unit's cache key in its place."""

    path: Path
    identity: str


class UnitCompile:
    """The compile of one unit, handed to a ``UnitCache`` as ``compile``: calling it runs the
    compiler and returns (the names of the files it wrote, its output); ``cpu_s`` is then the
    CPU seconds it took, which a cache records beside the unit and, on a hit, sets to those
    it recorded (left None by a cache that records none: the build's CPU is then unknown)."""

    def __init__(self, run: Callable[[], tuple[list[str], str, float]]) -> None:
        self._run = run
        self.cpu_s: float | None = None

    def __call__(self) -> tuple[list[str], str]:
        names, output, self.cpu_s = self._run()
        return names, output


class UnitCache(Protocol):
    """Where ``build_benchmark`` gets compiled units from instead of compiling them again."""

    def unit(self, inputs: dict, outdir: Path,
             compile: Callable[[], tuple[list[str], str]]) -> tuple[list[str], str, bool]:
        """Leave in ``outdir`` the files one unit's ``ocamlopt -c`` writes there.

        ``inputs`` (JSON-able) is everything those files depend on except the compiler
        itself.  A hit copies the stored files into ``outdir`` and returns ``(file names,
        compiler output, True)``; a miss calls ``compile()``, which runs the compiler in
        ``outdir`` and returns (the names of the files it wrote, its output), stores them and
        returns them with ``False``.  ``compile()`` raising stores nothing.
        """
        ...


# Bump when the meaning of a unit's cache inputs changes, so old entries are never reused.
_UNIT_INPUTS_VERSION = "benchmark-unit-v1"

#: What a later unit's compile reads of an earlier one: its interface and, for cross-module
#: inlining, its .cmx.  Not the .o (only the link reads it) nor the dumps.
_READ_BY_LATER_UNITS = (".cmi", ".cmx")


# OCaml's words for a failure of the external tool it runs (assembler, C compiler, linker):
# they say which tool, not why; the tool's own line before them does.
_TOOL_FAILED = ("Error during linking", "Assembler error", "Error while building custom runtime")
_DISK_ERRORS = tuple(os.strerror(e) for e in (errno.ENOSPC, errno.EDQUOT, errno.EROFS))


def _first_error_line(output: str) -> str:
    """One line saying why a command failed: OCaml's first ``Error`` line, followed by the
    failing tool's own first line when OCaml only names the tool (``/usr/bin/ld: final link
    failed: No space left on device``), or by any line reporting a full or read-only disk."""
    lines = [ln.strip() for ln in output.splitlines()
             if ln.strip() and not ln.startswith(("$ ", "# "))]
    first = next((i for i, ln in enumerate(lines) if ln.startswith("Error")), None)
    if first is None:
        return lines[-1] if lines else "no output"
    error = lines[first]
    why = next((ln for ln in lines if any(text in ln for text in _DISK_ERRORS)), None)
    if why is None and any(words in error for words in _TOOL_FAILED):
        why = next((ln for ln in lines[:first] if not ln.startswith(
            ("File ", "collect2: error: ld returned"))), None)
    return f"{error}: {why}" if why and why not in error else error


#: util-linux's ``setpriv``: a compiler started through it is killed when the thread that
#: started it ends, so a master killed mid-build (SIGKILL, SIGTERM) does not leave its
#: compilers running to the end of their build budget, writing into a store nobody reads
#: (``PR_SET_PDEATHSIG``, set after the fork and kept across the exec; without it: as before).
_SETPRIV = shutil.which("setpriv")


def run_counted(cmd: list[str], cwd: Path, env: Mapping[str, str], timeout: float
                ) -> tuple[int, bytes, float]:
    """``cmd`` run to its end -> (its exit status as ``subprocess`` gives it, its output with
    stderr, the CPU seconds, user and system, of it and of the processes it waited for: the
    assembler, the linker).  Read from ``wait4`` of this child alone, so compiles running
    in other threads are not counted in.  subprocess.TimeoutExpired past ``timeout``, the
    child killed; in its own session, so a Ctrl-C meant for the master does not reach it."""
    argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *cmd] if _SETPRIV else cmd
    proc = subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()),  # type: ignore
                              daemon=True)
    reader.start()
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        proc.kill()
    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped: Popen must not wait again
    reader.join()
    proc.stdout.close()
    if expired.is_set() and proc.returncode == -signal.SIGKILL:
        raise subprocess.TimeoutExpired(cmd, timeout)
    return proc.returncode, b"".join(chunks), usage.ru_utime + usage.ru_stime


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def unit_command(ocamlopt: Path, flags: Sequence[str], unit: Unit, overrides: str | None,
                 dump_decisions: bool, channel: Sequence[str] = ()) -> list[str]:
    """The ``ocamlopt -c`` of one unit, run in the build directory; ``overrides``: the path
    of its overrides file, ``channel``: the policy channel's options (only an implementation
    takes either)."""
    options: list[str] = []
    if unit.is_impl:
        if overrides is not None:
            options += ["-inlining-overrides", overrides]
        if dump_decisions:
            options.append("-dump-inlining-decisions")
        options += channel
    return [str(ocamlopt), *flags, *options, "-c", unit.source]


def link_command(ocamlopt: Path, flags: Sequence[str], units: Sequence[Unit],
                 binary_name: str) -> list[str]:
    """The link of the units' ``.cmx`` files, in order, into ``binary_name``."""
    cmx = [u.source[:-3] + ".cmx" for u in units if u.is_impl]
    return [str(ocamlopt), *flags, *cmx, "-o", binary_name]


def unit_inputs(flags: Sequence[str], unit: Unit, overrides: Path | None, dump_decisions: bool,
                source_sha256: str, source_names: Sequence[str], earlier: Mapping[str, str],
                keyed_channel: Sequence[str] = ()) -> dict:
    """A unit's key in the unit cache: its command (flags, its overrides file by content, the
    policy by identity), its source, the names of all sources, and the ``.cmi``/``.cmx``
    files the earlier units left (``earlier``: name -> sha256), so a unit whose dependency's
    inlining information changed is compiled again."""
    keyed = unit_command(Path(), flags, unit,
                         None if overrides is None else "sha256:" + _sha256(overrides),
                         dump_decisions, keyed_channel)[1 + len(flags):-2]
    return {"version": _UNIT_INPUTS_VERSION,
            "command": [*flags, *keyed, "-c", unit.source],
            "source": source_sha256,
            "sources": sorted(source_names),
            "earlier": dict(earlier)}


def read_by_later_units(name: str) -> bool:
    """Whether a file a unit's compile wrote is read by later units' compiles (its key)."""
    return name.endswith(_READ_BY_LATER_UNITS)


def build_commands(bench: Benchmark, ocamlopt: Path, flags: Sequence[str],
                   overrides: Mapping[str, str], dump_decisions: bool
                   ) -> list[tuple[list[str], str]]:
    """Every command of a whole build with no unit cache, each with what it does, as
    ``build_benchmark`` runs them (``overrides``: unit name -> its file's path, relative to
    the build directory or absolute): what a remote builder runs."""
    units = bench.units()
    return ([(unit_command(ocamlopt, flags, u, overrides.get(u.module), dump_decisions),
              f"compiling {u.source}") for u in units]
            + [(link_command(ocamlopt, flags, units, bench.binary_name()),
                f"linking {bench.binary_name()}")])


def build_error(bench: Benchmark, what: str, exit_status: int, text: str,
                output: str) -> BuildError:
    """The error of a build command that failed: one line saying why, the whole output."""
    return BuildError(f"{bench.name}: {what} failed (exit {exit_status}): "
                      f"{_first_error_line(text)}", output, lasting=exit_status > 0)


def build_benchmark(
    bench: Benchmark,
    outdir: Path,
    ocamlopt: Path,
    *,
    flags: Sequence[str] | None = None,
    overrides: Path | Mapping[str, Path] | None = None,
    dump_decisions: bool = False,
    timeout: float = 300,
    unit_cache: UnitCache | None = None,
    policy: PolicyChannel | PolicyFile | None = None,
) -> BuildResult:
    """Copy the sources into ``outdir`` and compile them there into ``outdir/<name>.exe``.

    One ``ocamlopt -c`` per file, in manifest order (so each compilation unit gets its own
    decision dumps, named after the unit), then a link of the ``.cmx`` files. ``flags``
    replaces the manifest's flags. ``overrides`` adds ``-inlining-overrides <abs path>`` and
    ``dump_decisions`` adds ``-dump-inlining-decisions`` to every ``.ml`` compile; neither is
    passed otherwise, so a stock compiler works too. ``overrides`` may instead map unit names
    (``Series``) to files: each ``.ml`` gets its own unit's file, a unit not in the mapping
    none (the compiler only applies a file's entries for the unit it compiles, so this builds
    the same as one file holding them all).  ``policy`` adds ``-inlining-policy-channel`` (and
    its timeout) to every ``.ml`` compile: a host must be serving it; or, a ``PolicyFile``,
    ``-inlining-policy FILE``.  ``timeout`` bounds the whole build.

    With ``unit_cache``, each unit's compile is looked up there first, under its inputs: the
    command (flags, the content of its overrides file), its source, the names of all sources,
    and the ``.cmi``/``.cmx`` files every earlier unit left (so a unit whose dependency's
    inlining information changed is compiled again).  The link always runs.

    ``outdir`` may already exist (it may, e.g., hold the overrides file); stale
    ``*.decisions.sexp`` files and a stale binary in it are removed first. It must not be
    the benchmark directory itself.
    """
    outdir = Path(os.path.abspath(outdir))
    ocamlopt = Path(os.path.abspath(ocamlopt))
    if not ocamlopt.is_file():
        raise FileNotFoundError(f"ocamlopt: {ocamlopt} does not exist")
    if outdir.exists() and outdir.resolve() == bench.directory.resolve():
        raise ValueError(f"outdir: {outdir} is the benchmark directory; build somewhere else")
    units = bench.units()
    per_unit: dict[str, Path] = {}
    if isinstance(overrides, Mapping):
        per_unit = {u: Path(os.path.abspath(f)) for u, f in overrides.items()}
    elif overrides is not None:
        whole = Path(os.path.abspath(overrides))
        per_unit = {u.module: whole for u in units}
    for f in set(per_unit.values()):
        if not f.is_file():
            raise FileNotFoundError(f"overrides: {f} does not exist")
    use_flags = list(bench.flags if flags is None else flags)

    outdir.mkdir(parents=True, exist_ok=True)
    binary = outdir / bench.binary_name()
    for stale in [*outdir.glob("*.decisions.sexp"), binary]:
        if stale.is_file() or stale.is_symlink():
            stale.unlink()
    for src in bench.source_files():
        shutil.copyfile(src, outdir / src.name)

    env = dict(os.environ)
    env.pop("OCAMLPARAM", None)  # would silently add flags to every compile
    deadline = time.monotonic() + timeout
    log: list[str] = []

    def run(cmd: list[str], what: str) -> float:
        """``cmd`` run in the build -> its CPU seconds; BuildError if it failed."""
        log.append("$ " + " ".join(cmd))
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise subprocess.TimeoutExpired(cmd, timeout)
            # Own session: a Ctrl-C meant for the master must not kill the compiler under it.
            # Its temporary files (the assembly, the startup code) in a directory of its own,
            # removed after it: a compiler that exits early (a refused policy file) or is
            # killed leaves its empty .s behind, one per compile, which piled up in /tmp.
            sweep_stale_scratch()
            with tempfile.TemporaryDirectory(prefix=scratch_prefix()) as scratch:
                returncode, stdout, cpu = run_counted(cmd, outdir, {**env, "TMPDIR": scratch},
                                                      remaining)
        except subprocess.TimeoutExpired:
            output = "\n".join(log)
            raise BuildError(f"{bench.name}: {what}: timed out (build budget {timeout:g} s)",
                             output, lasting=True) from None
        except OSError as e:
            log.append(str(e))
            raise BuildError(f"{bench.name}: {what}: cannot run {cmd[0]} ({e})",
                             "\n".join(log)) from None
        text = stdout.decode("utf-8", errors="replace")
        if text:
            log.append(text.rstrip("\n"))
        if returncode in _INTERRUPTING:
            raise BuildInterrupted(f"{bench.name}: {what}: stopped by "
                                   f"{signal.Signals(-returncode).name}")
        if returncode != 0:
            raise build_error(bench, what, returncode, text, "\n".join(log))
        return cpu

    earlier: dict[str, str] = {}  # .cmi/.cmx left by earlier units -> sha256
    compiled = reused = 0
    cpu: float | None = 0.0
    for unit in units:
        own = per_unit.get(unit.module) if unit.is_impl else None
        channel: list[str] = []
        keyed_channel: list[str] = []  # the same, with the policy named by its identity
        if isinstance(policy, PolicyFile):
            channel = ["-inlining-policy", str(Path(os.path.abspath(policy.path)))]
            keyed_channel = ["-inlining-policy", "policy:" + policy.identity]
        elif policy is not None:
            channel = ["-inlining-policy-channel", str(policy.base)]
            keyed_channel = ["-inlining-policy-channel", "policy:" + policy.identity]
            if policy.timeout is not None:
                channel += ["-inlining-policy-timeout", f"{policy.timeout:g}"]
        cmd = unit_command(ocamlopt, use_flags, unit, None if own is None else str(own),
                           dump_decisions, channel)

        def compile_unit(cmd: list[str] = cmd, unit: Unit = unit
                         ) -> tuple[list[str], str, float]:
            before = snapshot(str(outdir))
            mark = len(log)
            seconds = run(cmd, f"compiling {unit.source}")
            after = snapshot(str(outdir))
            written = sorted(n for n, st in after.items() if before.get(n) != st)
            return written, "\n".join(log[mark + 1:]), seconds

        step = UnitCompile(compile_unit)
        if unit_cache is None:
            written, _ = step()
            compiled += 1
        else:
            inputs = unit_inputs(use_flags, unit, own, dump_decisions,
                                 _sha256(outdir / unit.source),
                                 [f.name for f in bench.source_files()], earlier, keyed_channel)
            written, text, hit = unit_cache.unit(inputs, outdir, step)
            if hit:
                reused += 1
                log.append(f"# {unit.source}: reused from the unit cache")
                log.append("$ " + " ".join(cmd))
                if text:
                    log.append(text)
            else:
                compiled += 1
        cpu = None if cpu is None or step.cpu_s is None else cpu + step.cpu_s
        for name in written if unit_cache is not None else ():
            if read_by_later_units(name):
                earlier[name] = _sha256(outdir / name)
    link_cpu = run(link_command(ocamlopt, use_flags, units, binary.name),
                   f"linking {binary.name}")
    if not binary.is_file():
        raise BuildError(f"{bench.name}: linking {binary.name}: no binary produced",
                         "\n".join(log), lasting=True)
    return BuildResult(
        binary=binary,
        decision_files=sorted(outdir.glob("*.decisions.sexp")),
        compiler_output="\n".join(log) + ("\n" if log else ""),
        units_compiled=compiled,
        units_reused=reused,
        cpu_s=None if cpu is None else cpu + link_cpu,
    )
