"""The labels table of a benchmark (``labels/<bench>/sites.parquet`` and ``.csv``), its report
and its plot, from labels rundirs (``measure-sites``, docs/labels.md).

One row per label: the site (unit, round, key, callee, its source location), what the
heuristic did there and the site's features from the heuristic build's dump (from another
reference's build, ``reference``: what that build did there, and its dump's features), the action
tested and its context, and the outcome: the effect as a log speedup of the tested tree over
its reference with its 95% interval, pairs, the share of disturbed runs, and the cost; and the
same two binaries' effect in estimated cycles (``cycles_effect``, exact, counted at
``cycles_size``), so a label carries its cycles effect beside its wall effect.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from dispatcher.core.decisions import feature_rows, site_location
from dispatcher.core.outputs import read_dumps_in
from dispatcher.core.rundir import RundirError, SitesRundir
from dispatcher.core.site_records import (
    REFERENCE_DIR,
    LabelEvent,
    MinimalEvent,
    SitesExperiment,
    WinnerEvent,
    reference_name,
)
from dispatcher.core.sites import site_function

TABLE = "sites"
ID_COLUMNS = ["benchmark", "unit", "round", "key", "callee", "location",
              "heuristic_action", "heuristic_reason"]
OUTCOME_COLUMNS = ["action", "context", "status", "effect", "low", "high", "speedup", "pairs",
                   "disturbed_share", "runs", "cpu_s", "heat", "decision", "trial", "why",
                   "rundir"]
# and, in a table measure-sites writes now, ``metric``: what effect is in (time, or an exact
# one); a table without it (older, or made by hand) is in time; and ``cycles_effect`` (the log
# ratio reference / tested in estimated cycles, exact: no interval) with ``cycles_size`` (the
# size it was counted at): empty where not counted, absent from older tables (read as empty)
CYCLES_COLUMNS = ["cycles_effect", "cycles_size"]
# and ``reference``: the build the label was measured against and flipped a site of
# (``heuristic``, ``always-inline``, ``tree:NAME``: site_records.reference_name); absent from
# older tables, read as heuristic
REFERENCE_COLUMN = "reference"


class LabelsError(RuntimeError):
    """A labels rundir or table that cannot be read; the message is one line."""


def label_rows(rundir: Path) -> pd.DataFrame:
    """Every label a labels rundir journaled, one row each, with the site's features."""
    rd = SitesRundir(rundir)
    try:
        exp = rd.experiment
        events = rd.events()
    except RundirError as exc:
        raise LabelsError(str(exc)) from None
    dumps = rundir / REFERENCE_DIR
    reference = reference_name(exp.reference)
    features: dict[tuple[str, int, str], dict[str, Any]] = {}
    if dumps.is_dir():
        for row in feature_rows(read_dumps_in(dumps)):
            features[(row["unit"], row["round"], row["key"])] = row
    rows = []
    for e in events:
        if not isinstance(e, LabelEvent):
            continue
        s, o = e.site, e.outcome
        f = dict(features.get((s.unit, s.round, s.key), {}))
        reason = f.pop("reason", None)
        for k in ("unit", "key", "callee", "action"):
            f.pop(k, None)
        effect = low = high = math.nan
        if o.measured and o.speedup is not None:
            effect = math.log(o.speedup)
            if o.ci95 is not None:
                low, high = math.log(o.ci95[0]), math.log(o.ci95[1])
        cycles = math.log(o.cycles) if o.measured and o.cycles else math.nan
        rows.append({
            "benchmark": exp.task, "unit": s.unit, "round": s.round, "key": s.key,
            "callee": s.callee, "location": site_location(s.key) or "",
            "heuristic_action": s.heuristic, "heuristic_reason": reason,
            **{k: v for k, v in f.items() if k != "round"},
            "action": s.action, "context": e.context, "status": o.status,
            "effect": effect, "low": low, "high": high,
            "speedup": o.speedup if o.measured else math.nan, "pairs": o.pairs,
            "disturbed_share": o.disturbed / o.runs if o.runs else math.nan,
            "runs": o.runs, "cpu_s": o.cpu_s, "heat": e.heat, "decision": e.decision,
            "trial": e.trial, "why": o.why or "", "rundir": str(rundir),
            "metric": o.metric, "cycles_effect": cycles,
            "cycles_size": exp.cycles_size if not math.isnan(cycles) else None,
            REFERENCE_COLUMN: reference})
    if not rows:
        return pd.DataFrame(columns=ID_COLUMNS + OUTCOME_COLUMNS
                            + ["metric", *CYCLES_COLUMNS, REFERENCE_COLUMN])
    return pd.DataFrame(rows)


def merged_table(new: pd.DataFrame, existing: pd.DataFrame | None) -> pd.DataFrame:
    """The table a benchmark's labels directory holds once ``new`` (one reference's rows) is
    written: ``existing``'s rows of the other references kept, before it (labels from the
    heuristic's tree and from an aggressive reference live in one table, and
    ``train-policy --labels`` trains on both), its rows of the same reference replaced, as a
    table was always replaced."""
    if existing is None or existing.empty:
        return new
    mine = set(new[REFERENCE_COLUMN]) if len(new) else set()
    theirs = (existing[REFERENCE_COLUMN].fillna("heuristic")
              if REFERENCE_COLUMN in existing.columns
              else pd.Series("heuristic", index=existing.index))
    kept = existing[~theirs.isin(mine)].assign(**{REFERENCE_COLUMN: theirs})
    if kept.empty:
        return new
    return pd.concat([kept, new], ignore_index=True) if len(new) else kept


def write_table(table: pd.DataFrame, directory: Path) -> list[Path]:
    """``sites.parquet`` and ``sites.csv`` in ``directory`` (made if needed)."""
    directory.mkdir(parents=True, exist_ok=True)
    parquet, csv = directory / f"{TABLE}.parquet", directory / f"{TABLE}.csv"
    table.to_parquet(parquet, index=False)
    table.to_csv(csv, index=False)
    return [parquet, csv]


def significant(row: Any, threshold: float = 0.0) -> bool:
    """A measured label whose interval excludes zero and whose effect exceeds
    ``threshold`` (log units)."""
    return (row["status"] == "measured" and not math.isnan(row["low"])
            and (row["low"] > 0 or row["high"] < 0) and abs(row["effect"]) > threshold)


def report(rundirs: Sequence[Path], table: pd.DataFrame) -> list[str]:
    """The text report: per rundir the winner and its minimal subset, then the labels."""
    lines: list[str] = []
    confirmed_at: dict[str, str] = {}  # rundir -> the size its retests confirm at
    for path in rundirs:
        rd = SitesRundir(path)
        try:
            exp = rd.experiment
            events = rd.events()
        except RundirError as exc:
            raise LabelsError(str(exc)) from None
        if exp.confirm_size is not None:
            confirmed_at[str(path)] = exp.confirm_size
        if exp.reference is not None:
            lines.append(f"reference: {reference_name(exp.reference)}: each label sets one "
                         "site it inlined back to dont_inline, against its build (effect > 0: "
                         "inlining there hurt)")
        winner = next((e for e in events if isinstance(e, WinnerEvent)), None)
        minimal = next((e for e in events if isinstance(e, MinimalEvent)), None)
        if winner is not None:
            ci = "" if winner.ci95 is None else f" [{winner.ci95[0]:.3f}, {winner.ci95[1]:.3f}]"
            where = f"{winner.rundir}/{winner.dir}" if winner.dir else winner.rundir
            figure = ("" if winner.speedup is None else
                      f", confirmed {winner.speedup:.3f}x{ci}")
            lines.append(f"winner: {where}{figure}; {len(winner.decisions)} decision(s) differ "
                         "from the heuristic")
        if minimal is not None:
            kept = "; ".join(f"{winner.decisions[i].callee} {winner.decisions[i].action}"
                             for i in minimal.subset) if winner else ""
            share = "-" if minimal.kept_share is None else f"{100 * minimal.kept_share:.0f}%"
            lines.append(f"minimal subset: {len(minimal.subset)} decision(s) after "
                         f"{minimal.tests} test(s), stopped: {minimal.stopped} ({kept})")
            lines.append(f"  fresh pairs: all {_figure(minimal.full)}, minimal "
                         f"{_figure(minimal.kept)}; share of the log speedup kept: {share}")
        line = confirmation_line(exp, events)
        if line is not None:
            lines.append(line)
    if table.empty:
        lines.append("no labels")
        return lines
    counts = table.groupby("status").size().to_dict()
    lines.append("labels: " + ", ".join(f"{n} {k.replace('_', ' ')}"
                                        for k, n in sorted(counts.items())))
    shown = table.sort_values(["trial", "context", "effect"], na_position="last")
    for _, r in shown.iterrows():
        if r["status"] == "measured":
            figure = (f"{100 * (math.exp(r['effect']) - 1):+6.2f}% "
                      f"[{100 * (math.exp(r['low']) - 1):+.2f}, "
                      f"{100 * (math.exp(r['high']) - 1):+.2f}]")
            mark = " *" if significant(r) else ""
            metric = r.get("metric")  # absent or NaN: a table from before the column
            if isinstance(metric, str) and metric != "time":
                mark += f" ({metric})"
            cycles = r.get("cycles_effect")  # absent or NaN: not counted
            if isinstance(cycles, float) and not math.isnan(cycles) and metric != "cycles":
                mark += f"; cycles {100 * (math.exp(cycles) - 1):+.2f}%"
        else:
            figure, mark = r["status"].replace("_", " "), ""
        trial = r["trial"]
        if trial == "retest" and str(r["rundir"]) in confirmed_at:  # not the labels' size
            trial = f"retest at {confirmed_at[str(r['rundir'])]}"
        lines.append(f"  {trial:7} {r['context']:8} {r['action']:11} {r['callee']} in "
                     f"{site_function(r['unit'], r['key'])} ({r['unit']} round {r['round']}, "
                     f"{r['location']}): {figure}{mark}")
    cost = table[table["status"] == "measured"]["cpu_s"]
    if len(cost):
        lines.append(f"cost: {cost.sum():.0f} worker CPU-seconds for {len(cost)} measured "
                     f"labels, {cost.mean():.1f} s each")
    return lines


def confirmation_line(exp: SitesExperiment, events: Sequence[Any]) -> str | None:
    """How many exact labels were confirmed in wall time, at what size, and how many were
    below the threshold (not retested); None for a rundir that confirms nothing apart (under
    time, or written before confirmation: every label retested at its own size)."""
    if exp.confirm_above is None or exp.confirm_size is None:
        return None
    firsts = [e for e in events if isinstance(e, LabelEvent) and e.trial == "labels"
              and e.outcome.measured]
    above = sum(exp.confirms(e.outcome) for e in firsts)
    retests = [e for e in events if isinstance(e, LabelEvent) and e.trial == "retest"]
    done = sum(e.outcome.measured for e in retests)
    return (f"confirmation in wall time at {exp.confirm_size} size: {above} of {len(firsts)} "
            f"measured label(s) at |{exp.metric} effect| >= {exp.confirm_above:g} (log), "
            f"{len(retests)} retested ({done} measured); {len(firsts) - above} below, not "
            "retested")


def _figure(outcome: Any) -> str:
    if not outcome.measured:
        return outcome.status.replace("_", " ")
    ci = "" if outcome.ci95 is None else f" [{outcome.ci95[0]:.3f}, {outcome.ci95[1]:.3f}]"
    return f"{outcome.speedup:.3f}x{ci}"


def plot_effects(table: pd.DataFrame, path: Path, title: str,
                 retest_size: str | None = None) -> Path | None:
    """Each measured label's effect (in percent) with its 95% interval; None: nothing to
    plot.  ``retest_size``: the size the retests confirm at, named where it is not the
    labels' own."""
    measured = table[table["status"] == "measured"].sort_values("effect")
    if measured.empty:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pct = (measured["effect"].map(math.exp) - 1) * 100
    low = (measured["low"].map(math.exp) - 1) * 100
    high = (measured["high"].map(math.exp) - 1) * 100
    again = ", retest" + (f" at {retest_size}" if retest_size else "")
    names = [f"{r.callee} {r.action} ({r.context}{again if r.trial == 'retest' else ''})"
             for r in measured.itertuples()]
    fig, ax = plt.subplots(figsize=(8, 0.3 * len(names) + 1.5))
    ys = range(len(names))
    ax.errorbar(pct, ys, xerr=[pct - low, high - pct], fmt="o", capsize=3)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_yticks(list(ys))
    ax.set_yticklabels(names, fontsize=7)
    ax.set_xlabel("effect of the action: speedup over its reference, % (95% interval)")
    ax.set_title(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
