"""Experiment configuration: YAML, validated up front with one-line errors.

Every error names the file, the key and what was expected, so a typo in a config costs seconds,
not a failed overnight run.  ``configs/local.yaml`` is the default.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "local.yaml"
DEFAULT_STORE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) \
    / "inlining-orchestrator" / "store"
BACKENDS = ("local", "ssh", "ray")


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


def _finite_number(v: Any) -> bool:
    """An int or float (not a bool) that is finite as a float (a huge int is not)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


@dataclass(frozen=True)
class LocalConfig:
    cpus: tuple[int, ...]  # one worker slot per CPU
    worker_class: str = "local"


@dataclass(frozen=True)
class RunConfig:
    runs: int = 5
    timeout: float = 120.0
    perf: bool = True
    size: str = "full"


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
    rundirs: Path = Path("rundirs")
    batch_log: Path = Path("batch.log")


@dataclass(frozen=True)
class SchedulerConfig:
    """What happens when a worker is lost (its connection broke, its agent died)."""

    attempts: int = 3  # runs of one job on different slots before it is reported failed
    quarantine_after: int = 5  # consecutive losses before a slot is taken out of service
    backoff_s: float = 1.0  # first pause before re-probing a lost slot; doubles each time
    backoff_max_s: float = 60.0


@dataclass(frozen=True)
class SshHost:
    """One benchmark machine reached over SSH: one worker slot per CPU listed."""

    name: str  # label in slot names and messages (default host, or host:port)
    host: str
    port: int
    user: str
    key_file: Path
    rundir: str  # on the worker; relative paths are relative to the user's home
    cpus: tuple[int, ...]
    python: str = "python3"
    cache_limit_bytes: int = 2 << 30
    worker_class: str = "ssh"


@dataclass(frozen=True)
class SshConfig:
    known_hosts: Path
    trust_on_first_use: bool
    connect_timeout: float
    hosts: tuple[SshHost, ...]


@dataclass(frozen=True)
class Config:
    path: Path | None
    backend: str
    store: Path
    local: LocalConfig
    run: RunConfig = field(default_factory=RunConfig)
    compile_jobs: int = 1
    search: SearchConfig = field(default_factory=SearchConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    ssh: SshConfig | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def backend_settings(self):
        """The chosen backend's own section, as its module parsed it."""
        return self.local if self.backend == "local" else self.ssh


def default_cpus() -> tuple[int, ...]:
    """Every CPU this process may use but one (the master's), at least one."""
    cpus = sorted(os.sched_getaffinity(0))
    return tuple(cpus[1:] if len(cpus) > 1 else cpus)


def master_cpus(worker_cpus: tuple[int, ...]) -> frozenset[int] | None:
    """The CPUs left to the master (its compiles) when local workers take ``worker_cpus``;
    None when workers take them all (then nothing can be kept apart)."""
    rest = frozenset(os.sched_getaffinity(0)) - set(worker_cpus)
    return rest or None


class _Reader:
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

    def positive_int(self, data: dict, key: str, name: str, default: int) -> int:
        v = data.get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise self.fail(name, "a positive integer", v)
        return v

    def positive_number(self, data: dict, key: str, name: str, default: float) -> float:
        v = data.get(key, default)
        if not _finite_number(v) or v <= 0:
            raise self.fail(name, "a positive number", v)
        return float(v)

    def local_path(self, value: Any, name: str, expected: str = "a file path") -> Path:
        """A path on the master: ~ expanded, relative to the config file's directory."""
        if not isinstance(value, str) or not value or "\0" in value:
            raise self.fail(name, expected, value)
        p = Path(os.path.expanduser(value))
        return p if p.is_absolute() else (self.path.parent if self.path else Path.cwd()) / p


def parse_config(data: Any, path: Path | None = None) -> Config:
    r = _Reader(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise r.fail("(top level)", "a mapping", type(data).__name__)
    top = {"backend", "store", "local", "run", "compile", "search", "scheduler", "ssh", "ray"}
    unknown = sorted(set(data) - top)
    if unknown:
        raise r.fail(unknown[0], f"a known key ({', '.join(sorted(top))})")
    backend = data.get("backend", "local")
    if backend not in BACKENDS:
        raise r.fail("backend", " or ".join(BACKENDS), backend)
    store_raw = data.get("store")
    store = DEFAULT_STORE if store_raw is None else \
        r.local_path(store_raw, "store", "a directory path")

    local = r.section(data, "local", {"cpus", "worker_class"})
    cpus_raw = local.get("cpus", "auto")
    allowed = set(os.sched_getaffinity(0))
    if cpus_raw == "auto":
        cpus = default_cpus()
    elif (isinstance(cpus_raw, list) and cpus_raw
          and all(isinstance(c, int) and not isinstance(c, bool) for c in cpus_raw)):
        missing = sorted(set(cpus_raw) - allowed)
        if missing:
            raise r.fail("local.cpus", f"CPUs of this machine ({sorted(allowed)})", missing)
        if len(set(cpus_raw)) != len(cpus_raw):
            raise r.fail("local.cpus", "distinct CPU numbers", cpus_raw)
        cpus = tuple(cpus_raw)
    else:
        raise r.fail("local.cpus", "auto or a list of CPU numbers", cpus_raw)
    worker_class = local.get("worker_class", "local")
    if not isinstance(worker_class, str) or not worker_class:
        raise r.fail("local.worker_class", "a non-empty string", worker_class)

    run = r.section(data, "run", {"runs", "timeout", "perf", "size"})
    timeout = run.get("timeout", RunConfig.timeout)
    if not _finite_number(timeout) or timeout <= 0:
        raise r.fail("run.timeout", "a positive number of seconds", timeout)
    perf = run.get("perf", True)
    if not isinstance(perf, bool):
        raise r.fail("run.perf", "true or false", perf)
    size = run.get("size", RunConfig.size)
    if not isinstance(size, str) or not size:
        raise r.fail("run.size", "a benchmark size name such as quick or full", size)

    compile_ = r.section(data, "compile", {"jobs"})
    jobs_raw = compile_.get("jobs", "auto")
    master = master_cpus(cpus) if backend == "local" else None
    jobs = (len(master) if master else (os.cpu_count() or 1)) if jobs_raw == "auto" else \
        r.positive_int(compile_, "jobs", "compile.jobs", 1)

    search = _search_config(r, data, path)
    sched = r.section(data, "scheduler", {"attempts", "quarantine_after", "backoff_s",
                                          "backoff_max_s"})
    scheduler = SchedulerConfig(
        attempts=r.positive_int(sched, "attempts", "scheduler.attempts", 3),
        quarantine_after=r.positive_int(sched, "quarantine_after", "scheduler.quarantine_after",
                                        5),
        backoff_s=r.positive_number(sched, "backoff_s", "scheduler.backoff_s", 1.0),
        backoff_max_s=r.positive_number(sched, "backoff_max_s", "scheduler.backoff_max_s", 60.0))
    ssh = _ssh_config(r, data) if backend == "ssh" or data.get("ssh") is not None else None
    if backend == "ssh" and ssh is None:
        raise r.fail("ssh", "a mapping with hosts (backend is ssh)")
    return Config(path=path, backend=backend, store=store, search=search, scheduler=scheduler,
                  ssh=ssh,
                  local=LocalConfig(cpus=cpus, worker_class=worker_class),
                  run=RunConfig(runs=r.positive_int(run, "runs", "run.runs", RunConfig.runs),
                                timeout=float(timeout), perf=perf, size=size),
                  compile_jobs=jobs, raw=data)


def _search_config(r: _Reader, data: dict, path: Path | None) -> SearchConfig:
    d = r.section(data, "search", {"algorithm", "steps", "chains", "seed", "baseline_runs",
                                   "candidates_per_step", "t_start", "t_end", "remeasure_every",
                                   "max_flips", "rundirs", "batch_log"})
    algorithm = d.get("algorithm", "sa")
    if algorithm not in ("sa", "random-walk"):
        raise r.fail("search.algorithm", "sa or random-walk", algorithm)
    temps: dict[str, float] = {}
    for key in ("t_start", "t_end"):
        v = d.get(key, getattr(SearchConfig, key))
        if not _finite_number(v) or v <= 0:
            raise r.fail(f"search.{key}", "a positive number", v)
        temps[key] = float(v)
    seed = d.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise r.fail("search.seed", "an integer", seed)
    cps = d.get("candidates_per_step", "auto")
    candidates = None if cps == "auto" else r.positive_int(d, "candidates_per_step",
                                                           "search.candidates_per_step", 1)
    remeasure = d.get("remeasure_every", 10)
    if not isinstance(remeasure, int) or isinstance(remeasure, bool) or remeasure < 0:
        raise r.fail("search.remeasure_every", "a number of steps (0: never)", remeasure)
    paths: dict[str, Path] = {}
    for key in ("rundirs", "batch_log"):
        v = d.get(key, str(getattr(SearchConfig, key)))
        if not isinstance(v, str) or not v:
            raise r.fail(f"search.{key}", "a path", v)
        p = Path(os.path.expanduser(v))
        paths[key] = p if p.is_absolute() else Path.cwd() / p
    return SearchConfig(
        algorithm=algorithm, seed=seed, candidates_per_step=candidates,
        steps=r.positive_int(d, "steps", "search.steps", 300),
        chains=r.positive_int(d, "chains", "search.chains", 1),
        baseline_runs=r.positive_int(d, "baseline_runs", "search.baseline_runs", 10),
        remeasure_every=remeasure,
        max_flips=r.positive_int(d, "max_flips", "search.max_flips", 2),
        t_start=temps["t_start"], t_end=temps["t_end"], rundirs=paths["rundirs"],
        batch_log=paths["batch_log"])


# A host name or address: letters, digits and the punctuation of names, IPv4 and IPv6.
_HOST_RE = re.compile(r"^[A-Za-z0-9._:%\[\]-]+$")


def _ssh_config(r: _Reader, data: dict) -> SshConfig:
    d = r.section(data, "ssh", {"known_hosts", "trust_on_first_use", "key_file", "user",
                                "connect_timeout", "hosts"})
    known_hosts = r.local_path(d.get("known_hosts", "~/.ssh/known_hosts"), "ssh.known_hosts")
    tofu = d.get("trust_on_first_use", False)
    if not isinstance(tofu, bool):
        raise r.fail("ssh.trust_on_first_use", "true or false", tofu)
    timeout = r.positive_number(d, "connect_timeout", "ssh.connect_timeout", 10.0)
    hosts_raw = d.get("hosts")
    if not isinstance(hosts_raw, list) or not hosts_raw:
        raise r.fail("ssh.hosts", "a non-empty list of hosts", hosts_raw)
    hosts, names = [], set()
    for i, h in enumerate(hosts_raw):
        where = f"ssh.hosts[{i}]"
        if not isinstance(h, dict):
            raise r.fail(where, "a mapping with host, user, rundir and cpus", h)
        allowed = {"name", "host", "port", "user", "key_file", "rundir", "cpus", "python",
                   "cache_limit_mb", "worker_class"}
        unknown = sorted(set(h) - allowed)
        if unknown:
            raise r.fail(f"{where}.{unknown[0]}", f"one of {', '.join(sorted(allowed))}")
        host = h.get("host")
        if not isinstance(host, str) or not _HOST_RE.match(host):
            raise r.fail(f"{where}.host", "a host name or address", host)
        port = h.get("port", 22)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise r.fail(f"{where}.port", "a TCP port number", port)
        name = h.get("name", host if port == 22 else f"{host}:{port}")
        if not isinstance(name, str) or not _HOST_RE.match(name):
            raise r.fail(f"{where}.name", "a label of letters, digits, '.', '_', ':' or '-'",
                         name)
        if name in names:
            raise r.fail(f"{where}.name", "a name no other host has", name)
        names.add(name)
        user = h.get("user", d.get("user"))
        if not isinstance(user, str) or not user or any(c in user for c in "\0\n@"):
            raise r.fail(f"{where}.user", "a user name (here or as ssh.user)", user)
        key_file = r.local_path(h.get("key_file", d.get("key_file", "~/.ssh/id_ed25519")),
                                f"{where}.key_file")
        rundir = h.get("rundir")
        if (not isinstance(rundir, str) or not rundir.strip() or any(c in rundir for c in "\0\n")
                or ".." in rundir.split("/")):
            raise r.fail(f"{where}.rundir", "a directory on the worker (absolute, or relative "
                         "to the user's home; no '..')", rundir)
        cpus = h.get("cpus")
        if (not isinstance(cpus, list) or not cpus or len(set(cpus)) != len(cpus)
                or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0
                           for c in cpus)):
            raise r.fail(f"{where}.cpus", "a list of distinct CPU numbers", cpus)
        python = h.get("python", "python3")
        if not isinstance(python, str) or not python or any(c in python for c in "\0\n"):
            raise r.fail(f"{where}.python", "the worker's python3 (a command or path)", python)
        limit_mb = r.positive_int(h, "cache_limit_mb", f"{where}.cache_limit_mb", 2048)
        worker_class = h.get("worker_class", "ssh")
        if not isinstance(worker_class, str) or not worker_class or "\0" in worker_class:
            raise r.fail(f"{where}.worker_class", "a non-empty string", worker_class)
        hosts.append(SshHost(name=name, host=host, port=port, user=user, key_file=key_file,
                             rundir=rundir, cpus=tuple(cpus), python=python,
                             cache_limit_bytes=limit_mb << 20, worker_class=worker_class))
    return SshConfig(known_hosts=known_hosts, trust_on_first_use=tofu, connect_timeout=timeout,
                     hosts=tuple(hosts))


def load_config(path: Path | str | None = None) -> Config:
    """Load and validate a config file (default: ``configs/local.yaml``)."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror})") from None
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
