"""``plot_experiment``: energy against step for one rundir, written to ``<rundir>/plot.png``.

Dots: the energy of every proposal of every step (candidates without a successful run have
none); crosses: remeasured incumbent energies; lines: incumbent and best energy after each step
(step 0 is the baseline, energy 1.0, also drawn as a dashed horizontal line); SA temperature on a
secondary axis.  Uses matplotlib's object API with the Agg canvas: no display, no pyplot state.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.export import experiment_info
from dispatcher.rundir import read_journal


def plot_experiment(rundir: Path) -> Path:
    """Write ``<rundir>/plot.png`` (atomically) and return its path."""
    rundir = Path(rundir)
    events = read_journal(rundir / "journal.jsonl")
    exp = experiment_info(rundir, events)
    steps: dict[int, dict] = {}
    for e in events:
        if e.get("event") == "step" and isinstance(e.get("step"), int):
            steps[e["step"]] = e
    order = sorted(steps)

    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    px = [n for n in order for c in steps[n].get("candidates") or []
          if c.get("energy") is not None]
    py = [c["energy"] for n in order for c in steps[n].get("candidates") or []
          if c.get("energy") is not None]
    ax.scatter(px, py, s=14, alpha=0.6, color="tab:gray", label="proposals", zorder=5)
    rx = [e.get("step") for e in events
          if e.get("event") == "remeasure" and e.get("energy") is not None]
    ry = [e["energy"] for e in events
          if e.get("event") == "remeasure" and e.get("energy") is not None]
    if rx:
        ax.scatter(rx, ry, marker="x", s=30, color="tab:purple", label="remeasured incumbent",
                   zorder=6)
    for key, color, width in (("incumbent", "tab:blue", 2.8), ("best", "tab:green", 1.4)):
        xs, ys = [0], [1.0]
        for n in order:
            energy = (steps[n].get(key) or {}).get("energy")
            if energy is not None:
                xs.append(n)
                ys.append(energy)
        ax.plot(xs, ys, drawstyle="steps-post", color=color, linewidth=width, label=key,
                zorder=4)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="baseline", zorder=1)
    ax.set_xlabel("step")
    ax.set_ylabel("energy (time / baseline time)")
    ax.set_xlim(left=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()

    temps = [(n, steps[n].get("temperature")) for n in order
             if isinstance(steps[n].get("temperature"), (int, float))]
    if temps:
        ax2 = ax.twinx()
        (line,) = ax2.plot([n for n, _ in temps], [t for _, t in temps], color="tab:orange",
                           linewidth=1, alpha=0.8, label="temperature")
        ax2.set_ylabel("temperature")
        handles.append(line)
        labels.append("temperature")
    ax.legend(handles, labels, loc="best", fontsize="small")

    title = f"{exp.get('task', '?')} — {exp.get('algorithm', '?')}, seed {exp.get('seed', '?')}"
    done, planned = (order[-1] if order else 0), exp.get("steps")
    if planned is not None:
        title += f" ({done}/{planned} steps)"
    ax.set_title(title)
    fig.tight_layout()

    out = rundir / "plot.png"
    fd, tmp = tempfile.mkstemp(prefix=".plot.", suffix=".png.tmp", dir=rundir)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png")
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out
