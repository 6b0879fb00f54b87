"""Round trip through the real compiler: dump, flip one decision, recompile, compare.

For a seeded sample of round-0 decisions across the bundled training benchmarks, every other
decision of the unit is pinned as it was and the one decision is flipped.  The new dump must show
the flipped action, or "prevented" with a guard; decisions outside the flipped site's subtree must
keep their key and action.  (A call site outside it may still appear or vanish: inlining can make
a closure known, turning an indirect call into a direct one that then has a decision.)  The subtree of a site includes its copies: Flambda inlines optimised
bodies, so a call site in a function's declaration reappears wherever the function is inlined.
"""
from __future__ import annotations

import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dispatcher.build.driver import build_benchmark
from dispatcher.build.manifest import bundled_benchmarks
from dispatcher.core.decisions import Decision, Override, dump_files, read_dumps, write_overrides
from dispatcher.core.tree import split_key
from tests.helpers import assert_subtrees_consistent, on_every_cpu

SAMPLE_SIZE = 60
SEED = 20261122
CALL_FRAME = re.compile(r"^C\((?P<callee>[^@]*)@(?P<chain>.*)\)(?:#\d+)?$")


def call_site(frame: str) -> tuple[str, str] | None:
    """(callee, own source location) of a C(...) frame; the location ends its chain."""
    m = CALL_FRAME.match(frame)
    return (m.group("callee"), m.group("chain").split(">")[-1]) if m else None


def in_subtree(key: str, flipped: Decision) -> bool:
    """Below the flipped key, or below any copy of the same source call site."""
    if key == flipped.key or key.startswith(flipped.key + "/"):
        return True
    site = call_site(split_key(flipped.key)[-1])
    return any(call_site(frame) == site for frame in split_key(key))


def flip(action: str) -> str:
    return "dont_inline" if action == "inline" else "inline"


def pins_with_flip(dumps, target: Decision, rounds: int) -> list[Override]:
    """Pin the unit's decisions as taken, in every round, with the target flipped."""
    new_action = flip(target.action)
    pins = [Override(d.unit, d.round, d.key, d.action)
            for dump in dumps for d in dump.decisions
            if d.key != target.key]
    if new_action == "dont_inline":
        # The call survives round 0 now: keep it out of line in the later rounds too.
        pins += [Override(target.unit, r, target.key, "dont_inline") for r in range(rounds)]
    else:
        pins.append(Override(target.unit, 0, target.key, "inline"))
    return pins


@pytest.fixture(scope="module")
def built(bundled_builds):
    """Each training benchmark built once a session with decision dumps (shared with
    tests/test_benchmarks.py's; copied before a flip changes one)."""
    training = bundled_benchmarks("training")
    bundled_builds.prefetch(training, dumps=True)
    return {b.name: (b, bundled_builds.get(b, dumps=True).binary.parent) for b in training}


def recompile_unit(compiler, bench, build_dir: Path, unit: str, overrides: Path) -> None:
    source = next(f for f in bench.source_files()
                  if f.suffix == ".ml" and f.stem.capitalize() == unit)
    proc = subprocess.run(
        [str(compiler.ocamlopt), *bench.flags, "-dump-inlining-decisions",
         "-inlining-overrides", str(overrides), "-c", source.name],
        cwd=build_dir, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


def test_flip_fidelity_over_bundled_benchmarks(compiler, built, tmp_path):
    candidates = []
    for name, (_, d) in sorted(built.items()):
        dumps = read_dumps(dump_files(d))
        for dump in dumps:
            if dump.round == 0:
                candidates += [(name, dec) for dec in dump.decisions
                               if dec.action in ("inline", "dont_inline") and not dec.prevented]
    assert len(candidates) >= SAMPLE_SIZE
    sample = random.Random(SEED).sample(candidates, SAMPLE_SIZE)

    def flipped(i: int, name: str, target: Decision):
        """The unit's dumps before, and its round-0 decisions after the flip."""
        bench, d = built[name]
        work = tmp_path / f"flip{i}"
        shutil.copytree(d, work)
        unit_dumps = [x for x in read_dumps(dump_files(work)) if x.unit == target.unit]
        rounds = len(unit_dumps)
        ov = write_overrides(work / "flip.sexp", pins_with_flip(unit_dumps, target, rounds))
        recompile_unit(compiler, bench, work, target.unit, ov)
        after = {x.round: x for x in read_dumps(dump_files(work)) if x.unit == target.unit}
        return unit_dumps, {dec.key: dec for dec in after[0].decisions}

    honoured = prevented = appeared_or_vanished = 0
    outside_changed = []
    results = on_every_cpu(lambda job: flipped(job[0], *job[1]), list(enumerate(sample)))
    for (name, target), (unit_dumps, new) in zip(sample, results):
        got = new.get(target.key)
        assert got is not None, f"{name}: flipped site {target.key} vanished"
        if got.action == flip(target.action):
            honoured += 1
        elif got.prevented:
            prevented += 1
        else:
            pytest.fail(f"{name}: flip of {target.key} to {flip(target.action)} silently "
                        f"dropped: {got}")
        before_out = {dec.key: dec.action for dec in unit_dumps[0].decisions
                      if not in_subtree(dec.key, target)}
        after_out = {k: dec.action for k, dec in new.items() if not in_subtree(k, target)}
        both = before_out.keys() & after_out.keys()
        changed = sorted(k for k in both if before_out[k] != after_out[k])
        if changed:
            outside_changed.append((name, target.key, changed[:4]))
        # A site outside the subtree can appear or vanish when the flip changes what is
        # known about a closure (a call becomes direct or indirect): counted, not a failure.
        if before_out.keys() != after_out.keys():
            appeared_or_vanished += 1
    explicit = honoured + prevented
    print(f"\nflip fidelity: {explicit}/{SAMPLE_SIZE} handled explicitly "
          f"({honoured} honoured, {prevented} prevented with a guard); "
          f"{len(outside_changed)} flips changed a decision outside their subtree; "
          f"{appeared_or_vanished} made a call site outside it appear or vanish")
    assert explicit == SAMPLE_SIZE
    assert not outside_changed, outside_changed


def test_dumps_hold_no_discarded_speculation(built):
    """Across every benchmark and round: a decision below C(..)/I sits under an inlined call."""
    for _, d in built.values():
        for dump in read_dumps(dump_files(d)):
            assert_subtrees_consistent({dec.key: dec for dec in dump.decisions})


def test_benchmarks_byte_identical_dumps(compiler, built, tmp_path):
    name, (bench, d) = sorted(built.items())[0]
    again = tmp_path / "again"
    build_benchmark(bench, again, compiler.ocamlopt, dump_decisions=True)
    for p in dump_files(d):
        assert (again / p.name).read_bytes() == p.read_bytes(), p.name
