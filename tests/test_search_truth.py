"""The simulated profile (docs/simulation.md, "The profile") and the ground-truth scoring of
``bench/search_truth`` (``dispatcher/running/simulated/truth.py``): small, no search run, no
timing asserted."""
from __future__ import annotations

import hashlib
import math
import random
from pathlib import Path

import pytest

from dispatcher.build.manifest import resolve_benchmark
from dispatcher.config import ConfigError, parse_config
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import Candidate, ConfirmEvent, HotFunctions, Pointer, StepEvent
from dispatcher.core.sites import site_function
from dispatcher.core.tree import diff, flip, flippable, propose_action
from dispatcher.running.simulated.backend import SimulatedBackend, SimulatedConfig
from dispatcher.running.simulated.model import Condition, Effect, Model, ProgramModel
from dispatcher.running.simulated.programs import (
    DUMPS_DIR,
    functions_of,
    read_bundle,
)
from dispatcher.running.simulated.truth import LabelScore, found, holds, score_labels
from dispatcher.search.focus import RUNTIME, hot_functions_of, in_cold_code
from dispatcher.search.rules import propose

KAHAN = resolve_benchmark("kahan")


def kahan():
    return read_bundle(DUMPS_DIR / "kahan.tar.gz")


def planted_on(program, index: int) -> Effect:
    leaves = [x for x in flippable(program.tree, 0) if not x.node.prevented]
    u, r, n = leaves[index]
    return Effect(Condition(u, r, n.key, flip(n.decided)), math.log(1.05))


def profile_of(tmp: Path, model: ProgramModel, seed: int = 0) -> tuple[Path, HotFunctions]:
    """The heuristic build of kahan under ``model``, and its profile taken as a chain takes
    one: a sampled job on a simulated slot, read through the binary's symbol table."""
    backend = SimulatedBackend(SimulatedConfig(
        slots=1, time_scale=1e-6, cache_dir=tmp / "cache",
        model=Model(programs={"kahan": model}, seed=seed)))
    built, _ = backend.builder.build(KAHAN, tmp / "build", Path("unused"), (), {}, True)
    job = RunJob(sha256=hashlib.sha256(built.binary.read_bytes()).hexdigest(),
                 binary=built.binary, args=(), runs=1, timeout=60,
                 profile_period_ns=500_000)  # 1 s runs: about 2,000 samples
    return built.binary, hot_functions_of(built.binary, [backend.slots[0].run(job)])


def test_a_profile_names_the_programs_functions_through_the_symbol_table(tmp_path):
    program = kahan()
    effect = planted_on(program, 5)
    _, hot = profile_of(tmp_path, ProgramModel(effects=(effect,)))
    assert hot.error is None and hot.samples > 1500
    assert 0 < hot.elsewhere < 0.05 * hot.samples
    named = set(hot.functions) - {RUNTIME}
    assert named and named <= set(functions_of(program))
    assert hot.functions[RUNTIME] < 0.2 * hot.samples
    # the planted decision's function runs, with at least (about) the share its gain saves
    planted = site_function(effect.when.unit, effect.when.key)
    assert hot.functions.get(planted, 0) > 0.03 * hot.samples
    # most functions never ran (hot_share 0.25 of them besides the planted one's)
    assert len(named) < 0.5 * len(functions_of(program))


def test_a_given_heat_is_the_profile(tmp_path):
    program = kahan()
    chosen = functions_of(program)[:2]
    _, hot = profile_of(tmp_path, ProgramModel(heat=((chosen[0], 3.0), (chosen[1], 1.0))))
    assert set(hot.functions) == {*chosen, RUNTIME}
    assert hot.functions[chosen[0]] > 2 * hot.functions[chosen[1]]


def test_focus_hot_flips_the_planted_site_more_often_than_uniform(tmp_path):
    """Over the same 1,500 proposals from the heuristic's tree, the profiled search flips
    the planted site more often and lands in code that never ran less often."""
    program = kahan()
    effect = planted_on(program, 5)
    _, hot = profile_of(tmp_path, ProgramModel(effects=(effect,)))
    site = (effect.when.unit, effect.when.round, effect.when.key)
    counts = {}
    for name, profile in (("uniform", None), ("hot", hot)):
        rng = random.Random(11)
        planted = cold = flips = 0
        for _ in range(1500):
            tree, _ = propose(program.tree, rng, hot=profile)
            changed = diff(program.tree, tree).changed
            planted += site in changed
            for x in changed:
                node = program.tree.find(x.unit, x.round, x.key)
                flips += 1
                cold += node is not None and in_cold_code(x.unit, x.key, node.name, hot)
        counts[name] = (planted, cold / max(flips, 1))
    assert counts["hot"][0] > 1.3 * counts["uniform"][0], counts
    assert counts["hot"][1] < 0.5 * counts["uniform"][1], counts


# --------------------------------------------------------------------------- the truth


def candidate(step: int, speedup: float | None = None, low: float = 1.0) -> Candidate:
    """A candidate of ``step`` measured at ``speedup`` (None: it did not compile)."""
    d = f"steps/{step:05d}/c0"
    if speedup is None:
        return Candidate(candidate=0, dir=d, mutation="flip 1", error="compile failed")
    return Candidate(candidate=0, dir=d, mutation="flip 1", sha256=f"{step:064d}",
                     times=[1.0] * 10, reference_times=[1.0] * 10, speedup=speedup,
                     energy=1 / speedup, ci95=(low, 2 * speedup - low))


def step(n: int, c: Candidate, best: Candidate | None) -> StepEvent:
    pointer = (Pointer(step=0, candidate=0, dir="steps/00000/c0", energy=1.0) if best is None
               else best.pointer(int(best.dir.split("/")[1])))
    return StepEvent(step=n, temperature=None, candidates=[c], chosen=0, accepted=True,
                     incumbent=pointer, best=pointer, rng=[])


def test_found_is_the_first_best_holding_the_effect_measurably():
    c1 = candidate(1, 1.02, 0.99)  # no effect, not significant
    c2 = candidate(2, 1.04, 0.995)  # holds it, but its interval holds 1: not yet found
    c3 = candidate(3, 1.08, 1.03)  # a null measured lucky: the best, without the effect
    c4 = candidate(4)  # did not compile
    c5 = candidate(5, 1.09, 1.04)  # holds it, significant, the best: found
    holding = {c2.dir, c5.dir}
    asked = []

    def holds_in(d: str) -> bool:
        asked.append(d)
        return d in holding
    events = [step(1, c1, c1), step(2, c2, c2), step(3, c3, c3), step(4, c4, c3),
              step(5, c5, c5),
              ConfirmEvent(step=5, candidate=0, dir=c5.dir, times=[1.0], reference_times=[1.0],
                           speedup=1.05, ci95=(1.01, 1.09), significant=True)]
    got = found(events, holds_in)
    assert (got.proposed, got.best, got.final, got.confirmed, got.steps) == (2, 5, True, True, 5)
    assert (got.pairs, got.pairs_to_best) == (40, 40)
    assert len(asked) == len(set(asked))  # each directory checked once
    # the same journal where the last best lost the effect, and its confirmation held 1
    events[-2] = step(5, c5, c3)
    events[-1] = events[-1].model_copy(update={"dir": c3.dir, "ci95": (0.98, 1.06)})
    got = found(events, lambda d: d in holding)
    assert (got.best, got.final, got.confirmed) == (None, False, False)


def test_holds_needs_every_required_decision():
    program = read_bundle(DUMPS_DIR / "lu.tar.gz")
    a, b = [x for x in flippable(program.tree, 0) if not x.node.prevented][:2]
    effect = Effect(Condition(b.unit, 0, b.node.key, flip(b.node.decided)), 0.05,
                    (Condition(a.unit, 0, a.node.key, flip(a.node.decided)),))
    only_b = propose_action(program.tree, b, flip(b.node.decided))
    both = propose_action(only_b, a, flip(a.node.decided))
    assert not holds(effect, program.tree) and not holds(effect, only_b)
    assert holds(effect, both)


def test_labels_are_scored_against_the_planted_decisions():
    single = Effect(Condition("M", 0, "k1", "inline"), 0.05)
    pair = Effect(Condition("M", 0, "k2", "inline"), 0.05,
                  (Condition("M", 0, "k3", "dont_inline"),))
    labels = {("M", 0, "k1"): "inline",  # planted, right action
              ("M", 0, "k2"): "dont_inline",  # planted, reversed
              ("M", 0, "k3"): "default",  # planted, not labelled
              ("M", 0, "k4"): "inline",  # not planted: a false label
              ("M", 1, "k1"): "dont_inline",  # another round's site: not planted either
              ("M", 0, "k5"): "default"}
    score = score_labels(labels, [single, pair])
    assert score == LabelScore(planted=3, recalled=1, reversed=1, labelled=4, correct=1)
    assert score.recall == pytest.approx(1 / 3) and score.precision == pytest.approx(1 / 4)
    assert score_labels({}, [single]).precision is None
    assert (score + score).recalled == 2


@pytest.mark.parametrize("program, key", [
    ({"hot_share": 2}, "simulated.model.programs.lu.hot_share"),
    ({"heat": ["Lu.f"]}, "simulated.model.programs.lu.heat"),
    ({"heat": {"Lu.f": -1}}, "simulated.model.programs.lu.heat.Lu.f"),
])
def test_profile_config_errors_are_one_line(program, key):
    with pytest.raises(ConfigError) as err:
        parse_config({"backend": "simulated", "simulated": {"model": {"programs": {
            "lu": program}}}}, Path("c.yaml"))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"c.yaml: {key}:"), message


def test_a_slot_of_depth_one_is_configured_and_checked():
    cfg = parse_config({"backend": "simulated", "simulated": {"depth": 1}}, Path("c.yaml"))
    assert cfg.backend_settings.depth == 1
    with pytest.raises(ConfigError) as err:
        parse_config({"backend": "simulated", "simulated": {"depth": 3}}, Path("c.yaml"))
    assert str(err.value).startswith("c.yaml: simulated.depth:")
    backend = SimulatedBackend(cfg.backend_settings)
    assert [s.depth for s in backend.slots] == [1] * len(backend.slots)
