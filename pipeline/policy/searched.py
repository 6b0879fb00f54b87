"""A searched policy's parametrisation and objective: pure functions, no I/O.

``search-policy`` (``pipeline.policy.search``) looks for the policy file that makes the
training split fastest.  What it searches is a vector of numbers; ``policy_of`` turns one into
a policy file both readers accept as it is (``(linear ...)``, format version 1: no format
change), and ``score`` turns what was measured with it into the one number the sampler
maximises (docs/policies.md, "Searched policies").

The policy: two classes, ``default`` and ``inline``, one linear score over a few raw features
of the dump, ``s = b + sum_j w_j * x_j / scale_j``; ``inline`` where ``s > 0``, else
``default`` (the heuristic decides).  It only ever inlines more than the heuristic (the
aggressive end is where the baselines found the gains; never-inline's 0.775 says where
``dont_inline`` leads), at sites the heuristic decided freely, within a searched growth
budget (per function and round: the guard rail of the file).  Margin 0 (every answer is the
model's), no training ranges (there are no training rows).  A space with discounts
(``--discount FEATURE``) also searches a weight per named feature that makes a site's growth
cheaper, ``callee_size / (1 + sum_f d_f * x_f)``: a policy file of format version 2.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dispatcher.build.policy_file import Column, Linear, TrainedPolicy, number_features
from dispatcher.core.stats import geomean

#: The features the score reads, each with the scale it is divided by (so every coefficient
#: moves the score by about its own value over the feature's usual range; absent numbers are
#: -1, booleans 0/1).  Features every decision has, and the heuristic's benefit terms.
COLUMNS: tuple[tuple[str, float], ...] = (
    ("callee_size", 50.0),
    ("known_args", 2.0),
    ("in_loop", 1.0),
    ("in_recursive_function", 1.0),
    ("recursive", 1.0),
    ("depth", 2.0),
    ("remove_alloc", 2.0),
    ("remove_prim", 5.0),
)
WEIGHT = 4.0  # coefficients and the intercept are searched in [-WEIGHT, WEIGHT]
# the growth budget, searched on a log scale: up to budgets that bound nothing on most
# programs (a budget cut mid-cascade can cost more than none: vector_functor)
BUDGET_LOW, BUDGET_HIGH = 8, 4000
INTERCEPT = "intercept"
BUDGET = "growth_budget"
# a discount's weight, searched in [0, DISCOUNT_HIGH]: at the top a site whose feature is 1
# costs a fifth of its size (floyd_warshall's Fw.run, direct_call_of_indirect 6, a 25th)
DISCOUNT_HIGH = 4.0
#: A column's range in the file: the guard rail is off (ranges false), so only its form
#: matters; the widest range both readers take.
_RANGE = (-1.0, 1e9)


class SearchSpaceError(ValueError):
    """Parameters that are not a point of the space: one line."""


@dataclass(frozen=True)
class Param:
    """One searched parameter: a float in [low, high], or an integer on a log scale."""

    name: str
    low: float
    high: float
    integer: bool = False

    def check(self, v: object) -> float:
        """``v`` as a point's value of this parameter; SearchSpaceError, one line, where it is
        not a finite number within the bounds."""
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) \
                or not self.low <= v <= self.high:
            raise SearchSpaceError(f"parameter {self.name}: expected a number from "
                                   f"{self.low:g} to {self.high:g}, got {v!r}")
        return float(v)


@dataclass(frozen=True)
class Space:
    """What is searched: the score's columns (name, scale) and the parameters' bounds."""

    columns: tuple[tuple[str, float], ...] = COLUMNS
    weight: float = WEIGHT
    budget: tuple[int, int] = (BUDGET_LOW, BUDGET_HIGH)
    discounts: tuple[str, ...] = ()  # features whose growth discount is searched

    def params(self) -> list[Param]:
        """The parameters in a fixed order: the intercept, a weight per column, the budget,
        a discount weight per discounted feature."""
        return [Param(INTERCEPT, -self.weight, self.weight),
                *[Param(weight_name(c), -self.weight, self.weight) for c, _ in self.columns],
                Param(BUDGET, self.budget[0], self.budget[1], integer=True),
                *[Param(discount_name(f), 0.0, DISCOUNT_HIGH) for f in self.discounts]]

    def identity(self) -> dict[str, object]:
        """What a study's resume checks: the same space, or another study."""
        got: dict[str, object] = {"columns": [list(c) for c in self.columns],
                                  "weight": self.weight, "budget": list(self.budget)}
        if self.discounts:  # (absent otherwise: the studies made before resume as they were)
            got["discounts"] = list(self.discounts)
        return got


def space_with(extra: Sequence[str], base: Space = Space(), discounts: Sequence[str] = ()
               ) -> Space:
    """``base`` with more columns, each ``NAME=SCALE`` (a number feature of the compiler not
    already a column, a scale above 0), and growth discounts searched for ``discounts`` (number
    features of the compiler): a study of another space (its identity says so);
    SearchSpaceError, one line, for one that is not."""
    for name in discounts:
        if name not in number_features():
            raise SearchSpaceError(f"--discount {name}: not a number feature of the compiler "
                                   "(docs/policies.md, \"Column names\")")
        if list(discounts).count(name) > 1 or name in base.discounts:
            raise SearchSpaceError(f"--discount {name}: named twice")
    columns = list(base.columns)
    for spec in extra:
        name, eq, scale_text = spec.partition("=")
        try:
            scale = float(scale_text) if eq else math.nan
        except ValueError:
            scale = math.nan
        if not (math.isfinite(scale) and scale > 0):
            raise SearchSpaceError(f"--column {spec}: expected NAME=SCALE with a scale above 0 "
                                   "(the feature is divided by it, as callee_size by 50)")
        if name not in number_features():
            raise SearchSpaceError(f"--column {spec}: {name!r} is not a number feature of the "
                                   "compiler (docs/policies.md, \"Column names\")")
        if name in dict(columns):
            raise SearchSpaceError(f"--column {spec}: {name} is a column already")
        columns.append((name, scale))
    return Space(tuple(columns), base.weight, base.budget, (*base.discounts, *discounts))


def weight_name(column: str) -> str:
    return f"w_{column}"


def discount_name(feature: str) -> str:
    return f"d_{feature}"


def policy_of(space: Space, params: Mapping[str, float], benchmarks: Sequence[str] = ()
              ) -> TrainedPolicy:
    """The policy file of one point of ``space`` (``benchmarks``: the training programs it
    was searched on, recorded in its ``training`` section); SearchSpaceError for a point
    outside the space."""
    for p in space.params():
        p.check(params.get(p.name))
    extra = set(params) - {p.name for p in space.params()}
    if extra:
        raise SearchSpaceError(f"unknown parameter(s) {', '.join(sorted(extra))}")
    names = [c for c, _ in space.columns]
    model = Linear(mean=[0.0] * len(names), scale=[s for _, s in space.columns],
                   coefficients=[[float(params[weight_name(c)]) for c in names]],
                   intercepts=[float(params[INTERCEPT])])
    return TrainedPolicy(
        classifier="logistic", classes=["default", "inline"], model=model,
        columns=[Column(c, *_RANGE) for c in names], threshold=0.0,
        benchmarks=list(benchmarks), table_sha256="", sites=0, margin=0.0, ranges=False,
        growth_budget=int(round(params[BUDGET])),
        growth_discount=tuple((f, float(params[discount_name(f)])) for f in space.discounts))


def seeds(space: Space) -> list[tuple[str, dict[str, float]]]:
    """Known points the study starts from, before the sampler proposes: ``heuristic`` (the
    score below 0 everywhere: the heuristic's build, the study's reference for compile time),
    ``inline-within-budget`` (above 0 everywhere: always-inline, held to the largest growth
    budget) and, where the space has ``callee_size``, ``inline-small-callees`` (callees below
    half its scale, within a budget of 100, train-policy's default)."""
    zero = {**{weight_name(c): 0.0 for c, _ in space.columns},
            **{discount_name(f): 0.0 for f in space.discounts}}
    out = [("heuristic", {INTERCEPT: -space.weight, **zero, BUDGET: space.budget[0]}),
           ("inline-within-budget", {INTERCEPT: space.weight, **zero,
                                     BUDGET: space.budget[1]})]
    if "callee_size" in dict(space.columns) and space.weight >= 2:
        out.append(("inline-small-callees",
                    {INTERCEPT: 1.0, **zero, weight_name("callee_size"): -2.0,
                     BUDGET: min(max(100, space.budget[0]), space.budget[1])}))
    return out


def seed_from_labels(space: Space, features: Mapping[str, Sequence[float]],
                     inline: Sequence[bool], budget: int) -> dict[str, float] | None:
    """A point of ``space`` that answers as the labels do: a logistic regression of
    ``inline`` (the sites labelled inline) on the space's columns, each divided by its scale
    as the policy divides it, its coefficients and intercept clipped to the space's bounds,
    with growth budget ``budget``.  The search started from the classifier begins here
    (``select-policy``'s ``combined`` kind).  None when the labels have one class only, or
    lack a column (nothing to fit)."""
    names = [c for c, _ in space.columns]
    if any(c not in features for c in names) or len(set(inline)) < 2:
        return None
    from sklearn.linear_model import LogisticRegression
    rows = list(zip(*[[float(v) / scale for v in features[c]] for c, scale in space.columns]))
    model = LogisticRegression(max_iter=2000, class_weight="balanced").fit(
        rows, [bool(v) for v in inline])
    w = space.weight

    def clip(v: float) -> float:
        return float(min(w, max(-w, v)))
    return {INTERCEPT: clip(model.intercept_[0]),
            **{weight_name(c): clip(model.coef_[0][j]) for j, c in enumerate(names)},
            BUDGET: int(min(space.budget[1], max(space.budget[0], budget))),
            **{discount_name(f): 0.0 for f in space.discounts}}


#: The discount weights an earlier study's best is tried at when the space adds discounts
#: (``start_from``): a line along the new parameters, from none to the range's top.
START_LADDER = (0.0, 0.5, 1.0, 2.0, DISCOUNT_HIGH)


def start_from(space: Space, params: Mapping[str, object]) -> list[dict[str, float]]:
    """Points of ``space`` continuing an earlier study's point ``params`` (its best, from its
    ``searched.json``): the parameters ``space`` shares with it, and each discount it lacks
    at each weight of ``START_LADDER`` in turn (the first, 0: the earlier policy's own
    answers); one point where it lacks none.  SearchSpaceError, one line, where it lacks
    another of the space's parameters or holds one out of its bounds."""
    new = {discount_name(f) for f in space.discounts} - set(params)
    point: dict[str, float] = {}
    for p in space.params():
        point[p.name] = p.check(params.get(p.name, 0.0 if p.name in new else None))
    if not new:
        return [point]
    return [{**point, **{n: w for n in new}} for w in START_LADDER]


# --------------------------------------------------------------------------- the objective

@dataclass(frozen=True)
class ProgramFigure:
    """One training program built with a trial's policy, measured against its heuristic
    build: ``speedup`` (heuristic / policy, in the study's metric) and ``size_ratio`` (binary
    size / the heuristic's), or ``failed`` (one line: the policy's build failed or ran past
    the build budget, or its run failed); ``seconds``: its build's compile time on ``clock``
    (``cpu``: its compiler processes' CPU time; ``wall``), None where not known."""

    name: str
    speedup: float | None = None
    size_ratio: float | None = None
    seconds: float | None = None
    failed: str | None = None
    clock: str = "wall"


@dataclass(frozen=True)
class Penalties:
    """What the objective charges beyond the speedup, each as a factor ``exp(-weight *
    excess)`` with ``excess`` the log of the geometric mean ratio beyond ``1 + allowance``
    (0 within it): binary size and compile time.  A program whose policy build fails counts
    at ``failed_speedup`` (1: the heuristic's figure, as the baselines count a failed build),
    and so does one past the cost guards (``max_compile_ratio``, ``max_size_ratio``: the
    evaluation's, config ``policy:``; None: none), as ``run-plugin-benchmark`` counts it."""

    size_allowance: float = 0.05
    size_weight: float = 1.0
    time_allowance: float = 1.0
    time_weight: float = 0.1
    failed_speedup: float = 1.0
    max_compile_ratio: float | None = 2.0
    max_size_ratio: float | None = 1.5

    def identity(self) -> dict[str, float | None]:
        return {"size_allowance": self.size_allowance, "size_weight": self.size_weight,
                "time_allowance": self.time_allowance, "time_weight": self.time_weight,
                "failed_speedup": self.failed_speedup,
                "max_compile_ratio": self.max_compile_ratio,
                "max_size_ratio": self.max_size_ratio}


@dataclass(frozen=True)
class Score:
    """A trial's figures: ``objective`` = ``speedup`` x the penalties' factors (what the
    sampler maximises); ``speedup``, ``size``, ``compile``: geometric means over the programs
    as counted (``compile`` over those whose ratio is known; None: none is); ``failed``: the
    programs whose build or run failed, ``fell_back``: those past a cost guard, each counted
    at ``failed_speedup``."""

    objective: float
    speedup: float
    size: float
    compile: float | None
    size_penalty: float
    time_penalty: float
    failed: tuple[str, ...] = field(default=())
    fell_back: tuple[str, ...] = field(default=())


def _factor(ratio: float | None, allowance: float, weight: float) -> float:
    if ratio is None:
        return 1.0
    excess = max(0.0, math.log(ratio) - math.log1p(allowance))
    return math.exp(-weight * excess)


def score(figures: Sequence[ProgramFigure], penalties: Penalties,
          reference: Mapping[str, float] | None = None) -> Score:
    """The objective of one trial (ValueError without figures, or a figure that is neither
    measured nor failed).  ``reference``: each program's compile time with the heuristic's
    decisions, keyed ``CLOCK:PROGRAM``; the compile-time ratio is a geometric mean over the
    programs where both are known on the same clock (none: no compile-time penalty)."""
    if not figures:
        raise ValueError("no program measured")
    speedups, sizes, compiles = [], [], []
    failed: list[str] = []
    fell_back: list[str] = []
    for f in figures:
        known = (reference or {}).get(f"{f.clock}:{f.name}")
        ratio = (f.seconds / known if f.seconds is not None and f.seconds > 0
                 and known is not None and known > 0 else None)
        if f.failed is None and (f.speedup is None or f.speedup <= 0):
            raise ValueError(f"{f.name}: no speedup")
        if f.failed is not None:
            failed.append(f.name)
        elif over_guard(ratio, f.size_ratio, penalties):
            fell_back.append(f.name)
        else:
            assert f.speedup is not None
            speedups.append(f.speedup)
            sizes.append(f.size_ratio if f.size_ratio and f.size_ratio > 0 else 1.0)
            if ratio is not None:
                compiles.append(ratio)
            continue
        speedups.append(penalties.failed_speedup)  # the heuristic's build is shipped
        sizes.append(1.0)
    speedup, size = geomean(speedups), geomean(sizes)
    compile_ = geomean(compiles) if compiles else None
    size_factor = _factor(size, penalties.size_allowance, penalties.size_weight)
    time_factor = _factor(compile_, penalties.time_allowance, penalties.time_weight)
    return Score(speedup * size_factor * time_factor, speedup, size, compile_,
                 1.0 - size_factor, 1.0 - time_factor, tuple(failed), tuple(fell_back))


def over_guard(compile_ratio: float | None, size_ratio: float | None,
               penalties: Penalties) -> bool:
    """Past a cost guard: compile time (where known) or binary size above its limit."""
    limit_c, limit_s = penalties.max_compile_ratio, penalties.max_size_ratio
    return ((limit_c is not None and compile_ratio is not None and compile_ratio > limit_c)
            or (limit_s is not None and size_ratio is not None and size_ratio > limit_s))
