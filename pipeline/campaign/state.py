"""A campaign's stages, in order, and its state file (``<dir>/campaign.json``): what each
stage has done, so that a campaign run again skips what is done and continues the rest."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dispatcher.core.files import TextFileError, read_regular_text, write_text_atomic
from dispatcher.core.validation import first_model_error, shown
from pipeline.campaign.plan import Campaign, CampaignError

STATE_VERSION = 1
STATE_FILE = "campaign.json"
#: The campaign's answer (the kept policy against the baselines) before the optimal trees: a
#: diagnostic of the rewards that costs hours (every reward model on every searched program).
STAGES = ("search", "labels", "flipbacks", "rewards", "policy", "evaluate", "dataset",
          "searched", "select", "kept", "optimal", "publish")
DESCRIPTIONS = {
    "search": "search the training split (run_training_experiments)",
    "labels": "measure sites: attribute the winners, sweep hot sites (measure-sites)",
    "flipbacks": "measure sites of an aggressive build set back alone: where inlining hurts "
                 "(measure-sites --reference)",
    "rewards": "assign rewards to the searches' decisions (assign-rewards)",
    "policy": "train the policy, validated by measurement (train-policy)",
    "evaluate": "the policy and the baselines on the evaluation split (run-plugin-benchmark)",
    "optimal": "the optimal trees of the rewards (run-all-benchmarks)",
    "dataset": "the labels, rewards and measured trees as a dataset (export-dataset)",
    "searched": "a policy file's parameters searched for the training split's speedup "
                "(search-policy)",
    "select": "the kind of policy kept by leave-fold-out measurement (select-policy)",
    "kept": "the kept policy (select's, else the searched one) and the baselines on the "
            "evaluation split (run-plugin-benchmark)",
    "publish": "write the results (summary.csv, per-program CSVs, policy, README.md)",
}
DONE = ("done", "budget", "gate-failed", "skipped")


def now() -> float:
    return time.time()


@dataclass(frozen=True)
class StageState:
    state: str = "pending"  # pending | running | done | budget | gate-failed | skipped | failed
    started: float | None = None
    finished: float | None = None
    runs: int = 0  # times it was started (a resume counts)
    exit: int | None = None
    note: str = ""

    @property
    def done(self) -> bool:
        return self.state in DONE


@dataclass(frozen=True)
class CampaignState:
    identity: str
    stages: dict[str, StageState]
    version: int = STATE_VERSION
    # the files the identity covers, path -> sha256 (to name the one that changed)
    inputs: tuple[tuple[str, str], ...] = ()

    def next_stage(self) -> str | None:
        return next((s for s in STAGES if not self.stages[s].done), None)

    def with_stage(self, name: str, **changes: Any) -> CampaignState:
        return replace(self, stages={**self.stages,
                                     name: replace(self.stages[name], **changes)})


def new_state(campaign: Campaign) -> CampaignState:
    return CampaignState(identity=campaign.identity, stages={s: StageState() for s in STAGES},
                         inputs=campaign.inputs)


#: What campaign.json may hold: a few kB per campaign; past this it is not one.
STATE_LIMIT = 1 << 20
_STRICT = ConfigDict(extra="forbid", strict=True)
_Time = Optional[Annotated[float, Field(ge=0, allow_inf_nan=False)]]
_Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
#: A path as plan.py records it, on one line (it is named in one-line errors).
_InputPath = Annotated[str, Field(min_length=1, max_length=4096, pattern=r"^[^\x00-\x1f]+$")]


class _StageRecord(BaseModel):
    """One stage in campaign.json, as ``write_state`` writes it (``StageState``)."""

    model_config = _STRICT
    state: Literal["pending", "running", "done", "budget", "gate-failed", "skipped", "failed"]
    started: _Time = None
    finished: _Time = None
    runs: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    exit: Optional[Annotated[int, Field(ge=-255, le=255)]] = None
    note: Annotated[str, Field(max_length=10_000)] = ""


class _Stages(BaseModel):
    model_config = _STRICT
    search: _StageRecord
    labels: _StageRecord
    # absent in a campaign.json written before the stage existed: pending (it then runs, or
    # is skipped when the campaign file does not turn it on)
    flipbacks: _StageRecord = Field(default_factory=lambda: _StageRecord(state="pending"))
    rewards: _StageRecord
    policy: _StageRecord
    evaluate: _StageRecord
    optimal: _StageRecord
    dataset: _StageRecord
    # absent in a campaign.json written before the stage existed: pending (it then runs, or
    # is skipped when the campaign file does not turn it on)
    searched: _StageRecord = Field(default_factory=lambda: _StageRecord(state="pending"))
    select: _StageRecord = Field(default_factory=lambda: _StageRecord(state="pending"))
    kept: _StageRecord = Field(default_factory=lambda: _StageRecord(state="pending"))
    publish: _StageRecord


class _StateRecord(BaseModel):
    """The shape of campaign.json: checked whole on every read (it decides which stages run
    and which are skipped, so nothing in it is taken on trust)."""

    model_config = _STRICT
    version: Literal[1]
    identity: _Digest
    stages: _Stages
    # absent in a directory started before the identity covered the files' content
    inputs: dict[_InputPath, _Digest] = Field(default_factory=dict, max_length=10_000)


def validation_error(path: Path, exc: ValidationError) -> tuple[str, str, str]:
    """The first error of a pydantic validation of ``path`` as (file, key, message) for
    ``FileKeyError.at``: ``FILE: KEY: MESSAGE, got VALUE``."""
    return (str(path), *first_model_error(exc))


def read_state(campaign: Campaign) -> CampaignState:
    """The campaign directory's state, a new one where there is none; CampaignError (one line
    naming the file and the key) for a state of another campaign's settings or another
    format, or one that is not what ``write_state`` writes: not a regular file of at most
    ``STATE_LIMIT`` bytes, not JSON, a key unknown or missing, a value of the wrong type or
    out of its range.  Nothing is written before it is read whole and checked."""
    path = campaign.dir / STATE_FILE
    try:
        data = json.loads(read_regular_text(path, STATE_LIMIT))
    except FileNotFoundError:
        return new_state(campaign)
    except TextFileError as exc:
        raise CampaignError(f"{exc}; run-campaign writes it: put it back, or give the "
                            "campaign another dir") from None
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CampaignError(f"{path}: not a campaign state (not JSON: {reason})") from None
    if not isinstance(data, dict):
        raise CampaignError(f"{path}: not a campaign state (expected a JSON object)")
    version = data.get("version")
    if type(version) is not int or version != STATE_VERSION:  # not True, not 1.0
        raise CampaignError(f"{path}: version: state format version {shown(version)}; "
                            f"this run-campaign reads {STATE_VERSION}")
    try:
        record = _StateRecord.model_validate(data)
    except ValidationError as exc:
        raise CampaignError.at(*validation_error(path, exc)) from None
    stages = {s: StageState(**getattr(record.stages, s).model_dump()) for s in STAGES}
    identity, inputs = record.identity, record.inputs
    if identity == campaign.legacy_identity:
        # started before the identity covered the files' content: taken over as it is (the
        # next state written records the files as they are now)
        identity = campaign.identity
    if identity != campaign.identity:
        now_ = dict(campaign.inputs)
        changed = [p for p, digest in inputs.items() if now_.get(p, digest) != digest]
        if changed:
            raise CampaignError(
                f"{path}: this campaign directory was started with other content in "
                f"{changed[0]} than it has now; give the campaign another dir, or put the "
                "file back")
        raise CampaignError(
            f"{path}: this campaign directory was started with other settings than "
            f"{campaign.source} now has (the experiment config's content, a file it names, "
            "a benchmark directory's sources, the size or a stage's keys changed); give the "
            "campaign another dir, or put the settings back")
    return CampaignState(identity=identity, stages=stages, inputs=campaign.inputs)


def write_state(campaign: Campaign, state: CampaignState) -> None:
    data = {"version": state.version, "identity": state.identity,
            "stages": {s: state.stages[s].__dict__ for s in STAGES},
            "inputs": dict(state.inputs)}
    write_text_atomic(campaign.dir / STATE_FILE, json.dumps(data, indent=1) + "\n")
