"""The records of a labels rundir (``measure-sites``): what was asked, and its journal.

A labels rundir measures single inlining decisions of one benchmark against a reference build
(docs/labels.md).  Like a search's rundir it has ``experiment.json``, ``config.yaml`` and an
append-only ``journal.jsonl``; its events are these.  Every measurement is journaled as it
completes, so a resume replays the procedure from the journal and measures only what is
missing: delta debugging asks the same questions in the same order, and the answers it already
has are read back rather than measured again.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import Field, TypeAdapter, ValidationError

from dispatcher.core.records import (
    FinishEvent,
    Metric,
    Record,
    RecordError,
    ResumeEvent,
    _describe,
)

SITES_FORMAT_VERSION = 1
SITES_KIND: Literal["sites"] = "sites"
REFERENCE_DIR = "reference"  # the heuristic build's dumps (the features of the table)
WINNER_DIR = "winner"  # the winning tree's dumps, as the search found it

#: The references a label can be measured against (``SitesExperiment.reference``,
#: ``measure-sites --reference``), as the labels table names them.
HEURISTIC = "heuristic"
ALWAYS_INLINE = "always-inline"
TREE_PREFIX = "tree:"  # a tree reference's name in the table: tree:<its file's name>


def reference_name(reference: str | None) -> str:
    """What the labels table records in ``reference``: ``heuristic`` (None: a rundir
    without one, every rundir before the option), ``always-inline``, or ``tree:NAME``."""
    if reference is None or reference == HEURISTIC:
        return HEURISTIC
    if reference == ALWAYS_INLINE:
        return ALWAYS_INLINE
    return TREE_PREFIX + Path(reference).name


Context = Literal["alone", "removed", "minimal"]
Status = Literal["measured", "not_reached", "same_binary", "unresolved", "failed"]


class WinnerChoice(Record):
    """The tree to attribute: a search rundir's candidate dir and its confirmed speedup, or
    an overrides file the user named (``overrides``; no speedup yet: the procedure measures
    the tree it asks for first)."""

    rundir: str = ""
    dir: str = ""
    speedup: Optional[float] = None
    ci95: Optional[tuple[float, float]] = None
    overrides: Optional[str] = None
    # False: the best so far of a search stopped before its confirmation (its speedup is the
    # search's own estimate); the attribution's first test confirms it or attributes nothing
    confirmed: bool = True
    later_fields: ClassVar[frozenset[str]] = frozenset({"overrides", "confirmed"})


class SitesExperiment(Record):
    """What ``measure-sites`` was asked for one benchmark: its settings, recorded so that a
    resume goes on with them whatever the config says by then."""

    version: int = SITES_FORMAT_VERSION
    kind: Literal["sites"] = SITES_KIND
    task: str
    benchmark: str  # its directory
    size: str
    runs: int  # the fewest pairs per test, over every slot
    max_pairs: int  # the most pairs per test, over every slot
    half_width: float
    timeout: float
    perf: bool
    aslr: bool
    worker_class: str
    compiler: str  # sha256 of the ocamlopt that builds every tree
    sources: list[str] = Field(default_factory=list)  # the search rundirs it attributes
    winner: Optional[WinnerChoice] = None  # their best confirmed tree (None: no such tree)
    sweep: int = 0  # hottest flippable sites of the heuristic build flipped alone
    keep: float = 0.9  # share of the winner's log speedup a subset must keep
    max_tests: int = 64  # delta-debugging tests at most
    retest: bool = False  # every measured label measured again, independently
    rundir: Optional[str] = None
    # Later: what tests are measured in (absent: time, as in every earlier labels rundir);
    # under an exact metric the retests are in time (docs/labels.md)
    metric: Metric = "time"
    # Later: the size every measured label's binaries are counted at in estimated cycles
    # (cachegrind), so that a label carries its cycles effect beside its wall effect (the
    # experiment's own size under an exact metric; ``tiny`` where the benchmark has one under
    # time); absent (None): labels without a cycles effect, as in every earlier rundir
    cycles_size: Optional[str] = None
    # Later, under an exact metric only: the wall-time retest confirms the labels that matter
    # (DESIGN, "exact metrics": a label found exact is confirmed in wall time before it is
    # published): only those whose exact effect |log ratio| is at least ``confirm_above``,
    # at ``confirm_size`` (``full`` by default: the size the policy is judged at).  Absent
    # (None): every measured label retested at ``size``, as in every earlier rundir.
    confirm_size: Optional[str] = None
    confirm_above: Optional[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] = None
    # Later: the build every label is measured against and whose sites it flips back
    # (dispatcher.labels.reference): ``always-inline``, or a tree (an overrides file, its
    # path as given; the rundir keeps a copy, ``reference.sexp``, which is what is built).
    # Absent (None): the heuristic's build, as in every earlier rundir.
    reference: Optional[str] = None
    later_fields: ClassVar[frozenset[str]] = frozenset(
        {"metric", "cycles_size", "confirm_size", "confirm_above", "reference"})

    def confirms(self, outcome: Paired) -> bool:
        """Whether a first label's ``outcome`` is retested: every measured one, unless this
        rundir confirms only labels whose effect is at least ``confirm_above`` (log)."""
        if not outcome.measured:
            return False
        if self.confirm_above is None:
            return True
        assert outcome.speedup is not None
        return abs(math.log(outcome.speedup)) >= self.confirm_above

    @property
    def retest_size(self) -> str:
        """The size a label's retest is measured at: the confirmation's, else the labels'."""
        return self.confirm_size or self.size


def read_sites_experiment(path: Path) -> SitesExperiment:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != SITES_KIND:
        raise RecordError(f"{path}: not a labels rundir's experiment (no kind: sites)")
    if data.get("version") != SITES_FORMAT_VERSION:
        raise RecordError(f"{path}: labels rundir format version {data.get('version')!r} is "
                          f"not one this tool reads ({SITES_FORMAT_VERSION})")
    return SitesExperiment.from_json(data, str(path))


def is_sites_rundir(path: Path) -> bool:
    """Whether ``path``'s experiment.json is a labels rundir's (not a search's)."""
    try:
        return json.loads((path / "experiment.json").read_text()).get("kind") == SITES_KIND
    except (OSError, ValueError, AttributeError):
        return False


class SiteDecision(Record):
    """One call site and the action a tree took there; ``heuristic``: the heuristic build's
    action at the same site (None: the heuristic's tree has no such site, it lies in a body
    only the winner inlined)."""

    unit: str
    round: int
    key: str
    callee: str
    action: str
    heuristic: Optional[str] = None


class Paired(Record):
    """A test's outcome: a tree against its reference, pooled over every slot's pairs.

    ``status``: measured (a speedup with its interval), same_binary (the tree built the
    reference's binary: nothing to measure), not_reached (the changed site's code is not what
    runs), unresolved (too few undisturbed pairs), failed (the tree failed to build or run)."""

    status: Status
    sha256: Optional[str] = None
    speedup: Optional[float] = None  # reference time over tested time (geometric means)
    ci95: Optional[tuple[float, float]] = None
    pairs: int = 0
    runs: int = 0  # every run of both binaries, disturbed ones included
    disturbed: int = 0
    cpu_s: float = 0.0  # worker seconds its runs took now (its cost; 0: the store answered)
    why: Optional[str] = None  # one line, for every status but measured
    # Later: what ``speedup`` is in: time (paired), or an exact metric (one counted run of
    # each: ``ci95`` is [speedup, speedup]); absent: time
    metric: Metric = "time"
    # Later: the same two binaries counted in estimated cycles (cachegrind, at the
    # experiment's ``cycles_size``): the ratio reference / tested, exact (no interval); None:
    # not counted (an earlier rundir, workers that cannot count, a count that failed)
    cycles: Optional[float] = None
    later_fields: ClassVar[frozenset[str]] = frozenset({"metric", "cycles"})

    @property
    def measured(self) -> bool:
        return self.status == "measured" and self.speedup is not None


class _SitesEvent(Record):
    time: Optional[float] = None


class SitesStartEvent(_SitesEvent, SitesExperiment):
    event: Literal["start"] = "start"


class ReferenceEvent(_SitesEvent):
    """The heuristic build: every test's reference unless its context names another."""

    event: Literal["reference"] = "reference"
    sha256: str
    artifact: Optional[str] = None


class WinnerEvent(_SitesEvent):
    """The tree attributed: the best a search confirmed, where it differs from the heuristic
    (``decisions``, numbered by their place in this list in every later event)."""

    event: Literal["winner"] = "winner"
    rundir: str  # the search rundir (or the overrides file the user named)
    dir: str  # its candidate dir in that rundir ("" for a file)
    speedup: Optional[float] = None  # as the search confirmed it (None: a file)
    ci95: Optional[tuple[float, float]] = None
    decisions: list[SiteDecision]


class SubsetEvent(_SitesEvent):
    """One delta-debugging test: the heuristic's tree with the winner's decisions ``subset``
    (indices into the winner's decisions), against the heuristic build."""

    event: Literal["test"] = "test"
    subset: list[int]
    outcome: Paired
    passes: bool


class MinimalEvent(_SitesEvent):
    """Where delta debugging stopped, and fresh pairs of the minimal subset and of the whole
    set against the heuristic build (the share of the gain the subset keeps)."""

    event: Literal["minimal"] = "minimal"
    subset: list[int]
    tests: int
    stopped: str  # minimal | budget | no_gain
    full: Paired  # every decision of the winner, fresh pairs
    kept: Paired  # the minimal subset, fresh pairs
    kept_share: Optional[float] = None  # log speedup of kept over log speedup of full


class LabelEvent(_SitesEvent):
    """One label: ``action`` taken at ``site`` in ``context`` against its reference."""

    event: Literal["label"] = "label"
    site: SiteDecision  # action: the action tested; heuristic: the heuristic's there
    context: Context
    trial: Literal["labels", "retest"] = "labels"
    decision: Optional[int] = None  # its index in the winner's decisions (attribution)
    heat: Optional[int] = None  # profile samples of its function and callee (sweep)
    outcome: Paired
    # Later: the benchmark size ``outcome`` was measured at, written for a confirmation (a
    # retest at the experiment's ``confirm_size``); absent: the experiment's ``size``
    size: Optional[str] = None
    later_fields: ClassVar[frozenset[str]] = frozenset({"size"})


SitesEvent = Annotated[Union[SitesStartEvent, ReferenceEvent, WinnerEvent, SubsetEvent,
                             MinimalEvent, LabelEvent, ResumeEvent, FinishEvent],
                       Field(discriminator="event")]
_SITES_EVENT = TypeAdapter(SitesEvent)


def sites_event_from_json(data: Any, where: str) -> Any:
    try:
        return _SITES_EVENT.validate_python(data)
    except ValidationError as exc:
        raise _describe(exc, where) from None
