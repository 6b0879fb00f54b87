"""``python -m commands COMMAND``: the console scripts, without installing them."""
import sys

import click

from analysis.batch_log import main as batch_log
from commands.assign_rewards import assign_rewards
from commands.run_all_benchmarks import run_all_benchmarks
from commands.run_benchmark import run_benchmark
from commands.store_gc import store_gc
from commands.training import run_training_experiments
from dispatcher.suite import main as check_benchmarks


@click.group()
def main() -> None:
    """inlining-orchestrator commands."""


main.add_command(run_benchmark, "run-benchmark")
main.add_command(check_benchmarks, "check-benchmarks")
main.add_command(run_training_experiments, "run_training_experiments")
main.add_command(batch_log, "batch-log")
main.add_command(assign_rewards, "assign-rewards")
main.add_command(run_all_benchmarks, "run-all-benchmarks")
main.add_command(store_gc, "store-gc")

if __name__ == "__main__":
    sys.exit(main())
