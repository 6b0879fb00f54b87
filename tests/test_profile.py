"""Hot code: sampling a real binary through the agent, naming its functions, and the search's
focus on call sites in code that ran."""
from __future__ import annotations

import hashlib
import os
import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from dispatcher.core.decisions import Decision, DecisionDump
from dispatcher.core.jobs import RunJob
from dispatcher.core.records import HotFunctions
from dispatcher.core.sites import site_function
from dispatcher.core.tree import Tree, diff, flip_leaves, weighted_sample
from dispatcher.running.agent_client import LocalAgent, result_from_response
from dispatcher.search.focus import (
    COLD_SHARE,
    RUNTIME,
    demangle,
    focus_weights,
    hot_functions_of,
    in_cold_code,
    profile_job,
    site_heat,
)
from dispatcher.search.rules import propose
from tests.helpers import FIRST_CPU, compile_programs

# ``hot`` takes nearly all the time; ``cold`` runs only for a negative argument.
PROGRAM = """
let[@inline never] hot n =
  let r = ref 0 in
  for i = 1 to n do r := (!r + i * i) mod 1000003 done;
  !r
let[@inline never] cold n = n * 3 + 1
let () =
  let n = int_of_string Sys.argv.(1) in
  print_int (if n < 0 then cold n else hot n);
  print_newline ()
"""


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("symbol, name", [
    ("camlMain__go_1215", "Main.go"),
    ("camlStdlib__Array__fold_left_123", "Stdlib__Array.fold_left"),
    ("camlMain__anon_fn$5bmain$2eml$3a12$2c4$2d$2d584$5d_77", "Main.anon_fn[main.ml:12,4--584]"),
    ("camlMain__entry", "Main.entry"),
    ("camlMain__code_begin", None),
    ("caml_alloc_shr", None),  # the runtime's C
    ("main", None),
])
def test_ocaml_symbols_name_functions_as_keys_do(symbol, name):
    assert demangle(symbol) == name


def test_a_site_lives_in_its_innermost_declaration_or_its_units_top_level():
    assert site_function("Main", "D(Main.run@main.ml:4:8-134)/C(Main.sq@main.ml:7:47-66)/I/"
                                 "C(Util.add@util.ml:3:2-9)") == "Main.run"
    assert site_function("Main", "C(Summation.f@main.ml:3:12-46)/I/D(Main.go@s.ml:65:15-82)/"
                                 "C(Main.go@s.ml:65:54-82)") == "Main.go"
    assert site_function("Main", "C(Stdlib__List.iter@main.ml:9:2-20)") == "Main.entry"


def test_a_site_is_hot_through_its_function_or_its_callee():
    hot = HotFunctions(samples=30, functions={"Main.loop": 20, "Stdlib__List.iter": 10})
    key = "D(Main.setup@main.ml:1:1-9)/C(Stdlib__List.iter@main.ml:2:2-9)"
    assert site_heat("Main", key, "Stdlib__List.iter", hot) == 10  # a cold caller, a hot callee
    assert in_cold_code("Main", "D(Main.setup@main.ml:1:1-9)/C(Main.f@main.ml:3:2-9)",
                        "Main.f", hot)
    assert site_heat("Main", "D(Main.loop@main.ml:1:1-9)/C(Main.loop@main.ml:3:2-9)",
                     "Main.loop", hot) == 20  # a recursive call counts its function once


# --------------------------------------------------------------------------- weights


def test_focus_weights_leave_a_fixed_share_to_cold_code_and_favour_hot_functions():
    w = focus_weights([0, 0, 100, 10, 0, 1])
    assert w is not None and sum(w) == pytest.approx(1.0)
    assert sum(w[i] for i in (0, 1, 4)) == pytest.approx(COLD_SHARE)
    assert w[2] > w[3] > w[5] > w[0]
    assert focus_weights([0, 0, 0]) is None  # nothing ran: nothing to prefer
    assert focus_weights([5, 5]) is None  # all alike


def test_weighted_sample_is_distinct_replayable_and_follows_the_weights():
    pool = list("abcd")
    weights = [0.7, 0.1, 0.1, 0.1]
    draws = [weighted_sample(pool, weights, 2, random.Random(s)) for s in range(2000)]
    assert all(len(set(d)) == 2 for d in draws)
    assert draws[:50] == [weighted_sample(pool, weights, 2, random.Random(s))
                          for s in range(50)]
    first = Counter(d[0] for d in draws)
    assert 0.65 < first["a"] / 2000 < 0.75
    with pytest.raises(ValueError):
        weighted_sample(pool, [1.0, -1.0, 1.0, 1.0], 1, random.Random(0))


def _tree(n_hot: int, n_cold: int) -> Tree:
    decisions = [Decision(unit="Main", round=0, callee=f"Main.h{i}", action="dont_inline",
                          reason="heuristic", key=f"D(Main.hot@main.ml:1:1-9)/"
                                              f"C(Main.h{i}@main.ml:{i + 2}:1-9)")
                 for i in range(n_hot)]
    decisions += [Decision(unit="Main", round=0, callee=f"Main.c{i}", action="dont_inline",
                           reason="heuristic", key=f"D(Main.cold@main.ml:1:1-9)/"
                                               f"C(Main.c{i}@main.ml:{i + 2}:1-9)")
                  for i in range(n_cold)]
    return Tree.from_dumps([DecisionDump(unit="Main", round=0, decisions=tuple(decisions))])


def test_focused_proposals_flip_mostly_in_code_that_ran():
    tree = _tree(n_hot=5, n_cold=45)  # a cold trailer holds 90% of the sites
    hot = HotFunctions(samples=100, functions={"Main.hot": 100})

    def cold_share_of(profile: HotFunctions | None) -> float:
        rng, cold, flips = random.Random(3), 0, 0
        for _ in range(400):
            proposal, _ = propose(tree, rng, 2, hot=profile)
            for site in diff(tree, proposal).changed:
                flips += 1
                cold += site.key.startswith("D(Main.cold")
        return cold / flips

    assert cold_share_of(None) > 0.8
    assert cold_share_of(hot) < 0.15


def test_without_a_profile_proposals_draw_exactly_as_before():
    """Rundirs searched before profiles existed resume with the same draws."""
    tree = _tree(n_hot=5, n_cold=5)
    a, b = random.Random(9), random.Random(9)
    for _ in range(20):
        assert flip_leaves(tree, 2, a) == flip_leaves(tree, 2, b, weights=lambda pool: None)
    assert propose(tree, random.Random(4), hot=HotFunctions(error="no perf"))[0] == \
        propose(tree, random.Random(4))[0]


# --------------------------------------------------------------------------- end to end


def test_the_agent_samples_a_real_binary_and_its_functions_are_named(compiler, tmp_path):
    (binary,) = compile_programs(compiler.ocamlopt, {"prog": PROGRAM}, tmp_path).values()
    sha = hashlib.sha256(binary.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    cache.mkdir()
    shutil.copyfile(binary, cache / sha)
    os.chmod(cache / sha, 0o755)
    agent = LocalAgent("local/test", cache, "local")
    try:
        timing = RunJob(sha256=sha, binary=binary, args=("30000000",), runs=1, timeout=60)
        job = profile_job(timing, wall_s=0.1)
        assert job.profile_period_ns > 0 and job.measurement_identity() != \
            timing.measurement_identity()  # never pooled with timings
        response = agent.connection.request(job.request(FIRST_CPU))
        result = result_from_response(job, type("S", (), {"name": "local/test",
                                                          "worker_class": "local"})(),
                                      response)
        timed = agent.connection.request(timing.request(FIRST_CPU))
    finally:
        agent.close()
    (record,) = result.records
    assert record.failure is None and record.profile is not None
    profile = record.profile
    if profile.error is not None:
        pytest.skip(f"cpu-clock sampling unavailable here: {profile.error}")
    assert profile.mapped and profile.samples > 100 and profile.lost == 0
    assert sum(profile.offsets.values()) + profile.elsewhere == profile.samples
    hot = hot_functions_of(binary, [result])
    assert hot.error is None and hot.samples == profile.samples
    top = max(hot.functions, key=lambda f: hot.functions[f])
    assert top == "Prog.hot" and hot.functions[top] > 0.8 * sum(hot.functions.values())
    assert "Prog.cold" not in hot.functions
    assert set(hot.functions) <= {"Prog.hot", "Prog.entry", RUNTIME} | {
        f for f in hot.functions if f.startswith(("Stdlib", "Camlinternal"))}
    # a timing job carries no profile
    assert "profile" not in timed["runs"][0]
    assert Path(binary).exists()
