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

    from commands.registry import COMMANDS


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
