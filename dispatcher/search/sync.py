"""The synchronous search (``search.mode: sync``): a step proposes ``candidates_per_step``
candidates from one RNG stream, compiles and measures them all, then judges them together,
so each step waits for its slowest candidate.  The RNG state is journaled with each step: a
resume draws on from the last one."""
from __future__ import annotations

import random
import time
from typing import Any

from dispatcher.build.service import CompileError, CompileJob, CompileResult
from dispatcher.core.dump_cache import DUMPS, Build
from dispatcher.core.records import BaselineEvent, Candidate, Pointer, StepEvent, candidate_dir
from dispatcher.core.tree import Tree, to_overrides
from dispatcher.search.chain_core import ChainCore
from dispatcher.search.rules import metropolis, propose, temperature


def rng_to_json(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(data: list[Any]) -> random.Random:
    rng = random.Random()
    rng.setstate((data[0], tuple(data[1]), data[2]))
    return rng


class SyncSearch:
    """The synchronous loop over a chain's core."""

    def __init__(self, chain: ChainCore):
        self.chain = chain

    def run(self, baseline: BaselineEvent) -> Pointer:
        """Steps of ``candidates_per_step`` proposals, each step waiting for all of its
        candidates before deciding -> the best candidate."""
        chain, p = self.chain, self.chain.settings
        rundir, status = chain.rundir, chain.status
        last = rundir.last_step()
        if last is None:
            rng = random.Random(p.seed)
            incumbent = best = baseline.pointer()
            current_dir = baseline.dir  # random walk: the last compiled tree
            first = 1
        else:
            rng = rng_from_json(last.rng)
            incumbent, best = last.incumbent, last.best
            current_dir = last.current or incumbent.dir
            first = last.step + 1
            chain.resumed(first)
        incumbent_tree = DUMPS.tree_of_dir(rundir.path / incumbent.dir)
        current_tree = DUMPS.tree_of_dir(rundir.path / current_dir)
        status.best_energy = best.energy
        # elapsed_s and busy_s go on from where the journal left them (cumulative over
        # resumes); the time of a step lost to a crash is not counted.
        elapsed_before = (last.elapsed_s or 0.0) if last is not None else 0.0
        busy_before = (last.busy_s or 0.0) if last is not None else 0.0
        t_begin = time.monotonic()
        busy_begin = chain.busy_s()

        for step in range(first, p.steps + 1):
            chain.check_stop()
            status.step, status.state = step - 1, "compiling"
            temp = temperature(step, p.steps, p.t_start, p.t_end) if p.algorithm == "sa" else None
            origin = incumbent_tree if p.algorithm == "sa" else current_tree
            # The proposals' draws, then the Metropolis draw, taken whatever happens.
            candidates, trees = self.candidates(step, origin, rng, incumbent.energy)
            u = rng.random()
            scored = [c for c in candidates if c.energy is not None]
            chosen = min(scored, key=lambda c: c.energy or 0.0) if scored else None
            if chosen is None:
                accepted = False
            elif p.algorithm == "sa":
                assert temp is not None and chosen.energy is not None
                accepted = metropolis(incumbent.energy, chosen.energy, temp, u)
            else:
                accepted = True
            if accepted and chosen is not None:
                incumbent = chosen.pointer(step)
                incumbent_tree = trees[chosen.candidate].tree
                current_dir, current_tree = chosen.dir, incumbent_tree
            for c in scored:
                if c.energy is not None and c.energy < best.energy:
                    best = c.pointer(step)
                    status.best_ci = c.ci95
            if (p.algorithm == "sa" and p.remeasure_every and step % p.remeasure_every == 0
                    and incumbent.step > 0):
                incumbent = chain.remeasure(step, incumbent)
            chain.check_stop()  # a step cut short by a stop is redone on resume, not recorded
            event = StepEvent(step=step, temperature=temp, candidates=candidates,
                              chosen=chosen.candidate if chosen else None, accepted=accepted,
                              incumbent=incumbent, best=best, current=current_dir,
                              rng=rng_to_json(rng),
                              elapsed_s=elapsed_before + time.monotonic() - t_begin,
                              busy_s=busy_before + chain.busy_s() - busy_begin)
            rundir.append(event)
            rundir.write_state(event.state())
            # Binaries no later step runs leave the store (compiled again if ever needed).
            chain.builds.release({chain.reference.key, incumbent.artifact, best.artifact})
            status.step, status.best_energy = step, best.energy
            if p.canary_every and step % p.canary_every == 0:
                chain.canary(step)  # after the step: a resume never repeats it
        return best

    def candidates(self, step: int, origin: Tree, rng: random.Random,
                   incumbent_energy: float) -> tuple[list[Candidate], dict[int, Build]]:
        """Propose, compile and measure one step's candidates -> their records and the builds
        the compiler really produced (by candidate index; a tree is made for the one kept)."""
        chain, p = self.chain, self.chain.settings
        n = p.candidates_per_step if p.algorithm == "sa" else 1
        proposals = [propose(origin, rng, p.max_flips, hot=chain.hot) for _ in range(n)]
        compiles = [chain.builds.submit(CompileJob(chain.benchmark, to_overrides(t)))
                    for t, _ in proposals]
        compiled: list[CompileResult | None] = []
        errors: list[str | None] = []
        for future in compiles:
            try:
                compiled.append(chain.wait(future))
                errors.append(None)
            except CompileError as exc:
                compiled.append(None)
                errors.append(f"compile failed: {exc}")
        chain.status.state = "running"
        # Every comparison starts before any is waited for: the slots fill at once.  One
        # that cannot beat the incumbent stops early.
        bar = 1.0 / incumbent_energy
        pending = {k: chain.start_comparison(c, chain.pairing(bar))
                   for k, c in enumerate(compiled) if c is not None}
        candidates, trees = [], {}
        for k, ((_, mutation), c) in enumerate(zip(proposals, compiled)):
            entry = Candidate(candidate=k, dir=candidate_dir(step, k), mutation=mutation,
                              error=errors[k])
            compared = chain.wait(pending[k]) if c is not None else None
            entry, built = chain.record(step, entry, c, compared)
            if built is not None:
                trees[k] = built
            candidates.append(entry)
        return candidates, trees
