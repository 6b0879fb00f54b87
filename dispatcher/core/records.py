"""The experiment record: every file a rundir and a batch log hold, as typed, versioned records.

This module owns those formats (docs/rundir-format.md describes them; a test keeps the two in
step).  The search writes these records, resume and ``analysis/`` read them; nothing else
assembles or re-derives rundir JSON.  Each record validates what it reads, so a damaged or
foreign file is refused with one line naming the file, the field and what was expected, never
half-used.

Version 2 adds to version 1: the chain's ``worker_class`` in the experiment, and in each run
record what the agent measured but version 1 dropped (``stdout_sha256``, ``stdout_bytes``,
``cpus_allowed``).  Version 3 adds ``profile.json`` (``HotFunctions``): where the
baseline spent its time, which biases the search's flips, so a resume must see it.  Version 4
adds the asynchronous search (``Experiment.mode``): ``propose`` events and the
``proposals/`` files they name, and the proposal a step judged; and the compiler's identity
(``Experiment.compiler``), which a resume must match.  Version 5 records every setting of a
chain in one record (``SearchSettings``), the run settings and the focus included, which
earlier versions took from the config of each resume.  Version 6 (this one) keeps each
candidate's decision dumps packed (``dispatcher.core.outputs``), and its records as version
5's; a rundir keeps the layout of the version it began with.  Older rundirs are
read as they are (missing fields take their defaults: synchronous steps; no profile: every
site alike, as they were searched; no run settings: the resume's config's, named in its
``resume`` event); a newer version is refused.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

FORMAT_VERSION = 6
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)
#: The first version whose candidate directories keep the compiler's outputs packed
PACKED_OUTPUTS_VERSION = 6

STEPS_DIR = "steps"
REMEASURE_DIR = "remeasure"
PROPOSALS_DIR = "proposals"


def candidate_dir(step: int, candidate: int) -> str:
    """The rundir-relative directory of one candidate; step 0, candidate 0 is the baseline."""
    return f"{STEPS_DIR}/{step:05d}/c{candidate}"


def remeasure_dir(step: int) -> str:
    return f"{STEPS_DIR}/{step:05d}/{REMEASURE_DIR}"


def canary_dir(step: int) -> str:
    return f"{STEPS_DIR}/{step:05d}/canary"


def confirm_dir(step: int) -> str:
    return f"{STEPS_DIR}/{step:05d}/confirm"


def proposal_file(proposal: int) -> str:
    """The rundir-relative overrides file of an asynchronous search's proposal: written before
    its ``propose`` event, compiled from (again, by a resume, while it is not judged)."""
    return f"{PROPOSALS_DIR}/{proposal:05d}.sexp"


BASELINE_DIR = candidate_dir(0, 0)


class RecordError(ValueError):
    """A record that cannot be read; the message is one line naming the file and field."""


def _describe(exc: ValidationError, where: str) -> RecordError:
    """The first validation error as one line: ``where: field.path: what was expected``."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return RecordError(f"{where}: {loc}: {err['msg']}")


class Record(BaseModel):
    """Frozen, strict about unknown fields (so the format cannot drift silently)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    # Fields a later version added, written only when they differ from their default: a
    # record of an earlier version writes out as it was read.
    later_fields: ClassVar[frozenset[str]] = frozenset()

    def to_json(self) -> dict[str, Any]:
        fields = type(self).model_fields
        data = self.model_dump(mode="json", exclude={
            f for f in self.later_fields
            if getattr(self, f) == fields[f].get_default(call_default_factory=True)})
        for name in data:  # a record inside a record leaves out its own later fields too
            value = getattr(self, name)
            if isinstance(value, Record) and value.later_fields:
                data[name] = value.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any, where: str = "record"):
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise _describe(exc, where) from None


# --------------------------------------------------------------------------- measurements

class PerfCount(Record):
    """One perf counter of one run: a value, or why there is none."""

    value: Optional[float] = None
    unit: Optional[str] = None
    running_pct: Optional[float] = None  # multiplexed: the value is scaled as perf stat does
    unsupported: bool = False
    not_counted: bool = False

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_defaults=True)


class SampleProfile(Record):
    """Where one run spent its CPU time, as the agent sampled it (``workers/agent/sampling``):
    samples per offset in the binary's file (hex), or why there are none."""

    period_ns: int = 0
    samples: int = 0
    lost: int = 0  # samples the agent's buffer could not hold
    mapped: bool = False  # whether the binary's own mapping was seen
    offsets: dict[str, int] = Field(default_factory=dict)
    elsewhere: int = 0  # samples outside the binary (shared libraries, vdso, kernel)
    error: Optional[str] = None


class HotFunctions(Record):
    """Where the baseline spent its time (``dispatcher.search.focus``): samples per OCaml function
    (``Module.name``; ``(runtime)`` for the rest of the binary), or why there are none."""

    period_ns: int = 0
    samples: int = 0
    lost: int = 0
    elsewhere: int = 0  # samples outside the binary
    functions: dict[str, int] = Field(default_factory=dict)
    error: Optional[str] = None
    worker: Optional[str] = None  # the slot that took the profile
    lost_on: tuple[str, ...] = ()  # slots that lost the profile job first, with the reason


class RunRecord(Record):
    """One run of a binary, as measured by the agent (every field it reports)."""

    wall_ns: Optional[int]
    user_s: Optional[float]
    sys_s: Optional[float]
    maxrss_kb: Optional[int]
    exit_status: Optional[int] = None
    signal: Optional[int] = None
    output_ok: Optional[bool] = None
    gc: dict[str, Union[int, float]] = Field(default_factory=dict)  # OCaml GC stats at exit
    perf: Optional[dict[str, PerfCount]] = None
    failure: Optional[str] = None
    stderr_tail: str = ""
    stdout_sha256: Optional[str] = None
    stdout_bytes: Optional[int] = None
    cpus_allowed: Optional[str] = None  # the run's affinity, /proc's list format ("3")
    # Disturbance evidence (docs/measurement.md): CPU time over wall time, and from what.
    cpu_share: Optional[float] = None
    cpu_share_source: Optional[Literal["task-clock", "rusage"]] = None
    nivcsw: Optional[int] = None  # involuntary context switches of the binary
    migrations: Optional[int] = None  # perf cpu-migrations (null: perf off)
    disturbed: Optional[str] = None  # why the run must not be used (it migrated); null: fine
    # Layout: address-space randomisation (false: personality ADDR_NO_RANDOMIZE), and the
    # length of the random environment pad of a randomised run (null: none).
    aslr: Optional[bool] = None
    env_pad: Optional[int] = None
    profile: Optional[SampleProfile] = None  # only in runs of a profile job; never timed
    # Processes the binary left running after it exited, killed by the agent (more than 0
    # fails the run); null: not looked for (older agents, an agent inside another program).
    strays: Optional[int] = None
    # The exact metric's runs only: cachegrind's counts by event (dispatcher.core.cycles).
    counts: Optional[dict[str, int]] = None

    @property
    def wall_s(self) -> float:
        return (self.wall_ns or 0) / 1e9

    @property
    def usable(self) -> bool:
        """A run whose time counts: it succeeded and was not disturbed."""
        return self.failure is None and self.disturbed is None

    def to_json(self) -> dict[str, Any]:
        # strays is written only when looked for, and profile only in a profile job's runs,
        # so records of earlier agents (the golden rundir's) write out as they were read
        d = self.model_dump(mode="json", exclude={"perf", "profile"} | (
            {"strays"} if self.strays is None else set()) | (
            {"counts"} if self.counts is None else set()))
        d["perf"] = None if self.perf is None else {k: v.to_json() for k, v in self.perf.items()}
        if self.profile is not None:  # absent from every timed run
            d["profile"] = self.profile.to_json()
        return d


class RunResult(Record):
    """All runs of one job on one worker slot."""

    sha256: str
    args: tuple[str, ...]
    worker: str  # slot name, e.g. local/cpu1
    worker_class: str
    cpu: int
    records: tuple[RunRecord, ...]
    # Slots that lost this job with their worker before ``worker`` ran it, with the reason.
    lost_on: tuple[str, ...] = ()

    @property
    def failed(self) -> int:
        return sum(r.failure is not None for r in self.records)

    @property
    def disturbed(self) -> int:
        """Successful runs recorded as disturbed (the agent ran each again, within bounds)."""
        return sum(r.failure is None and r.disturbed is not None for r in self.records)

    @property
    def times(self) -> list[float]:
        """Wall seconds of the successful, undisturbed runs."""
        return [r.wall_s for r in self.records if r.usable]

    def to_json(self) -> dict[str, Any]:
        d = self.model_dump(mode="json", exclude={"records"})
        d["records"] = [r.to_json() for r in self.records]
        return d


_RESULTS = TypeAdapter(list[RunResult])


def results_to_json(results: list[RunResult]) -> list[dict[str, Any]]:
    return [r.to_json() for r in results]


def results_from_json(data: Any, where: str) -> list[RunResult]:
    """A ``measurements.json`` (a list of run results; a lone result is accepted)."""
    if isinstance(data, dict):
        data = [data]
    try:
        return _RESULTS.validate_python(data)
    except ValidationError as exc:
        raise _describe(exc, where) from None


def read_results(path: Path) -> list[RunResult]:
    """Read a ``measurements.json``; RecordError (one line) if it is not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: unreadable ({exc})") from None
    return results_from_json(data, str(path))


# --------------------------------------------------------------------------- experiment

Algorithm = Literal["sa", "random-walk"]
SearchMode = Literal["sync", "async"]


Focus = Literal["uniform", "hot"]
# What a chain's candidates are compared in (docs/measurement.md, "Exact metrics"): wall time,
# or an exact count; the confirmation is always in time.
Metric = Literal["time", "instructions", "cycles"]


class SearchSettings(Record):
    """How one chain searches and measures: the one shape of those settings.  The config
    produces it (``dispatcher.search.settings``), ``experiment.json`` stores it (``Experiment``
    extends it with the chain's identity, flat), and the chain and every resume of it read it
    from there, so an edited config cannot change a chain midway."""

    algorithm: Algorithm
    seed: int
    steps: int
    size: str
    runs: int
    baseline_runs: int
    candidates_per_step: int
    t_start: float
    t_end: float
    remeasure_every: int
    max_flips: int
    # Paired measurement (version 2): runs is the fewest pairs per candidate.
    max_pairs: Optional[int] = None
    half_width: Optional[float] = None
    canary_every: int = 0
    confirm: bool = False
    # Version 4.  sync: a step is candidates_per_step proposals judged together; async: a step
    # is one candidate, judged when it lands, with in_flight candidates kept in flight.
    mode: SearchMode = "sync"
    in_flight: Optional[int] = None  # async only
    # Version 5: the run settings and the focus, which earlier versions took from the config
    # of each resume (null: such a rundir; a resume takes them from its config, as then).
    timeout: Optional[float] = None
    perf: Optional[bool] = None
    aslr: Optional[bool] = None
    focus: Optional[Focus] = None
    # Later: what candidates are compared in (absent: time, as every earlier rundir was).
    metric: Metric = "time"
    later_fields: ClassVar[frozenset[str]] = frozenset(
        {"mode", "in_flight", "timeout", "perf", "aslr", "focus", "metric"})

    def settings(self) -> SearchSettings:
        """These settings alone (an ``Experiment``'s, without the chain's identity)."""
        return SearchSettings(**{f: getattr(self, f) for f in SearchSettings.model_fields})


class Experiment(SearchSettings):
    """What was asked of one chain: its settings and its identity; ``experiment.json`` and
    the journal's ``start`` event."""

    version: int = FORMAT_VERSION
    task: str
    benchmark: str  # its directory
    chain: int
    rundir: Optional[str] = None
    worker_class: Optional[str] = None  # version 1: the backend's first slot's class
    # Version 4: the compiler's identity (sha256 of its ocamlopt): a resume with another
    # compiler would mix two compilers' binaries in one chain, so it is refused.
    compiler: Optional[str] = None
    later_fields: ClassVar[frozenset[str]] = SearchSettings.later_fields | {"compiler"}

    @property
    def packs_outputs(self) -> bool:
        """Whether its candidates' outputs are kept packed (version 6 on): a rundir keeps the
        layout it began with, so that the tool that began it can still read it."""
        return self.version >= PACKED_OUTPUTS_VERSION


def check_version(version: Any, where: str) -> None:
    if version not in READABLE_VERSIONS:
        raise RecordError(f"{where}: rundir format version {version!r} is not one this tool "
                          f"reads ({', '.join(map(str, READABLE_VERSIONS))})")


def read_experiment(path: Path) -> Experiment:
    """``experiment.json``: version checked first, then every field."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RecordError(f"{path}: unreadable ({exc})") from None
    if not isinstance(data, dict):
        raise RecordError(f"{path}: expected a JSON object")
    check_version(data.get("version", 1), str(path))
    return Experiment.from_json(data, str(path))


# --------------------------------------------------------------------------- journal events

class DecisionCounts(Record):
    """How many decisions of a compiled candidate were inline / not / prevented."""

    inlined: int
    not_inlined: int
    prevented: int


class Pointer(Record):
    """How the journal names a candidate kept as incumbent or best (step 0: the baseline)."""

    step: int
    candidate: int
    dir: str
    energy: float
    sha256: Optional[str] = None
    artifact: Optional[str] = None  # its store key (to re-measure it)


class Candidate(Record):
    """One proposal of a step: what was compiled, what the compiler did, how it ran.

    Measured in pairs with the baseline on one worker CPU (``times[i]`` ran next to
    ``reference_times[i]``); ``speedup`` and ``ci95`` are those pairs' (dispatcher.core.stats).
    Version-1 candidates have no pairs (``reference_times`` empty, ``speedup`` null).
    """

    candidate: int
    dir: str
    mutation: Optional[str]
    sha256: Optional[str] = None  # None: the compile failed
    artifact: Optional[str] = None
    cached: bool = False  # measurement reused (store, or another chain's job in flight)
    decisions: Optional[DecisionCounts] = None
    times: list[float] = Field(default_factory=list)
    failed: int = 0
    energy: Optional[float] = None  # 1 / speedup; None: no successful run
    error: Optional[str] = None
    reference_times: list[float] = Field(default_factory=list)
    speedup: Optional[float] = None
    ci95: Optional[tuple[float, float]] = None
    worker: Optional[str] = None  # the slot its pairs ran on
    stopped: Optional[str] = None  # why measuring stopped: target | budget | worse | failed

    def pointer(self, step: int) -> Pointer:
        assert self.energy is not None
        return Pointer(step=step, candidate=self.candidate, dir=self.dir, energy=self.energy,
                       sha256=self.sha256, artifact=self.artifact)


class _Event(Record):
    time: Optional[float] = None  # Unix seconds; stamped when appended


class StartEvent(_Event, Experiment):
    event: Literal["start"] = "start"


class BaselineEvent(_Event):
    event: Literal["baseline"] = "baseline"
    sha256: str
    dir: str = BASELINE_DIR
    artifact: Optional[str] = None
    times: list[float]
    geomean: float
    median: float
    ci95: tuple[float, float]
    decisions: Optional[DecisionCounts] = None

    def pointer(self) -> Pointer:
        return Pointer(step=0, candidate=0, dir=self.dir, energy=1.0, sha256=self.sha256,
                       artifact=self.artifact)


class SearchState(Record):
    """The search state after a step: what ``--resume`` continues from (``state.json``)."""

    step: int
    temperature: Optional[float]
    incumbent: Pointer
    best: Pointer
    current: Optional[str] = None  # random walk: the last compiled tree's dir
    rng: list[Any]  # random.Random.getstate(), as JSON


class StepEvent(_Event):
    event: Literal["step"] = "step"
    step: int
    temperature: Optional[float]
    candidates: list[Candidate]
    chosen: Optional[int]
    accepted: bool
    incumbent: Pointer
    best: Pointer
    current: Optional[str] = None
    rng: list[Any]  # async: empty (each proposal draws from its own stream: ProposeEvent)
    elapsed_s: Optional[float] = None
    busy_s: Optional[float] = None
    proposal: Optional[int] = None  # async: the proposal this step judged
    later_fields: ClassVar[frozenset[str]] = frozenset({"proposal"})

    def state(self) -> SearchState:
        return SearchState(step=self.step, temperature=self.temperature,
                           incumbent=self.incumbent, best=self.best, current=self.current,
                           rng=self.rng)


class ProposeEvent(_Event):
    """A proposal of an asynchronous search, journaled before it is compiled: a resume
    compiles and measures again each one no step has judged, from the same file."""

    event: Literal["propose"] = "propose"
    proposal: int  # 1, 2, ... in the order they were drawn
    origin: str  # the candidate dir of the tree it mutates (SA: the incumbent)
    mutation: str
    overrides: str  # rundir-relative: proposal_file(proposal)
    bar: float  # the speedup it must beat (the incumbent's when drawn): measuring stops early
    u: float  # its Metropolis draw, taken with the proposal


class RemeasureEvent(_Event):
    event: Literal["remeasure"] = "remeasure"
    step: int
    dir: str  # the incumbent's candidate dir
    measurements: str  # rundir-relative path of the new runs' measurements.json
    times: list[float]  # the new runs only
    energy: float  # 1 / speedup over all the incumbent's pairs (version 1: over all its runs)
    reference_times: list[float] = Field(default_factory=list)  # paired with the new runs
    speedup: Optional[float] = None  # over all the incumbent's pairs, these included
    ci95: Optional[tuple[float, float]] = None


class _PairedEvent(_Event):
    """Fresh pairs of a binary against the baseline, and what they say."""

    times: list[float]
    reference_times: list[float]
    speedup: Optional[float]
    ci95: Optional[tuple[float, float]]
    significant: bool  # the interval excludes 1


class CanaryEvent(_PairedEvent):
    """The baseline measured against itself as if it were a candidate (an A/A test): an
    interval that excludes 1 is a false positive of the protocol."""

    event: Literal["canary"] = "canary"
    step: int


class ConfirmEvent(_PairedEvent):
    """The best candidate measured again against the baseline at the end of a chain."""

    event: Literal["confirm"] = "confirm"
    step: int  # the best candidate's step
    candidate: int
    dir: str


class ResumeEvent(_Event):
    event: Literal["resume"] = "resume"
    from_step: int
    # Version 5: the settings this resume took from its config because the rundir did not
    # record them (a rundir of an earlier version), with their values; empty: none, every
    # setting is the recorded one.
    from_config: dict[str, Union[bool, int, float, str]] = Field(default_factory=dict)
    later_fields: ClassVar[frozenset[str]] = frozenset({"from_config"})


class FinishEvent(_Event):
    event: Literal["finish"] = "finish"
    reason: str  # completed | interrupted | failed: <one line>


Event = Annotated[Union[StartEvent, BaselineEvent, StepEvent, ProposeEvent, RemeasureEvent,
                        CanaryEvent, ConfirmEvent, ResumeEvent, FinishEvent],
                  Field(discriminator="event")]
EVENT_TYPES = (StartEvent, BaselineEvent, StepEvent, ProposeEvent, RemeasureEvent, CanaryEvent,
               ConfirmEvent, ResumeEvent, FinishEvent)
_EVENT = TypeAdapter(Event)


def event_from_json(data: Any, where: str) -> Event:
    try:
        return _EVENT.validate_python(data)
    except ValidationError as exc:
        raise _describe(exc, where) from None


def event_to_json(event: _Event) -> dict[str, Any]:
    return event.to_json()


def pooled_pairs(events: Sequence[Event], target: Pointer) -> tuple[list[float], list[float]]:
    """(reference times, candidate times) of every pair measured for the candidate ``target``
    points to: its own step's pairs (none for the baseline), then those of every
    ``remeasure`` of its dir or of another dir with the same binary.  The one pooling rule of
    the search, the plot and batch-log."""
    sha_of: dict[str, str] = {}
    reference: list[float] = []
    candidate: list[float] = []
    target_sha = target.sha256
    for e in events:
        if isinstance(e, StepEvent):
            for c in e.candidates:
                if c.sha256:
                    sha_of[c.dir] = c.sha256
                if e.step == target.step and c.candidate == target.candidate:
                    reference += c.reference_times
                    candidate += c.times if c.reference_times else []
                    target_sha = target_sha or c.sha256
    for e in events:
        if isinstance(e, RemeasureEvent) and e.reference_times and (
                e.dir == target.dir or (target_sha is not None
                                        and sha_of.get(e.dir) == target_sha)):
            reference += e.reference_times
            candidate += e.times
    return reference, candidate


# --------------------------------------------------------------------------- batch log

class BatchEntry(Record):
    """One line of the batch log: an experiment that was started."""

    task: Optional[str] = None
    rundir: str
    algorithm: Optional[str] = None
    steps: Optional[int] = None
    time: Optional[float] = None
    version: Optional[int] = None  # absent in version 1
