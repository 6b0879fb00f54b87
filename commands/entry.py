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
    from collections.abc import Callable, Iterator
    from contextlib import contextmanager

    from commands.registry import COMMANDS, entry_point, module_of

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


def _unraisable_while_starting(unraisable: sys.UnraisableHookArgs) -> None:
    """A Ctrl-C that lands in a callback Python cannot raise from (the import system's module
    lock is released from a weakref callback) is printed as "Exception ignored" with a
    traceback, and lost; it is remembered in ``_ctrl_c_seen`` already, so print nothing."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        return
    sys.__unraisablehook__(unraisable)


@contextmanager
def quiet_interrupt(prog: str) -> Iterator[None]:
    """A Ctrl-C inside is one line on stderr and exit status 130, whatever the import it
    broke made of it: Python 3.11 wraps one raised in a class's ``__set_name__`` in a
    RuntimeError, pydantic's compiled core one raised while it builds a model's schema in a
    SchemaError.  After the block Ctrl-C is a KeyboardInterrupt again, the command's own."""
    try:
        sys.unraisablehook = _unraisable_while_starting
        signal.signal(signal.SIGINT, _raise_interrupt)
        yield
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.unraisablehook = sys.__unraisablehook__
        if _ctrl_c_seen:  # raised inside an import that swallowed it (a library's bare
            # ``except:`` around an optional import): the Ctrl-C is still the user's
            _exit_interrupted(prog)
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


def _entry_point(prog: str) -> Callable[[], None]:
    module = module_of(prog)

    def launch() -> None:
        _launch(prog, module)
    launch.__name__ = launch.__qualname__ = entry_point(prog)
    return launch


# One entry point per command (``run_benchmark`` for run-benchmark), the console scripts' targets
for _prog in COMMANDS:
    globals()[entry_point(_prog)] = _entry_point(_prog)
