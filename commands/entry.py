"""The console scripts' entry points: each imports its command only after Ctrl-C is made
quiet, so a Ctrl-C while the imports run (pandas, pydantic, sklearn: up to a second) ends the
command with one line and exit status 130, not a traceback from an import.  Stdlib only, and
guarded from this module's first statement on.  From the command's start on, each command
handles Ctrl-C itself (click: "Aborted!"; run_training_experiments: its --resume line)."""
from __future__ import annotations

try:  # from the first statement on: a Ctrl-C while this module itself runs (its imports
    # take a few milliseconds, more on a loaded machine) would otherwise be a traceback
    import signal
    import sys
    from collections.abc import Iterator
    from contextlib import contextmanager

    def _exit_interrupted(prog: str) -> None:
        sys.stderr.write(f"{prog}: interrupted\n")
        sys.stderr.flush()
        raise SystemExit(130)

    def _interrupted_while_starting(signum: int, frame: object) -> None:
        """Ctrl-C before a command's guard is up: one line and exit status 130."""
        _exit_interrupted(sys.argv[0].rsplit("/", 1)[-1] if sys.argv[0] else "command")

    signal.signal(signal.SIGINT, _interrupted_while_starting)
except KeyboardInterrupt:
    import sys
    sys.stderr.write(f"{sys.argv[0].rsplit('/', 1)[-1]}: interrupted\n")
    raise SystemExit(130) from None


_ctrl_c_seen: list[bool] = []  # appended to by the guard's handler


def _raise_interrupt(signum: int, frame: object) -> None:
    _ctrl_c_seen.append(True)
    raise KeyboardInterrupt


@contextmanager
def quiet_interrupt(prog: str) -> Iterator[None]:
    """A Ctrl-C inside is one line on stderr and exit status 130, whatever the import it
    broke made of it: Python 3.11 wraps one raised in a class's ``__set_name__`` in a
    RuntimeError, pydantic's compiled core one raised while it builds a model's schema in a
    SchemaError.  After the block Ctrl-C is a KeyboardInterrupt again, the command's own."""
    try:
        signal.signal(signal.SIGINT, _raise_interrupt)
        yield
        signal.signal(signal.SIGINT, signal.default_int_handler)
    except KeyboardInterrupt:
        _exit_interrupted(prog)
    except Exception:
        if not _ctrl_c_seen:
            raise
        _exit_interrupted(prog)


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
