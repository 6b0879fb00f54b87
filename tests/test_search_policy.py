"""search-policy (issue 35 item 2): the parametrisation (a point -> a policy file both readers
accept), the objective and its penalties, and the study end to end with the real compiler:
trials measured in cycles, the study resumed after Ctrl-C and after a kill, the written
policy accepted by run-benchmark --policy."""
from __future__ import annotations

import csv
import json
import math
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dispatcher.build.policy_file import (
    PolicyEvaluation,
    decode_policy_file,
    policy_bytes,
    read_policy_file,
)
from pipeline.policy.search import SearchError, start_from_file
from pipeline.policy.searched import (
    BUDGET,
    INTERCEPT,
    Penalties,
    ProgramFigure,
    SearchSpaceError,
    Space,
    discount_name,
    policy_of,
    score,
    seeds,
    space_with,
    start_from,
    weight_name,
)
from tests.helpers import FIRST_CPU, REPO, campaign_data, cli, one_line_error, write_yaml


def random_point(space: Space, rng: random.Random) -> dict[str, float]:
    return {p.name: (rng.randint(int(p.low), int(p.high)) if p.integer
                     else rng.uniform(p.low, p.high)) for p in space.params()}


def test_every_point_is_a_policy_file_the_reader_gives_back_byte_for_byte():
    space, rng = Space(), random.Random(7)
    points = [p for _, p in seeds(space)] + [random_point(space, rng) for _ in range(50)]
    for point in points:
        data = policy_bytes(policy_of(space, point, ["kahan", "hamming"]))
        back = decode_policy_file(data, "searched.policy")
        assert policy_bytes(back) == data
        assert back.classes == ["default", "inline"] and back.margin == 0.0
        assert back.ranges is False and back.growth_budget == round(point[BUDGET])
        assert back.benchmarks == ["kahan", "hamming"]


def test_the_score_decides_inline_or_default_within_the_budget():
    space = Space()
    base = {INTERCEPT: 1.0, **{weight_name(c): 0.0 for c, _ in space.columns}, BUDGET: 30}
    # inline where callee_size / 50 * -2 + 1 > 0: callees under 25
    small = policy_of(space, {**base, weight_name("callee_size"): -2.0})
    features = {"callee_size": 10, "known_args": 1, "depth": 0}
    assert small.advise(features, "dont_inline") == "inline"
    assert small.advise({**features, "callee_size": 40}, "dont_inline") == "default"
    # a site the heuristic did not decide freely is the heuristic's
    assert small.advise(features, "dont_inline", "attribute") == "default"
    # the growth budget: 30 per function and round, departures spend the callee's size
    ev = PolicyEvaluation(small)
    got = [ev.advise("M", 0, f"D(M.f@m.ml:1:0-9)/C(M.g@m.ml:{i}:0-9)", features,
                     "dont_inline") for i in range(4)]
    assert got == ["inline", "inline", "inline", "default"]
    heuristic = policy_of(space, seeds(space)[0][1])
    assert heuristic.advise(features, "dont_inline") == "default"
    assert heuristic.advise(features, "inline") == "default"


def test_a_space_with_a_discount_writes_format_2_and_charges_the_discounted_growth():
    """``--discount F``: a weight per feature searched in [0, DISCOUNT_HIGH], written as the
    file's growth_discount (format version 2, read back byte for byte); a site's growth is
    callee_size / (1 + d * F), so a site with the feature passes a budget its size alone
    would not; at weight 0 the answers are the undiscounted policy's."""
    space = space_with((), discounts=("direct_call_of_indirect",))
    assert space.identity()["discounts"] == ["direct_call_of_indirect"]
    assert "discounts" not in Space().identity()  # the studies before resume as they were
    assert [p.name for p in space.params()][-1] == discount_name("direct_call_of_indirect")
    base = {INTERCEPT: 1.0, **{weight_name(c): 0.0 for c, _ in space.columns}, BUDGET: 215,
            discount_name("direct_call_of_indirect"): 0.5}
    policy = policy_of(space, base)
    data = policy_bytes(policy)
    assert b"(version 2)" in data and \
        b'(growth_discount ("direct_call_of_indirect" 0.5))' in data
    assert policy_bytes(decode_policy_file(data, "p.policy")) == data
    fw = {"callee_size": 689, "direct_call_of_indirect": 6}  # floyd_warshall's Fw.run
    ev = PolicyEvaluation(policy)
    key = "D(Main.main@main.ml:1:0-9)/C(Fw.run@main.ml:{}:0-9)"
    assert ev.advise("Main", 0, key.format(1), fw, "dont_inline") == "inline"  # 689 / 4
    assert ev.spent[(0, "D(Main.main@main.ml:1:0-9)")] == 172.25
    assert ev.advise("Main", 0, key.format(2), fw, "dont_inline") == "default"  # 344.5
    plain = PolicyEvaluation(policy_of(space, {**base, discount_name(
        "direct_call_of_indirect"): 0.0}))
    assert plain.advise("Main", 0, key.format(1), fw, "dont_inline") == "default"
    assert b"(version 1)" in policy_bytes(policy_of(Space(), {
        k: v for k, v in base.items() if not k.startswith("d_")}))
    for point in [p for _, p in seeds(space)] + [random_point(space, random.Random(3))]:
        back = decode_policy_file(policy_bytes(policy_of(space, point)), "p.policy")
        assert back.growth_discount == (("direct_call_of_indirect",
                                         point[discount_name("direct_call_of_indirect")]),)


def test_an_earlier_studys_best_starts_a_study_of_a_larger_space(tmp_path):
    """``--start-from searched.json``: the earlier best's parameters, a discount it lacks
    along a ladder of weights from 0 (the earlier policy's own answers), as the study's first
    points after the heuristic."""
    space = space_with((), discounts=("direct_call_of_indirect",))
    earlier = {INTERCEPT: 2.5, **{weight_name(c): 0.25 for c, _ in space.columns},
               BUDGET: 215}
    (tmp_path / "searched.json").write_text(json.dumps({"params": earlier}))
    got = start_from_file(tmp_path / "searched.json", space)
    assert [name for name, _ in got] == [f"start-from searched.json #{i}" for i in range(5)]
    d = discount_name("direct_call_of_indirect")
    assert [dict(point) for _, point in got] == [{**earlier, d: w}
                                                  for w in (0.0, 0.5, 1.0, 2.0, 4.0)]
    assert policy_of(space, dict(got[0][1])).growth_discount == \
        (("direct_call_of_indirect", 0.0),)
    assert start_from(Space(), earlier) == [earlier]  # nothing new: the point itself
    assert start_from(space, {**earlier, d: 1.5}) == [{**earlier, d: 1.5}]
    for text, why in (("{", "not a searched.json"), ("[]", "with the best trial's params"),
                      (json.dumps({"params": {**earlier, INTERCEPT: 40}}),
                       "parameter intercept: expected a number from -4 to 4, got 40"),
                      (json.dumps({"params": {INTERCEPT: 1.0}}), "got None")):
        (tmp_path / "bad.json").write_text(text)
        with pytest.raises(SearchError) as err:
            start_from_file(tmp_path / "bad.json", space)
        assert str(err.value).startswith(f"{tmp_path / 'bad.json'}: ") and why in str(err.value)
    with pytest.raises(SearchError, match="no such file"):
        start_from_file(tmp_path / "absent.json", space)


def test_a_point_outside_the_space_is_refused_in_one_line():
    space = Space()
    point = dict(seeds(space)[0][1])
    with pytest.raises(SearchSpaceError, match="parameter intercept: expected a number from "
                                               "-4 to 4, got 9"):
        policy_of(space, {**point, INTERCEPT: 9.0})
    with pytest.raises(SearchSpaceError, match="got nan"):
        policy_of(space, {**point, weight_name("depth"): math.nan})
    with pytest.raises(SearchSpaceError, match="unknown parameter"):
        policy_of(space, {**point, "w_size_after": 1.0})


def test_the_objective_is_the_geometric_mean_less_its_penalties():
    p = Penalties(size_allowance=0.05, size_weight=1.0, time_allowance=1.0, time_weight=0.5,
                  failed_speedup=1.0, max_compile_ratio=None, max_size_ratio=None)
    figures = [ProgramFigure("a", 1.21, 1.02), ProgramFigure("b", 1.0, 1.03)]
    s = score(figures, p)
    assert s.speedup == pytest.approx(1.1) and s.objective == pytest.approx(1.1)
    assert s.size_penalty == 0 and s.time_penalty == 0 and s.compile is None
    # binaries 10% larger where 5% is free: the objective pays exp(-(log 1.1 - log 1.05))
    big = score([ProgramFigure("a", 1.21, 1.1), ProgramFigure("b", 1.0, 1.1)], p)
    assert big.objective == pytest.approx(1.1 * 1.05 / 1.1)
    # compile time: three times the reference where twice is free, at half weight
    slow = score([ProgramFigure("a", 1.21, 1.0, seconds=3.0), ProgramFigure("b", 1.0, 1.0)],
                 p, {"wall:a": 1.0, "cpu:b": 1.0})
    assert slow.compile == pytest.approx(3.0)
    assert slow.objective == pytest.approx(1.1 * math.exp(-0.5 * math.log(1.5)))
    # a ratio only between times of the same clock
    other = score([ProgramFigure("a", 1.21, 1.0, seconds=3.0, clock="cpu"),
                   ProgramFigure("b", 1.0, 1.0)], p, {"wall:a": 1.0})
    assert other.compile is None and other.objective == pytest.approx(1.1)
    # a failed build counts at failed_speedup and the heuristic's size, and is named
    failed = score([ProgramFigure("a", 1.21, 1.0), ProgramFigure("b", failed="x")],
                   Penalties(failed_speedup=0.81))
    assert failed.speedup == pytest.approx(math.sqrt(1.21 * 0.81)) and failed.failed == ("b",)
    # past a cost guard (the evaluation's): counted at the heuristic's figure, named apart
    guarded = Penalties(max_compile_ratio=2.0, max_size_ratio=1.5)
    g = score([ProgramFigure("a", 1.44, 1.0, seconds=2.5, clock="cpu"),
               ProgramFigure("b", 1.21, 1.6), ProgramFigure("c", 1.21, 1.4, seconds=1.9,
                                                           clock="cpu")],
              guarded, {"cpu:a": 1.0, "cpu:c": 1.0})
    assert g.fell_back == ("a", "b") and g.failed == ()
    assert g.speedup == pytest.approx(1.21 ** (1 / 3)) and g.compile == pytest.approx(1.9)
    assert score([ProgramFigure("a", 1.44, 1.0, seconds=2.5, clock="cpu")],
                 Penalties(max_compile_ratio=None), {"cpu:a": 1.0}).fell_back == ()
    with pytest.raises(ValueError):
        score([ProgramFigure("a")], p)


# --------------------------------------------------------------------------- end to end


def _config(tmp_path: Path) -> Path:
    return write_yaml(tmp_path / "config.yaml", {
        "store": str(tmp_path / "store"), "local": {"cpus": [FIRST_CPU]},
        "run": {"runs": 2, "timeout": 30, "size": "tiny", "perf": False},
        "measure": {"max_pairs": 2, "min_cpu_share": 0.05}, "compile": {"jobs": 2}})


def _command(cfg: Path, out: Path, trials: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "commands", "search-policy", "kahan", "hamming",
            "--metric", "cycles", "--size", "tiny", "--trials", str(trials), "--out", str(out),
            "--config", str(cfg), *extra]


def _running(db: Path) -> bool:
    """A trial of the study has its point and is being measured."""
    try:
        with sqlite3.connect(db) as c:
            return c.execute("select count(*) from trials t join trial_params p on "
                             "p.trial_id = t.trial_id where t.state = 'RUNNING'"
                             ).fetchone()[0] > 0
    except sqlite3.Error:
        return False


def _stop_mid_trial(cmd: list[str], db: Path, sig: int) -> subprocess.CompletedProcess:
    """Start ``cmd``, send ``sig`` once a trial is running in the study."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 120
    while not _running(db) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # into its builds
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _trials(out: Path) -> list[dict[str, str]]:
    """The study's trials but those waiting (enqueued points not asked for yet)."""
    with open(out / "trials.csv") as f:
        return [r for r in csv.DictReader(f) if r["state"] != "waiting"]


def test_a_study_measured_in_cycles_resumes_after_ctrl_c_and_a_kill(compiler, tmp_path):
    cfg, out = _config(tmp_path), tmp_path / "out"
    first = subprocess.run(_command(cfg, out, 2, "--confirm-size", "none"), cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    rows = _trials(out)
    assert [(r["trial"], r["state"], r["seed"]) for r in rows] == [
        ("0", "complete", "heuristic"), ("1", "complete", "inline-within-budget")]
    # the heuristic's decisions asked of a policy: the heuristic's cycles, exactly
    assert float(rows[0]["speedup"]) == 1.0 and float(rows[0]["objective"]) == 1.0
    assert float(rows[1]["speedup"]) > 0
    sidecar = json.loads((out / "searched.json").read_text())
    best = max(rows, key=lambda r: float(r["objective"]))
    assert sidecar["trial"] == int(best["trial"]) and sidecar["metric"] == "cycles"
    assert set(sidecar["programs"]) == {"kahan", "hamming"}
    read_policy_file(out / "searched.policy")  # the reader accepts it

    # Ctrl-C in the third trial: one line, status 130, the trial failed in the study
    db = out / "study.db"
    stopped = _stop_mid_trial(_command(cfg, out, 3, "--confirm-size", "none"), db,
                              signal.SIGINT)
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr.strip().splitlines()[-1] == (
        f"search-policy: interrupted: the same command continues the study in {out}")
    assert [r["state"] for r in _trials(out)] == ["complete", "complete", "fail"]
    cut = _trials(out)[2]

    # a kill while its point is tried again: left running in the study
    killed = _stop_mid_trial(_command(cfg, out, 3, "--confirm-size", "none"), db,
                             signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    # the same command again: the point is tried once more and the study has three trials
    again = subprocess.run(_command(cfg, out, 3, "--confirm-size", "tiny", "--confirm-on",
                                    "kahan", "--runs", "2", "--max-pairs", "2"),
                           cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "1 trial(s) cut short before" in again.stderr
    rows = _trials(out)
    complete = [r for r in rows if r["state"] == "complete"]
    assert len(complete) == 3 and [r["trial"] for r in complete[:2]] == ["0", "1"]
    params = [k for k in rows[0] if k == "intercept" or k.startswith("w_") or k == BUDGET]
    assert [complete[2][k] for k in params] == [cut[k] for k in params]
    assert "study " in again.stdout and "3 complete trial(s), 1 this run" in again.stdout
    # the confirmation, in paired wall time, on kahan
    with open(out / "confirm.csv") as f:
        confirmed = list(csv.DictReader(f))
    assert [(r["benchmark"], r["metric"], r["size"]) for r in confirmed] == [
        ("kahan", "time", "tiny")]
    assert json.loads((out / "searched.json").read_text())["confirmation"]["metric"] == "time"

    # the written policy is one run-benchmark --policy takes
    run = cli("run-benchmark", "kahan", "--policy", str(out / "searched.policy"), "--config",
              str(cfg), "--size", "tiny", "--runs", "1", "--no-compare", cwd=tmp_path)
    assert run.returncode == 0, run.stderr

    # another size in the same directory is another study: refused in one line
    other = subprocess.run(_command(cfg, out, 3, "--size", "quick"), cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    line = one_line_error(other)
    assert line.startswith(f"search-policy: {out / 'search.json'}: the study was started "
                           'with size "tiny", not "quick"'), line

    # another feature in the score is another space: refused here, a study of its own there
    wider = subprocess.run(_command(cfg, out, 3, "--column", "direct_call_of_indirect=2"),
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "the study was started with" in one_line_error(wider)
    col = tmp_path / "col"
    own = subprocess.run(_command(cfg, col, 1, "--column", "direct_call_of_indirect=2",
                                  "--confirm-size", "none"),
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert own.returncode == 0, own.stderr
    columns = read_policy_file(col / "searched.policy").columns
    assert [c.name for c in columns][-1] == "direct_call_of_indirect"
    assert "w_direct_call_of_indirect" in _trials(col)[0]

    # a study file that is not a database: one line naming it, not SQLAlchemy's traceback
    db.write_bytes(b"not a database\n")
    damaged = subprocess.run(_command(cfg, out, 3), cwd=REPO, capture_output=True, text=True,
                             timeout=120)
    line = one_line_error(damaged)
    assert line.startswith(f"search-policy: {db}: not a study this command can read"), line


def test_bad_input_is_one_line(tmp_path):
    r = cli("search-policy", "no-such-benchmark", "--out", str(tmp_path / "o"))
    assert "no-such-benchmark" in one_line_error(r)
    r = cli("search-policy", "kahan", "--size", "huge", "--out", str(tmp_path / "o"))
    assert "huge" in one_line_error(r)
    for spec, why in (("nope=2", "'nope' is not a number feature"),
                      ("callee_size=50", "callee_size is a column already"),
                      ("direct_call_of_indirect=0", "a scale above 0"),
                      ("direct_call_of_indirect", "expected NAME=SCALE")):
        r = cli("search-policy", "kahan", "--column", spec, "--out", str(tmp_path / "o"))
        assert why in one_line_error(r), spec
    for feature, why in (("nope", "--discount nope: not a number feature"),
                         ("inline_attribute", "not a number feature")):
        r = cli("search-policy", "kahan", "--discount", feature, "--out", str(tmp_path / "o"))
        assert why in one_line_error(r), feature
    r = cli("search-policy", "kahan", "--discount", "known_args", "--discount", "known_args",
            "--out", str(tmp_path / "o"))
    assert "--discount known_args: named twice" in one_line_error(r)
    (tmp_path / "s.json").write_text('{"params": {"intercept": 1}}')
    r = cli("search-policy", "kahan", "--start-from", str(tmp_path / "s.json"),
            "--out", str(tmp_path / "o"))
    assert f"{tmp_path / 's.json'}: parameter" in one_line_error(r)
    assert not (tmp_path / "o").exists()  # nothing made before the input is checked


# --------------------------------------------------------------------------- the campaign stage


def test_the_campaign_stage_is_off_unless_the_file_turns_it_on(tmp_path):
    from pipeline.campaign import plan, stages
    from pipeline.campaign import state as cstate
    data, source = campaign_data(tmp_path)
    off = plan.parse_campaign(data, source)
    assert stages.stage_command(off, "searched") is None  # skipped: nothing to do
    # the section, off, is the same campaign as no section (earlier identities hold)
    assert plan.parse_campaign({**data, "searched": {"enabled": False, "trials": 3}},
                               source).identity == off.identity
    on = plan.parse_campaign({**data, "searched": {"enabled": True, "benchmarks": ["kahan"],
                                                   "trials": 3}}, source)
    assert on.identity != off.identity
    argv = stages.stage_command(on, "searched")
    assert argv is not None and argv[0] == "search-policy"
    assert argv[argv.index("--trials") + 1] == "3" and "kahan" in argv
    assert argv[argv.index("--confirm-size") + 1] == "quick"  # the campaign's size
    assert argv[argv.index("--out") + 1] == str(on.dir / "searched")
    assert argv[argv.index("--metric") + 1] == "cycles"
    assert "--discount" not in argv
    # discounts: the search's flags, in the identity only where there are some
    searched = {"enabled": True, "benchmarks": ["kahan"], "trials": 3}
    assert plan.parse_campaign({**data, "searched": {**searched, "discounts": []}},
                               source).identity == on.identity
    disc = plan.parse_campaign({**data, "searched": {
        **searched, "discounts": ["direct_call_of_indirect"]}}, source)
    assert disc.identity != on.identity
    argv = stages.stage_command(disc, "searched")
    assert argv is not None and argv[argv.index("--discount") + 1] == "direct_call_of_indirect"
    for bad, why in ((["nope"], "searched.discounts: nope: not a number feature"),
                     ("in_loop", "searched.discounts"), ([3], "searched.discounts[0]"),
                     (["in_loop", "in_loop"], "in_loop: named twice")):
        with pytest.raises(plan.CampaignError) as err:
            plan.parse_campaign({**data, "searched": {"discounts": bad}}, source)
        assert why in str(err.value) and "\n" not in str(err.value), bad
    with pytest.raises(plan.CampaignError, match="searched.max_pairs"):
        plan.parse_campaign({**data, "searched": {"runs": 4, "max_pairs": 2}}, source)
    with pytest.raises(plan.CampaignError, match="searched.metric"):
        plan.parse_campaign({**data, "searched": {"metric": "joules"}}, source)
    # a campaign.json written before the stage existed is read: the stage pending
    on_disk = {"version": 1, "identity": off.identity,
               "stages": {s: {"state": "done"} for s in cstate.STAGES if s != "searched"}}
    off.dir.mkdir(parents=True)
    (off.dir / cstate.STATE_FILE).write_text(json.dumps(on_disk))
    st = cstate.read_state(off)
    assert st.stages["searched"].state == "pending" and st.next_stage() == "searched"
