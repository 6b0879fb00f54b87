"""The console scripts' entry points: each imports its command only after Ctrl-C is made
quiet, so a Ctrl-C while the imports run (pandas, pydantic, sklearn: up to a second) ends the
command with one line and exit status 130, not a traceback from an import.  Stdlib only, and
nothing imported here before the guard is up.  From the command's start on, each command
handles Ctrl-C itself (click: "Aborted!"; run_training_experiments: its --resume line)."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def quiet_interrupt(prog: str) -> Iterator[None]:
    """A KeyboardInterrupt inside is one line on stderr and exit status 130."""
    try:
        yield
    except KeyboardInterrupt:
        sys.stderr.write(f"{prog}: interrupted\n")
        sys.stderr.flush()
        raise SystemExit(130) from None


def _launch(prog: str, module: str) -> None:
    with quiet_interrupt(prog):
        import importlib
        main = importlib.import_module(module).main
    main()


def run_benchmark() -> None:
    _launch("run-benchmark", "commands.run_benchmark")


def check_benchmarks() -> None:
    _launch("check-benchmarks", "commands.check_benchmarks")


def batch_log() -> None:
    _launch("batch-log", "commands.batch_log")


def run_training_experiments() -> None:
    _launch("run_training_experiments", "commands.training")


def assign_rewards() -> None:
    _launch("assign-rewards", "commands.assign_rewards")


def run_all_benchmarks() -> None:
    _launch("run-all-benchmarks", "commands.run_all_benchmarks")


def store_gc() -> None:
    _launch("store-gc", "commands.store_gc")


def train_policy() -> None:
    _launch("train-policy", "commands.train_policy")


def run_plugin_benchmark() -> None:
    _launch("run-plugin-benchmark", "commands.run_plugin_benchmark")


def measure_sites() -> None:
    _launch("measure-sites", "commands.measure_sites")


def export_dataset() -> None:
    _launch("export-dataset", "commands.export_dataset")


def run_campaign() -> None:
    _launch("run-campaign", "commands.run_campaign")
