"""Experiment configuration: YAML, validated up front with one-line errors.

Every error names the file, the key and what was expected, so a typo in a config costs seconds,
not a failed overnight run.  ``configs/local.yaml`` is the default.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dispatcher.core.files import TextFileError, read_utf8
from dispatcher.running.backend import MODULES, backend_spec

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "local.yaml"
DEFAULT_STORE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) \
    / "inlining-orchestrator" / "store"


class ConfigError(ValueError):
    """A config file that cannot be used; the message is one line."""


class _KeyPathError(Exception):
    """A problem the YAML loader found at a key path (``run.timeout``, ``ssh.hosts[0].port``)."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that also refuses, at any depth, a key given twice in one mapping
    (plain YAML keeps the last silently) and a number that is not finite (``.nan``, ``.inf``,
    ``-.inf``, a float that overflows such as ``1.0e+999``), naming the key path.

    The checks walk the composed node tree before anything is constructed, so the path of every
    node is known.  A merge key (``<<: *anchor``) is not a duplicate of the keys it brings in.
    """

    def construct_document(self, node: yaml.Node) -> Any:
        self._check(node, "", set())
        return super().construct_document(node)

    def _check(self, node: yaml.Node, path: str, seen: set[int]) -> None:
        if id(node) in seen:  # an alias of a node checked already (or a recursive one)
            return
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: set[Any] = set()
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self._check(value_node, path, seen)
                    continue
                self._check(key_node, path, seen)
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                where = f"{path}.{name}" if path else str(name)
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in keys
                    keys.add(key)
                except TypeError:  # unhashable: the constructor reports it
                    duplicate = False
                if duplicate:
                    line = key_node.start_mark.line + 1
                    raise _KeyPathError(where, f"duplicate key (line {line})")
                self._check(value_node, where, seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self._check(item, f"{path}[{i}]", seen)
        elif node.tag == "tag:yaml.org,2002:float" and isinstance(node, yaml.ScalarNode):
            try:
                finite = math.isfinite(self.construct_yaml_float(node))
            except ValueError:  # an explicit !!float on something else
                finite = False
            if not finite:
                raise _KeyPathError(path or "(top level)",
                                    f"expected a finite number, got {node.value}")


#: Upper bounds of the config's counts and durations (documented in configs/local.yaml): past
#: them a value is a slip (a million seconds, a zero too many) that would fail hours later, or
#: never, in a job; it is refused up front with the file and key instead.
MAX_SECONDS = 24 * 3600  # run.timeout, scheduler.backoff_max_s (and local.lock_wait)
MAX_BACKOFF_S = 3600  # scheduler.backoff_s, ssh.connect_timeout
MAX_RUNS = 10_000  # run.runs, search.baseline_runs, measure.max_pairs
MAX_STEPS = 1_000_000  # search.steps, search.remeasure_every, measure.canary_every
MAX_CHAINS = 1_000  # search.chains, search.max_flips, scheduler.quarantine_after
MAX_ATTEMPTS = 100  # scheduler.attempts
MAX_PARALLEL = 1_024  # compile.jobs, search.candidates_per_step, search.in_flight
MAX_SEED = 2 ** 63 - 1  # search.seed, either sign


def _finite_number(v: Any) -> bool:
    """An int or float (not a bool) that is finite as a float (a huge int is not)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


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
    t_start: float = 0.04  # the research tool's schedule: 0.04 -> 0.001 over 300 steps
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


@dataclass(frozen=True)
class SchedulerConfig:
    """What happens when a worker is lost (its connection broke, its agent died)."""

    attempts: int = 3  # runs of one job on different slots before it is reported failed
    quarantine_after: int = 5  # consecutive losses before a slot is taken out of service
    backoff_s: float = 1.0  # first pause before re-probing a lost slot; doubles each time
    backoff_max_s: float = 60.0


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
    # Each backend section present (and the chosen backend's), as its module parsed it.
    backends: dict[str, Any] = field(default_factory=dict)
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def backend_settings(self) -> Any:
        """The chosen backend's own settings (``dispatcher.running.local.LocalConfig``, ...)."""
        return self.backends[self.backend]


class ConfigReader:
    """What parsers of config sections use: one-line errors naming the file and key, and
    the common value checks.  Backends get one for their own section."""

    def __init__(self, path: Path | None):
        self.path = path

    def fail(self, key: str, expected: str, got: Any = None) -> ConfigError:
        where = str(self.path) if self.path else "<config>"
        tail = "" if got is None else f", got {got!r}"
        return ConfigError(f"{where}: {key}: expected {expected}{tail}")

    def section(self, data: dict, key: str, allowed: set[str]) -> dict:
        value = data.get(key, {})
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.fail(key, "a mapping", value)
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.fail(f"{key}.{unknown[0]}", f"one of {', '.join(sorted(allowed))}",)
        return value

    def positive_int(self, data: dict, key: str, name: str, default: int, *, most: int) -> int:
        v = data.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= most:
            raise self.fail(name, f"a positive integer, at most {most}", v)
        return v

    def count(self, data: dict, key: str, name: str, default: int, *, most: int,
              what: str = "a number of steps") -> int:
        """A whole number where 0 means never."""
        v = data.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= most:
            raise self.fail(name, f"{what} from 0 (never) to {most}", v)
        return v

    def positive_number(self, data: dict, key: str, name: str, default: float, *, most: float,
                        what: str = "a positive number") -> float:
        v = data.get(key, default)
        if not _finite_number(v) or not 0 < v <= most:
            raise self.fail(name, f"{what}, at most {most:g}", v)
        return float(v)

    def local_path(self, value: Any, name: str, expected: str = "a file path") -> Path:
        """A path on the master: ~ expanded, relative to the config file's directory."""
        if not isinstance(value, str) or not value or "\0" in value:
            raise self.fail(name, expected, value)
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else (self.path.parent if self.path else Path.cwd()) / p


def parse_config(data: Any, path: Path | None = None) -> Config:
    r = ConfigReader(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise r.fail("(top level)", "a mapping", type(data).__name__)
    top = {"backend", "store", "run", "compile", "search", "scheduler", "measure", *MODULES}
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
    perf = run.get("perf", True)
    if not isinstance(perf, bool):
        raise r.fail("run.perf", "true or false", perf)
    aslr = run.get("aslr", False)
    if not isinstance(aslr, bool):
        raise r.fail("run.aslr", "true or false", aslr)
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
    m = r.section(data, "measure", {"max_pairs", "half_width", "canary_every", "confirm"})
    half_width = m.get("half_width", MeasureConfig.half_width)
    if not _finite_number(half_width) or not 0 < half_width < 1:
        raise r.fail("measure.half_width", "a fraction between 0 and 1 (0.01: +-1%)",
                     half_width)
    canary_every = r.count(m, "canary_every", "measure.canary_every",
                           MeasureConfig.canary_every, most=MAX_STEPS)
    confirm = m.get("confirm", True)
    if not isinstance(confirm, bool):
        raise r.fail("measure.confirm", "true or false", confirm)
    measure = MeasureConfig(
        max_pairs=r.positive_int(m, "max_pairs", "measure.max_pairs", MeasureConfig.max_pairs,
                                 most=MAX_RUNS),
        half_width=float(half_width), canary_every=canary_every, confirm=confirm)
    return Config(path=path, backend=backend, store=store, search=search, scheduler=scheduler,
                  backends=backends, measure=measure,
                  run=RunConfig(runs=r.positive_int(run, "runs", "run.runs", RunConfig.runs,
                                                    most=MAX_RUNS),
                                timeout=timeout, perf=perf, size=size, aslr=aslr),
                  compile_jobs=jobs, compile_jobs_auto=jobs_raw == "auto", raw=data)


def _search_config(r: ConfigReader, data: dict, path: Path | None) -> SearchConfig:
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
        if not _finite_number(v) or v <= 0:
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


def load_config(path: Path | str | None = None) -> Config:
    """Load and validate a config file (default: ``configs/local.yaml``)."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        text = read_utf8(path)
    except TextFileError as exc:
        raise ConfigError(str(exc)) from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except _KeyPathError as exc:
        raise ConfigError(f"{path}: {exc.key}: {exc.message}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"{where}: YAML syntax error: {problem}") from None
    return parse_config(data, path)
