"""A campaign's last stage: what is small and meaningful, copied from the campaign directory
into ``results`` (the repository's, by default), with a README that says what produced it.

Written: ``summary.csv`` (policy or baseline, split, program, speedup, low, high, pairs, binary
size; the policy against each baseline; ``summary-kept.csv`` the same for the policy the
``select`` or ``searched`` stage kept), per-program CSVs (``<bench>/plugins/``, and the
optimal trees' ``<bench>/<model>/``), ``global-setting.json``, the policy file with its
validation scores, the labels tables and their figures (``labels/<bench>/``), the dataset
(``dataset/``: ``export-dataset``'s), the searches' plots (``search/<rundir>.png``), and
``README.md`` with the stages' tables, the command that trains the same policy from the
dataset, the settings, the compiler's identity and the machine.  Nothing in it depends on when
it is written: a rerun over the same campaign directory writes the same files.
"""
from __future__ import annotations

import os
import platform
import shutil
from datetime import datetime, timezone
from pathlib import Path

from dispatcher.build.policy_file import PolicyFileError, read_policy_file
from dispatcher.core.files import write_text_atomic
from dispatcher.core.rundir import PLOT_TEMPORARIES
from pipeline.campaign.budget import WorkerClock
from pipeline.campaign.plan import SEARCHES, Campaign, CampaignError
from pipeline.campaign.stages import KEPT, experiments
from pipeline.campaign.state import STAGES, CampaignState, read_state
from pipeline.longrun import progress


class PublishError(Exception):
    """What stopped the publishing; one line."""


def _copy(src: Path, dst: Path, written: list[Path]) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists() or dst.read_bytes() != src.read_bytes():
        shutil.copyfile(src, dst)
    written.append(dst)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _compiler_identity() -> str:
    from dispatcher.build.toolchain import CompilerNotFound, locate_compiler
    try:
        compiler = locate_compiler(build=False)
        return f"ocamlopt sha256 {compiler.identity} (compiler/flambda-inlining.patch)"
    except (CompilerNotFound, OSError) as exc:
        return f"unknown ({exc})"


def _log(campaign: Campaign, stage: str) -> str:
    path = campaign.dir / "logs" / f"{stage}.out"
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def reproduce_command(campaign: Campaign) -> str:
    """train-policy --dataset with the options that wrote the campaign's policy (the
    classifier its measured validation kept)."""
    try:
        classifier = read_policy_file(campaign.policy_file).classifier
    except (PolicyFileError, OSError):  # unreadable: the classifier the campaign asked for
        classifier = campaign.policy.classifier
    model = (f" --model {campaign.rewards_model}" if (campaign.dir / "rewards").is_dir()
             else "")
    return (f"train-policy --dataset dataset --classifier {classifier} --margin "
            f"{campaign.policy.margin} --growth-budget {campaign.policy.growth_budget}{model} "
            f"--out {campaign.policy_file.name}")


def readme(campaign: Campaign, state: CampaignState, spent_s: float) -> str:
    source = campaign.source.read_text(encoding="utf-8")
    lines = [
        "# Campaign results",
        "",
        f"Written by `run-campaign --config {campaign.source.name}"
        f"{' --quick' if campaign.quick else ''}` (the campaign file is below); a rerun over "
        "the same campaign directory writes the same files.  Speedup: the heuristic build's "
        "time over the build's, measured in pairs on one worker CPU, with its 95% interval "
        "(docs/measurement.md); above 1 is faster.",
        "",
        "## Stages",
        "",
        "| stage | state | finished | note |",
        "|---|---|---|---|",
    ]
    for name in STAGES[:-1]:  # not publish: it is what writes this
        s = state.stages[name]
        when = "-" if s.finished is None else \
            datetime.fromtimestamp(s.finished, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        lines.append(f"| {name} | {s.state} | {when} | {s.note} |")
    lines += ["", f"Worker budget: {spent_s / 3600:.2f} of {campaign.worker_hours:g} "
              "worker-hours spent running binaries by the search and the sweeps.", ""]
    for stage, title in (("kept", "The kept policy and the baselines (run-plugin-benchmark)"),
                         ("evaluate", "The policy and the baselines (run-plugin-benchmark)"),
                         ("policy", "Training and measured validation (train-policy)"),
                         ("optimal", "Optimal trees of the rewards (run-all-benchmarks)")):
        text = _log(campaign, stage)
        if text:
            lines += [f"## {title}", "", "```", text, "```", ""]
    if (campaign.dir / "dataset").is_dir() and campaign.policy_file.is_file():
        lines += ["## Reproducing the policy from the dataset", "",
                  "From `dataset/` alone (no compiler, no config), the same policy file byte "
                  "for byte (docs/dataset.md):", "", "```",
                  reproduce_command(campaign), "```", ""]
    lines += [
        "## Where it ran",
        "",
        f"- compiler: {_compiler_identity()}",
        f"- machine: {_cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} "
        f"{platform.release()}",
        f"- experiment config: `{campaign.config.name}`",
        "",
        "## The campaign file",
        "",
        "```yaml",
        source.rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _published(campaign: Campaign) -> list[tuple[Path, Path]]:
    """What is published: (source in the campaign directory, destination in the results)."""
    d, out = campaign.dir, campaign.results
    pairs: list[tuple[Path, Path]] = []
    measured = d / "results"
    for src in sorted(measured.rglob("*")) if measured.is_dir() else []:
        rel = src.relative_to(measured)
        if not src.is_file():
            continue
        if rel.name == f"plugin_{KEPT}.summary.csv":  # the kept policy's evaluation
            pairs.append((src, out / "summary-kept.csv"))
        elif rel.name.startswith("plugin_") and rel.name.endswith(".summary.csv") \
                and len(rel.parts) == 1:
            pairs.append((src, out / "summary.csv"))
        elif src.suffix in (".csv", ".json", ".png"):
            pairs.append((src, out / rel))
    for name in (campaign.policy_file.name, campaign.policy_file.name + ".scores.csv"):
        if (d / name).is_file():
            pairs.append((d / name, out / name))
    labels = d / "labels"
    for src in sorted(labels.glob("*/*")) if labels.is_dir() else []:
        if src.is_file() and src.name in ("sites.csv", "sites.parquet", "report.txt",
                                          "effects.png"):
            pairs.append((src, out / "labels" / src.parent.name / src.name))
    dataset = d / "dataset"
    for src in sorted(dataset.rglob("*")) if dataset.is_dir() else []:
        if src.is_file():
            pairs.append((src, out / "dataset" / src.relative_to(dataset)))
    searched = d / "searched"  # the searched stage's study: its policy and tables
    for name in ("searched.policy", "searched.json", "trials.csv", "confirm.csv"):
        if (searched / name).is_file():
            pairs.append((searched / name, out / "searched" / name))
    selected = d / "selected"  # the select stage's choice and the policy it kept
    for name in ("selected.policy", "choice.csv", "choice.json"):
        if (selected / name).is_file():
            pairs.append((selected / name, out / "selected" / name))
    for rundir in experiments(campaign.batch_log, SEARCHES):
        if (rundir / "plot.png").is_file():
            pairs.append((rundir / "plot.png", out / "search" / f"{rundir.name}.png"))
    return pairs


def plot_searches(campaign: Campaign) -> None:
    """Each search's plot drawn again from its journal.  The search draws it only when its
    chains end uninterrupted: a chain that finished in a run stopped later (a kill, Ctrl-C,
    the budget) was never drawn, and its resume says "already finished"; so the plots
    published depend on the journals alone, whatever stopped the stage on the way."""
    rundirs = experiments(campaign.batch_log, SEARCHES)
    if not rundirs:
        return
    from analysis.plots import plot_experiment
    for rundir in rundirs:
        # What a kill during an earlier publish's plot left (the searches are over: no one
        # else writes there now; a search's own resume sweeps the same names).
        for stale in rundir.glob(PLOT_TEMPORARIES):
            stale.unlink(missing_ok=True)
        try:
            plot_experiment(rundir)
        except Exception as exc:  # a plot is a convenience: the rest is still published
            progress(f"{rundir}: no plot ({' '.join(str(exc).split())})")


def publish(campaign: Campaign) -> list[Path]:
    """Copy the campaign's results into ``campaign.results`` and write its README; the files
    written.  PublishError when there is nothing to publish or it cannot be written."""
    out = campaign.results
    written: list[Path] = []
    try:
        state = read_state(campaign)
        plot_searches(campaign)
        for src, dst in _published(campaign):
            _copy(src, dst, written)
        if not written:
            raise PublishError(f"{campaign.dir}: nothing to publish (no stage wrote results)")
        write_text_atomic(out / "README.md",
                          readme(campaign, state, WorkerClock().spent(campaign)))
        written.append(out / "README.md")
    except OSError as exc:
        raise PublishError(f"{out}: cannot write the results ({exc.strerror or exc})") from None
    except CampaignError as exc:
        raise PublishError(str(exc)) from None
    return written
