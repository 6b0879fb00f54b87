"""The campaign: the whole pipeline on one set of programs, resumable (docs/campaign.md).

Search the training split, measure sites, assign rewards, train a policy with measured
validation, measure it with the baselines on the test split and the optimal trees on the
training split, then publish what is small and meaningful under ``results``.  Each stage is one
of the project's own commands, run in the campaign directory (so the config's relative
``search.rundirs`` and ``search.batch_log`` land there); a stage stopped half-way continues
through that command's own resume.

- ``plan``: the campaign file, validated, as a ``Campaign``
- ``state``: the stages and the state file (``campaign.json``)
- ``stages``: the command line each stage runs
- ``budget``: the worker-hours the search and the sweeps have spent, from their journals
- ``runner``: the stages run, stopped by the budget, their exit status made their state
- ``publish``: the results folder and its README

``open_campaign`` and ``run`` are what ``run-campaign`` calls.
"""
from __future__ import annotations

from pathlib import Path

from pipeline.campaign.budget import WorkerClock, stage_budget_s
from pipeline.campaign.plan import Campaign, CampaignError, load_campaign
from pipeline.campaign.runner import CampaignRun, run
from pipeline.campaign.state import (
    DESCRIPTIONS,
    DONE,
    STAGES,
    CampaignState,
    StageState,
    read_state,
)

__all__ = ["DESCRIPTIONS", "DONE", "STAGES", "Campaign", "CampaignError", "CampaignRun",
           "CampaignState", "StageState", "WorkerClock", "load_campaign", "open_campaign",
           "read_state", "run", "stage_budget_s"]


def open_campaign(path: Path, *, quick: bool = False) -> tuple[Campaign, CampaignState]:
    """The campaign file and its directory's state (a new one where there is none);
    CampaignError, one line, for either that cannot be used."""
    campaign = load_campaign(path, quick=quick)
    return campaign, read_state(campaign)
