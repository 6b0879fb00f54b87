"""``train-policy``: an inlining policy from the rewards ``assign-rewards`` wrote and the
features the compiler dumps, validated on benchmarks it did not see.

For each benchmark under the rewards directory (or each one named): its rewards for one model
and hyperparameters (``--hyper``; ``best``: the setting with the best mean held-out R^2 in its
``fits.csv``), and the features of its call sites, from the decision dumps of its heuristic
build (compiled, or taken from the store).  ``analysis.policy_training`` labels, validates
leave-one-benchmark-out and trains; the policy file (``dispatcher.build.policy_file``) goes
to ``--out`` with the validation scores beside it (``<out>.scores.csv``).
"""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, NoReturn

import click
import pandas as pd

from analysis.policy_training import (
    CLASSIFIERS,
    TrainingError,
    choose,
    leave_one_benchmark_out,
    summary,
    train,
    training_set,
)
from analysis.sources import SourcesError, benchmark_of
from commands.common import backend_errors_in_one_line, show_warnings
from dispatcher.build.manifest import Benchmark, ManifestError
from dispatcher.build.policy_file import save_policy_file
from dispatcher.build.service import CompileError, CompileJob
from dispatcher.build.toolchain import CompilerNotFound
from dispatcher.config import ConfigError, load_config
from dispatcher.core.files import atomic_output
from dispatcher.session import Session
from dispatcher.storage.store import StoreError

PROG = "train-policy"
DEFAULT_THRESHOLD = 0.005  # net reward (log speedup with the default target): half a percent


def _fail(message: str) -> NoReturn:
    click.echo(f"{PROG}: {message}", err=True)
    sys.exit(2)


def best_hyper(bench_dir: Path, model: str) -> str:
    """The hyperparameters of ``model`` with the best mean held-out score (fits.csv)."""
    fits_path = bench_dir / "fits.csv"
    try:
        fits = pd.read_csv(fits_path)
    except (OSError, ValueError) as exc:
        _fail(f"{fits_path}: unreadable ({exc})")
    fits = fits[fits["model"] == model]
    if fits.empty:
        _fail(f"{fits_path}: no fit of model {model}")
    # by held-out R^2, then rank correlation; with neither (too few candidates to hold any
    # out), the first setting by name
    for score in ("r2", "spearman"):
        means = fits.groupby("hyperparameters")[score].mean().dropna()
        if not means.empty:
            return str(means.idxmax())
    return str(sorted(fits["hyperparameters"])[0])


def read_rewards(rewards: Path, name: str, model: str, hyper: str) -> pd.DataFrame:
    slug = best_hyper(rewards / name, model) if hyper == "best" else hyper
    path = rewards / name / model / slug / "rewards.csv"
    try:
        return pd.read_csv(path)
    except FileNotFoundError:
        _fail(f"{path}: no such rewards table (assign-rewards writes one per model and "
              "hyperparameters)")
    except (OSError, ValueError) as exc:
        _fail(f"{path}: unreadable ({exc})")


def site_features(session: Session, bench: Benchmark) -> pd.DataFrame:
    """One row per decision of the heuristic build: unit, round, key and its features."""
    try:
        built = session.builds.compile(CompileJob(bench))
    except (CompileError, StoreError) as exc:
        _fail(f"{bench.name}: {exc}")
    rows = []
    for dump in built.artifact.dumps():
        for d in dump.decisions:
            if d.features is not None:
                rows.append({"unit": d.unit, "round": d.round, "key": d.key,
                             **d.features.row()})
    if not rows:
        _fail(f"{bench.name}: its decision dumps carry no features (dump version 2 needed: "
              "rebuild the compiler with compiler/build)")
    return pd.DataFrame(rows)


class _FiniteFloatRange(click.FloatRange):
    """A FloatRange that refuses nan and the infinities: ``nan`` compares false with every
    bound, so a plain range lets it through (and every label would be nonsense)."""

    name = "finite float range"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


@click.command()
@click.argument("benchmarks", nargs=-1)
@click.option("--rewards", "rewards_dir", type=click.Path(path_type=Path), default="rewards",
              show_default=True, help="What assign-rewards wrote (--out).")
@click.option("--model", default="ridge", show_default=True,
              help="Whose rewards: a model assign-rewards fitted.")
@click.option("--hyper", default="best", show_default=True,
              help="Hyperparameters (a directory name such as gamma0.8-alpha0.01-log), or "
                   "best: per benchmark, the best mean held-out R^2.")
@click.option("--threshold", type=_FiniteFloatRange(0), default=DEFAULT_THRESHOLD,
              show_default=True, help="|net reward| at or below this: does not matter.")
@click.option("--classifier", type=click.Choice(["all", *CLASSIFIERS]), default="all",
              show_default=True, help="all: validate each, keep the best.")
@click.option("--out", type=click.Path(path_type=Path), default=Path("policy.policy"),
              show_default=True, help="The policy file to write.")
@click.option("--config", "config_path", type=click.Path(path_type=Path))
@backend_errors_in_one_line
def train_policy(benchmarks, rewards_dir, model, hyper, threshold, classifier, out,
                 config_path) -> None:
    """Train an inlining policy on the rewards of BENCHMARKS (default: every one there)."""
    if not rewards_dir.is_dir():
        _fail(f"{rewards_dir}: no such rewards directory (assign-rewards --out writes one)")
    known = sorted(p.name for p in rewards_dir.iterdir() if (p / "sources.json").is_file())
    for b in benchmarks:
        if b not in known:
            _fail(f"unknown benchmark {b}: no {rewards_dir / b}/sources.json (benchmarks "
                  f"there: {', '.join(known) or 'none'})")
    names = list(benchmarks) or known
    if not names:
        _fail(f"{rewards_dir}: no benchmark's rewards there")
    rewards = {n: read_rewards(rewards_dir, n, model, hyper) for n in names}
    try:
        session = Session(load_config(config_path))
    except (ConfigError, CompilerNotFound, StoreError) as exc:
        raise click.ClickException(str(exc)) from None
    show_warnings()
    with session:
        features = {}
        for n in names:
            try:
                bench = benchmark_of(rewards_dir, n)[0]
            except (SourcesError, ManifestError) as exc:
                _fail(str(exc))
            features[n] = site_features(session, bench)
    try:
        ts = training_set(rewards, features, threshold)
    except TrainingError as exc:
        _fail(str(exc))
    counts = ts.labels.value_counts()
    click.echo(f"{len(ts.labels)} call sites from {len(names)} benchmark(s): "
               + ", ".join(f"{counts.get(k, 0)} {k}" for k in ("inline", "dont_inline",
                                                              "default")))
    names_to_try = list(CLASSIFIERS) if classifier == "all" else [classifier]
    scores = pd.concat([leave_one_benchmark_out(ts, c) for c in names_to_try],
                       ignore_index=True)
    table = summary(scores)
    if table.empty:
        click.echo("one benchmark: no validation on a benchmark left out", err=True)
    else:
        click.echo("held out one benchmark at a time (mean over benchmarks):")
        click.echo(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    chosen = choose(scores, names_to_try)
    policy = train(ts, chosen, threshold)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        save_policy_file(policy, out)
        if not scores.empty:
            with atomic_output(out.with_name(out.name + ".scores.csv")) as tmp:
                scores.to_csv(tmp, index=False)
    except OSError as exc:
        _fail(f"{out}: cannot write the policy ({exc.strerror or exc})")
    click.echo(f"{chosen} trained on {', '.join(policy.benchmarks)}: {out}")


def main() -> None:
    train_policy(prog_name=PROG)
