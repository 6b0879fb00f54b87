"""A chain's settings (``records.SearchSettings``): made from the config once, when the chain
starts, then read from its rundir by the chain and by every resume of it.

``config`` is ``dispatcher.config.Config``, a layer above this one, so it is not imported:
what is read of it is named here.
"""
from __future__ import annotations

from typing import Any, cast

from dispatcher.core.records import Algorithm, Focus, Metric, SearchSettings
from dispatcher.search.rules import in_flight_share

# Settings a rundir of an earlier version did not record, which a resume of it takes from
# its own config, as that version did: the run settings and the focus (before version 5)
# and the pairing (version 1, which did not pair: it pairs from the resume on).
LATER_SETTINGS = ("timeout", "perf", "aslr", "focus", "max_pairs", "half_width")


def _config_values(config: Any) -> dict[str, Any]:
    """The config's values of ``LATER_SETTINGS``."""
    run, m = config.run, config.measure
    return {"timeout": run.timeout, "perf": run.perf, "aslr": run.aslr,
            "focus": config.search.focus, "max_pairs": m.max_pairs, "half_width": m.half_width}


def settings_of(config: Any, slots: int, *, chain: int = 0, chains: int = 1,
                algorithm: str | None = None, steps: int | None = None,
                seed: int | None = None, size: str | None = None, runs: int | None = None,
                max_pairs: int | None = None, metric: str | None = None) -> SearchSettings:
    """The settings of a new chain: the config's, then the command line's overrides (None:
    not given).  ``chain``: its index among its task's chains (its seed is the seed plus
    it); ``slots``: the worker slots of its class; ``chains``: the chains sharing them (an
    asynchronous chain keeps its share of the slots in flight).  Under an exact ``metric``
    the incumbent is never re-measured and no canary is run: counts have no noise to undo
    or to detect (docs/measurement.md, "Exact metrics")."""
    s, m = config.search, config.measure
    sync = s.mode != "async"
    metric = metric or m.metric
    exact = metric != "time"
    return SearchSettings(
        algorithm=cast(Algorithm, algorithm or s.algorithm),
        seed=(s.seed if seed is None else seed) + chain,
        steps=steps or s.steps, size=size or config.run.size,
        runs=runs or config.run.runs, baseline_runs=s.baseline_runs,
        candidates_per_step=(s.candidates_per_step or slots) if sync else 1,
        mode="sync" if sync else "async",
        in_flight=None if sync else (s.in_flight or in_flight_share(slots, chains, exact)),
        t_start=s.t_start, t_end=s.t_end,
        remeasure_every=0 if exact else s.remeasure_every, max_flips=s.max_flips,
        max_pairs=max_pairs or m.max_pairs, half_width=m.half_width,
        canary_every=0 if exact else m.canary_every, confirm=m.confirm,
        metric=cast(Metric, metric),
        timeout=config.run.timeout, perf=config.run.perf, aslr=config.run.aslr,
        focus=cast(Focus, s.focus))


def recorded_settings(recorded: SearchSettings,
                      config: Any) -> tuple[SearchSettings, dict[str, Any]]:
    """The settings a chain runs with: those its rundir recorded, every one of them; a
    setting an earlier version did not record is the config's (as that version resumed) ->
    the settings, and those taken from the config with their values (the ``resume`` event
    journals them; empty for a rundir of this version)."""
    settings = recorded.settings()
    taken = {k: v for k, v in _config_values(config).items() if getattr(settings, k) is None}
    return settings.model_copy(update=taken), taken
