"""``plot_experiment``: energy against step for one rundir, written to ``<rundir>/plot.png``;
``plot_predicted`` and ``plot_rewards`` for reward assignment (``analysis.rewards``).

Dots: the energy of every proposal of every step (candidates without a successful run have
none); crosses: remeasured incumbent energies; a red diamond: the end-of-chain confirmation of
the best candidate with its 95% interval; lines: incumbent and best energy after each step
(step 0 is the baseline, energy 1.0, also drawn as a dashed horizontal line); SA temperature on a
secondary axis.  Uses matplotlib's object API with the Agg canvas: no display, no pyplot state.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.export import experiment_info
from dispatcher.core.files import atomic_output
from dispatcher.core.records import ConfirmEvent, RemeasureEvent, StepEvent
from dispatcher.core.rundir import read_journal


def plot_experiment(rundir: Path) -> Path:
    """Write ``<rundir>/plot.png`` (atomically) and return its path."""
    rundir = Path(rundir)
    events = read_journal(rundir / "journal.jsonl")
    exp = experiment_info(rundir, events)
    steps = {e.step: e for e in events if isinstance(e, StepEvent)}  # a step twice: the last
    order = sorted(steps)

    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    px: list[int] = []
    py: list[float] = []
    for n in order:
        for c in steps[n].candidates:
            if c.energy is not None:
                px.append(n)
                py.append(c.energy)
    ax.scatter(px, py, s=14, alpha=0.6, color="tab:gray", label="proposals", zorder=5)
    remeasures = [e for e in events if isinstance(e, RemeasureEvent)]
    rx = [e.step for e in remeasures]
    ry = [e.energy for e in remeasures]
    if rx:
        ax.scatter(rx, ry, marker="x", s=30, color="tab:purple", label="remeasured incumbent",
                   zorder=6)
    # The confirmation of the best candidate, at the last step, with its 95% interval (in
    # energy: 1 / speedup), the figure batch-log reports.
    last = order[-1] if order else 0
    for e in events:
        if isinstance(e, ConfirmEvent) and e.speedup is not None:
            low, high = e.ci95 if e.ci95 is not None else (e.speedup, e.speedup)
            ax.errorbar([last], [1.0 / e.speedup],
                        yerr=[[1.0 / e.speedup - 1.0 / high], [1.0 / low - 1.0 / e.speedup]],
                        fmt="D", color="tab:red", capsize=4, zorder=7,
                        label="confirmed best (95% interval)")
    for key, color, width in (("incumbent", "tab:blue", 2.8), ("best", "tab:green", 1.4)):
        xs, ys = [0], [1.0]
        for n in order:
            pointer = steps[n].incumbent if key == "incumbent" else steps[n].best
            xs.append(n)
            ys.append(pointer.energy)
        ax.plot(xs, ys, drawstyle="steps-post", color=color, linewidth=width, label=key,
                zorder=4)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="baseline", zorder=1)
    ax.set_xlabel("step")
    ax.set_ylabel("energy (1 / speedup over the baseline)")
    ax.set_xlim(left=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()

    tx: list[int] = []
    ty: list[float] = []
    for n in order:
        t = steps[n].temperature
        if t is not None:
            tx.append(n)
            ty.append(t)
    if tx:
        ax2 = ax.twinx()
        (line,) = ax2.plot(tx, ty, color="tab:orange", linewidth=1, alpha=0.8,
                           label="temperature")
        ax2.set_ylabel("temperature")
        handles.append(line)
        labels.append("temperature")
    ax.legend(handles, labels, loc="best", fontsize="small")

    title = (f"{exp.task} — {exp.algorithm}, seed {exp.seed}" if exp is not None
             else f"{rundir.name} (no experiment record)")
    done, planned = (order[-1] if order else 0), exp.steps if exp is not None else None
    if planned is not None:
        title += f" ({done}/{planned} steps)"
    ax.set_title(title)
    fig.tight_layout()

    out = rundir / "plot.png"
    with atomic_output(out, suffix=".png.tmp") as tmp:
        fig.savefig(tmp, format="png")
    return out


# --------------------------------------------------------------------------- reward assignment

def _save(fig: Figure, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    with atomic_output(out, suffix=".png.tmp") as tmp:
        fig.savefig(tmp, format="png")
    return out


def plot_predicted(out: Path, benchmark: str, model: str, measured: Sequence[float],
                   predicted: Mapping[str, Sequence[float] | np.ndarray]) -> Path:
    """Predicted (in sample) against measured speedup of every candidate, one marker series
    per hyperparameter setting of ``model``; the diagonal is a perfect fit."""
    fig = Figure(figsize=(7, 6), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    lo = min([*measured, *(min(p) for p in predicted.values() if len(p))], default=0.9)
    hi = max([*measured, *(max(p) for p in predicted.values() if len(p))], default=1.1)
    for slug, values in sorted(predicted.items()):
        ax.scatter(measured, values, s=10, alpha=0.5, label=slug)
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, linestyle="--")
    ax.set_xlabel("measured speedup (paired, over the baseline)")
    ax.set_ylabel("predicted speedup")
    ax.set_title(f"{benchmark} — {model}")
    ax.grid(True, alpha=0.3)
    if len(predicted) <= 20:
        ax.legend(fontsize="x-small", loc="best")
    return _save(fig, out)


def plot_rewards(out: Path, benchmark: str, slug: str, rewards: pd.DataFrame,
                 top: int = 30) -> Path:
    """The ``top`` largest net rewards (what inlining a call adds, by magnitude) with their 95%
    bootstrap intervals."""
    rows = []
    calls = rewards[rewards["varies"] & (rewards["kind"] == "call")]
    for _, r in calls.iterrows():
        rows.append((f"{r['name']} ({r['unit']}:{r['round']}, depth {r['depth']})",
                     r["net"], r["low_net"], r["high_net"]))
    rows.sort(key=lambda t: -abs(t[1]))
    rows = rows[:top][::-1]
    fig = Figure(figsize=(9, max(3.0, 0.28 * len(rows) + 1.2)), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if rows:
        ys = range(len(rows))
        values = [r[1] for r in rows]
        err = [[max(0.0, r[1] - r[2]) for r in rows], [max(0.0, r[3] - r[1]) for r in rows]]
        ax.errorbar(values, ys, xerr=err, fmt="o", markersize=4, capsize=2)
        ax.set_yticks(list(ys))
        ax.set_yticklabels([r[0] for r in rows], fontsize="x-small")
    ax.axvline(0.0, color="black", linewidth=1)
    ax.set_xlabel("net reward of inlining (inline - out), with its 95% bootstrap interval")
    ax.set_title(f"{benchmark} — {slug}")
    ax.grid(True, axis="x", alpha=0.3)
    return _save(fig, out)
