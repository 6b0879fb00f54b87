"""A campaign's settings, its stages and its state: what ``run-campaign`` runs, in which order,
with which arguments, and what it has done so far.  No printing and no processes here
(``commands.run_campaign`` runs the stages); every function is pure but for the reading and
writing of the campaign's own files.

A campaign is the whole pipeline on one set of programs: search the training split, measure
sites, assign rewards, train a policy with measured validation, measure it with the baselines
on the test split and the optimal trees on the training split, then publish what is small and
meaningful under ``results``.  Each stage is one of the project's own commands, run in the
campaign directory (so the config's relative ``search.rundirs`` and ``search.batch_log`` land
there); a stage stopped half-way continues through that command's own resume.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from dispatcher.build.manifest import SPLITS, ManifestError, resolve_benchmark
from dispatcher.config import ConfigError, load_config
from dispatcher.core.files import TextFileError, read_utf8, write_text_atomic
from dispatcher.core.rundir import RundirError, read_batch_log
from dispatcher.core.validation import MAX_RUNS, MAX_STEPS, KeyPathError, Reader, load_strict

STATE_VERSION = 1
STATE_FILE = "campaign.json"
SEARCHES = ("sa", "random-walk")
SITES = "sites"
CLASSIFIERS = ("all", "logistic", "boosted", "mlp")
MAX_WORKER_HOURS = 1e6


class CampaignError(ValueError):
    """A campaign file or campaign directory that cannot be used; the message is one line."""

    @classmethod
    def at(cls, file: str, key: str, message: str) -> CampaignError:
        return cls(f"{file}: {key}: {message}")


# ---------------------------------------------------------------------- settings

@dataclass(frozen=True)
class SearchStage:
    benchmarks: tuple[str, ...] = ("training",)
    algorithm: str = "sa"
    steps: int = 40
    chains: int = 1
    seed: int = 0
    size: str = ""  # the benchmark size searched at ("": the campaign's size)


@dataclass(frozen=True)
class LabelsStage:
    runs: int = 4
    max_pairs: int = 8
    max_tests: int = 12
    sweep: int = 4
    retest: bool = True


@dataclass(frozen=True)
class PolicyStage:
    classifier: str = "all"
    gate: float = 0.95
    margin: float = 0.2
    growth_budget: int = 100
    runs: int = 4
    max_pairs: int = 8


@dataclass(frozen=True)
class EvaluateStage:
    benchmarks: tuple[str, ...] = ("test",)
    baselines: bool = True
    runs: int = 4
    max_pairs: int = 8


@dataclass(frozen=True)
class Campaign:
    """One campaign file, validated (``--quick``: with its ``quick`` section applied)."""

    source: Path  # the campaign file
    config: Path  # the experiment config every stage runs under (absolute)
    dir: Path  # state, rundirs, labels, rewards, policy, per-stage outputs (absolute)
    results: Path  # where the small outputs are published (absolute)
    size: str = "full"
    worker_hours: float = 24.0  # shared by the search and the sweeps
    search_share: float = 0.5  # the most of it the search may use
    rewards_model: str = "ridge"
    search: SearchStage = field(default_factory=SearchStage)
    labels: LabelsStage = field(default_factory=LabelsStage)
    policy: PolicyStage = field(default_factory=PolicyStage)
    evaluate: EvaluateStage = field(default_factory=EvaluateStage)
    quick: bool = False
    identity: str = ""  # sha256 of the settings that decide what the stages compute
    batch_log_setting: str = "batch.log"  # the config's search.batch_log, as written

    @property
    def budget_s(self) -> float:
        return self.worker_hours * 3600

    @property
    def batch_log(self) -> Path:
        """Where the stages' experiments are listed: the config's search.batch_log, a
        relative one in the campaign directory (where the stages run)."""
        p = Path(os.path.expanduser(self.batch_log_setting))
        return p if p.is_absolute() else self.dir / p

    @property
    def policy_file(self) -> Path:
        return self.dir / "policy.policy"


_TOP = {"config", "dir", "results", "size", "budget", "search", "labels", "rewards", "policy",
        "evaluate", "quick"}


def _benchmarks(r: Reader, value: Any, key: str) -> tuple[str, ...]:
    """A split name, or a list of benchmark names or directories, each checked now."""
    names = (value,) if isinstance(value, str) else r.string_list(value, key)
    if not names:
        raise r.fail(key, "a split (training, test) or a list of benchmarks", value)
    for n in names:
        if n in SPLITS:
            continue
        try:
            resolve_benchmark(n)
        except ManifestError as exc:
            raise r.error(key, f"unknown benchmark {n!r} ({exc})") from None
    return names


def _fraction(r: Reader, data: dict, key: str, name: str, default: float) -> float:
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise r.fail(name, "a number above 0, at most 1", v)
    return float(v)


def _merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra``'s keys replacing its own, mappings merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else v
    return out


def parse_campaign(data: Any, source: Path, *, quick: bool = False) -> Campaign:
    """The campaign ``data`` (a campaign file's YAML) describes; relative paths are relative
    to the campaign file's directory, as in a config."""
    r = Reader(source, CampaignError.at)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise r.fail_kind("(top level)", "a mapping", data)
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise r.fail(unknown[0], f"one of {', '.join(sorted(_TOP))}")
    if quick:
        overrides = r.section(data, "quick", _TOP - {"quick"})
        if not overrides:
            raise r.error("quick", "--quick needs a quick section (the keys it replaces)")
        data = _merge({k: v for k, v in data.items() if k != "quick"}, overrides)
    else:
        r.section(data, "quick", _TOP - {"quick"})

    def path(key: str, default: str) -> Path:
        return r.local_path(data.get(key, default), key, "a path").resolve()

    config = path("config", "local.yaml")
    try:
        load_config(config)
        raw = load_strict(read_utf8(config)) or {}
    except ConfigError as exc:
        raise r.error("config", str(exc)) from None
    batch_log = str(((raw.get("search") or {}).get("batch_log")) or "batch.log")
    size = data.get("size", "full")
    if size not in ("quick", "full"):
        raise r.fail("size", "quick or full", size)
    budget = r.section(data, "budget", {"worker_hours", "search_share"})
    worker_hours = r.positive_number(budget, "worker_hours", "budget.worker_hours", 24.0,
                                     most=MAX_WORKER_HOURS)
    share = _fraction(r, budget, "search_share", "budget.search_share", 0.5)

    s = r.section(data, "search", {"benchmarks", "algorithm", "steps", "chains", "seed",
                                   "size"})
    algorithm = s.get("algorithm", "sa")
    if algorithm not in SEARCHES:
        raise r.fail("search.algorithm", " or ".join(SEARCHES), algorithm)
    seed = s.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 31:
        raise r.fail("search.seed", "an integer from 0 to 2147483647", seed)
    search = SearchStage(
        benchmarks=_benchmarks(r, s.get("benchmarks", "training"), "search.benchmarks"),
        algorithm=algorithm,
        steps=r.positive_int(s, "steps", "search.steps", 40, most=MAX_STEPS),
        chains=r.positive_int(s, "chains", "search.chains", 1, most=1000), seed=seed,
        size=s.get("size", size))
    if search.size not in ("quick", "full"):
        raise r.fail("search.size", "quick or full", search.size)

    lab = r.section(data, "labels", {"runs", "max_pairs", "max_tests", "sweep", "retest"})
    labels = LabelsStage(
        runs=max(2, r.positive_int(lab, "runs", "labels.runs", 4, most=MAX_RUNS)),
        max_pairs=r.positive_int(lab, "max_pairs", "labels.max_pairs", 8, most=MAX_RUNS),
        max_tests=r.positive_int(lab, "max_tests", "labels.max_tests", 12, most=10000),
        sweep=r.count(lab, "sweep", "labels.sweep", 4, most=10000,
                      what="a number of sites"),
        retest=r.boolean(lab, "retest", "labels.retest", True))
    if labels.max_pairs < labels.runs:
        raise r.fail("labels.max_pairs", f"at least labels.runs ({labels.runs})",
                     labels.max_pairs)

    rew = r.section(data, "rewards", {"model"})
    model = rew.get("model", "ridge")
    if model not in ("ridge", "lasso"):
        raise r.fail("rewards.model", "ridge or lasso", model)

    pol = r.section(data, "policy", {"classifier", "gate", "margin", "growth_budget", "runs",
                                     "max_pairs"})
    classifier = pol.get("classifier", "all")
    if classifier not in CLASSIFIERS:
        raise r.fail("policy.classifier", f"one of {', '.join(CLASSIFIERS)}", classifier)
    gate = r.positive_number(pol, "gate", "policy.gate", 0.95, most=10.0)
    margin = pol.get("margin", 0.2)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) \
            or not 0 <= margin <= 1:
        raise r.fail("policy.margin", "a number from 0 to 1", margin)
    policy = PolicyStage(
        classifier=classifier, gate=gate, margin=float(margin),
        growth_budget=r.count(pol, "growth_budget", "policy.growth_budget", 100,
                              most=999_999_999, what="a size in callee_size units"),
        runs=r.positive_int(pol, "runs", "policy.runs", 4, most=MAX_RUNS),
        max_pairs=r.positive_int(pol, "max_pairs", "policy.max_pairs", 8, most=MAX_RUNS))

    ev = r.section(data, "evaluate", {"benchmarks", "baselines", "runs", "max_pairs"})
    evaluate = EvaluateStage(
        benchmarks=_benchmarks(r, ev.get("benchmarks", "test"), "evaluate.benchmarks"),
        baselines=r.boolean(ev, "baselines", "evaluate.baselines", True),
        runs=r.positive_int(ev, "runs", "evaluate.runs", 4, most=MAX_RUNS),
        max_pairs=r.positive_int(ev, "max_pairs", "evaluate.max_pairs", 8, most=MAX_RUNS))

    campaign = Campaign(source=source, config=config, dir=path("dir", "campaign"),
                        results=path("results", "results"), size=size,
                        worker_hours=worker_hours, search_share=share, rewards_model=model,
                        search=search, labels=labels, policy=policy, evaluate=evaluate,
                        quick=quick, batch_log_setting=batch_log)
    return replace(campaign, identity=_identity(campaign))


def _identity(c: Campaign) -> str:
    """What decides the stages' results: not where they are written nor the budget (a resumed
    campaign may be given more), but the config, size and every stage's settings."""
    what = {"config": str(c.config), "size": c.size, "search": c.search.__dict__,
            "labels": c.labels.__dict__, "rewards": c.rewards_model,
            "policy": c.policy.__dict__, "evaluate": c.evaluate.__dict__}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=list).encode()).hexdigest()


def load_campaign(path: Path, *, quick: bool = False) -> Campaign:
    try:
        text = read_utf8(path)
    except TextFileError as exc:
        raise CampaignError(str(exc)) from None
    try:
        data = load_strict(text)
    except KeyPathError as exc:
        raise CampaignError(f"{path}: {exc.key}: {exc.message}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise CampaignError(f"{where}: YAML syntax error: "
                            f"{getattr(exc, 'problem', None) or 'invalid YAML'}") from None
    return parse_campaign(data, path, quick=quick)


# ---------------------------------------------------------------------- state

STAGES = ("search", "labels", "rewards", "policy", "evaluate", "optimal", "dataset",
          "publish")
DESCRIPTIONS = {
    "search": "search the training split (run_training_experiments)",
    "labels": "measure sites: attribute the winners, sweep hot sites (measure-sites)",
    "rewards": "assign rewards to the searches' decisions (assign-rewards)",
    "policy": "train the policy, validated by measurement (train-policy)",
    "evaluate": "the policy and the baselines on the evaluation split (run-plugin-benchmark)",
    "optimal": "the optimal trees of the rewards (run-all-benchmarks)",
    "dataset": "the labels, rewards and measured trees as a dataset (export-dataset)",
    "publish": "write the results (summary.csv, per-program CSVs, policy, README.md)",
}
DONE = ("done", "budget", "gate-failed", "skipped")


@dataclass(frozen=True)
class StageState:
    state: str = "pending"  # pending | running | done | budget | gate-failed | skipped | failed
    started: float | None = None
    finished: float | None = None
    runs: int = 0  # times it was started (a resume counts)
    exit: int | None = None
    note: str = ""

    @property
    def done(self) -> bool:
        return self.state in DONE


@dataclass(frozen=True)
class CampaignState:
    identity: str
    stages: dict[str, StageState]
    version: int = STATE_VERSION

    def next_stage(self) -> str | None:
        return next((s for s in STAGES if not self.stages[s].done), None)

    def with_stage(self, name: str, **changes: Any) -> CampaignState:
        return replace(self, stages={**self.stages,
                                     name: replace(self.stages[name], **changes)})


def new_state(campaign: Campaign) -> CampaignState:
    return CampaignState(identity=campaign.identity, stages={s: StageState() for s in STAGES})


def read_state(campaign: Campaign) -> CampaignState:
    """The campaign directory's state, a new one where there is none; CampaignError for a
    state of another campaign's settings or another format."""
    path = campaign.dir / STATE_FILE
    if not path.exists():
        return new_state(campaign)
    try:
        data = json.loads(read_utf8(path))
        if data.get("version") != STATE_VERSION:
            raise CampaignError(f"{path}: state format version {data.get('version')!r}; this "
                                f"run-campaign reads {STATE_VERSION}")
        stages = {s: StageState(**data["stages"][s]) for s in STAGES}
        identity = str(data["identity"])
    except (TextFileError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, CampaignError):
            raise
        raise CampaignError(f"{path}: not a campaign state ({exc})") from None
    if identity != campaign.identity:
        raise CampaignError(
            f"{path}: this campaign directory was started with other settings than "
            f"{campaign.source} now has (config, size or a stage's keys changed); give the "
            "campaign another dir, or put the settings back")
    return CampaignState(identity=identity, stages=stages)


def write_state(campaign: Campaign, state: CampaignState) -> None:
    data = {"version": state.version, "identity": state.identity,
            "stages": {s: state.stages[s].__dict__ for s in STAGES}}
    write_text_atomic(campaign.dir / STATE_FILE, json.dumps(data, indent=1) + "\n")


# ---------------------------------------------------------------------- the stages' commands

def experiments(batch_log: Path, kinds: Iterable[str]) -> list[Path]:
    """The rundirs the batch log lists of these algorithms, each once, in order."""
    if not batch_log.is_file():
        return []
    try:
        entries = read_batch_log(batch_log)
    except (RundirError, OSError) as exc:
        raise CampaignError(f"{batch_log}: unreadable batch log ({exc})") from None
    wanted, seen, out = set(kinds), set(), []
    for e in entries:
        p = Path(e.rundir)
        p = p if p.is_absolute() else batch_log.parent / p
        if e.algorithm in wanted and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def _tasks(names: Sequence[str]) -> list[str]:
    """Benchmark names or directories, a split expanded to its benchmarks' directories."""
    from dispatcher.build.manifest import bundled_benchmarks
    out: list[str] = []
    for n in names:
        out += ([str(b.directory) for b in bundled_benchmarks(n)] if n in SPLITS else [n])
    return out


def stage_command(campaign: Campaign, stage: str) -> list[str] | None:
    """The command line of ``stage`` (None: nothing to run: publish, or a stage with nothing
    to do), continuing through the command's own resume where the stage was started before.
    Every path is absolute: the stage runs in the campaign directory."""
    c, d = campaign, campaign.dir
    conf = ["--config", str(c.config)]
    searches = experiments(c.batch_log, SEARCHES)
    if stage == "search":
        if searches:  # started before: each rundir continues (a finished one says so)
            return ["run_training_experiments", *conf,
                    *[a for p in searches for a in ("--resume", str(p))]]
        return ["run_training_experiments", *conf, "--tasks", str(d / "search.tasks"),
                "--algorithm", c.search.algorithm, "--steps", str(c.search.steps),
                "--chains", str(c.search.chains), "--seed", str(c.search.seed),
                "--size", c.search.size]
    if stage == "labels":
        started = experiments(c.batch_log, [SITES])
        if started:
            return ["measure-sites", *conf, "--labels", str(d / "labels"),
                    *[a for p in started for a in ("--resume", str(p))]]
        return ["measure-sites", *conf, "--batch-log", str(c.batch_log), "--labels",
                str(d / "labels"), "--size", c.size, "--runs", str(c.labels.runs),
                "--max-pairs", str(c.labels.max_pairs), "--max-tests",
                str(c.labels.max_tests), "--sweep", str(c.labels.sweep),
                *(["--retest"] if c.labels.retest else [])]
    if stage == "rewards":
        if not searches:
            return None
        return ["assign-rewards", "--out", str(d / "rewards"), "--model", c.rewards_model,
                *[str(p) for p in searches]]
    if stage == "policy":
        labels = [a for a in ("--labels", str(d / "labels")) if (d / "labels").is_dir()]
        rewards = [a for a in ("--rewards", str(d / "rewards")) if (d / "rewards").is_dir()]
        return ["train-policy", *conf, *labels, *rewards, "--model", c.rewards_model,
                "--classifier", c.policy.classifier, "--margin", str(c.policy.margin),
                "--growth-budget", str(c.policy.growth_budget), "--validate", "measured",
                "--gate", str(c.policy.gate), "--size", c.size, "--runs",
                str(c.policy.runs), "--max-pairs", str(c.policy.max_pairs), "--out",
                str(c.policy_file)]
    if stage == "evaluate":
        return ["run-plugin-benchmark", *conf, str(c.policy_file), *_tasks(c.evaluate.benchmarks),
                *(["--baselines", *[a for t in c.search.benchmarks for a in ("--tune-on", t)]]
                  if c.evaluate.baselines else []),
                "--size", c.size, "--runs", str(c.evaluate.runs), "--max-pairs",
                str(c.evaluate.max_pairs), "--results", str(d / "results")]
    if stage == "optimal":
        if not (d / "rewards").is_dir():
            return None
        return ["run-all-benchmarks", *conf, c.rewards_model, "--rewards", str(d / "rewards"),
                "--size", c.size, "--runs", str(c.evaluate.runs), "--max-pairs",
                str(c.evaluate.max_pairs), "--results", str(d / "results")]
    if stage == "dataset":
        inputs = [*[a for a in ("--labels", str(d / "labels")) if (d / "labels").is_dir()],
                  *([a for a in ("--rewards", str(d / "rewards"), "--model", c.rewards_model)]
                    if (d / "rewards").is_dir() else []),
                  *(["--batch-log", str(c.batch_log)] if searches else [])]
        if not inputs:
            return None
        return ["export-dataset", *conf, *inputs, "--out", str(d / "dataset")]
    raise ValueError(f"unknown stage {stage!r}")


def write_tasks(campaign: Campaign) -> Path:
    """The search's tasks file, one benchmark per line."""
    path = campaign.dir / "search.tasks"
    write_text_atomic(path, "".join(f"{t}\n" for t in _tasks(campaign.search.benchmarks)))
    return path


# ---------------------------------------------------------------------- the budget

@dataclass
class WorkerClock:
    """Worker-seconds the campaign's experiments have spent running binaries, read from their
    journals: a search's timed runs (every candidate's and its reference's, a canary's, a
    confirmation's; a candidate the store answered costs nothing) and each label's and test's
    CPU seconds.  Files are read again only when they grew."""

    seen: dict[Path, tuple[int, float]] = field(default_factory=dict)

    def seconds(self, rundirs: Iterable[Path]) -> float:
        total = 0.0
        for r in rundirs:
            journal = r / "journal.jsonl"
            try:
                size = journal.stat().st_size
            except OSError:
                continue
            known = self.seen.get(journal)
            if known is None or known[0] != size:
                known = (size, _journal_seconds(journal))
                self.seen[journal] = known
            total += known[1]
        return total


def _run_seconds(value: Any) -> float:
    """The timed seconds in one journal record, wherever they sit in it."""
    if isinstance(value, list):
        return sum(_run_seconds(v) for v in value)
    if not isinstance(value, dict) or value.get("cached") is True:
        return 0.0
    if isinstance(value.get("cpu_s"), (int, float)):  # a label's or a test's outcome
        return float(value["cpu_s"])
    total = 0.0
    for k, v in value.items():
        if k in ("times", "reference_times") and isinstance(v, list):
            total += sum(x for x in v if isinstance(x, (int, float)) and math.isfinite(x))
        elif isinstance(v, (dict, list)):
            total += _run_seconds(v)
    return total


def _journal_seconds(journal: Path) -> float:
    total = 0.0
    try:
        with journal.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                try:
                    total += _run_seconds(json.loads(line))
                except ValueError:  # a line being written
                    continue
    except OSError:
        return 0.0
    return total


def stage_budget_s(campaign: Campaign, stage: str) -> float | None:
    """The worker-seconds the campaign may have spent when ``stage`` must stop (None: the
    budget does not bound it): the search its share, the sweeps the rest."""
    if stage == "search":
        return campaign.budget_s * campaign.search_share
    if stage == "labels":
        return campaign.budget_s
    return None


def now() -> float:
    return time.time()
