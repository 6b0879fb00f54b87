"""The simulated builds' own work in processes of their own (``simulated.build_cpus``).

A real build's CPU is ocamlopt's, in processes beside the master; the master's threads only
wait for it and then store what it wrote.  A simulated build done in the master's compile
threads (the default) puts the tree work and the dumps' text on the master's CPU and under
its GIL instead: at hundreds of slots that is a third of the process's CPU, which a bench
can subtract from the master's figure but not from its waits for the GIL.  Here each build's
work runs in one of these processes, pinned to the CPUs named; what a process holds (its own
world, made from the config) and does are the backend's functions, passed in by reference
(``spawn`` imports their module in each process), so this module imports no backend.
"""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from dispatcher.build.driver import BuildError

T = TypeVar("T")


def _pinned(cpus: frozenset[int], start: Callable[..., None], *args: Any) -> None:
    os.sched_setaffinity(0, cpus)
    start(*args)


class BuildProcesses:
    """One process per CPU of ``cpus``, each pinned there and started by ``start(*args)``
    (with ``spawn``: the master has threads)."""

    def __init__(self, cpus: tuple[int, ...], start: Callable[..., None], *args: Any):
        self._pool = ProcessPoolExecutor(
            max_workers=len(cpus), mp_context=multiprocessing.get_context("spawn"),
            initializer=_pinned, initargs=(frozenset(cpus), start, *args))

    def run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` in one of the processes (its exceptions as there); a process that
        died fails the build in one line."""
        try:
            return self._pool.submit(work, *args).result()
        except BrokenProcessPool:
            raise BuildError("simulated: a build process died (simulated.build_cpus)",
                             "") from None

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
