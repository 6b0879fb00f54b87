"""The run job: what to run and how, independent of where (the scheduler picks the slot).

It is the unit of measurement everywhere: the agent's request is made from it, the store keys
measurements by its ``measurement_identity``, and comparisons pair two of them.  It sits at the
bottom layer so that the store and the search can name it without the backends.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunJob:
    """What to run, independent of where: the scheduler picks the slot (and its CPU)."""

    sha256: str
    binary: Path  # on the master; backends copy it to the worker once per sha256
    args: tuple[str, ...]
    runs: int
    timeout: float
    expected_output: dict | None = None
    perf: bool = True
    env: dict = field(default_factory=dict)
    aslr: bool = False  # randomise the layout (ASLR on, a random environment pad per run)
    # > 0: sample where the binary spends its time, every that many ns of CPU time (a
    # profile job: its runs are never used as timings, and are stored under their own key)
    profile_period_ns: int = 0
    # What a run measures (the agent's ``metric``): "time" (the clock), or "cachegrind" (the
    # exact metric: counts that depend on the binary and its input only, docs/measurement.md)
    metric: str = "time"
    # An exact job: what its counts depend on besides binary and input (the tool and its cache
    # geometry, ``workers.agent.cachegrind.identity``); the store keys exact results by it
    # instead of by worker class.  Not sent: the workers' hellos are checked against it.
    exact_identity: str = ""

    @property
    def exact(self) -> bool:
        """Counted, not timed: the same on every worker of any class."""
        return self.metric != "time"

    def request(self, cpu: int) -> dict:
        message = {"op": "run", "sha256": self.sha256, "args": list(self.args),
                   "runs": self.runs, "cpu": cpu, "timeout": self.timeout,
                   "expected_output": self.expected_output, "perf": self.perf,
                   "env": dict(self.env), "aslr": self.aslr}
        if self.profile_period_ns:
            message["profile_period_ns"] = self.profile_period_ns
        if self.metric != "time":
            message["metric"] = self.metric
        return message

    # Fields that are not part of what is measured: where the binary lies on the master (its
    # content is ``sha256``) and how many runs (results of any count of the same job pool).
    NOT_MEASURED = frozenset({"binary", "runs"})
    # Fields added after measurements were stored: left out of the identity at their default,
    # so the keys of measurements already stored stay what they were.
    LATER_OPTIONS = {"profile_period_ns": 0, "metric": "time", "exact_identity": ""}

    def measurement_identity(self) -> dict:
        """Everything a run's verdict and times depend on: every field of the job but
        ``NOT_MEASURED`` (binary, arguments, environment, expected output, timeout, perf and
        any run option added later), as canonical JSON values.  The CPU is the slot's, not the
        job's; the worker class is added by ``dispatcher.storage.store.measurement_key``."""
        return {f.name: self._canonical(getattr(self, f.name)) for f in fields(self)
                if f.name not in self.NOT_MEASURED
                and (f.name not in self.LATER_OPTIONS
                     or getattr(self, f.name) != self.LATER_OPTIONS[f.name])}

    @staticmethod
    def _canonical(value: Any) -> Any:
        """A JSON value that compares as the value does: 30 and 30.0 alike, tuples as lists,
        paths as strings."""
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, (int, float)):
            return value
        if isinstance(value, dict):
            return {str(k): RunJob._canonical(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [RunJob._canonical(v) for v in value]
        return str(value)
