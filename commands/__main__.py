"""``python -m commands COMMAND``: the console scripts, without installing them.

Each command's module is imported only when that command runs: ``batch-log`` needs pandas
(most of a second to import), which a master started with ``run_training_experiments`` (the
tests start hundreds) does not.
"""
import sys

from commands.entry import quiet_interrupt

with quiet_interrupt("commands"):  # a Ctrl-C during the imports: one line, exit 130
    import importlib

    import click

COMMANDS = {
    "run-benchmark": "commands.run_benchmark:run_benchmark",
    "check-benchmarks": "commands.check_benchmarks:check_benchmarks",
    "run_training_experiments": "commands.training:run_training_experiments",
    "batch-log": "commands.batch_log:batch_log",
    "assign-rewards": "commands.assign_rewards:assign_rewards",
    "run-all-benchmarks": "commands.run_all_benchmarks:run_all_benchmarks",
    "store-gc": "commands.store_gc:store_gc",
    "train-policy": "commands.train_policy:train_policy",
    "run-plugin-benchmark": "commands.run_plugin_benchmark:run_plugin_benchmark",
    "measure-sites": "commands.measure_sites:measure_sites",
    "export-dataset": "commands.export_dataset:export_dataset",
    "run-campaign": "commands.run_campaign:run_campaign",
}


class _Commands(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, name = target.split(":")
        with quiet_interrupt(cmd_name):
            return getattr(importlib.import_module(module), name)


@click.group(cls=_Commands)
def main() -> None:
    """inlining-orchestrator commands."""


if __name__ == "__main__":
    sys.exit(main())
