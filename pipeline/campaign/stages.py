"""What each stage runs: one of the project's own commands, as it would be typed, in the
campaign directory (every path absolute), continuing through the command's own resume where
the stage was started before."""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from dispatcher.build.manifest import SPLITS
from dispatcher.core.files import write_text_atomic
from dispatcher.core.records import BatchEntry, RecordError
from dispatcher.core.rundir import EXPERIMENT, RundirError, rundirs_of_batch_log
from dispatcher.core.site_records import (
    HEURISTIC,
    SITES_KIND,
    read_sites_experiment,
    reference_name,
)
from pipeline.campaign.plan import SEARCHES, Campaign, CampaignError

SITES = SITES_KIND  # the labels stage's experiments, as the batch log names them


def listed(batch_log: Path, kinds: Iterable[str]) -> list[tuple[BatchEntry, Path]]:
    """The experiments the batch log lists of these algorithms, each once, in order, with
    their rundirs (none while there is no batch log)."""
    if not batch_log.is_file():
        return []
    try:
        return rundirs_of_batch_log(batch_log, kinds)
    except RundirError as exc:
        raise CampaignError(str(exc)) from None


def experiments(batch_log: Path, kinds: Iterable[str]) -> list[Path]:
    """The rundirs the batch log lists of these algorithms, each once, in order."""
    return [rundir for _, rundir in listed(batch_log, kinds)]


def _tasks(names: Sequence[str]) -> list[str]:
    """Benchmark names or directories, a split expanded to its benchmarks' directories."""
    from dispatcher.build.manifest import bundled_benchmarks
    out: list[str] = []
    for n in names:
        out += ([str(b.directory) for b in bundled_benchmarks(n)] if n in SPLITS else [n])
    return out


#: The tasks files the stages read, in the campaign directory: one benchmark per line.
SEARCH_TASKS, FLIPBACK_TASKS = "search.tasks", "flipbacks.tasks"


def write_tasks(campaign: Campaign) -> None:
    """The search's tasks file and, when that stage is on, the flipbacks', each written once
    (a resumed stage reads what it started with)."""
    files = [(SEARCH_TASKS, campaign.search.benchmarks)]
    if campaign.flipbacks.enabled:
        files.append((FLIPBACK_TASKS, campaign.flipbacks.benchmarks))
    for name, benchmarks in files:
        path = campaign.dir / name
        if not path.exists():
            write_text_atomic(path, "".join(f"{t}\n" for t in _tasks(benchmarks)))


def labels_against(batch_log: Path, reference: str) -> list[Path]:
    """The labels rundirs the batch log lists that measure against ``reference`` (as the
    labels table names it: heuristic, always-inline), in order.  One whose experiment cannot
    be read counts as the heuristic's: the labels stage's resume says what is wrong with it."""
    out = []
    for rundir in experiments(batch_log, [SITES]):
        try:
            measured = reference_name(read_sites_experiment(rundir / EXPERIMENT).reference)
        except RecordError:
            measured = HEURISTIC
        if measured == reference:
            out.append(rundir)
    return out


def _resumed(rundirs: list[Path]) -> list[str]:
    return [a for p in rundirs for a in ("--resume", str(p))]


def _search(c: Campaign, conf: list[str], searches: list[Path]) -> list[str]:
    if searches:  # started before: each rundir continues (a finished one says so)
        return ["run_training_experiments", *conf, *_resumed(searches)]
    return ["run_training_experiments", *conf, "--tasks", str(c.dir / SEARCH_TASKS),
            "--algorithm", c.search.algorithm, "--steps", str(c.search.steps),
            "--chains", str(c.search.chains), "--seed", str(c.search.seed),
            "--size", c.search.size,
            *(["--metric", c.search.metric] if c.search.metric != "time" else [])]


def _measured_as_labels(c: Campaign) -> list[str]:
    """How the labels stage measures, which the flipbacks stage shares."""
    return ["--size", c.labels.size or c.size, "--runs", str(c.labels.runs),
            "--max-pairs", str(c.labels.max_pairs),
            *(["--retest"] if c.labels.retest else []),
            *(["--metric", c.labels.metric] if c.labels.metric != "time" else [])]


def _labels(c: Campaign, conf: list[str]) -> list[str]:
    labels = ["--labels", str(c.dir / "labels")]
    started = labels_against(c.batch_log, HEURISTIC)
    if started:
        return ["measure-sites", *conf, *labels, *_resumed(started)]
    return ["measure-sites", *conf, "--batch-log", str(c.batch_log), *labels,
            "--max-tests", str(c.labels.max_tests), "--sweep", str(c.labels.sweep),
            *_measured_as_labels(c)]


def _flipbacks(c: Campaign, conf: list[str]) -> list[str] | None:
    f = c.flipbacks
    if not f.enabled:
        return None
    labels = ["--labels", str(c.dir / "labels")]
    started = labels_against(c.batch_log, f.reference)
    if started:
        return ["measure-sites", *conf, *labels, *_resumed(started)]
    return ["measure-sites", *conf, "--tasks", str(c.dir / FLIPBACK_TASKS), "--reference",
            f.reference, "--sweep", str(f.sweep), *labels, *_measured_as_labels(c)]


def _policy(c: Campaign, conf: list[str]) -> list[str]:
    d, p = c.dir, c.policy
    labels = [a for a in ("--labels", str(d / "labels")) if (d / "labels").is_dir()]
    rewards = [a for a in ("--rewards", str(d / "rewards")) if (d / "rewards").is_dir()]
    return ["train-policy", *conf, *labels, *rewards, "--model", c.rewards_model,
            "--classifier", p.classifier, "--margin", str(p.margin),
            "--growth-budget", str(p.growth_budget), "--validate", "measured",
            "--gate", str(p.gate), "--size", c.size, "--runs", str(p.runs),
            "--max-pairs", str(p.max_pairs), "--out", str(c.policy_file)]


#: The ``--name`` of the kept policy's evaluation: ``results/plugin_kept.summary.csv``.
KEPT = "kept"


def _plugin_benchmark(c: Campaign, conf: list[str], policy: Path,
                      name: list[str]) -> list[str]:
    """run-plugin-benchmark of ``policy`` on the evaluation split, with the baselines tuned
    on the searched programs (a second evaluation finds them in the store and in
    ``results/global-setting.json``: nothing is measured twice)."""
    e = c.evaluate
    baselines = ["--baselines", *[a for t in c.search.benchmarks for a in ("--tune-on", t)]]
    return ["run-plugin-benchmark", *conf, str(policy), *_tasks(e.benchmarks), *name,
            *(baselines if e.baselines else []),
            "--size", c.size, "--runs", str(e.runs), "--max-pairs", str(e.max_pairs),
            "--results", str(c.dir / "results")]


def kept_policy(c: Campaign) -> Path | None:
    """The policy the campaign answers with when it chooses one by measurement: the select
    stage's choice, else (select off) the searched stage's best; None when neither stage is
    on, or the one that decides kept nothing (every kind refused by its gate)."""
    if c.select.enabled:
        chosen = c.dir / "selected" / "selected.policy"
    elif c.searched.enabled:
        chosen = c.dir / "searched" / "searched.policy"
    else:
        return None
    return chosen if chosen.is_file() else None


def _kept(c: Campaign, conf: list[str]) -> list[str] | None:
    kept = kept_policy(c)
    if kept is None:
        return None
    return _plugin_benchmark(c, conf, kept, ["--name", KEPT])


def _optimal(c: Campaign, conf: list[str]) -> list[str] | None:
    if not (c.dir / "rewards").is_dir():
        return None
    return ["run-all-benchmarks", *conf, c.rewards_model, "--rewards", str(c.dir / "rewards"),
            "--size", c.size, "--runs", str(c.evaluate.runs), "--max-pairs",
            str(c.evaluate.max_pairs), "--results", str(c.dir / "results")]


def _dataset(c: Campaign, conf: list[str], searches: list[Path]) -> list[str] | None:
    d = c.dir
    inputs = [*[a for a in ("--labels", str(d / "labels")) if (d / "labels").is_dir()],
              *([a for a in ("--rewards", str(d / "rewards"), "--model", c.rewards_model)]
                if (d / "rewards").is_dir() else []),
              *(["--batch-log", str(c.batch_log)] if searches else [])]
    if not inputs:
        return None
    return ["export-dataset", *conf, *inputs, "--out", str(d / "dataset")]


def _searched(c: Campaign, conf: list[str]) -> list[str] | None:
    s = c.searched
    if not s.enabled:
        return None
    return ["search-policy", *conf, *_tasks(s.benchmarks), "--trials", str(s.trials),
            "--metric", s.metric, "--size", s.size, "--confirm-size",
            s.confirm_size or c.size, "--runs", str(s.runs), "--max-pairs", str(s.max_pairs),
            "--seed", str(s.seed), *[a for f in s.discounts for a in ("--discount", f)],
            "--out", str(c.dir / "searched")]


def _select(c: Campaign, conf: list[str]) -> list[str] | None:
    s = c.select
    if not s.enabled:
        return None
    labels = c.dir / "labels"
    if not labels.is_dir() and set(s.kinds) & {"classifier", "combined"}:
        return None  # nothing labelled to train on: the labels stage measured no site
    return ["select-policy", *conf, *_tasks(s.benchmarks),
            *(["--labels", str(labels)] if labels.is_dir() else []),
            *[a for k in s.kinds for a in ("--kind", k)], "--folds", str(s.folds),
            "--trials", str(s.trials), "--metric", s.metric, "--size", s.size,
            "--classifier", s.classifier, "--seed", str(s.seed),
            "--out", str(c.dir / "selected")]


def stage_command(campaign: Campaign, stage: str) -> list[str] | None:
    """The command line of ``stage`` (None: nothing to run: publish, or a stage with nothing
    to do), continuing through the command's own resume where the stage was started before.
    Every path is absolute: the stage runs in the campaign directory."""
    c = campaign
    conf = ["--config", str(c.config)]
    searches = experiments(c.batch_log, SEARCHES)
    if stage == "search":
        return _search(c, conf, searches)
    if stage == "labels":
        return _labels(c, conf)
    if stage == "flipbacks":
        return _flipbacks(c, conf)
    if stage == "rewards":
        if not searches:
            return None
        return ["assign-rewards", "--out", str(c.dir / "rewards"), "--model", c.rewards_model,
                "--bootstrap", str(c.rewards_bootstrap),
                *([] if c.rewards_plots else ["--no-plots"]), *[str(p) for p in searches]]
    if stage == "policy":
        return _policy(c, conf)
    if stage == "evaluate":
        return _plugin_benchmark(c, conf, c.policy_file, [])
    if stage == "optimal":
        return _optimal(c, conf)
    if stage == "dataset":
        return _dataset(c, conf, searches)
    if stage == "searched":
        return _searched(c, conf)
    if stage == "select":
        return _select(c, conf)
    if stage == "kept":
        return _kept(c, conf)
    raise ValueError(f"unknown stage {stage!r}")
