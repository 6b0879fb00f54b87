"""dispatcher.search.rules, the pure rules: the temperature schedule, Metropolis, and the
asynchronous search's bookkeeping (in-flight share, per-proposal streams, judging in landing
order, what a resume must measure again).  No I/O: the end-to-end runs are in
tests/test_experiment_async.py."""
from __future__ import annotations

import math

import pytest

from dispatcher.core.records import Candidate, Pointer, ProposeEvent, StepEvent, proposal_file
from dispatcher.search.rules import (
    JournalOrderError,
    accept,
    backlog,
    in_flight_share,
    judge,
    metropolis,
    proposal_rng,
    temperature,
)

BASE = Pointer(step=0, candidate=0, dir="steps/00000/c0", energy=1.0)


def candidate(step: int, energy: float | None) -> Candidate:
    return Candidate(candidate=0, dir=f"steps/{step:05d}/c0", mutation="flip 1",
                     energy=energy, sha256=None if energy is None else f"{step:064x}")


def proposed(n: int) -> ProposeEvent:
    return ProposeEvent(proposal=n, origin=BASE.dir, mutation="flip 1",
                        overrides=proposal_file(n), bar=1.0, u=0.5)


def judged(step: int, n: int) -> StepEvent:
    return StepEvent(step=step, temperature=0.01, candidates=[candidate(step, 1.0)], chosen=0,
                     accepted=False, incumbent=BASE, best=BASE, rng=[], proposal=n)


def test_temperature_runs_from_t_start_to_t_end_exponentially():
    assert temperature(1, 10, 0.04, 0.001) == pytest.approx(0.04)
    assert temperature(10, 10, 0.04, 0.001) == pytest.approx(0.001)
    middle = temperature(5, 9, 0.04, 0.001)
    assert middle == pytest.approx(math.sqrt(0.04 * 0.001))
    assert temperature(1, 1, 0.04, 0.001) == 0.04


def test_metropolis_takes_better_always_and_worse_by_chance():
    assert metropolis(1.0, 0.9, 0.01, 0.999)
    assert metropolis(1.0, 1.0, 0.01, 0.999)
    p = math.exp(-0.01 / 0.01)
    assert metropolis(1.0, 1.01, 0.01, p - 1e-9) and not metropolis(1.0, 1.01, 0.01, p + 1e-9)
    assert not metropolis(1.0, 1.01, 0.0, 0.0)


def test_in_flight_share_is_the_chains_share_of_the_slots_plus_one():
    assert in_flight_share(1, 1) == 2
    assert in_flight_share(14, 1) == 15
    assert in_flight_share(14, 3) == 6  # ceil(14 / 3) = 5
    assert in_flight_share(14, 14) == 2
    assert in_flight_share(2, 5) == 2  # more chains than slots: still one measured, one ready
    # counted, a comparison is about four compiles long: a quarter of the share more
    assert in_flight_share(256, 23, exact=True) == 12 + 3 + 1
    assert in_flight_share(64, 23, exact=True) == 3 + 1 + 1
    assert in_flight_share(1, 1, exact=True) == 3
    assert in_flight_share(3, 0) == 4


def test_each_proposal_has_its_own_reproducible_stream():
    def draws(seed: int, n: int) -> list[float]:
        rng = proposal_rng(seed, n)
        return [rng.random() for _ in range(3)]

    assert draws(7, 3) == draws(7, 3)
    assert len({tuple(draws(seed, n)) for seed in (0, 1, 7) for n in (1, 2, 3)}) == 9


def test_accept_rule():
    assert not accept("sa", 1.0, None, 0.01, 0.0)  # nothing measured
    assert accept("sa", 1.0, 0.95, 0.01, 0.99)
    assert not accept("sa", 1.0, 1.2, 0.01, 0.5)
    assert accept("random-walk", 1.0, 5.0, None, 0.99)  # a walk moves to every measurement
    assert not accept("random-walk", 1.0, None, None, 0.0)


def test_a_landed_candidate_is_judged_against_the_incumbent_of_the_moment_it_landed():
    """Two candidates drawn from the baseline; the second to land meets the first as the
    incumbent if the first was accepted: the landing order decides."""
    a, b = candidate(1, 0.90), candidate(2, 0.95)  # (dirs as if each were step 1 or 2)
    temp, u = 0.001, 0.5  # cold: a worse candidate is refused

    # a lands first: accepted; b (worse than a, better than the baseline) is refused
    first = judge("sa", 1, a, BASE, BASE, BASE.dir, temp, u)
    assert first.accepted and first.incumbent.energy == 0.90 and first.best.energy == 0.90
    second = judge("sa", 2, b, first.incumbent, first.best, first.current, temp, u)
    assert not second.accepted and second.incumbent == first.incumbent
    assert second.best == first.best

    # b lands first: both accepted, each better than the incumbent it met
    first = judge("sa", 1, b, BASE, BASE, BASE.dir, temp, u)
    second = judge("sa", 2, a, first.incumbent, first.best, first.current, temp, u)
    assert first.accepted and second.accepted
    assert second.incumbent.step == 2 and second.best.energy == 0.90
    assert second.current == a.dir


def test_judging_keeps_the_best_even_when_it_is_not_accepted_and_skips_failures():
    incumbent = Pointer(step=3, candidate=0, dir="steps/00003/c0", energy=0.8)
    best = Pointer(step=2, candidate=0, dir="steps/00002/c0", energy=0.7)
    failed = judge("sa", 4, candidate(4, None), incumbent, best, incumbent.dir, 0.01, 0.0)
    assert not failed.accepted and failed.incumbent is incumbent and failed.best is best
    # a random walk does not move to a candidate that did not compile
    walk = judge("random-walk", 4, candidate(4, None), incumbent, best, "steps/00003/c0",
                 None, 0.0)
    assert not walk.accepted and walk.current == "steps/00003/c0"
    moved = judge("random-walk", 5, candidate(5, 1.5), incumbent, best, "steps/00003/c0",
                  None, 0.9)
    assert moved.accepted and moved.current == "steps/00005/c0" and moved.best is best


def test_backlog_lists_the_unjudged_proposals_in_the_order_they_were_drawn():
    events = [proposed(1), proposed(2), judged(1, 2), proposed(3), proposed(4), judged(2, 4)]
    log = backlog(events)
    assert [e.proposal for e in log.pending] == [1, 3]
    assert log.next_proposal == 5
    assert backlog([]).pending == () and backlog([]).next_proposal == 1
    # synchronous steps (no proposal) are not the backlog's business
    sync = StepEvent(step=1, temperature=0.04, candidates=[], chosen=None, accepted=False,
                     incumbent=BASE, best=BASE, rng=[3, [1], None])
    assert backlog([sync]).next_proposal == 1


@pytest.mark.parametrize("events, message", [
    ([proposed(1), judged(1, 1), judged(2, 1)], "step 2 judges proposal 1 a second time"),
    ([proposed(1), judged(1, 2)], "step 1 judges proposal 2, which was never proposed"),
    ([proposed(1), proposed(3)], "proposal 3 journaled after proposal 1"),
    ([proposed(1), proposed(1)], "proposal 1 journaled after proposal 1"),
])
def test_backlog_refuses_a_journal_that_does_not_fit_together(events, message):
    with pytest.raises(JournalOrderError, match=f"^{message}$"):
        backlog(events)
