"""What ``run-all-benchmarks`` measured, judged: per benchmark and hyperparameters the speedup of
the optimal tree over the heuristic with its 95% interval, per benchmark the best and the median
over hyperparameters, and the hyperparameters to use in general, if a measurement supports any.

The regret of hyperparameters h on benchmark b is how far h's speedup falls short of the best
measured on b, on the log scale:

    regret(b, h) = log(best speedup on b) - log(speedup of h on b)

A hyperparameter setting not measured on a benchmark (its optimal tree missing there, or its
measurement failed) is charged that benchmark's worst regret, so skipping a benchmark never pays.
Benchmarks where nothing was measured take no part.  Ties go to the setting measured on more
benchmarks, then to the first by name.

Least regret alone recommends nothing: among settings that all did no better than the heuristic
it still names one (regret 0 with one benchmark measured).  So a setting is recommended
(``recommend``) only when a measurement supports it: its optimal tree measured significantly
faster than the heuristic on at least one benchmark (the 95% interval of the speedup above 1)
and significantly slower on none (the interval below 1).  Of those, the one of least total
regret; none such, no recommendation, and the line says why.

Pure functions of made-up or measured ``Outcome``s; the command does the measuring.
"""
from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TextIO

from dispatcher.core.comparison import Comparison
from dispatcher.core.figures import Figure

# ``<rewards>/<bench>/<model>/<hyper>/no-optimal.txt``: why assign-rewards wrote no optimal.sexp
# there (a weak fit, docs/rewards.md); run-all-benchmarks reports that setting as skipped
WITHHELD = "no-optimal.txt"


@dataclass(frozen=True)
class Outcome:
    """One optimal tree (or policy) measured against the heuristic: which, and its ``figure``
    (no speedup: no pairs, ``stopped`` says why)."""

    benchmark: str
    hyper: str
    figure: Figure = Figure()
    worker: str | None = None
    stopped: str = ""

    @classmethod
    def of(cls, benchmark: str, hyper: str, c: Comparison) -> Outcome:
        """A comparison with the heuristic, judged (no speedup when unresolved)."""
        speedup, low, high = c.interval
        return cls(benchmark, hyper, Figure(speedup, low, high, c.pairs, metric=c.metric),
                   c.worker, c.stopped)

    def text(self) -> str:
        """Its speedup and interval, or ``-`` and why there is none."""
        return self.figure.text(f"- ({self.stopped or 'not measured'})")


@dataclass(frozen=True)
class BenchmarkSummary:
    benchmark: str
    best: float
    median: float
    best_hypers: tuple[str, ...]  # every setting reaching the best speedup
    measured: int  # settings with a speedup


@dataclass(frozen=True)
class Regret:
    hyper: str
    total: float
    measured: int  # benchmarks where it was measured
    missing: tuple[str, ...]  # benchmarks where it was not (charged their worst regret)


def _measured(outcomes: Iterable[Outcome]) -> dict[str, dict[str, float]]:
    """benchmark -> hyper -> speedup, for outcomes with a speedup."""
    out: dict[str, dict[str, float]] = {}
    for o in outcomes:
        speedup = o.figure.speedup
        if speedup is not None:
            if not speedup > 0 or math.isinf(speedup):
                raise ValueError(f"{o.benchmark} {o.hyper}: speedup {speedup!r} is not "
                                 "positive and finite")
            out.setdefault(o.benchmark, {})[o.hyper] = speedup
    return out


def per_benchmark(outcomes: Iterable[Outcome]) -> list[BenchmarkSummary]:
    """Best and median speedup over each benchmark's measured settings, by benchmark name."""
    rows = []
    for bench, speedups in sorted(_measured(outcomes).items()):
        best = max(speedups.values())
        rows.append(BenchmarkSummary(
            bench, best, statistics.median(speedups.values()),
            tuple(sorted(h for h, s in speedups.items() if s == best)), len(speedups)))
    return rows


def regrets(outcomes: Iterable[Outcome]) -> dict[str, dict[str, float]]:
    """benchmark -> hyper -> regret, for every setting measured on any benchmark (a missing
    one gets that benchmark's worst regret)."""
    measured = _measured(outcomes)
    hypers = sorted({h for speedups in measured.values() for h in speedups})
    table: dict[str, dict[str, float]] = {}
    for bench, speedups in measured.items():
        best = math.log(max(speedups.values()))
        own = {h: best - math.log(s) for h, s in speedups.items()}
        worst = max(own.values())
        table[bench] = {h: own.get(h, worst) for h in hypers}
    return table


def total_regrets(outcomes: Sequence[Outcome]) -> list[Regret]:
    """Every setting's regret summed over benchmarks, least first (see the module's doc)."""
    measured = _measured(outcomes)
    table = regrets(outcomes)
    rows = []
    for h in sorted({h for per in table.values() for h in per}):
        rows.append(Regret(h, math.fsum(per[h] for per in table.values()),
                           sum(h in measured[b] for b in table),
                           tuple(sorted(b for b in table if h not in measured[b]))))
    return sorted(rows, key=lambda r: (round(r.total, 12), -r.measured, r.hyper))


def choose(outcomes: Sequence[Outcome]) -> Regret | None:
    """The hyperparameters of least total regret (None when nothing was measured), supported by
    a measurement or not: ``recommend`` says which to use."""
    ranked = total_regrets(outcomes)
    return ranked[0] if ranked else None


def faster(o: Outcome) -> bool:
    """Measured significantly faster than the heuristic: the 95% interval lies above 1."""
    return o.figure.ok and o.figure.low is not None and o.figure.low > 1.0


def slower(o: Outcome) -> bool:
    """Measured significantly slower than the heuristic: the 95% interval lies below 1."""
    return o.figure.ok and o.figure.high is not None and o.figure.high < 1.0


@dataclass(frozen=True)
class Recommendation:
    """The hyperparameters to use in general and the measurements that support them, or
    (``hyper`` None) why there are none."""

    hyper: str | None
    support: tuple[Outcome, ...] = ()  # its measurements significantly faster than the heuristic
    regret: Regret | None = None
    benchmarks: int = 0  # benchmarks with a speedup measured (the regret's sum runs over them)
    eligible: int = 0  # settings measured significantly faster somewhere, slower nowhere
    reason: str = ""  # no recommendation: why; a recommendation: what less regret was passed over

    def line(self) -> str:
        if self.hyper is None:
            return f"no hyperparameters to recommend: {self.reason}"
        assert self.regret is not None
        s = "s" if self.benchmarks != 1 else ""
        line = (f"hyperparameters to use in general: {self.hyper} (measured significantly "
                f"faster than the heuristic on {'; '.join(_figure(o) for o in self.support)}; "
                f"least total regret {self.regret.total:.4f} over {self.benchmarks} benchmark{s}"
                f" of the {self.eligible} setting{'s' if self.eligible != 1 else ''} measured "
                "significantly faster somewhere and slower nowhere; regret = log(best speedup) "
                "- log(its speedup))")
        return line + (f"; {self.reason}" if self.reason else "")


def _figure(o: Outcome) -> str:
    return f"{o.benchmark} {o.text()}, {o.figure.pairs} pairs"


def recommend(outcomes: Sequence[Outcome]) -> Recommendation:
    """The hyperparameters to use in general, when a measurement supports them (see the
    module's docstring)."""
    ranked = total_regrets(outcomes)
    benchmarks = len(regrets(outcomes))
    by_hyper: dict[str, list[Outcome]] = {}
    for o in sorted(outcomes, key=lambda o: o.benchmark):
        by_hyper.setdefault(o.hyper, []).append(o)
    if not ranked:
        return Recommendation(None, reason="no optimal tree was measured")
    gains = {h: [o for o in os if faster(o)] for h, os in by_hyper.items()}
    losses = {h: [o for o in os if slower(o)] for h, os in by_hyper.items()}
    eligible = [r for r in ranked if gains[r.hyper] and not losses[r.hyper]]
    if not eligible:
        gained = [r for r in ranked if gains[r.hyper]]
        if not gained:
            best = max((o for o in outcomes if o.figure.speedup is not None),
                       key=lambda o: (o.figure.speedup or 0.0, o.figure.low or 0.0))
            return Recommendation(None, benchmarks=benchmarks, reason=(
                "no optimal tree measured significantly faster than the heuristic (95% "
                f"interval above 1); the fastest: {best.hyper} on {_figure(best)}"))
        h = gained[0].hyper
        return Recommendation(None, benchmarks=benchmarks, reason=(
            f"every setting measured significantly faster somewhere is significantly slower "
            f"elsewhere; e.g. {h}: faster on {'; '.join(_figure(o) for o in gains[h])}, "
            f"slower on {'; '.join(_figure(o) for o in losses[h])}"))
    chosen, top = eligible[0], ranked[0]
    note = ""
    if chosen is not top:
        why = (f"was measured significantly slower on "
               f"{'; '.join(_figure(o) for o in losses[top.hyper])}" if losses[top.hyper]
               else "was measured significantly faster nowhere")
        note = f"{top.hyper} has less total regret ({top.total:.4f}) but {why}"
    return Recommendation(chosen.hyper, tuple(gains[chosen.hyper]), chosen, benchmarks,
                          len(eligible), note)


# --------------------------------------------------------------------------- printing


def _significant(o: Outcome) -> str:
    s = o.figure.significant
    return "-" if s is None else "yes" if s else "no"


def print_tables(outcomes: Sequence[Outcome], file: TextIO | None = None) -> None:
    """The measurements, the per-benchmark summary, the regret ranking and the general choice
    or why there is none, in one line (rich tables, plain text when not on a terminal)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    out = file or sys.stdout
    tty = out.isatty()
    console = Console(file=out, width=None if tty else 10_000, highlight=False,
                      force_terminal=tty, color_system="auto" if tty else None)

    def table(*columns: str, right: Iterable[str] = ()) -> Table:
        t = Table(box=box.SIMPLE_HEAD, expand=False, show_edge=False)
        for name in columns:
            t.add_column(name, justify="right" if name in set(right) else "left",
                         no_wrap=not tty, overflow="fold")
        return t

    measured = table("benchmark", "hyperparameters", "speedup [95% CI]", "significant",
                     "pairs", "worker", right=("speedup [95% CI]", "pairs"))
    for o in sorted(outcomes, key=lambda o: (o.benchmark, o.hyper)):
        measured.add_row(o.benchmark, o.hyper, o.text(), _significant(o),
                         str(o.figure.pairs), o.worker or "-")
    console.print(measured)
    summaries = per_benchmark(outcomes)
    if not summaries:
        console.print(recommend(outcomes).line(), markup=False)
        return
    console.print()
    bench = table("benchmark", "best speedup", "median speedup", "measured",
                  "best hyperparameters", right=("best speedup", "median speedup", "measured"))
    for s in summaries:
        bench.add_row(s.benchmark, f"{s.best:.3f}", f"{s.median:.3f}", str(s.measured),
                      ", ".join(s.best_hypers))
    console.print(bench)
    console.print()
    ranked = total_regrets(outcomes)
    regret = table("hyperparameters", "total regret", "benchmarks measured", "missing on",
                   right=("total regret", "benchmarks measured"))
    for r in ranked:
        regret.add_row(r.hyper, f"{r.total:.4f}", f"{r.measured}/{len(summaries)}",
                       ", ".join(r.missing) or "-")
    console.print(regret)
    console.print(recommend(outcomes).line(), markup=False)
