"""The data-generation driver: search chains that share one compile service and one scheduler.

Each chain (one benchmark, one rundir) runs in its own thread: propose candidates, compile
them, read back the tree the compiler really produced, measure, decide, journal.  Jobs of all
chains meet in the scheduler's queue, so a free worker slot takes whichever chain has work and
no slot idles while one chain compiles.  Chains only write their rundir and a ``status`` record
that the progress display reads: data flows one way.

Measurements are deduplicated across chains: a binary already measured in the store is not run
again (except when the incumbent is deliberately re-measured), and a request for a binary whose
run job is still queued or running (the K chains' common baseline, say) shares that job instead
of queueing another.
"""
from __future__ import annotations

import random
import shutil
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from dispatcher.benchmark import Benchmark
from dispatcher.compile import CompileError, CompileJob, CompileResult, CompileService
from dispatcher.rundir import Rundir
from dispatcher.scheduler import Scheduler
from dispatcher.search import energy, geomean, geomean_ci95, metropolis, propose, temperature
from dispatcher.files import write_json_atomic
from dispatcher.store import Store, measurement_key
from dispatcher.tree import Tree, count, to_overrides
from dispatcher.worker import RunJob, RunResult


@dataclass(frozen=True)
class SearchParams:
    algorithm: str  # "sa" | "random-walk"
    steps: int
    seed: int
    size: str
    runs: int
    baseline_runs: int
    candidates_per_step: int
    t_start: float = 0.04
    t_end: float = 0.001
    remeasure_every: int = 10
    max_flips: int = 2
    timeout: float = 120.0
    perf: bool = True


@dataclass
class ChainStatus:
    """What the progress display shows; written by the chain thread only."""

    task: str
    rundir: Path
    steps: int
    step: int = 0
    best_energy: float | None = None
    state: str = "starting"
    error: str | None = None


def _rng_to_json(rng: random.Random) -> list:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from_json(data: list) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng


def _counts(tree: Tree) -> dict:
    inlined, not_inlined, prevented = count(tree)
    return {"inlined": inlined, "not_inlined": not_inlined, "prevented": prevented}


def _pointer(step: int, candidate: dict) -> dict:
    """How the journal names a candidate kept as incumbent or best."""
    return {"step": step, **{k: candidate[k] for k in
                             ("candidate", "dir", "energy", "sha256", "artifact")}}


class Interrupted(Exception):
    pass


@dataclass(frozen=True)
class _Shared:
    """A run job another chain submitted and will store; this chain only reads its result."""

    future: Future


# Run jobs in flight per scheduler, by measurement key: (runs, future).
_running: "weakref.WeakKeyDictionary[Scheduler, dict[str, tuple[int, Future]]]" = \
    weakref.WeakKeyDictionary()
_running_lock = threading.Lock()


@dataclass
class Chain:
    rundir: Rundir
    benchmark: Benchmark
    params: SearchParams
    compiler: CompileService
    scheduler: Scheduler
    store: Store
    worker_class: str
    stop: threading.Event
    status: ChainStatus = field(init=False)

    def __post_init__(self) -> None:
        self.status = ChainStatus(self.benchmark.name, self.rundir.path, self.params.steps)

    # -- helpers

    def _check_stop(self) -> None:
        if self.stop.is_set():
            raise Interrupted

    def _wait(self, future: Future):
        """Wait for a future, but give up promptly on Ctrl-C (the job's result is dropped)."""
        while True:
            try:
                return future.result(timeout=0.2)
            except TimeoutError:
                self._check_stop()

    def _submit_runs(self, sha256: str, binary: Path, runs: int,
                     reuse: bool) -> Future | _Shared | list[RunResult]:
        """Queue a run job, or, if allowed, return the stored measurement of this binary or
        share a job for it that is still running (one with at least ``runs`` runs)."""
        size = self.benchmark.size(self.params.size)
        if reuse:
            known = [r for r in self.store.measurements_for(sha256, size.args, self.worker_class)
                     if len(r.records) >= runs]
            if known:
                return known[:1]
        job = RunJob(sha256=sha256, binary=binary, args=size.args, runs=runs,
                     timeout=self.params.timeout, expected_output=size.expected.to_json(),
                     perf=self.params.perf)
        if not reuse:
            return self.scheduler.submit(job)
        mkey = measurement_key(sha256, size.args, self.worker_class)
        with _running_lock:
            table = _running.setdefault(self.scheduler, {})
            running = table.get(mkey)
            if running is not None and running[0] >= runs and not (
                    running[1].done() and running[1].exception() is not None):
                return _Shared(running[1])
            future = self.scheduler.submit(job)
            table[mkey] = (runs, future)
        return future

    def _collect(self, pending: Future | _Shared | list[RunResult]
                 ) -> tuple[list[RunResult], bool]:
        """The results, and whether they were reused (from the store or another chain's job)
        rather than measured for this request."""
        if isinstance(pending, list):
            return pending, True
        if isinstance(pending, _Shared):
            return [self._wait(pending.future)], True
        try:
            result = self._wait(pending)
            self.store.add_measurement(result)
        finally:
            if pending.done():  # stored, or failed: later requests look again
                with _running_lock:
                    table = _running.get(self.scheduler, {})
                    for mkey, (_, future) in list(table.items()):
                        if future is pending:
                            del table[mkey]
        return [result], False

    @staticmethod
    def _times(results: list[RunResult]) -> list[float]:
        return [t for r in results for t in r.times]

    def _save_candidate(self, d: Path, compiled: CompileResult, results: list[RunResult]) -> None:
        for f in compiled.artifact.decision_files:
            shutil.copyfile(f, d / f.name)
        overrides = compiled.artifact.directory / "overrides.sexp"
        if overrides.exists():
            shutil.copyfile(overrides, d / "overrides.sexp")
        write_json_atomic(d / "measurements.json", [r.to_json() for r in results])

    # -- the search

    def run(self) -> None:
        try:
            self._run()
        except Interrupted:
            self.rundir.append({"event": "finish", "reason": "interrupted"})
            self.status.state = "interrupted"
        except Exception as exc:  # recorded in the rundir, never lost silently
            message = " ".join(str(exc).split())[:300] or type(exc).__name__
            self.rundir.append({"event": "finish", "reason": f"failed: {message}"})
            self.status.state, self.status.error = "failed", message

    def _baseline(self) -> dict:
        baseline = self.rundir.baseline()
        if baseline is not None:
            return baseline
        self.status.state = "baseline"
        compiled = self._wait(self.compiler.submit(CompileJob(self.benchmark)))
        results, _ = self._collect(self._submit_runs(compiled.sha256, compiled.binary,
                                                     self.params.baseline_runs, reuse=True))
        times = self._times(results)
        if not times:
            failure = next((rec.failure for r in results for rec in r.records if rec.failure),
                           "no successful run")
            raise RuntimeError(f"{self.benchmark.name}: baseline: {failure}")
        d = self.rundir.candidate_dir(0, 0)
        self._save_candidate(d, compiled, results)
        baseline = {"event": "baseline", "sha256": compiled.sha256, "dir": "steps/00000/c0",
                    "artifact": compiled.artifact.key,
                    "times": times, "geomean": geomean(times),
                    "median": sorted(times)[len(times) // 2],
                    "ci95": list(geomean_ci95(times)),
                    "decisions": _counts(Tree.from_dir(d))}
        self.rundir.append(baseline)
        return baseline

    def _run(self) -> None:
        p = self.params
        baseline = self._baseline()
        base = baseline["geomean"]
        last = self.rundir.last_step()
        if last is None:
            rng = random.Random(p.seed)
            incumbent = {"step": 0, "candidate": 0, "dir": baseline["dir"], "energy": 1.0,
                         "sha256": baseline["sha256"], "artifact": baseline["artifact"]}
            best = dict(incumbent)
            current_dir = baseline["dir"]  # random walk: the last compiled tree
            first = 1
        else:
            rng = _rng_from_json(last["rng"])
            incumbent, best = last["incumbent"], last["best"]
            current_dir = last.get("current", incumbent["dir"])
            first = last["step"] + 1
            self.rundir.append({"event": "resume", "from_step": first})
        incumbent_tree = Tree.from_dir(self.rundir.path / incumbent["dir"])
        current_tree = Tree.from_dir(self.rundir.path / current_dir)
        self.status.best_energy = best["energy"]
        t_begin = time.monotonic()

        for step in range(first, p.steps + 1):
            self._check_stop()
            self.status.step, self.status.state = step - 1, "compiling"
            temp = temperature(step, p.steps, p.t_start, p.t_end) if p.algorithm == "sa" else None
            origin = incumbent_tree if p.algorithm == "sa" else current_tree
            n = p.candidates_per_step if p.algorithm == "sa" else 1
            proposals = [propose(origin, rng, p.max_flips) for _ in range(n)]
            u = rng.random()  # the Metropolis draw, taken whatever happens
            futures = [self.compiler.submit(CompileJob(self.benchmark, tuple(to_overrides(t))))
                       for t, _ in proposals]
            candidates, compiled, trees = [], [], {}
            for k, ((_, mutation), future) in enumerate(zip(proposals, futures)):
                entry = {"candidate": k, "dir": f"steps/{step:05d}/c{k}", "mutation": mutation,
                         "sha256": None, "artifact": None, "cached": False, "decisions": None,
                         "times": [], "failed": 0, "energy": None, "error": None}
                try:
                    compiled.append(self._wait(future))
                    entry["sha256"] = compiled[-1].sha256
                    entry["artifact"] = compiled[-1].artifact.key
                except CompileError as exc:
                    compiled.append(None)
                    entry["error"] = f"compile failed: {exc}"
                candidates.append(entry)
            self.status.state = "running"
            # Submit every candidate's runs before waiting for any: slots fill at once.
            pending = {e["candidate"]: self._submit_runs(c.sha256, c.binary, p.runs, reuse=True)
                       for e, c in zip(candidates, compiled) if c is not None}
            for entry, c in zip(candidates, compiled):
                d = self.rundir.candidate_dir(step, entry["candidate"])
                if c is None:
                    continue
                results, cached = self._collect(pending[entry["candidate"]])
                self._save_candidate(d, c, results)
                times = self._times(results)
                trees[entry["candidate"]] = Tree.from_dir(d)  # what the compiler really did
                entry.update(cached=cached, decisions=_counts(trees[entry["candidate"]]),
                             times=times,
                             failed=sum(r.failed for r in results), energy=energy(times, base))
            scored = [e for e in candidates if e["energy"] is not None]
            chosen = min(scored, key=lambda e: e["energy"]) if scored else None
            if p.algorithm == "sa":
                accepted = chosen is not None and metropolis(incumbent["energy"],
                                                             chosen["energy"], temp, u)
            else:
                accepted = chosen is not None
            if accepted:
                incumbent = _pointer(step, chosen)
                incumbent_tree = trees[chosen["candidate"]]
                current_dir, current_tree = chosen["dir"], incumbent_tree
            for e in scored:
                if e["energy"] < best["energy"]:
                    best = _pointer(step, e)
            if (p.algorithm == "sa" and p.remeasure_every and step % p.remeasure_every == 0
                    and incumbent["step"] > 0):
                incumbent = self._remeasure(step, incumbent, base)
            self._check_stop()  # a step cut short by a stop is redone on resume, not recorded
            event = {"event": "step", "step": step, "temperature": temp,
                     "candidates": candidates,
                     "chosen": chosen["candidate"] if chosen else None, "accepted": accepted,
                     "incumbent": incumbent, "best": best, "current": current_dir,
                     "rng": _rng_to_json(rng), "elapsed_s": time.monotonic() - t_begin,
                     "busy_s": sum(self.scheduler.busy_s.values())}
            self.rundir.append(event)
            self.rundir.write_state({k: event[k] for k in
                                     ("step", "temperature", "incumbent", "best", "current",
                                      "rng")})
            self.status.step, self.status.best_energy = step, best["energy"]
        self.rundir.append({"event": "finish", "reason": "completed"})
        self.status.state = "finished"

    def _remeasure(self, step: int, incumbent: dict, base: float) -> dict:
        """Measure the incumbent again (noise must not keep a lucky candidate forever)."""
        artifact = self.store.artifact(incumbent["artifact"])
        if artifact is None:
            raise RuntimeError(f"{incumbent['dir']}: its compiled artifact left the store")
        result, _ = self._collect(self._submit_runs(artifact.sha256, artifact.binary,
                                                    self.params.runs, reuse=False))
        size = self.benchmark.size(self.params.size)
        times = self._times(self.store.measurements_for(artifact.sha256, size.args,
                                                        self.worker_class))
        new_energy = energy(times, base) if times else incumbent["energy"]
        d = self.rundir.path / "steps" / f"{step:05d}" / "remeasure"
        d.mkdir(parents=True, exist_ok=True)
        write_json_atomic(d / "measurements.json", [r.to_json() for r in result])
        self.rundir.append({"event": "remeasure", "step": step, "dir": incumbent["dir"],
                            "measurements": f"steps/{step:05d}/remeasure/measurements.json",
                            "times": self._times(result), "energy": new_energy})
        return {**incumbent, "energy": new_energy}


def new_experiment(bench: Benchmark, chain: int, config, slots: int, *,
                   algorithm: str | None = None, steps: int | None = None,
                   seed: int | None = None, size: str | None = None,
                   runs: int | None = None) -> dict:
    """The experiment record of a new chain: the config's search settings, then overrides."""
    s = config.search
    return {"task": bench.name, "benchmark": str(bench.directory),
            "algorithm": algorithm or s.algorithm,
            "seed": (s.seed if seed is None else seed) + chain, "chain": chain,
            "steps": steps or s.steps, "size": size or config.run.size,
            "runs": runs or config.run.runs, "baseline_runs": s.baseline_runs,
            "candidates_per_step": s.candidates_per_step or slots,
            "t_start": s.t_start, "t_end": s.t_end,
            "remeasure_every": s.remeasure_every, "max_flips": s.max_flips}


def params_of(experiment: dict, config) -> SearchParams:
    """Search parameters from a rundir's experiment record (so a resume uses the same)."""
    e = experiment
    return SearchParams(
        algorithm=e["algorithm"], steps=e["steps"], seed=e["seed"], size=e["size"],
        runs=e["runs"], baseline_runs=e["baseline_runs"],
        candidates_per_step=e["candidates_per_step"], t_start=e["t_start"], t_end=e["t_end"],
        remeasure_every=e["remeasure_every"], max_flips=e["max_flips"],
        timeout=config.run.timeout, perf=config.run.perf)
