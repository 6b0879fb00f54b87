"""Experiment configuration: YAML, validated up front with one-line errors.

Every error names the file, the key and what was expected, so a typo in a config costs seconds,
not a failed overnight run.  ``configs/local.yaml`` is the default.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dispatcher.core.figures import METRICS
from dispatcher.core.guards import CostGuard
from dispatcher.core.validation import (
    MAX_ATTEMPTS,
    MAX_BACKOFF_S,
    MAX_CHAINS,
    MAX_PARALLEL,
    MAX_RUNS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_STEPS,
    FileKeyError,
    Reader,
    finite_number,
    load_strict_file,
)
from dispatcher.running.backend import MODULES, backend_spec
from dispatcher.running.measurement import DEFAULT_MIN_CPU_SHARE, SHARE_MARGIN
from dispatcher.running.scheduler import SchedulerConfig

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "local.yaml"
DEFAULT_STORE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) \
    / "inlining-orchestrator" / "store"


class ConfigError(FileKeyError):
    """A config file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class RunConfig:
    runs: int = 5
    timeout: float = 120.0
    perf: bool = True
    size: str = "full"
    aslr: bool = False  # randomise the layout per run instead of fixing it (RunJob.aslr)


@dataclass(frozen=True)
class SearchConfig:
    algorithm: str = "sa"
    steps: int = 300
    chains: int = 1
    seed: int = 0
    baseline_runs: int = 10
    candidates_per_step: int | None = None  # None: one per worker slot
    # 0.01 -> 0.001 (the research tool's started at 0.04): bench/search_truth found a planted
    # 5% gain in more chains with 0.01 (docs/simulation.md, "The defaults")
    t_start: float = 0.01
    t_end: float = 0.001
    remeasure_every: int = 10
    max_flips: int = 2
    focus: str = "hot"  # "hot": flips favour code the baseline ran in; "uniform"
    # "sync": a step waits for all its candidates; "async": each candidate is judged as it
    # lands, with in_flight kept in flight (None: the chain's share of the slots, plus one)
    mode: str = "sync"
    in_flight: int | None = None
    rundirs: Path = Path("rundirs")
    batch_log: Path = Path("batch.log")


@dataclass(frozen=True)
class MeasureConfig:
    """How a candidate's speedup is measured: in pairs with the baseline on one worker CPU
    (docs/measurement.md).  ``run.runs`` is the fewest pairs."""

    max_pairs: int = 20  # the run budget of one comparison, in pairs
    half_width: float = 0.01  # stop once the 95% interval is within +-1% of the speedup
    canary_every: int = 10  # steps between A/A canaries (the baseline against itself); 0: none
    confirm: bool = True  # measure the best candidate again at the end of a chain
    # A timed run whose CPU share (CPU time / wall time) is below this is disturbed and never
    # used, whatever its binary's own share (0: no floor; the relative check stays).
    min_cpu_share: float = DEFAULT_MIN_CPU_SHARE
    # ... and a run more than this below its binary's own quiet share on its slot (1: no
    # relative check)
    share_margin: float = SHARE_MARGIN
    # What a comparison measures (docs/measurement.md, "Exact metrics"): "time" (paired wall
    # time), or "instructions" / "cycles" (one cachegrind run of each binary, exact)
    metric: str = "time"


# Replaces the floor's default (not a config's own key): for a machine whose runs never reach
# it (a guest VM with steal time, a test suite on a shared CPU).
MIN_CPU_SHARE_ENV = "INLINING_ORCHESTRATOR_MIN_CPU_SHARE"
SHARE_MARGIN_ENV = "INLINING_ORCHESTRATOR_SHARE_MARGIN"  # the same, for measure.share_margin


def _share_from_env(name: str, default: float, most_inclusive: bool, expected: str) -> float:
    """``$name`` as a share from 0 up to 1 (inclusive or not) when set, else ``default``;
    ConfigError (one line naming the variable) if it is not one."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (0 <= value <= 1 if most_inclusive else 0 <= value < 1):
        raise ConfigError(f"${name}: expected {expected}, got {raw!r}")
    return value


def default_min_cpu_share() -> float:
    """``$INLINING_ORCHESTRATOR_MIN_CPU_SHARE`` when set, else DEFAULT_MIN_CPU_SHARE."""
    return _share_from_env(MIN_CPU_SHARE_ENV, DEFAULT_MIN_CPU_SHARE, False,
                           "a CPU share from 0 (no floor) to below 1")


def default_share_margin() -> float:
    """``$INLINING_ORCHESTRATOR_SHARE_MARGIN`` when set, else SHARE_MARGIN."""
    return _share_from_env(SHARE_MARGIN_ENV, SHARE_MARGIN, True,
                           "a share from 0 to 1 (no relative check)")


@dataclass(frozen=True)
class Config:
    path: Path | None
    backend: str
    store: Path
    run: RunConfig = field(default_factory=RunConfig)
    compile_jobs: int = 1
    compile_jobs_auto: bool = False  # compile.jobs: auto (one per CPU left to the master)
    search: SearchConfig = field(default_factory=SearchConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    # The cost guards of a policy's build against the heuristic's (``policy:`` section;
    # dispatcher.core.guards): past either, a program is counted at the heuristic's figure
    policy: CostGuard = field(default_factory=CostGuard)
    # Each backend section present (and the chosen backend's), as its module parsed it.
    backends: dict[str, Any] = field(default_factory=dict)
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def backend_settings(self) -> Any:
        """The chosen backend's own settings (``dispatcher.running.local.LocalConfig``, ...)."""
        return self.backends[self.backend]


def config_reader(path: Path | None) -> Reader:
    """The reader of a config file's sections (backends get it for theirs): ConfigErrors."""
    return Reader(path, ConfigError.at, unnamed="<config>")


def parse_config(data: Any, path: Path | None = None) -> Config:
    r = config_reader(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise r.fail("(top level)", "a mapping", type(data).__name__)
    top = {"backend", "store", "run", "compile", "search", "scheduler", "measure", "policy",
           *MODULES}
    unknown = sorted(set(data) - top)
    if unknown:
        raise r.fail(unknown[0], f"a known key ({', '.join(sorted(top))})")
    backend = data.get("backend", "local")
    if backend not in MODULES:
        raise r.fail("backend", " or ".join(MODULES), backend)
    store_raw = data.get("store")
    store = DEFAULT_STORE if store_raw is None else \
        r.local_path(store_raw, "store", "a directory path")
    backends = {}
    for name in MODULES:  # every section present is checked, the chosen one always parsed
        if name == backend or data.get(name) is not None:
            raw = data.get(name)
            if raw is None:
                raw = {}
            if not isinstance(raw, dict):
                raise r.fail(name, "a mapping", raw)
            backends[name] = backend_spec(name).parse(raw, r)

    run = r.section(data, "run", {"runs", "timeout", "perf", "size", "aslr"})
    timeout = r.positive_number(run, "timeout", "run.timeout", RunConfig.timeout,
                                most=MAX_SECONDS, what="a positive number of seconds")
    perf = r.boolean(run, "perf", "run.perf", RunConfig.perf)
    aslr = r.boolean(run, "aslr", "run.aslr", RunConfig.aslr)
    size = run.get("size", RunConfig.size)
    if not isinstance(size, str) or not size:
        raise r.fail("run.size", "a benchmark size name such as quick or full", size)

    compile_ = r.section(data, "compile", {"jobs"})
    jobs_raw = compile_.get("jobs", "auto")
    master = backend_spec(backend).master_cpus(backends[backend])
    jobs = (len(master) if master else (os.cpu_count() or 1)) if jobs_raw == "auto" else \
        r.positive_int(compile_, "jobs", "compile.jobs", 1, most=MAX_PARALLEL)

    search = _search_config(r, data, path)
    sched = r.section(data, "scheduler", {"attempts", "quarantine_after", "backoff_s",
                                          "backoff_max_s"})
    scheduler = SchedulerConfig(
        attempts=r.positive_int(sched, "attempts", "scheduler.attempts", 3, most=MAX_ATTEMPTS),
        quarantine_after=r.positive_int(sched, "quarantine_after", "scheduler.quarantine_after",
                                        5, most=MAX_CHAINS),
        backoff_s=r.positive_number(sched, "backoff_s", "scheduler.backoff_s", 1.0,
                                    most=MAX_BACKOFF_S, what="a positive number of seconds"),
        backoff_max_s=r.positive_number(sched, "backoff_max_s", "scheduler.backoff_max_s", 60.0,
                                        most=MAX_SECONDS, what="a positive number of seconds"))
    m = r.section(data, "measure", {"max_pairs", "half_width", "canary_every", "confirm",
                                    "min_cpu_share", "share_margin", "metric"})
    metric = m.get("metric", MeasureConfig.metric)
    if metric not in METRICS:
        raise r.fail("measure.metric", " | ".join(METRICS), metric)
    half_width = m.get("half_width", MeasureConfig.half_width)
    if not finite_number(half_width) or not 0 < half_width < 1:
        raise r.fail("measure.half_width", "a fraction between 0 and 1 (0.01: +-1%)",
                     half_width)
    canary_every = r.count(m, "canary_every", "measure.canary_every",
                           MeasureConfig.canary_every, most=MAX_STEPS)
    confirm = r.boolean(m, "confirm", "measure.confirm", MeasureConfig.confirm)
    min_share = m.get("min_cpu_share")
    if min_share is None:
        min_share = default_min_cpu_share()
    elif not finite_number(min_share) or not 0 <= min_share < 1:
        raise r.fail("measure.min_cpu_share", "a CPU share from 0 (no floor) to below 1 "
                     "(0.8: runs below 80% are disturbed)", min_share)
    margin = m.get("share_margin")
    if margin is None:
        margin = default_share_margin()
    elif not finite_number(margin) or not 0 <= margin <= 1:
        raise r.fail("measure.share_margin", "a share from 0 to 1 (0.05: runs 5 points below "
                     "their binary's quiet share are disturbed; 1: no such check)", margin)
    measure = MeasureConfig(
        max_pairs=r.positive_int(m, "max_pairs", "measure.max_pairs", MeasureConfig.max_pairs,
                                 most=MAX_RUNS),
        half_width=float(half_width), canary_every=canary_every, confirm=confirm,
        min_cpu_share=float(min_share), share_margin=float(margin), metric=metric)
    return Config(path=path, backend=backend, store=store, search=search, scheduler=scheduler,
                  backends=backends, measure=measure, policy=_cost_guard(r, data),
                  run=RunConfig(runs=r.positive_int(run, "runs", "run.runs", RunConfig.runs,
                                                    most=MAX_RUNS),
                                timeout=timeout, perf=perf, size=size, aslr=aslr),
                  compile_jobs=jobs, compile_jobs_auto=jobs_raw == "auto", raw=data)


def _cost_guard(r: Reader, data: dict) -> CostGuard:
    """The ``policy:`` section: each limit a ratio to the heuristic's build from 1 (a build
    no worse than the heuristic's is never past it) up to 1e6."""
    d = r.section(data, "policy", {"max_compile_ratio", "max_size_ratio"})
    limits: dict[str, float] = {}
    for key in ("max_compile_ratio", "max_size_ratio"):
        v = d.get(key, getattr(CostGuard, key))
        if not finite_number(v) or not 1 <= v <= 1e6:
            raise r.fail(f"policy.{key}", "a ratio to the heuristic's build from 1 to 1e6 "
                         "(2: twice the heuristic's)", v)
        limits[key] = float(v)
    return CostGuard(**limits)


def _search_config(r: Reader, data: dict, path: Path | None) -> SearchConfig:
    d = r.section(data, "search", {"algorithm", "steps", "chains", "seed", "baseline_runs",
                                   "candidates_per_step", "t_start", "t_end", "remeasure_every",
                                   "max_flips", "focus", "mode", "in_flight", "rundirs",
                                   "batch_log"})
    algorithm = d.get("algorithm", "sa")
    if algorithm not in ("sa", "random-walk"):
        raise r.fail("search.algorithm", "sa or random-walk", algorithm)
    temps: dict[str, float] = {}
    for key in ("t_start", "t_end"):
        v = d.get(key, getattr(SearchConfig, key))
        if not finite_number(v) or v <= 0:
            raise r.fail(f"search.{key}", "a positive number", v)
        temps[key] = float(v)
    focus = d.get("focus", "hot")
    if focus not in ("hot", "uniform"):
        raise r.fail("search.focus", "hot or uniform", focus)
    seed = d.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or abs(seed) > MAX_SEED:
        raise r.fail("search.seed", f"an integer from -{MAX_SEED} to {MAX_SEED}", seed)
    cps = d.get("candidates_per_step", "auto")
    candidates = None if cps == "auto" else r.positive_int(
        d, "candidates_per_step", "search.candidates_per_step", 1, most=MAX_PARALLEL)
    remeasure = r.count(d, "remeasure_every", "search.remeasure_every", 10, most=MAX_STEPS)
    mode = d.get("mode", "sync")
    if mode not in ("sync", "async"):
        raise r.fail("search.mode", "sync or async", mode)
    flights = d.get("in_flight", "auto")
    in_flight = None if flights == "auto" else r.positive_int(
        d, "in_flight", "search.in_flight", 1, most=MAX_PARALLEL)
    paths: dict[str, Path] = {}
    for key in ("rundirs", "batch_log"):
        v = d.get(key, str(getattr(SearchConfig, key)))
        if not isinstance(v, str) or not v:
            raise r.fail(f"search.{key}", "a path", v)
        p = Path(os.path.expanduser(v))
        paths[key] = p if p.is_absolute() else Path.cwd() / p
    return SearchConfig(
        algorithm=algorithm, seed=seed, candidates_per_step=candidates,
        steps=r.positive_int(d, "steps", "search.steps", 300, most=MAX_STEPS),
        chains=r.positive_int(d, "chains", "search.chains", 1, most=MAX_CHAINS),
        baseline_runs=r.positive_int(d, "baseline_runs", "search.baseline_runs", 10,
                                     most=MAX_RUNS),
        remeasure_every=remeasure,
        max_flips=r.positive_int(d, "max_flips", "search.max_flips", 2, most=MAX_CHAINS),
        focus=focus, mode=mode, in_flight=in_flight,
        t_start=temps["t_start"], t_end=temps["t_end"], rundirs=paths["rundirs"],
        batch_log=paths["batch_log"])


def with_metric(config: Config, metric: str | None) -> Config:
    """``config`` measuring in ``metric`` (a command's ``--metric``; None: as it says)."""
    if metric is None or metric == config.measure.metric:
        return config
    return replace(config, measure=replace(config.measure, metric=metric))


def load_config(path: Path | str | None = None) -> Config:
    """Load and validate a config file (default: ``configs/local.yaml``)."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    return parse_config(load_strict_file(path, ConfigError), path)
