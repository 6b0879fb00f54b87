"""The asynchronous search (``search.mode: async``; docs/measurement.md, "Asynchronous
search"): ``in_flight`` candidates are kept in flight and each is judged as it lands, one step
per candidate, so no slot waits for a step's slowest candidate.  Each proposal draws from its
own stream and is journaled before it is compiled: a resume needs no RNG state, and measures
again the proposals no step judged."""
from __future__ import annotations

import queue
import time
from concurrent.futures import Future
from dataclasses import dataclass

from dispatcher.build.service import CompileError, CompileJob, CompileResult
from dispatcher.core.comparison import Comparison
from dispatcher.core.dump_cache import DUMPS
from dispatcher.core.records import (
    BaselineEvent,
    Candidate,
    Pointer,
    ProposeEvent,
    StepEvent,
    candidate_dir,
    proposal_file,
)
from dispatcher.core.tree import Tree, to_overrides
from dispatcher.search.chain_core import ChainCore, Interrupted
from dispatcher.search.rules import backlog, judge, proposal_rng, propose, temperature


@dataclass
class Flight:
    """An asynchronous proposal between its journal line and its judgement.  Filled in by
    the compile and comparison callbacks, then put on the chain's landing queue once."""

    proposal: ProposeEvent
    key: str  # its compile key: the chain holds its binary until it is judged
    compiled: CompileResult | None = None
    compared: Comparison | None = None
    error: str | None = None  # the compile failed: judged without an energy
    exc: BaseException | None = None  # anything else: the chain fails with it


class AsyncSearch:
    """The asynchronous loop over a chain's core."""

    def __init__(self, chain: ChainCore):
        self.chain = chain

    def run(self, baseline: BaselineEvent) -> Pointer:
        """Keep ``in_flight`` candidates in flight and judge each as it lands, one step each
        -> the best candidate.  A proposal is drawn from the incumbent (random walk: the
        current tree) of the moment and journaled before it is compiled; a step judges the
        candidate that landed against the incumbent of the moment it landed.  The journal's
        order is the decision order: a resume takes the state of its last step, measures
        again the proposals no step judged (the same files) and goes on drawing."""
        chain, p = self.chain, self.chain.settings
        rundir, status = chain.rundir, chain.status
        in_flight = p.in_flight or 1
        events = rundir.events()
        log = backlog(events)
        steps = [e for e in events if isinstance(e, StepEvent)]
        last = steps[-1] if steps else None
        if last is None:
            incumbent = best = baseline.pointer()
            current: str | None = baseline.dir
            judged = 0
        else:
            incumbent, best = last.incumbent, last.best
            current = last.current or incumbent.dir
            judged = last.step
        if last is not None or log.next_proposal > 1:
            chain.resumed(judged + 1)
        trees: dict[str, Tree] = {}  # the incumbent's and the current tree, by dir

        def tree_of(d: str) -> Tree:
            if d not in trees:
                trees[d] = DUMPS.tree_of_dir(rundir.path / d)
            return trees[d]

        status.step, status.best_energy = judged, best.energy
        elapsed_before = (last.elapsed_s or 0.0) if last is not None else 0.0
        busy_before = (last.busy_s or 0.0) if last is not None else 0.0
        t_begin = time.monotonic()
        busy_begin = chain.busy_s()
        landed: queue.SimpleQueue[Flight] = queue.SimpleQueue()
        flights = {e.proposal: self.launch(e, self.job_of(e), landed) for e in log.pending}
        proposal = log.next_proposal
        # Journal lines decided but not written yet, and the proposals among them, launched
        # once written: the candidates landed together are judged one step each, each step's
        # proposals drawn after it as when they land one at a time (the same decisions, the
        # same journal), and all their lines written at once (one write and one sync, where a
        # chain that falls behind its slots would sync twice per candidate).
        unwritten: list[ProposeEvent | StepEvent] = []
        drawn: list[tuple[ProposeEvent, CompileJob]] = []

        def draw() -> None:
            nonlocal proposal
            while len(flights) + len(drawn) < in_flight and proposal <= p.steps:
                origin = incumbent.dir if p.algorithm == "sa" else (current or incumbent.dir)
                event, job = self.propose(proposal, origin, tree_of(origin), incumbent)
                unwritten.append(event)
                drawn.append((event, job))
                proposal += 1

        def write(launch: bool = True) -> None:
            rundir.append_all(unwritten)
            unwritten.clear()
            if launch:  # a proposal is compiled once its line is written
                for event, job in drawn:
                    flights[event.proposal] = self.launch(event, job, landed)
                drawn.clear()

        while judged < p.steps:
            draw()
            write()
            status.state = "running"
            for flight in self.landings(landed, p.steps - judged):
                del flights[flight.proposal.proposal]
                step = judged + 1
                temp = (temperature(step, p.steps, p.t_start, p.t_end) if p.algorithm == "sa"
                        else None)
                entry = Candidate(candidate=0, dir=candidate_dir(step, 0),
                                  mutation=flight.proposal.mutation, error=flight.error)
                entry, built = chain.record(step, entry, flight.compiled, flight.compared,
                                            rundir.path / flight.proposal.overrides)
                verdict = judge(p.algorithm, step, entry, incumbent, best, current, temp,
                                flight.proposal.u)
                if verdict.best is not best:
                    status.best_ci = entry.ci95
                incumbent, best, current = verdict.incumbent, verdict.best, verdict.current
                if built is not None and verdict.accepted:  # (a rejected one's is never made)
                    trees[entry.dir] = built.tree
                if (p.algorithm == "sa" and p.remeasure_every
                        and step % p.remeasure_every == 0 and incumbent.step > 0):
                    write()  # the lines before its own
                    incumbent = chain.remeasure(step, incumbent)
                if chain.stop.is_set():  # a judgement cut short is made again on resume
                    write(launch=False)
                    raise Interrupted
                event = StepEvent(step=step, temperature=temp, candidates=[entry],
                                  chosen=0 if entry.energy is not None else None,
                                  accepted=verdict.accepted, incumbent=incumbent, best=best,
                                  current=current, rng=[], proposal=flight.proposal.proposal,
                                  elapsed_s=elapsed_before + time.monotonic() - t_begin,
                                  busy_s=busy_before + chain.busy_s() - busy_begin)
                unwritten.append(event)
                judged = step
                status.step, status.best_energy = step, best.energy
                if p.canary_every and step % p.canary_every == 0:
                    write()  # after the step: a resume never repeats it
                    chain.canary(step)
                draw()
            write()
            rundir.write_state(event.state())
            for d in [d for d in trees if d not in (incumbent.dir, current)]:
                del trees[d]
            # Binaries no later step runs leave the store; those in flight stay.
            chain.builds.release({chain.reference.key, incumbent.artifact, best.artifact}
                                   | {f.key for f in flights.values()})
        return best

    def propose(self, n: int, origin: str, tree: Tree,
                incumbent: Pointer) -> tuple[ProposeEvent, CompileJob]:
        """Draw proposal ``n`` from ``tree`` (its own stream: ``rules.proposal_rng``), with its
        Metropolis draw, and write its file -> its event, for the caller to journal before it
        is compiled, and its compile job (the overrides the file holds: ``to_overrides`` gives
        them sorted and unique, as the file is read back)."""
        chain = self.chain
        rng = proposal_rng(chain.settings.seed, n)
        mutated, mutation = propose(tree, rng, chain.settings.max_flips, hot=chain.hot)
        u = rng.random()
        path = proposal_file(n)
        job = CompileJob(chain.benchmark, to_overrides(mutated))
        chain.rundir.write_proposal(path, job.canonical_overrides)
        event = ProposeEvent(proposal=n, origin=origin, mutation=mutation, overrides=path,
                             bar=1.0 / incumbent.energy, u=u)
        return event, job

    def job_of(self, proposal: ProposeEvent) -> CompileJob:
        """The compile job of a journaled proposal, from its file (a resume's)."""
        return CompileJob(self.chain.benchmark, self.chain.rundir.proposal_overrides(proposal))

    def launch(self, proposal: ProposeEvent, job: CompileJob,
               landed: queue.SimpleQueue[Flight]) -> Flight:
        """Compile a journaled proposal's ``job``, then compare it with the baseline
        (callbacks: the chain thread is not needed between the two); the flight goes on
        ``landed`` once, when it has its comparison or cannot have one."""
        chain = self.chain
        flight = Flight(proposal, chain.builds.key(job))

        def compared(future: Future[Comparison]) -> None:
            try:
                flight.compared = future.result()
            except BaseException as exc:
                flight.exc = exc
            landed.put(flight)

        def compiled(future: Future[CompileResult]) -> None:
            try:
                flight.compiled = future.result()
                comparison = chain.start_comparison(flight.compiled,
                                                    chain.pairing(proposal.bar))
            except CompileError as exc:
                flight.error = f"compile failed: {exc}"
                landed.put(flight)
            except BaseException as exc:
                flight.exc = exc
                landed.put(flight)
            else:
                comparison.add_done_callback(compared)

        chain.builds.submit(job).add_done_callback(compiled)
        return flight

    def landings(self, landed: queue.SimpleQueue[Flight], most: int) -> list[Flight]:
        """The candidates landed, in the order they landed, at least one (waited for; given
        up promptly on Ctrl-C) and at most ``most``."""
        while True:
            try:
                flights = [landed.get(timeout=0.2)]
                break
            except queue.Empty:
                self.chain.check_stop()
        while len(flights) < most:
            try:
                flights.append(landed.get_nowait())
            except queue.Empty:
                break
        for flight in flights:
            if flight.exc is not None:
                raise flight.exc
        return flights
