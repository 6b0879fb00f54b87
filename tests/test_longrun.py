"""The long-run protocol (pipeline/longrun.py) and the one session shutdown, without a
process: the exit status and --resume line a stop leaves, the graceful Ctrl-C handler, the
plain status lines, and Session.__exit__ aborting on Ctrl-C or a graceful stop."""
from __future__ import annotations

import os
import signal
import threading
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest

from dispatcher.session import Session
from pipeline import longrun
from pipeline.longrun import Ending, GracefulStop, InterruptLatch, StatusLine


def test_a_stop_that_left_work_unfinished_is_an_interruption_with_its_resume_line():
    stop = GracefulStop("stopping")
    states = [("finished", Path("a")), ("interrupted", Path("b c")), ("running", Path("d"))]
    assert Ending.of(stop, states) == Ending((Path("b c"), Path("d")), True, False)
    ending = Ending.of(stop, states)
    assert ending.exit_status == 130
    assert ending.resume_line("measure-sites", Path("my config.yaml")) == (
        "interrupted; to continue: measure-sites --config 'my config.yaml' --resume 'b c' "
        "--resume d")
    assert ending.resume_line("x", None) == "interrupted; to continue: x --resume 'b c' --resume d"


def test_a_stop_after_every_unit_ended_stops_nothing_and_a_failure_is_status_1():
    stop = GracefulStop("stopping")
    stop.set()
    done = Ending.of(stop, [("finished", Path("a"))])
    assert not done.interrupted and done.exit_status == 0
    failed = Ending.of(GracefulStop("stopping"), [("failed", Path("a")), ("finished", Path("b"))])
    assert not failed.interrupted and failed.exit_status == 1
    # a failure beside work a stop left: the stop's status, so that a resume is said
    both = Ending.of(stop, [("failed", Path("a")), ("running", Path("b"))])
    assert both.interrupted and both.exit_status == 130


def test_the_graceful_handler_stops_once_raises_on_the_second_and_is_restored(capsys):
    before = signal.getsignal(signal.SIGINT)
    with GracefulStop("stopping: runs in flight are dropped") as stop:
        assert signal.getsignal(signal.SIGINT) is before  # not armed: Ctrl-C ends at once
        stop.arm()
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.is_set()
        assert "stopping: runs in flight are dropped" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_plain_status_lines_say_each_change_once_and_repeat_only_what_asks(monkeypatch):
    said: list[str] = []
    monkeypatch.setattr(longrun, "progress", said.append)
    clock = iter(range(0, 10_000, 30))  # 30 s between polls
    monkeypatch.setattr(longrun, "time", SimpleNamespace(
        monotonic=lambda: float(next(clock)), sleep=lambda s: None))
    polls = iter([
        [StatusLine(None, "a starting"), StatusLine(("b", 1), "b 1", repeat=False)],
        [StatusLine(("a", 1), "a 1"), StatusLine(("b", 1), "b 1", repeat=False)],
        [StatusLine(("a", 1), "a 1"), StatusLine(("b", 1), "b 1", repeat=False)],
        [StatusLine(("a", 1), "a 1"), StatusLine(("b", 1), "b 1", repeat=False)],
        [StatusLine(("a", 2), "a 2"), StatusLine(("b", 2), "b 2", repeat=False)]])
    alive = iter([True, True, True, True, False])
    longrun.watch(lambda: next(alive), lambda: next(polls))
    # a's unchanged line is said again once 60 s have passed; b's never is
    assert said == ["b 1", "a 1", "a 1", "a 2", "b 2"]


class _Recorded(Session):
    def __init__(self) -> None:  # no store, no compiler: only the shutdown is under test
        self._stop = None
        self.aborted: list[bool] = []

    def close(self, abort: bool = False) -> None:
        self.aborted.append(abort)


def test_the_session_aborts_in_its_own_exit_on_ctrl_c_or_a_graceful_stop():
    session = _Recorded()
    with session:
        pass
    with pytest.raises(ValueError), session:
        raise ValueError("an error closes as usual")
    with pytest.raises(KeyboardInterrupt), session:
        raise KeyboardInterrupt
    stop = threading.Event()
    session.stop_on(stop)
    with session:
        stop.set()
    assert session.aborted == [False, False, True, True]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_ctrl_c_swallowed_in_a_weakref_callback_is_raised_at_the_next_check():
    """Python drops the KeyboardInterrupt of a Ctrl-C handled inside a weakref callback
    ("Exception ignored in ..."): search-policy ran on after one.  The latch keeps it."""
    class Thing:
        pass

    def callback(_: object) -> None:
        # to this thread, delivered before raise_signal returns (os.kill to the process may
        # land on one of the worker's other threads later, outside the callback)
        signal.raise_signal(signal.SIGINT)
        for _ in range(1000):  # the handler runs here, between bytecodes, and raises
            pass

    before = signal.getsignal(signal.SIGINT)
    with InterruptLatch() as latch:
        latch.check()  # nothing seen yet
        thing = Thing()
        ref = weakref.ref(thing, callback)
        del thing  # the callback runs; its KeyboardInterrupt is ignored, not raised here
        assert ref() is None and latch.is_set()
        with pytest.raises(KeyboardInterrupt):
            latch.check()
    assert signal.getsignal(signal.SIGINT) is before
