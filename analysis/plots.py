"""``plot_experiment``: energy against step for one rundir, written to ``<rundir>/plot.png``.

Dots: the energy of every proposal of every step (candidates without a successful run have
none); crosses: remeasured incumbent energies; a red diamond: the end-of-chain confirmation of
the best candidate with its 95% interval; lines: incumbent and best energy after each step
(step 0 is the baseline, energy 1.0, also drawn as a dashed horizontal line); SA temperature on a
secondary axis.  Uses matplotlib's object API with the Agg canvas: no display, no pyplot state.
"""
from __future__ import annotations

from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.export import experiment_info
from dispatcher.files import atomic_output
from dispatcher.records import ConfirmEvent, RemeasureEvent, StepEvent
from dispatcher.rundir import read_journal


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
