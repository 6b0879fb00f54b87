"""``python -m dispatcher COMMAND``: the console scripts, without installing them."""
import sys

import click

from dispatcher.cli import run_benchmark, run_training_experiments
from dispatcher.suite import main as check_benchmarks


@click.group()
def main() -> None:
    """inlining-orchestrator commands."""


main.add_command(run_benchmark, "run-benchmark")
main.add_command(check_benchmarks, "check-benchmarks")
main.add_command(run_training_experiments, "run_training_experiments")

if __name__ == "__main__":
    sys.exit(main())
