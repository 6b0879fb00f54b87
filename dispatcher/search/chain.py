"""The data-generation driver: search chains that share one compile service and one
measurement service.

Each chain (one benchmark, one rundir) runs in its own thread and reads as the search it is:
propose candidates, compile them, read back the tree the compiler really produced, measure,
decide, journal.  Jobs of all chains meet in the scheduler's queue, so a free worker slot
takes whichever chain has work and no slot idles while one chain compiles.  Chains only write
their rundir (through ``dispatcher.core.records``) and a ``status`` record that the progress display
reads: data flows one way.

A chain is its core (``dispatcher.search.chain_core``: baseline, measuring, re-measuring,
canary, confirmation, journaling) and one of two loops, picked by the mode its rundir
recorded (``search.mode``): ``sync`` (``dispatcher.search.sync``) steps propose
``candidates_per_step`` candidates and wait for all of them before deciding, so each step
waits for its slowest candidate; ``async`` (``dispatcher.search.asynchronous``) keeps
``in_flight`` candidates in flight and judges each as it lands, one step per candidate
(docs/measurement.md, "Asynchronous search").  Every setting a chain runs with is its
rundir's (``dispatcher.search.settings``).
"""
from __future__ import annotations

import threading
from typing import Any, Protocol

from dispatcher.build.driver import BuildInterrupted
from dispatcher.build.manifest import Benchmark
from dispatcher.build.service import CompileService
from dispatcher.core.records import BaselineEvent, Experiment, FinishEvent, Pointer
from dispatcher.core.rundir import Rundir
from dispatcher.running.measurement import MeasurementService
from dispatcher.search.asynchronous import AsyncSearch
from dispatcher.search.chain_core import ChainCore, ChainStatus, Interrupted
from dispatcher.search.settings import recorded_settings, settings_of
from dispatcher.search.sync import SyncSearch

__all__ = ["Chain", "ChainStatus", "Interrupted", "new_experiment"]


class Loop(Protocol):
    def run(self, baseline: BaselineEvent) -> Pointer: ...


LOOPS: dict[str, type[SyncSearch] | type[AsyncSearch]] = {"sync": SyncSearch,
                                                          "async": AsyncSearch}


class Chain(ChainCore):
    """One search chain: its core and the loop of its recorded mode."""

    @classmethod
    def of_rundir(cls, rundir: Rundir, benchmark: Benchmark, config: Any,
                  builds: CompileService, measurements: MeasurementService,
                  worker_class: str, stop: threading.Event) -> Chain:
        """The chain of a rundir, with the settings it recorded; ``config`` gives only those
        a rundir of an earlier version did not record (as that version did)."""
        settings, taken = recorded_settings(rundir.experiment, config)
        return cls(rundir, benchmark, settings, builds, measurements, worker_class, stop,
                   from_config=taken)

    def run(self) -> None:
        try:
            self._run()
        except (Interrupted, BuildInterrupted):  # a compiler the Ctrl-C reached: the same
            self.status.state = "interrupted"
            self.finish("interrupted")
        except Exception as exc:  # recorded in the rundir, never lost silently
            message = " ".join(str(exc).split())[:300] or type(exc).__name__
            self.status.state, self.status.error = "failed", message
            self.finish(f"failed: {message}")

    def _run(self) -> None:
        baseline = self.baseline()
        self.reference = self.binary_of(baseline.pointer())
        self.hot = self.rundir.profile()
        loop: Loop = LOOPS[self.settings.mode](self)
        best = loop.run(baseline)
        if self.settings.confirm and best.step > 0:
            self.confirm(best)
        elif best.step == 0:
            self.status.none_better = "the heuristic's own tree stayed the best"
        self.rundir.append(FinishEvent(reason="completed"))
        self.builds.release(set())
        self.status.state = "finished"


def new_experiment(bench: Benchmark, chain: int, config: Any, slots: int, worker_class: str, *,
                   algorithm: str | None = None, steps: int | None = None,
                   seed: int | None = None, size: str | None = None,
                   runs: int | None = None, max_pairs: int | None = None,
                   chains: int = 1, compiler: str | None = None,
                   metric: str | None = None) -> Experiment:
    """The experiment record of a new chain: its settings (``settings.settings_of``: the
    config's, then the overrides) and its identity."""
    settings = settings_of(config, slots, chain=chain, chains=chains, algorithm=algorithm,
                           steps=steps, seed=seed, size=size, runs=runs, max_pairs=max_pairs,
                           metric=metric)
    return Experiment(**settings.model_dump(), task=bench.name, benchmark=str(bench.directory),
                      chain=chain, worker_class=worker_class, compiler=compiler)
