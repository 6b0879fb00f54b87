"""``select-policy``: each kind of policy made per fold of the training split, measured on the
fold it never saw, and the kind kept by ``pipeline.policy.choice``'s rule.

The kinds (``choice.KINDS``):

- ``searched``: ``search-policy``'s study (``pipeline.policy.search``) on the other folds'
  programs, its best trial's policy;
- ``classifier``: the classifier trained on the other folds' labelled sites (labels measured
  from the heuristic's tree and from an aggressive reference alike: whatever the labels
  directory holds), with the guard rails asked for;
- ``combined``: the same study started from the classifier: its first point after the
  heuristic's is a linear score fitted to the same labels (``searched.seed_from_labels``).

Then the heuristic is measured against itself on every training program (the A/A gate), each
fold's policies are measured on its programs in the session's metric (the store answers what
was measured before, and every study resumes: the same command continues after Ctrl-C or a
kill), and the rule keeps one kind.  The kept kind is then made once more from every training
program (``OUT/final/``) and written to ``OUT/selected.policy``; what chose it is in
``OUT/choice.csv`` (every held-out program of every kind) and ``OUT/choice.json``.

Nothing here prints: progress goes through ``say``; bad input is a ``ChoiceError`` or a
``SearchError`` of one line.
"""
from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.policy_training import TrainingError, TrainingSet, train
from dispatcher import baselines as base
from dispatcher.build.manifest import Benchmark, Size
from dispatcher.build.policies import PolicySpec, learned_spec
from dispatcher.build.policy_file import DEFAULT_GROWTH_BUDGET, write_policy_bytes
from dispatcher.build.service import CompileError, CompileJob
from dispatcher.compare import Contender, Failure, compare_with_heuristic, pairing_policy
from dispatcher.core.figures import Figure
from dispatcher.core.files import write_text_atomic
from dispatcher.session import Session
from pipeline.policy import search
from pipeline.policy.choice import (
    KINDS,
    Choice,
    ChoiceError,
    HeldOut,
    KindResult,
    aa_gates,
    choose,
    fold_groups,
    judge,
    unmade,
)
from pipeline.policy.searched import Penalties, Space, over_guard, policy_of, seed_from_labels
from pipeline.policy.validation import subset

SELECTED = "selected.policy"
CHOICE_CSV = "choice.csv"
CHOICE_JSON = "choice.json"


@dataclass(frozen=True)
class Rails:
    """The classifier's guard rails and label threshold (train-policy's options)."""

    threshold: float
    margin: float
    ranges: bool
    growth_budget: int | None


@dataclass(frozen=True)
class ChoiceRequest:
    """What ``select-policy`` was asked: the training programs and how each kind is made."""

    benchmarks: tuple[Benchmark, ...]
    sizes: Mapping[str, Size]
    size: str
    metric: str
    folds: int
    trials: int  # complete trials of each study (searched, combined, and the final one)
    kinds: tuple[str, ...]
    labels: TrainingSet | None  # the labelled sites (classifier, combined)
    classifier: str
    rails: Rails
    penalties: Penalties
    seed: int = 0
    space: Space = Space()


@dataclass(frozen=True)
class ChoiceOutcome:
    choice: Choice
    groups: list[tuple[str, ...]]
    gates: list[float]
    held: dict[str, list[HeldOut]]
    selected: Path | None


def choose_policy(session: Session, request: ChoiceRequest, out: Path,
                  say: Callable[[str], None] = lambda _: None,
                  check: Callable[[], None] = lambda: None) -> ChoiceOutcome:
    """Every kind made and measured per fold, judged, the kept one made from every training
    program; ``out`` must be ``search.locked`` by the caller."""
    groups = folds_of(request)
    say(f"{len(groups)} folds: " + "; ".join(", ".join(g) for g in groups))
    aa = _aa(session, request)
    gates = aa_gates({n: f.low for n, f in aa.items() if f.low is not None}, groups)
    say("A/A gates per fold: " + ", ".join(f"{g:.4f}" for g in gates))
    held: dict[str, list[HeldOut]] = {k: [] for k in request.kinds}
    not_made: dict[str, KindResult] = {}
    for i, group in enumerate(groups):
        rest = tuple(b for b in request.benchmarks if b.name not in group)
        mine = [b for b in request.benchmarks if b.name in group]
        for kind in request.kinds:
            if kind in not_made:
                continue
            check()
            try:
                spec = _make(session, request, kind, rest, out / "folds" / str(i), say, check)
            except ChoiceError as exc:  # this kind is out; the others go on
                not_made[kind] = unmade(kind, i, gates[i], str(exc))
                say(f"fold {i} {kind}: not made ({exc})")
                continue
            got = _measure(session, request, spec, mine, i, check)
            held[kind].extend(got)
            say(f"fold {i} {kind}: " + ", ".join(f"{h.program} {h.counted:.4f}"
                                                 + (" (fallback)" if h.fallback else "")
                                                 for h in got))
    choice = choose([not_made.get(k) or judge(k, held[k], groups, gates)
                     for k in request.kinds])
    selected = None
    if choice.kept is not None:
        say(f"kept {choice.kept}: made again from every training program")
        spec = _make(session, request, choice.kept, request.benchmarks, out / "final", say,
                     check)
        write_policy_bytes(spec.data, out / SELECTED)
        selected = out / SELECTED
    else:  # an earlier run's choice is not this one's
        (out / SELECTED).unlink(missing_ok=True)
    outcome = ChoiceOutcome(choice, groups, gates, held, selected)
    _write(out, request, outcome, aa)
    return outcome


def folds_of(request: ChoiceRequest) -> list[tuple[str, ...]]:
    """The request checked before anything is built (ChoiceError, one line), and its folds."""
    unknown = [k for k in request.kinds if k not in KINDS]
    if unknown or not request.kinds:
        raise ChoiceError(f"kinds {', '.join(unknown) or 'none'}: expected some of "
                          f"{', '.join(KINDS)}")
    if request.labels is None and set(request.kinds) & {"classifier", "combined"}:
        raise ChoiceError("the classifier and combined kinds train on labels: give --labels")
    return fold_groups([b.name for b in request.benchmarks], request.folds)


# --------------------------------------------------------------------------- making a kind

def _make(session: Session, request: ChoiceRequest, kind: str, programs: Sequence[Benchmark],
          where: Path, say: Callable[[str], None], check: Callable[[], None]) -> PolicySpec:
    """The policy of ``kind`` made from ``programs`` only, its file under ``where``."""
    names = [b.name for b in programs]
    if kind == "classifier":
        try:
            policy = train(_labels_of(request, names, where), request.classifier,
                           request.rails.threshold, margin=request.rails.margin,
                           ranges=request.rails.ranges,
                           growth_budget=request.rails.growth_budget)
        except TrainingError as exc:
            raise ChoiceError(f"{where}: {exc}") from None
        where.mkdir(parents=True, exist_ok=True)
        spec = learned_spec(policy, source=str((where / "classifier.policy").resolve()))
        write_policy_bytes(spec.data, where / "classifier.policy")
        return spec
    extra: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()
    if kind == "combined":
        ts = _labels_of(request, names, where)
        start = seed_from_labels(request.space, {c: list(ts.features[c])
                                                 for c in ts.features.columns},
                                 list(ts.labels == "inline"),
                                 request.rails.growth_budget or DEFAULT_GROWTH_BUDGET)
        if start is None:
            raise ChoiceError(f"{where}: the labels of {', '.join(names)} give no linear start "
                              "(no site labelled inline, or every site is)")
        extra = (("classifier", tuple(sorted(start.items()))),)
    settings = search.SearchSettings(
        tuple(programs), {n: request.sizes[n] for n in names}, request.size, request.metric,
        request.trials, request.seed, request.space, request.penalties, extra_seeds=extra)
    study = where / kind
    with search.locked(study):
        found = search.run_search(session, settings, study,
                                  say=lambda line: say(f"{study}: {line}"), check=check)
    if found.best is None:
        raise ChoiceError(f"{study}: no complete trial")
    return learned_spec(policy_of(request.space, found.best.params, names),
                        source=str((study / search.POLICY).resolve()))


def _labels_of(request: ChoiceRequest, names: Sequence[str], where: Path) -> TrainingSet:
    assert request.labels is not None
    ts = request.labels
    rows = ts.benchmarks.isin(list(names))
    if not rows.any():
        raise ChoiceError(f"{where}: no labelled site in {', '.join(names)}")
    mine = subset(ts, rows)
    if mine.labels.nunique() < 2:
        raise ChoiceError(f"{where}: the labels of {', '.join(names)} have one class only "
                          f"({mine.labels.iloc[0]})")
    return mine


# --------------------------------------------------------------------------- measuring

def _aa(session: Session, request: ChoiceRequest) -> dict[str, Figure]:
    """The heuristic against itself on every training program (ChoiceError naming one
    without a figure)."""
    config = session.config
    got = base.measure_all(session, [Contender(b.name, b, CompileJob(b), request.sizes[b.name])
                                     for b in request.benchmarks],
                           config.run.runs, pairing_policy(config, config.run.runs))
    for name, m in got.items():
        if m.speedup is None or m.low is None:
            raise ChoiceError(f"{name}: the heuristic against itself has no figure "
                              f"({m.error or 'not measured'})")
    return got


def _measure(session: Session, request: ChoiceRequest, spec: PolicySpec,
             programs: Sequence[Benchmark], fold: int,
             check: Callable[[], None] = lambda: None) -> list[HeldOut]:
    """``spec`` built into each held-out program and compared with its heuristic build; a
    build that fails or goes past a cost guard counts at the heuristic's figure.  ``check``
    after each comparison: a Ctrl-C a library swallowed ends the measurement there, not at
    the fold's last program (minutes later)."""
    config = session.config
    contenders = [Contender(b.name, b, CompileJob(b, policy=spec), request.sizes[b.name])
                  for b in programs]
    got_all = []
    with closing(compare_with_heuristic(session, contenders, config.run.runs,
                                        pairing_policy(config, config.run.runs))) as it:
        for got in it:
            check()
            got_all.append(got)
    out = []
    for got in sorted(got_all, key=lambda g: g.contender.bench.name):
        b = got.contender.bench
        m = base.measured_of(session, got)
        fallback = None
        same = False
        if got.failure is Failure.COMPILE:
            fallback = base.failed_build(m) or "does not compile"
        elif got.comparison is not None and got.comparison.resolved and got.comparison.failed:
            fallback = "a run of its build failed"
        elif got.failure is not None or m.speedup is None:
            raise ChoiceError(f"{b.name}: {m.error or 'not measured'}")
        elif over_guard(m.compile_ratio, m.size_ratio, request.penalties):
            fallback = "past a cost guard"
        same = got.compiled is not None and got.compiled.sha256 == _heuristic_sha(session, b)
        out.append(HeldOut(b.name, fold, m.speedup, m.low, m.high, m.size_ratio, fallback,
                           same))
    return out


def _heuristic_sha(session: Session, bench: Benchmark) -> str | None:
    try:
        return session.builds.compile(CompileJob(bench)).sha256
    except CompileError:
        return None


# --------------------------------------------------------------------------- the record

def _num(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"


def _write(out: Path, request: ChoiceRequest, outcome: ChoiceOutcome,
           aa: Mapping[str, Figure]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["kind", "fold", "program", "speedup", "low", "high", "size_ratio", "counted",
                "fallback", "same_binary", "aa_low"])
    for kind, rows in outcome.held.items():
        for h in rows:
            w.writerow([kind, h.fold, h.program, _num(h.speedup), _num(h.low), _num(h.high),
                        _num(h.size_ratio), _num(h.counted), h.fallback or "",
                        int(h.same_binary), _num(aa[h.program].low)])
    write_text_atomic(out / CHOICE_CSV, buf.getvalue())
    record: dict[str, Any] = {
        "rule": "pipeline.policy.choice (docs/policies.md, \"Choosing the kind of policy\")",
        "metric": request.metric, "size": request.size, "folds": outcome.groups,
        "gates": outcome.gates, "trials": request.trials, "classifier": request.classifier,
        "seed": request.seed, "penalties": request.penalties.identity(),
        "kinds": {r.kind: {"figure": r.figure, "fold_figures": list(r.fold_figures),
                           "worst_fold": r.worst_fold, "gate": r.gate, "refused": r.refused}
                  for r in outcome.choice.results},
        "kept": outcome.choice.kept,
        "selected": None if outcome.selected is None else str(outcome.selected)}
    write_text_atomic(out / CHOICE_JSON, json.dumps(record, indent=1) + "\n")
