"""``python -m dispatcher COMMAND``: the console scripts, without installing them."""
import sys

import click

from dispatcher.cli import run_benchmark
from dispatcher.suite import main as check_benchmarks


@click.group()
def main() -> None:
    """inlining-orchestrator commands."""


main.add_command(run_benchmark, "run-benchmark")
main.add_command(check_benchmarks, "check-benchmarks")

if __name__ == "__main__":
    sys.exit(main())
