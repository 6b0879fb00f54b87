"""The simulated builds' own work in processes of their own (``simulated.build_cpus``).

A real build's CPU is ocamlopt's, in processes beside the master; the master's threads only
wait for it and then store what it wrote.  A simulated build done in the master's compile
threads (the default) puts the tree work and the dumps' text on the master's CPU and under
its GIL instead: at hundreds of slots that is a third of the process's CPU, which a bench
can subtract from the master's figure but not from its waits for the GIL.  Here each build's
work (``backend.make_build``) runs in one of these processes, pinned to the CPUs named, each
holding a world of its own made from the same config; the master's thread then sleeps the
modelled compile time as before.
"""
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import TYPE_CHECKING

from dispatcher.build.driver import BuildError
from dispatcher.build.manifest import Benchmark

if TYPE_CHECKING:
    from dispatcher.running.simulated.backend import MadeBuild, SimulatedConfig, World

_world: World | None = None  # a build process's own


def _start(config: SimulatedConfig, cpus: frozenset[int]) -> None:
    # Imported here: the backend module imports this one.
    from dispatcher.running.simulated.backend import World

    global _world
    os.sched_setaffinity(0, cpus)
    _world = World(config)


def _make(bench: Benchmark, outdir: Path, overrides: dict[str, Path]) -> MadeBuild:
    from dispatcher.running.simulated.backend import make_build

    assert _world is not None, "a build process without its world"
    return make_build(_world, bench, outdir, overrides)


class BuildProcesses:
    """One process per CPU of ``cpus`` (started with ``spawn``: the master has threads),
    doing ``make_build``'s work for the builder's threads."""

    def __init__(self, config: SimulatedConfig, cpus: tuple[int, ...]):
        self._pool = ProcessPoolExecutor(
            max_workers=len(cpus), mp_context=multiprocessing.get_context("spawn"),
            initializer=_start, initargs=(config, frozenset(cpus)))

    def build(self, bench: Benchmark, outdir: Path, overrides: dict[str, Path]) -> MadeBuild:
        """``make_build`` in a build process (SimulationError as there); a process that died
        fails the build in one line."""
        try:
            return self._pool.submit(_make, bench, outdir, overrides).result()
        except BrokenProcessPool:
            raise BuildError("simulated: a build process died (simulated.build_cpus)",
                             "") from None

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
