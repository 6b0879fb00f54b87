"""The command list, in one place: each user command's name and the click command that runs
it (``module:function``; the module's ``main`` runs it as a console script).

``python -m commands`` (``commands/__main__.py``) and the console scripts' entry points
(``commands/entry.py``) are made from it; setup.cfg's ``console_scripts`` and the launchers in
``scripts/`` cannot be, and ``tests/test_launchers.py`` checks that they name the same commands.
Stdlib only (nothing at all): the entry points import it before Ctrl-C is quiet.
"""
from __future__ import annotations

COMMANDS: dict[str, str] = {
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
    "search-policy": "commands.search_policy:search_policy",
    "select-policy": "commands.select_policy:select_policy",
}


def module_of(name: str) -> str:
    """The module of the command ``name``."""
    return COMMANDS[name].split(":")[0]


def entry_point(name: str) -> str:
    """The name of ``name``'s entry point in ``commands.entry`` (a console script's target)."""
    return name.replace("-", "_")
