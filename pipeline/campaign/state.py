"""A campaign's stages, in order, and its state file (``<dir>/campaign.json``): what each
stage has done, so that a campaign run again skips what is done and continues the rest."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

from dispatcher.core.files import TextFileError, read_utf8, write_text_atomic
from pipeline.campaign.plan import Campaign, CampaignError

STATE_VERSION = 1
STATE_FILE = "campaign.json"
STAGES = ("search", "labels", "rewards", "policy", "evaluate", "optimal", "dataset",
          "publish")
DESCRIPTIONS = {
    "search": "search the training split (run_training_experiments)",
    "labels": "measure sites: attribute the winners, sweep hot sites (measure-sites)",
    "rewards": "assign rewards to the searches' decisions (assign-rewards)",
    "policy": "train the policy, validated by measurement (train-policy)",
    "evaluate": "the policy and the baselines on the evaluation split (run-plugin-benchmark)",
    "optimal": "the optimal trees of the rewards (run-all-benchmarks)",
    "dataset": "the labels, rewards and measured trees as a dataset (export-dataset)",
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


def read_state(campaign: Campaign) -> CampaignState:
    """The campaign directory's state, a new one where there is none; CampaignError for a
    state of another campaign's settings or another format."""
    path = campaign.dir / STATE_FILE
    if not path.exists():
        return new_state(campaign)
    try:
        data = json.loads(read_utf8(path))
        if data.get("version") != STATE_VERSION:
            raise CampaignError(f"{path}: state format version {data.get('version')!r}; this "
                                f"run-campaign reads {STATE_VERSION}")
        stages = {s: StageState(**data["stages"][s]) for s in STAGES}
        identity = str(data["identity"])
        inputs = {str(k): str(v) for k, v in (data.get("inputs") or {}).items()}
    except (TextFileError, ValueError, KeyError, TypeError, AttributeError) as exc:
        if isinstance(exc, CampaignError):
            raise
        raise CampaignError(f"{path}: not a campaign state ({exc})") from None
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
