"""The one place the system is wired: config -> store -> compile service -> backend ->
scheduler -> measurement service.

Every command and every ``bench/`` script opens a ``Session`` rather than assembling these
itself, so they all compile on the same CPUs, keep the master off the worker CPUs the same
way, and measure through the same rules.  Workers start only when a caller asks
(``start_workers``): a command answered from the store never starts an agent, and reading a
property never starts anything.
"""
from __future__ import annotations

import gc
import threading
from dataclasses import replace
from typing import Any

from dispatcher.build.service import CompileService
from dispatcher.build.toolchain import locate_compiler
from dispatcher.config import Config
from dispatcher.running.backend import Backend, BackendContext, BackendSpec, backend_spec
from dispatcher.running.exact import IDENTITY, check_workers
from dispatcher.running.measurement import MeasurementService
from dispatcher.running.scheduler import Scheduler
from dispatcher.storage.store import Store

#: The cyclic collector's first threshold in a master with workers (Python's default: 700).
#: A master allocates a few thousand containers per candidate (trees, records, JSON) and
#: keeps large structures alive (cached trees, the chains' state): at 700 every few hundred
#: allocations trigger a collection whose survivors climb to the older generations, and their
#: full collections walk every live object.  bench/search_sim (64 slots, cycles): 5.6-8.9 ms of
#: the master's CPU per candidate in the collector at 700, 2.4-3.6 at 10,000 with the freeze.
GC_THRESHOLD0 = 10_000

_collector_tuned = threading.Lock()  # held for good once tuned: the first start tunes


def tune_collector() -> None:
    """Once per process, when a master starts its workers: what lives by then (modules,
    the config, the store's indexes) is collected once and frozen (``gc.freeze``: no later
    collection walks it), and the first threshold raised to ``GC_THRESHOLD0``.  Reference
    counting still frees what is not cyclic at once; cycles wait a little longer."""
    if not _collector_tuned.acquire(blocking=False):
        return
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD0, *gc.get_threshold()[1:])


class WorkersNotStarted(RuntimeError):
    """The backend, scheduler or measurement service was asked for before ``start_workers``."""


class Session:
    def __init__(self, config: Config, compile_jobs: int | None = None,
                 compile_service: type[CompileService] = CompileService):
        """Raises CompilerNotFound if the patched compiler is not built, StoreError if the
        store cannot be used.  ``compile_service``: a subclass to use (bench scripts
        instrument it)."""
        self.config = config
        self.spec: BackendSpec = backend_spec(config.backend)
        self.store = Store(config.store)
        try:
            toolchain = (self.spec.toolchain(config.backend_settings)
                         if self.spec.toolchain is not None else locate_compiler())
            self.builds = compile_service(self.store, toolchain,
                                          jobs=compile_jobs or config.compile_jobs,
                                          cpus=self.master_cpus)
        except BaseException:
            self.store.close()
            raise
        self._backend: Backend | None = None
        self._scheduler: Scheduler | None = None
        self._measurements: MeasurementService | None = None
        self._stop: threading.Event | None = None

    @property
    def master_cpus(self) -> frozenset[int] | None:
        """The CPUs of this machine left to the master (None: every CPU)."""
        return self.spec.master_cpus(self.config.backend_settings)

    @property
    def worker_classes(self) -> list[str]:
        """The classes of the backend's slots, known without starting it."""
        return self.spec.worker_classes(self.config.backend_settings)

    def start_workers(self) -> MeasurementService:
        """Start the backend (its agents as it starts them), the scheduler over its slots and
        the measurement service, once; later calls return the same service.  Raises
        BackendUnavailable (one line) if the backend cannot start.  The collector is tuned
        for a master (``tune_collector``) the first time a session starts its workers."""
        tune_collector()
        if self._backend is None:
            context = BackendContext(store_root=self.store.root,
                                     worker_cache=self.store.worker_cache,
                                     exact=self.config.measure.metric != "time")
            self._backend = self.spec.start(self.config.backend_settings, context)
            builder = self._backend.remote_builder()
            if builder is not None:  # compile capacity grows with the cluster
                self.builds.use_builder(builder)
        if self._scheduler is None:
            self._scheduler = Scheduler(self._backend.slots, self.config.scheduler)
        if self._measurements is None:
            exact = (check_workers(self._backend.slots, self.config.measure.metric)
                     if self.config.measure.metric != "time" else IDENTITY)  # or one line
            self._measurements = MeasurementService(
                self._scheduler, self.store, self.config.measure.min_cpu_share,
                self.config.measure.share_margin, exact_identity=exact)
        return self._measurements

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise WorkersNotStarted("Session.backend before start_workers()")
        return self._backend

    @property
    def scheduler(self) -> Scheduler:
        if self._scheduler is None:
            raise WorkersNotStarted("Session.scheduler before start_workers()")
        return self._scheduler

    @property
    def measurements(self) -> MeasurementService:
        if self._measurements is None:
            raise WorkersNotStarted("Session.measurements before start_workers()")
        return self._measurements

    def lost_workers(self) -> list[str]:
        """One line per slot taken out of service, or still lost, when asked."""
        if self._scheduler is None:
            return []
        s = self._scheduler
        return ([f"{name}: out of service: {why}" for name, why in s.quarantined.items()]
                + [f"{name}: unavailable at the end: {why}" for name, why in s.down.items()])

    def close(self, abort: bool = False) -> None:
        """Stop the scheduler (finishing queued jobs), the workers and the compile pool.
        ``abort`` (Ctrl-C): drop queued jobs, close the workers at once (an agent kills the
        run it is doing) and wait for no compile."""
        try:
            if self._measurements is not None:
                self._measurements.close()
            if self._scheduler is not None:
                self._scheduler.close(abort=abort)
            if self._backend is not None:
                self._backend.close()
        finally:
            self.builds.close(wait=not abort)
            self.store.close()

    def stop_on(self, stop: threading.Event) -> None:
        """A graceful stop of the work this session serves: once ``stop`` is set, the session
        closes as on Ctrl-C (the runs in flight are dropped; a resume does them again)."""
        self._stop = stop

    def __enter__(self) -> Session:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        """The one shutdown of every session: a Ctrl-C (a KeyboardInterrupt ending the block)
        or a graceful stop (``stop_on``) aborts, since closing as usual would first run every
        pair still asked for; any other ending closes as usual."""
        ctrl_c = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        self.close(abort=ctrl_c or (self._stop is not None and self._stop.is_set()))


def with_overrides(config: Config, **changes: Any) -> Config:
    """A config with some top-level fields replaced (bench scripts: a temporary store)."""
    return replace(config, **changes)
