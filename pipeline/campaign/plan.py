"""The campaign file: a campaign's settings, validated as the config is (``load_strict`` and
``Reader``: one line naming the file and the key for every bad value).

The defaults a campaign shares with other commands are their owners': the classifiers
(``analysis.policy_training``), the rewards models (``analysis.models``), the guard rails
(``dispatcher.build.policy_file``) and the measured gate (``pipeline.policy.selection``).
"""
from __future__ import annotations

import hashlib
import json
import os
import typing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from analysis.models import MODELS
from analysis.policy_training import CLASSIFIERS as TRAINED_CLASSIFIERS
from analysis.rewards import BOOTSTRAP_ROUNDS
from dispatcher.build.manifest import (
    SPLITS,
    ManifestError,
    is_benchmark_path,
    resolve_benchmark,
)
from dispatcher.build.policy_file import DEFAULT_GROWTH_BUDGET, DEFAULT_MARGIN
from dispatcher.config import ConfigError, load_config
from dispatcher.core.figures import METRICS
from dispatcher.core.files import sha256_file
from dispatcher.core.records import Algorithm
from dispatcher.core.validation import (
    MAX_RUNS,
    MAX_STEPS,
    FileKeyError,
    Reader,
    load_strict_file,
)
from pipeline.policy.choice import KINDS
from pipeline.policy.searched import SearchSpaceError, space_with
from pipeline.policy.selection import GATE

SEARCHES: tuple[str, ...] = typing.get_args(Algorithm)  # the search stage's algorithms
CLASSIFIERS = ("all", *TRAINED_CLASSIFIERS)  # all: train-policy validates each, keeps the best
# tiny: a smoke run of the whole pipeline (runs of 10-50 ms: every stage's machinery, figures
# that say little); quick and full as the manifests define them.
SIZES = ("tiny", "quick", "full")
_SIZES_SAID = "tiny, quick or full"
MAX_WORKER_HOURS = 1e6
MAX_BOOTSTRAP = 10000  # assign-rewards --bootstrap's most


class CampaignError(FileKeyError):
    """A campaign file or campaign directory that cannot be used; the message is one line."""


@dataclass(frozen=True)
class SearchStage:
    benchmarks: tuple[str, ...] = ("training",)
    algorithm: str = "sa"
    steps: int = 40
    chains: int = 1
    seed: int = 0
    size: str = ""  # the benchmark size searched at ("": the campaign's size)
    # what candidates are compared in: time, or an exact metric to screen on (the chains'
    # winners are confirmed in time, and everything published is measured in time)
    metric: str = "time"


@dataclass(frozen=True)
class LabelsStage:
    runs: int = 4
    max_pairs: int = 8
    max_tests: int = 12
    sweep: int = 4
    retest: bool = True
    metric: str = "time"  # an exact one: tests counted, every label retested in time
    # the size labels are measured (or counted) at ("": the campaign's); an exact metric's
    # retests are confirmed in wall time at full size whatever this is
    size: str = ""


@dataclass(frozen=True)
class FlipbacksStage:
    """measure-sites --reference after the labels stage (off unless the file turns it on):
    the ``sweep`` hottest sites an aggressive build inlined, each set back alone against that
    build, to learn where inlining hurts (docs/labels.md, "Labels from an aggressive
    reference"); measured as the labels stage measures (its runs, pairs, retest, metric) into
    the same tables, which keep both references side by side."""

    enabled: bool = False
    benchmarks: tuple[str, ...] = ("training",)
    reference: str = "always-inline"
    sweep: int = 10


@dataclass(frozen=True)
class PolicyStage:
    classifier: str = "all"
    gate: float = GATE
    margin: float = DEFAULT_MARGIN
    growth_budget: int = DEFAULT_GROWTH_BUDGET
    runs: int = 4
    max_pairs: int = 8


@dataclass(frozen=True)
class EvaluateStage:
    benchmarks: tuple[str, ...] = ("test",)
    baselines: bool = True
    runs: int = 4
    max_pairs: int = 8


@dataclass(frozen=True)
class SearchedStage:
    """search-policy after the other stages (off unless the file turns it on): a policy
    file's parameters searched for the training split's speedup, screened in ``metric`` at
    ``size``, the best confirmed in wall time at ``confirm_size`` ("": the campaign's)."""

    enabled: bool = False
    benchmarks: tuple[str, ...] = ("training",)
    trials: int = 40
    metric: str = "cycles"
    size: str = "tiny"
    confirm_size: str = ""
    seed: int = 0
    runs: int = 4
    max_pairs: int = 8
    discounts: tuple[str, ...] = ()  # features whose growth discount is searched too


@dataclass(frozen=True)
class SelectStage:
    """select-policy after the searched stage (off unless the file turns it on): the kind of
    policy kept by leave-fold-out measurement on the training split, the classifier and
    combined kinds trained on the labels stage's tables (docs/policies.md, "Choosing the
    kind of policy")."""

    enabled: bool = False
    benchmarks: tuple[str, ...] = ("training",)
    kinds: tuple[str, ...] = KINDS
    folds: int = 3
    trials: int = 20
    metric: str = "cycles"
    size: str = "tiny"
    classifier: str = "mlp"
    seed: int = 0


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
    # kept for the flipbacks stage (when on): the labels stage stops at the rest
    flipbacks_share: float = 0.25
    rewards_model: str = "ridge"
    rewards_bootstrap: int = BOOTSTRAP_ROUNDS  # assign-rewards --bootstrap
    # assign-rewards --plots: figures only, so not part of the identity
    rewards_plots: bool = True
    search: SearchStage = field(default_factory=SearchStage)
    labels: LabelsStage = field(default_factory=LabelsStage)
    flipbacks: FlipbacksStage = field(default_factory=FlipbacksStage)
    policy: PolicyStage = field(default_factory=PolicyStage)
    evaluate: EvaluateStage = field(default_factory=EvaluateStage)
    searched: SearchedStage = field(default_factory=SearchedStage)
    select: SelectStage = field(default_factory=SelectStage)
    quick: bool = False
    identity: str = ""  # sha256 of the settings that decide what the stages compute
    # the identity before it covered the files' content (a campaign directory it started
    # is taken over: read_state)
    legacy_identity: str = ""
    # the content (sha256) of every file the stages run on: the experiment config, a model
    # file it names, each benchmark given as a directory (its sources)
    inputs: tuple[tuple[str, str], ...] = ()
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


_TOP = {"config", "dir", "results", "size", "budget", "search", "labels", "flipbacks",
        "rewards", "policy", "evaluate", "searched", "select", "quick"}
#: The references the flipbacks stage may set sites back from (a tree is one program's).
FLIPBACK_REFERENCES = ("always-inline",)


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


def _fraction(r: Reader, data: dict, key: str, name: str, default: float, *,
              zero: bool = False) -> float:
    """A number above 0 (``zero``: from 0), at most 1."""
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) \
            or not (0 <= v if zero else 0 < v) or not v <= 1:
        raise r.fail(name, "a number from 0 to 1" if zero else "a number above 0, at most 1",
                     v)
    return float(v)


def _choice(r: Reader, data: dict, key: str, name: str, default: str,
            choices: tuple[str, ...], expected: str) -> str:
    v = data.get(key, default)
    if v not in choices:
        raise r.fail(name, expected, v)
    return v


def _merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra``'s keys replacing its own, mappings merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) \
            else v
    return out


def _search(r: Reader, data: dict, size: str) -> SearchStage:
    d = SearchStage()
    s = r.section(data, "search", {"benchmarks", "algorithm", "steps", "chains", "seed",
                                   "size", "metric"})
    seed = s.get("seed", d.seed)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 31:
        raise r.fail("search.seed", "an integer from 0 to 2147483647", seed)
    return SearchStage(
        benchmarks=_benchmarks(r, s.get("benchmarks", "training"), "search.benchmarks"),
        algorithm=_choice(r, s, "algorithm", "search.algorithm", d.algorithm, SEARCHES,
                          " or ".join(SEARCHES)),
        steps=r.positive_int(s, "steps", "search.steps", d.steps, most=MAX_STEPS),
        chains=r.positive_int(s, "chains", "search.chains", d.chains, most=1000), seed=seed,
        size=_choice(r, s, "size", "search.size", size, SIZES, _SIZES_SAID),
        metric=_choice(r, s, "metric", "search.metric", d.metric, METRICS,
                       " | ".join(METRICS)))


def _labels(r: Reader, data: dict, size: str) -> LabelsStage:
    d = LabelsStage()
    lab = r.section(data, "labels", {"runs", "max_pairs", "max_tests", "sweep", "retest",
                                     "metric", "size"})
    runs = lab.get("runs", d.runs)
    if not isinstance(runs, int) or isinstance(runs, bool) or not 2 <= runs <= MAX_RUNS:
        raise r.fail("labels.runs", f"an integer from 2 to {MAX_RUNS} (a label's interval "
                     "needs two pairs at least)", runs)
    labels = LabelsStage(
        runs=runs,
        max_pairs=r.positive_int(lab, "max_pairs", "labels.max_pairs", d.max_pairs,
                                 most=MAX_RUNS),
        max_tests=r.positive_int(lab, "max_tests", "labels.max_tests", d.max_tests,
                                 most=10000),
        sweep=r.count(lab, "sweep", "labels.sweep", d.sweep, most=10000,
                      what="a number of sites"),
        retest=r.boolean(lab, "retest", "labels.retest", d.retest),
        metric=_choice(r, lab, "metric", "labels.metric", d.metric, METRICS,
                       " | ".join(METRICS)),
        size=_choice(r, lab, "size", "labels.size", size, SIZES, _SIZES_SAID))
    if labels.metric != "time" and not labels.retest:  # a label is kept on the clock too
        raise r.fail("labels.retest", f"true with labels.metric {labels.metric} (every "
                     "exact label is measured again in wall time)", labels.retest)
    _pairs(r, "labels", labels.runs, labels.max_pairs)
    return labels


def _pairs(r: Reader, stage: str, runs: int, max_pairs: int) -> None:
    """A stage's max_pairs below its runs is refused (the commands would raise it silently)."""
    if max_pairs < runs:
        raise r.fail(f"{stage}.max_pairs", f"at least {stage}.runs ({runs})", max_pairs)


def _policy(r: Reader, data: dict) -> PolicyStage:
    d = PolicyStage()
    pol = r.section(data, "policy", {"classifier", "gate", "margin", "growth_budget", "runs",
                                     "max_pairs"})
    policy = PolicyStage(
        classifier=_choice(r, pol, "classifier", "policy.classifier", d.classifier,
                           CLASSIFIERS, f"one of {', '.join(CLASSIFIERS)}"),
        gate=r.positive_number(pol, "gate", "policy.gate", d.gate, most=10.0),
        margin=_fraction(r, pol, "margin", "policy.margin", d.margin, zero=True),
        growth_budget=r.count(pol, "growth_budget", "policy.growth_budget", d.growth_budget,
                              most=999_999_999, what="a size in callee_size units"),
        runs=r.positive_int(pol, "runs", "policy.runs", d.runs, most=MAX_RUNS),
        max_pairs=r.positive_int(pol, "max_pairs", "policy.max_pairs", d.max_pairs,
                                 most=MAX_RUNS))
    _pairs(r, "policy", policy.runs, policy.max_pairs)
    return policy


def _evaluate(r: Reader, data: dict) -> EvaluateStage:
    d = EvaluateStage()
    ev = r.section(data, "evaluate", {"benchmarks", "baselines", "runs", "max_pairs"})
    evaluate = EvaluateStage(
        benchmarks=_benchmarks(r, ev.get("benchmarks", "test"), "evaluate.benchmarks"),
        baselines=r.boolean(ev, "baselines", "evaluate.baselines", d.baselines),
        runs=r.positive_int(ev, "runs", "evaluate.runs", d.runs, most=MAX_RUNS),
        max_pairs=r.positive_int(ev, "max_pairs", "evaluate.max_pairs", d.max_pairs,
                                 most=MAX_RUNS))
    _pairs(r, "evaluate", evaluate.runs, evaluate.max_pairs)
    return evaluate


def _seed(r: Reader, section: dict, name: str, default: int) -> int:
    """A stage's sampler seed: an integer from 0 to 2**31 - 1 (Optuna's and numpy's range)."""
    seed = section.get("seed", default)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2 ** 31:
        raise r.fail(name, "an integer from 0 to 2147483647", seed)
    return seed


def _flipbacks(r: Reader, data: dict) -> FlipbacksStage:
    d = FlipbacksStage()
    sp = r.section(data, "flipbacks", {"enabled", "benchmarks", "reference", "sweep"})
    return FlipbacksStage(
        enabled=r.boolean(sp, "enabled", "flipbacks.enabled", d.enabled),
        benchmarks=_benchmarks(r, sp.get("benchmarks", "training"), "flipbacks.benchmarks"),
        reference=_choice(r, sp, "reference", "flipbacks.reference", d.reference,
                          FLIPBACK_REFERENCES, " or ".join(FLIPBACK_REFERENCES)),
        sweep=r.positive_int(sp, "sweep", "flipbacks.sweep", d.sweep, most=10_000))


def _searched(r: Reader, data: dict, size: str) -> SearchedStage:
    d = SearchedStage()
    sp = r.section(data, "searched", {"enabled", "benchmarks", "trials", "metric", "size",
                                      "confirm_size", "seed", "runs", "max_pairs",
                                      "discounts"})
    seed = _seed(r, sp, "searched.seed", d.seed)
    searched = SearchedStage(
        enabled=r.boolean(sp, "enabled", "searched.enabled", d.enabled),
        benchmarks=_benchmarks(r, sp.get("benchmarks", "training"), "searched.benchmarks"),
        trials=r.positive_int(sp, "trials", "searched.trials", d.trials, most=100_000),
        metric=_choice(r, sp, "metric", "searched.metric", d.metric, METRICS,
                       " | ".join(METRICS)),
        size=_choice(r, sp, "size", "searched.size", d.size, SIZES, _SIZES_SAID),
        confirm_size=_choice(r, sp, "confirm_size", "searched.confirm_size", size, SIZES,
                             _SIZES_SAID),
        seed=seed,
        runs=r.positive_int(sp, "runs", "searched.runs", d.runs, most=MAX_RUNS),
        max_pairs=r.positive_int(sp, "max_pairs", "searched.max_pairs", d.max_pairs,
                                 most=MAX_RUNS),
        discounts=_discounts(r, sp.get("discounts", [])))
    _pairs(r, "searched", searched.runs, searched.max_pairs)
    return searched


def _discounts(r: Reader, value: Any) -> tuple[str, ...]:
    """``searched.discounts``: distinct number features of the compiler (search-policy
    --discount), checked now."""
    names = r.string_list(value, "searched.discounts")
    try:
        space_with((), discounts=names)
    except SearchSpaceError as exc:
        raise r.error("searched.discounts", str(exc).removeprefix("--discount ")) from None
    return names


def _select(r: Reader, data: dict) -> SelectStage:
    d = SelectStage()
    sp = r.section(data, "select", {"enabled", "benchmarks", "kinds", "folds", "trials",
                                    "metric", "size", "classifier", "seed"})
    seed = _seed(r, sp, "select.seed", d.seed)
    kinds = sp.get("kinds", list(d.kinds))
    if not isinstance(kinds, list) or not kinds or \
            any(not isinstance(k, str) or k not in KINDS for k in kinds) or \
            len(set(kinds)) != len(kinds):
        raise r.fail("select.kinds", f"a list of distinct kinds among {', '.join(KINDS)}",
                     kinds)
    folds = r.positive_int(sp, "folds", "select.folds", d.folds, most=100)
    if folds < 2:
        raise r.fail("select.folds", "an integer from 2 to 100", folds)
    return SelectStage(
        enabled=r.boolean(sp, "enabled", "select.enabled", d.enabled),
        benchmarks=_benchmarks(r, sp.get("benchmarks", "training"), "select.benchmarks"),
        kinds=tuple(kinds), folds=folds,
        trials=r.positive_int(sp, "trials", "select.trials", d.trials, most=100_000),
        metric=_choice(r, sp, "metric", "select.metric", d.metric, METRICS,
                       " | ".join(METRICS)),
        size=_choice(r, sp, "size", "select.size", d.size, SIZES, _SIZES_SAID),
        classifier=_choice(r, sp, "classifier", "select.classifier", d.classifier,
                           TRAINED_CLASSIFIERS, " | ".join(TRAINED_CLASSIFIERS)),
        seed=seed)


def _top_level(r: Reader, data: Any, quick: bool) -> dict:
    """The file's mapping, its keys checked; ``quick``: with the quick section applied."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise r.fail_kind("(top level)", "a mapping", data)
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise r.fail(unknown[0], f"one of {', '.join(sorted(_TOP))}")
    overrides = r.section(data, "quick", _TOP - {"quick"})
    if not quick:
        return data
    if not overrides:
        raise r.error("quick", "--quick needs a quick section (the keys it replaces)")
    return _merge({k: v for k, v in data.items() if k != "quick"}, overrides)


def _digest(r: Reader, key: str, path: Path) -> str:
    try:
        return sha256_file(path)
    except OSError as exc:
        raise r.error(key, f"{path}: cannot read ({exc.strerror or exc})") from None


def _config_inputs(r: Reader, config: Path, raw: Any) -> list[tuple[str, str]]:
    """The experiment config's content, and that of a model file it names (the simulated
    backend's ``simulated.model``), each as (path, sha256)."""
    out = [(str(config), _digest(r, "config", config))]
    simulated = raw.get("simulated") if isinstance(raw, dict) else None
    model = simulated.get("model") if isinstance(simulated, dict) else None
    if isinstance(model, str):  # the config's loader checked it is a readable file
        path = Path(os.path.expanduser(model))
        path = (path if path.is_absolute() else config.parent / path).resolve()
        out.append((str(path), _digest(r, "config", path)))
    return out


def _benchmark_inputs(r: Reader, stages: tuple[tuple[str, tuple[str, ...]], ...]
                      ) -> list[tuple[str, str]]:
    """Each benchmark given as a directory, with its sources' hash (a bundled name or a split
    is the repository's own: it changes with the project, not with the user's files)."""
    out = []
    for key, names in stages:
        for n in names:
            if n in SPLITS or not is_benchmark_path(n):
                continue
            try:
                bench = resolve_benchmark(n)
                out.append((str(bench.directory.resolve()), bench.source_hash()))
            except (ManifestError, OSError) as exc:
                raise r.error(key, f"{n}: cannot read its sources ({exc})") from None
    return out


def _batch_log_setting(r: Reader, config: Path) -> tuple[str, list[tuple[str, str]]]:
    """The config's ``search.batch_log`` as written (a relative one lands in the campaign
    directory, where the stages run), from the config loaded as every command loads it, and
    the content of the files it is made of; a config measuring in an exact metric is refused
    (what the campaign publishes is timed)."""
    try:
        loaded = load_config(config)
    except ConfigError as exc:
        raise r.error("config", str(exc)) from None
    if loaded.measure.metric != "time":  # train-policy's gate and the evaluation read it
        raise r.error("config", f"{config}: measure.metric is {loaded.measure.metric}: a "
                      "campaign publishes in time; screen with search.metric or labels.metric")
    raw = loaded.raw
    search = raw.get("search") if isinstance(raw, dict) else None
    return str((search or {}).get("batch_log") or "batch.log"), _config_inputs(r, config, raw)


def parse_campaign(data: Any, source: Path, *, quick: bool = False) -> Campaign:
    """The campaign ``data`` (a campaign file's YAML) describes; relative paths are relative
    to the campaign file's directory, as in a config."""
    r = Reader(source, CampaignError.at)
    data = _top_level(r, data, quick)

    def path(key: str, default: str) -> Path:
        return r.local_path(data.get(key, default), key, "a path").resolve()

    config = path("config", "local.yaml")
    batch_log, inputs = _batch_log_setting(r, config)
    size = _choice(r, data, "size", "size", "full", SIZES, _SIZES_SAID)
    budget = r.section(data, "budget", {"worker_hours", "search_share", "flipbacks_share"})
    rewards = r.section(data, "rewards", {"model", "bootstrap", "plots"})
    campaign = Campaign(
        source=source, config=config, dir=path("dir", "campaign"),
        results=path("results", "results"), size=size,
        worker_hours=r.positive_number(budget, "worker_hours", "budget.worker_hours",
                                       Campaign.worker_hours, most=MAX_WORKER_HOURS),
        search_share=_fraction(r, budget, "search_share", "budget.search_share",
                               Campaign.search_share),
        flipbacks_share=_fraction(r, budget, "flipbacks_share", "budget.flipbacks_share",
                                  Campaign.flipbacks_share, zero=True),
        search=_search(r, data, size), labels=_labels(r, data, size),
        flipbacks=_flipbacks(r, data),
        rewards_model=_choice(r, rewards, "model", "rewards.model", Campaign.rewards_model,
                              MODELS, " or ".join(MODELS)),
        rewards_bootstrap=r.count(rewards, "bootstrap", "rewards.bootstrap",
                                  Campaign.rewards_bootstrap, most=MAX_BOOTSTRAP,
                                  what="bootstrap refits"),
        rewards_plots=r.boolean(rewards, "plots", "rewards.plots", Campaign.rewards_plots),
        policy=_policy(r, data), evaluate=_evaluate(r, data),
        searched=_searched(r, data, size), select=_select(r, data), quick=quick,
        batch_log_setting=batch_log)
    if campaign.flipbacks.enabled and \
            campaign.search_share + campaign.flipbacks_share > 1 + 1e-9:
        raise r.fail("budget.flipbacks_share", "a share that leaves the search its own "
                     f"(search_share {campaign.search_share:g} + flipbacks_share at most 1)",
                     campaign.flipbacks_share)
    inputs += _benchmark_inputs(r, (("search.benchmarks", campaign.search.benchmarks),
                                    ("evaluate.benchmarks", campaign.evaluate.benchmarks),
                                    ("flipbacks.benchmarks", campaign.flipbacks.benchmarks
                                     if campaign.flipbacks.enabled else ()),
                                    ("searched.benchmarks", campaign.searched.benchmarks
                                     if campaign.searched.enabled else ()),
                                    ("select.benchmarks", campaign.select.benchmarks
                                     if campaign.select.enabled else ())))
    campaign = replace(campaign, inputs=tuple(inputs))
    return replace(campaign, identity=_identity(campaign),
                   legacy_identity=_identity(campaign, legacy=True))


def _identity(c: Campaign, *, legacy: bool = False) -> str:
    """What decides the stages' results: not where they are written nor the budget (a resumed
    campaign may be given more), but the config (its path and the content of every file the
    stages run on: ``inputs``), size and every stage's settings.  ``legacy``: the identity
    before it covered the files' content."""
    search = {k: v for k, v in c.search.__dict__.items()
              if k != "metric" or v != "time"}  # absent at time: earlier identities hold
    what: dict[str, Any] = {
        "config": str(c.config), "size": c.size, "search": search,
        # absent at their defaults (time, the campaign's size): earlier identities hold
        "labels": {k: v for k, v in c.labels.__dict__.items()
                   if (k, v) not in (("metric", "time"), ("size", c.size))},
        # the bootstrap only where it is not the default: earlier identities hold
        "rewards": c.rewards_model if c.rewards_bootstrap == BOOTSTRAP_ROUNDS
        else [c.rewards_model, c.rewards_bootstrap],
        "policy": c.policy.__dict__, "evaluate": c.evaluate.__dict__}
    if c.flipbacks.enabled:  # absent when off: earlier identities hold
        what["flipbacks"] = c.flipbacks.__dict__
    if c.searched.enabled:  # the same, and its discounts only where there are some
        what["searched"] = {k: v for k, v in c.searched.__dict__.items()
                            if k != "discounts" or v}
    if c.select.enabled:  # the same
        what["select"] = c.select.__dict__
    if not legacy:
        what["inputs"] = [list(x) for x in c.inputs]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=list).encode()).hexdigest()


def load_campaign(path: Path, *, quick: bool = False) -> Campaign:
    """The campaign file at ``path``, through the config's strict loader."""
    return parse_campaign(load_strict_file(path, CampaignError), path, quick=quick)
