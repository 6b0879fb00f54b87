"""Exact labels confirmed in wall time (issue 34, "Exact measurements"): under an exact metric
``measure-sites`` retests in wall time only the labels whose exact effect |log ratio| is at
least ``--confirm-above``, at ``--confirm-size`` (``full`` by default), and records both in the
rundir so a resume goes on with them; an older rundir (without them) retests every label at
its own size, as before.  In process: the rule, the sizes asked of the workers, the defaults,
the report's words; end to end on the planted program at its tiny size (cachegrind), with
the wall retests at ``quick``.  Everything asserted is what the journal says, never a speed:
the suite runs on loaded machines."""
from __future__ import annotations

import json
import math
import shutil
import threading
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from analysis.label_training import DEFAULT_LABEL_THRESHOLD
from analysis.labels import confirmation_line, label_rows, report
from dispatcher.build.manifest import resolve_benchmark
from dispatcher.core.comparison import Comparison
from dispatcher.core.records import FinishEvent
from dispatcher.core.rundir import SitesRundir
from dispatcher.core.site_records import LabelEvent, Paired, SitesExperiment
from dispatcher.labels.planning import (
    CONFIRM_SIZE,
    DEFAULT_CONFIRM_ABOVE,
    LabelsSettings,
    confirm_size,
)
from dispatcher.labels.procedure import LabelsStatus, SiteLabeller
from pipeline.longrun import GracefulStop
from pipeline.sites import _label_all
from tests.helpers import FIRST_CPU, GOLDEN_LABELS, invoke, needs_valgrind, one_line_error
from tests.helpers import PLANTED_GRID as PLANTED


def experiment(**over) -> SitesExperiment:
    return SitesExperiment(**{
        "task": "grid", "benchmark": str(PLANTED), "size": "tiny", "runs": 2, "max_pairs": 2,
        "half_width": 0.01, "timeout": 30, "perf": False, "aslr": False,
        "worker_class": "local", "compiler": "c", "metric": "cycles", **over})


def measured(speedup: float) -> Paired:
    return Paired(status="measured", speedup=speedup, ci95=(speedup, speedup), pairs=1,
                  metric="cycles")


# -- the rule and the defaults ---------------------------------------------------------------

def test_a_label_is_confirmed_from_the_threshold_up_in_either_direction():
    exp = experiment(confirm_size="full", confirm_above=math.log(1.02))
    assert exp.confirms(measured(1.02))  # at the threshold
    assert exp.confirms(measured(math.exp(-0.05)))  # slower: |effect| counts
    assert not exp.confirms(measured(1.019))
    assert not exp.confirms(measured(math.exp(-0.01)))
    assert not exp.confirms(Paired(status="same_binary"))  # nothing to confirm
    every = experiment(confirm_size="full", confirm_above=0.0)
    assert every.confirms(measured(1.0)) and every.confirms(measured(1.0001))
    older = experiment()  # no confirm_above: every measured label, at the labels' size
    assert older.confirms(measured(1.0)) and older.retest_size == "tiny"
    assert exp.retest_size == "full"


def test_the_defaults_full_size_and_train_policys_label_threshold():
    assert DEFAULT_CONFIRM_ABOVE == DEFAULT_LABEL_THRESHOLD and CONFIRM_SIZE == "full"

    def settings(**over) -> LabelsSettings:
        return LabelsSettings(**{
            "size": None, "default_size": "tiny", "runs": 2, "max_pairs": 2,
            "half_width": 0.01, "timeout": 30, "perf": False, "aslr": False, "sweep": 1,
            "keep": 0.9, "max_tests": 4, "retest": True, "rundirs": Path("r"),
            "batch_log": Path("b"), "config_raw": {}, "metric": "cycles", **over})

    grid = resolve_benchmark(str(PLANTED))
    no_full = SimpleNamespace(sizes={"tiny": None, "quick": None})
    assert confirm_size(settings(), grid, "tiny") == "full"
    assert confirm_size(settings(), no_full, "tiny") == "tiny"  # type: ignore[arg-type]
    assert confirm_size(settings(confirm_size="quick"), grid, "tiny") == "quick"
    assert confirm_size(settings(metric="time"), grid, "tiny") is None


def test_older_records_read_and_write_as_they_were():
    """A rundir without the confirmation fields (format version 1 as first written): none
    written back, every label's retest at its own size, no confirmation line."""
    data = json.loads((GOLDEN_LABELS / "experiment.json").read_text())
    exp = SitesExperiment.from_json(data)
    assert exp.confirm_size is None and exp.confirm_above is None
    assert exp.to_json() == data
    assert confirmation_line(exp, SitesRundir(GOLDEN_LABELS).events()) is None
    text = report([GOLDEN_LABELS], label_rows(GOLDEN_LABELS))
    assert not any("at full" in x or "confirmation" in x for x in text), text
    event = next(e for e in SitesRundir(GOLDEN_LABELS).events() if isinstance(e, LabelEvent))
    assert event.size is None and "size" not in event.to_json()


class _Measurements:
    """compare() answers a comparison and records the arguments and metric asked."""

    def __init__(self) -> None:
        self.asked: list[tuple[tuple[str, ...], tuple[str, ...], str]] = []
        self.scheduler = SimpleNamespace(slots=[SimpleNamespace(worker_class="local")])

    def compare(self, reference, candidate, worker_class, policy, metric="time", **_):
        self.asked.append((reference.args, candidate.args, metric))
        done: Future = Future()
        done.set_result(Comparison(worker="w", reference_times=[1.2, 1.2],
                                   candidate_times=[1.0, 1.0], results=[],
                                   stopped="exact" if metric != "time" else "resolved",
                                   min_pairs=1, metric=metric))
        return done


def test_a_confirmation_runs_the_same_binaries_at_the_confirmation_size():
    """The exact test at the labels' size (grid's tiny, 40), the wall retest at the
    confirmation's (full, 35000), the same two binaries."""
    exp = experiment(confirm_size="full", confirm_above=0.01)
    rundir = SimpleNamespace(experiment=exp, path=Path("r"))
    m = _Measurements()
    lab = SiteLabeller(rundir, resolve_benchmark(str(PLANTED)), None,  # type: ignore[arg-type]
                       m, threading.Event())  # type: ignore[arg-type]
    art = [SimpleNamespace(sha256=k, binary=Path(f"/b/{k}")) for k in ("r", "t")]
    exact = lab._compare(art[1], art[0], "labels")  # type: ignore[arg-type]
    timed = lab._compare(art[1], art[0], "retest", "full")  # type: ignore[arg-type]
    assert m.asked == [(("40",), ("40",), "cycles"), (("35000",), ("35000",), "time")]
    assert exact.metric == "cycles" and timed.metric == "time"


# -- the confirmations' own thread ---------------------------------------------------------

WAIT_S = 30.0  # how long a stand-in waits for another (fails the test rather than hangs)


class Stand:
    """An exact labeller's stand-in: its exact phase (``run``) then, left to the
    confirmations' thread, its confirmation (``confirm``), each logged."""

    def __init__(self, name: str, log: list[tuple[str, str]], confirming=None):
        self.name, self.log, self.confirming = name, log, confirming
        self.status = LabelsStatus(name, Path(name))
        self.rundir = SimpleNamespace(path=Path(name))
        self.awaiting_confirmation = False
        self.started = threading.Event()

    def run(self, defer_confirmation: bool = False) -> None:
        assert defer_confirmation  # under an exact metric the retests are left
        self.log.append(("exact", self.name))
        self.status.phase = "sweep: 1 hottest sites"
        self.started.set()
        self.awaiting_confirmation = self.confirming is not None
        if not self.awaiting_confirmation:
            self.status.state, self.status.phase = "finished", "done"

    def confirm(self) -> None:
        self.awaiting_confirmation = False
        self.log.append(("confirm", self.name))
        self.status.state = self.confirming(self) if self.confirming else "finished"


def test_a_confirmation_does_not_hold_the_thread_that_counts_exact_labels():
    """One labeller at a time: the second's exact phase starts while the first's
    confirmation waits (for it: never, were the confirmation in the counting thread); a
    labeller with nothing to confirm finishes in its exact phase."""
    log: list[tuple[str, str]] = []
    second = Stand("b", log)

    def waits_for_b(me: Stand) -> str:
        assert second.started.wait(WAIT_S), "the exact phase waited for a confirmation"
        return "finished"

    first = Stand("a", log, confirming=waits_for_b)
    _label_all([first, second], GracefulStop("stopping"), 1, defer=True)  # type: ignore[list-item]
    assert ("confirm", "b") not in log
    # a failed wait would leave a's state running (the assertion ends its thread)
    assert [s.status.state for s in (first, second)] == ["finished", "finished"]


def test_a_stop_ends_the_waiting_confirmations_interrupted():
    stop = GracefulStop("stopping")
    log: list[tuple[str, str]] = []

    def stopped(me: Stand) -> str:  # its confirmation finds the stop: ends interrupted
        return "interrupted" if stop.is_set() else "finished"

    first = Stand("a", log, confirming=stopped)
    later = Stand("c", log)
    original = first.run

    def run_then_stop(defer_confirmation: bool = False) -> None:
        original(defer_confirmation)
        stop.set()  # a Ctrl-C as its exact phase ends

    first.run = run_then_stop  # type: ignore[method-assign]
    _label_all([first, later], stop, 1, defer=True)  # type: ignore[list-item]
    assert log == [("exact", "a"), ("confirm", "a")]  # c never begun
    assert first.status.state == "interrupted" and later.status.state == "running"


# -- the options ----------------------------------------------------------------------------

def config(where: Path, store: Path) -> Path:
    path = where / "config.yaml"
    path.write_text(yaml.safe_dump({
        "store": str(store), "local": {"cpus": [FIRST_CPU]},
        "run": {"runs": 2, "timeout": 30, "size": "tiny"},
        "measure": {"max_pairs": 2, "canary_every": 0},
        "search": {"rundirs": str(where / "rundirs"), "batch_log": str(where / "batch.log")}}))
    return path


@pytest.mark.parametrize("args, says", [
    (["--metric", "cycles", "--confirm-above", "-0.5"], "--confirm-above -0.5: expected a log"),
    (["--metric", "cycles", "--confirm-above", "nan"], "--confirm-above nan: expected a log"),
    (["--metric", "cycles", "--confirm-above", "inf"], "--confirm-above inf: expected a log"),
    (["--metric", "cycles", "--confirm-above", "a lot"], "--confirm-above a lot: expected"),
    (["--confirm-above", "0.1"], "--confirm-above: only under an exact metric"),
    (["--metric", "time", "--confirm-size", "full", "--confirm-above", "0"],
     "--confirm-size and --confirm-above: only under an exact metric"),
    (["--resume", "x", "--confirm-size", "full"],
     "--confirm-size cannot be used with --resume")])
def test_bad_confirmation_options_are_one_line_before_any_rundir(tmp_path, args, says):
    cfg = config(tmp_path, tmp_path / "store")
    (tmp_path / "tasks").write_text(f"{PLANTED}\n")
    tasks = [] if "--resume" in args else ["--tasks", str(tmp_path / "tasks")]
    line = one_line_error(invoke("measure-sites", "--config", str(cfg), *tasks, *args,
                                 cwd=tmp_path))
    assert line.startswith(f"measure-sites: {says}"), line
    assert not (tmp_path / "rundirs").exists() or not any((tmp_path / "rundirs").iterdir())


@needs_valgrind
def test_a_confirmation_size_the_benchmark_lacks_is_one_line_before_any_rundir(tmp_path):
    cfg = config(tmp_path, tmp_path / "store")
    (tmp_path / "tasks").write_text(f"{PLANTED}\n")
    line = one_line_error(invoke("measure-sites", "--config", str(cfg), "--tasks",
                                 str(tmp_path / "tasks"), "--metric", "cycles",
                                 "--confirm-size", "huge", cwd=tmp_path))
    assert "--confirm-size huge: no such size in benchmark grid (known: " in line, line
    assert not (tmp_path / "rundirs").exists() or not any((tmp_path / "rundirs").iterdir())


# -- end to end -----------------------------------------------------------------------------

def measure(where: Path, store: Path, *args: str):
    """measure-sites on the planted program, 3 hottest sites, in cycles at tiny size."""
    where.mkdir()
    (where / "tasks").write_text(f"{PLANTED}\n")
    done = invoke("measure-sites", "--config", str(config(where, store)), "--tasks",
                  str(where / "tasks"), "--sweep", "3", "--metric", "cycles", "--labels",
                  str(where / "labels"), *args, cwd=where)
    assert done.exit_code == 0, done.stderr
    assert "Traceback" not in done.stderr
    return SitesRundir(next((where / "rundirs").iterdir())), done.stderr


def split(rundir: SitesRundir) -> tuple[list[LabelEvent], list[LabelEvent]]:
    """(first labels measured, retests) as the journal has them."""
    labels = [e for e in rundir.events() if isinstance(e, LabelEvent)]
    return ([e for e in labels if e.trial == "labels" and e.outcome.measured],
            [e for e in labels if e.trial == "retest"])


def effect(e: LabelEvent) -> float:
    assert e.outcome.speedup is not None
    return abs(math.log(e.outcome.speedup))


def site(e: LabelEvent) -> tuple[str, int, str, str]:
    return (e.site.unit, e.site.round, e.site.key, e.site.action)


def resumed(source: SitesRundir, where: Path, store: Path, **experiment_changes):
    """A copy of ``source`` cut after its first labels (its retests and finish gone), its
    experiment changed as asked, resumed: what a resume journals."""
    copy = where / "rundirs" / source.path.name
    where.mkdir()
    shutil.copytree(source.path, copy)
    exp = {k: v for k, v in json.loads((copy / "experiment.json").read_text()).items()
           if k not in experiment_changes or experiment_changes[k] is not None}
    exp.update({k: v for k, v in experiment_changes.items() if v is not None})
    (copy / "experiment.json").write_text(json.dumps(exp))
    lines = [json.loads(x) for x in (copy / "journal.jsonl").read_text().splitlines()]
    kept = [x for x in lines if x["event"] not in ("finish",) and x.get("trial") != "retest"]
    kept[0] = {"event": "start", "time": kept[0].get("time"), **exp}  # the start's copy
    (copy / "journal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in kept))
    config(where, store)
    done = invoke("measure-sites", "--config", str(where / "config.yaml"), "--labels",
                  str(where / "labels"), "--resume", str(copy), cwd=where)
    assert done.exit_code == 0, done.stderr
    rundir = SitesRundir(copy)
    end = [e for e in rundir.events() if isinstance(e, FinishEvent)]
    assert end and end[-1].reason == "completed"
    return rundir


@needs_valgrind
def test_exact_labels_are_confirmed_at_the_confirmation_size_from_the_threshold_up(
        tmp_path, compiler):
    """--confirm-above 0 retests every measured label, each at quick size (journaled), and the
    report says so; a threshold taken from the journal's exact effects retests only the labels
    at or above it (a fresh run, and a resume of the first run's labels with that threshold
    recorded: it goes on with what its rundir says); an older rundir's resume retests every
    label at its own size."""
    store = tmp_path / "store"
    first, said = measure(tmp_path / "all", store, "--confirm-above", "0",
                          "--confirm-size", "quick")
    exp = first.experiment
    assert (exp.confirm_size, exp.confirm_above, exp.retest) == ("quick", 0.0, True)
    firsts, retests = split(first)
    assert len(firsts) >= 2, firsts
    assert sorted(map(site, retests)) == sorted(map(site, firsts))
    assert {e.size for e in retests} == {"quick"}
    assert {e.outcome.metric for e in retests} == {"time"}
    n = len(firsts)
    assert (f"confirmation in wall time at quick size: {n} of {n} measured label(s) at "
            f"|cycles effect| >= 0 (log), {n} retested") in said, said
    assert "retest at quick alone" in said, said

    # the threshold: one label's own exact effect, so that one is at it
    effects = sorted({effect(e) for e in firsts})
    assert len(effects) >= 2, effects  # the planted program's sites count apart
    threshold = effects[len(effects) // 2]
    above = sorted(site(e) for e in firsts if effect(e) >= threshold)
    assert 0 < len(above) < len(firsts)

    again = resumed(first, tmp_path / "resumed", store, confirm_above=threshold)
    assert again.experiment.confirm_above == threshold
    got_firsts, got = split(again)
    assert sorted(map(site, got)) == above  # below the threshold: no wall retest
    assert {e.size for e in got} == {"quick"}
    line = confirmation_line(again.experiment, again.events())
    assert line is not None and line.startswith(
        f"confirmation in wall time at quick size: {len(above)} of {len(firsts)} ")
    assert line.endswith(f"{len(firsts) - len(above)} below, not retested"), line

    fresh, said = measure(tmp_path / "some", store, "--confirm-above", repr(threshold),
                          "--confirm-size", "quick")
    assert fresh.experiment.confirm_above == threshold
    its_firsts, its_retests = split(fresh)  # the sites it swept (a sampled profile ranks them)
    assert sorted(map(site, its_retests)) == sorted(
        site(e) for e in its_firsts if effect(e) >= threshold)
    assert {e.size for e in its_retests} <= {"quick"}

    older = resumed(first, tmp_path / "older", store, confirm_size=None, confirm_above=None)
    assert older.experiment.confirm_size is None and older.experiment.confirm_above is None
    _, old_retests = split(older)
    assert sorted(map(site, old_retests)) == sorted(map(site, firsts))  # every label
    assert {e.size for e in old_retests} == {None}  # at the labels' own size
    text = report([older.path], label_rows(older.path))
    assert not any("confirmation" in x or "retest at" in x for x in text), text
