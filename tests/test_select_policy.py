"""select-policy (issue 35 item 4): the kind of policy kept by leave-fold-out measurement.

The rule (``pipeline.policy.choice``) on planted figures; the search started from the
classifier (its first point after the heuristic's); and the command end to end on two
programs at tiny in cycles with the real compiler."""
from __future__ import annotations

import csv
import json
import math
import sys

import pytest

from pipeline.policy.choice import (
    ChoiceError,
    HeldOut,
    aa_gates,
    choose,
    fold_groups,
    judge,
)
from pipeline.policy.searched import (
    BUDGET,
    INTERCEPT,
    Space,
    policy_of,
    seed_from_labels,
    weight_name,
)
from tests.helpers import FIRST_CPU, REPO, campaign_data, one_line_error, sites_table, write_yaml


def held(program: str, fold: int, speedup: float | None, *, fallback: str | None = None,
         same: bool = False) -> HeldOut:
    return HeldOut(program, fold, speedup, speedup, speedup, 1.0, fallback, same)


def test_folds_are_the_names_dealt_in_order():
    assert fold_groups(["d", "b", "a", "c", "e"], 2) == [("a", "c", "e"), ("b", "d")]
    assert fold_groups(["b", "a"], 2) == [("a",), ("b",)]
    with pytest.raises(ChoiceError, match="expected at least 2"):
        fold_groups(["a", "b"], 1)
    with pytest.raises(ChoiceError, match="3 folds of 2 program"):
        fold_groups(["a", "b"], 3)


def test_the_gate_is_the_heuristic_against_itself_per_fold():
    groups = [("a", "b"), ("c",)]
    gates = aa_gates({"a": 0.98, "b": 1.02, "c": 0.99}, groups)
    assert gates == pytest.approx([math.sqrt(0.98 * 1.0), 0.99])  # a bound above 1 counts 1
    assert aa_gates({"a": 1.0, "b": 1.0, "c": 1.0}, groups) == [1.0, 1.0]  # exact: no noise
    with pytest.raises(ChoiceError, match="no A/A figure for c"):
        aa_gates({"a": 1.0, "b": 1.0}, groups)


def test_the_best_kind_past_the_gate_is_kept():
    groups = [("a", "b"), ("c", "d")]
    gates = [0.99, 0.99]
    # searched: the best mean, but one fold loses 3%: refused
    searched = judge("searched", [held("a", 0, 1.30), held("b", 0, 1.20),
                                  held("c", 1, 0.95), held("d", 1, 0.99)], groups, gates)
    assert searched.figure == pytest.approx((1.30 * 1.20 * 0.95 * 0.99) ** 0.25)
    assert searched.worst_fold == 1 and not searched.eligible
    assert searched.refused.startswith("fold 1 (c, d) at 0.9698, below its A/A gate 0.9900")
    # classifier: a failed build counts at the heuristic's figure; kept
    classifier = judge("classifier", [held("a", 0, 1.10), held("b", 0, None, fallback="x"),
                                      held("c", 1, 1.01), held("d", 1, 1.00)], groups, gates)
    assert classifier.figure == pytest.approx((1.10 * 1.01) ** 0.25) and classifier.eligible
    # combined: the heuristic's own binary everywhere: refused whatever its figures
    combined = judge("combined", [held(p, i // 2, 1.0, same=True) for i, p in
                                  enumerate("abc")] + [held("d", 1, 1.2, fallback="guard")],
                     groups, gates)
    assert combined.refused == "the heuristic's own binary on every training program"
    got = choose([searched, classifier, combined])
    assert got.kept == "classifier"
    # a smaller but eligible figure beats none; nothing eligible keeps nothing
    assert choose([searched, combined]).kept is None
    with pytest.raises(ChoiceError, match="searched: no figure for d"):
        judge("searched", [held("a", 0, 1.0), held("b", 0, 1.0), held("c", 1, 1.0)], groups,
              gates)


def test_ties_keep_the_kind_asked_first():
    groups = [("a",), ("b",)]
    one = judge("classifier", [held("a", 0, 1.1), held("b", 1, 1.0)], groups, [1.0, 1.0])
    two = judge("searched", [held("a", 0, 1.0), held("b", 1, 1.1)], groups, [1.0, 1.0])
    assert choose([one, two]).kept == "classifier" and choose([two, one]).kept == "searched"


def test_a_kind_not_made_for_a_fold_is_refused_and_the_others_still_compared(tmp_path,
                                                                          monkeypatch):
    """A fold whose other programs' labels have one class only cannot train the classifier:
    that kind is refused with the reason, and the searched kind is still judged and kept
    (it stopped the whole select stage of a small campaign before)."""
    from types import SimpleNamespace

    from dispatcher.core.figures import Figure
    from pipeline.policy import choosing
    from pipeline.policy.searched import Penalties
    benches = tuple(SimpleNamespace(name=n) for n in ("a", "b", "c", "d"))
    made = []

    def make(session, request, kind, programs, where, say, check):
        made.append((kind, where.name))
        if kind == "classifier":
            raise ChoiceError(f"{where}: the labels of c, d have one class only (inline)")
        return SimpleNamespace(data=b"policy")

    def measure(session, request, spec, programs, fold, check):
        return [held(b.name, fold, 1.1) for b in programs]

    aa = Figure(speedup=1.0, low=1.0, high=1.0)
    monkeypatch.setattr(choosing, "_make", make)
    monkeypatch.setattr(choosing, "_measure", measure)
    monkeypatch.setattr(choosing, "_aa", lambda session, request: {b.name: aa for b in benches})
    monkeypatch.setattr(choosing, "write_policy_bytes", lambda data, path: None)
    request = choosing.ChoiceRequest(
        benches, {}, "tiny", "cycles", 2, 3, ("searched", "classifier"),
        SimpleNamespace(), "mlp", choosing.Rails(0.01, 0.2, True, None), Penalties())
    outcome = choosing.choose_policy(None, request, tmp_path)
    assert outcome.choice.kept == "searched"
    classifier = {r.kind: r for r in outcome.choice.results}["classifier"]
    assert classifier.figure is None and classifier.refused.startswith(
        "not made for fold 0: ") and "one class only" in classifier.refused
    # not tried again for fold 1; searched made for both folds, then from every program
    assert made == [("searched", "0"), ("classifier", "0"), ("searched", "1"),
                    ("searched", "final")]
    record = json.loads((tmp_path / choosing.CHOICE_JSON).read_text())
    assert record["kinds"]["classifier"]["figure"] is None


def test_a_swallowed_ctrl_c_ends_the_measurement_at_the_next_comparison(monkeypatch):
    """The latch's check runs after each comparison of a fold, so a Ctrl-C that a library
    swallowed stops there and the comparisons still to come are closed, not run."""
    from types import SimpleNamespace

    from pipeline.policy import choosing
    yielded, closed = [], []

    def comparisons(session, contenders, runs, pairing):
        try:
            for c in contenders:
                yielded.append(c.tag)
                yield SimpleNamespace(contender=c)
        finally:
            closed.append(True)

    hits = iter([False, True, True])

    def check():
        if next(hits):
            raise KeyboardInterrupt

    monkeypatch.setattr(choosing, "compare_with_heuristic", comparisons)
    monkeypatch.setattr(choosing, "pairing_policy", lambda config, runs: None)
    session = SimpleNamespace(config=SimpleNamespace(run=SimpleNamespace(runs=2)))
    request = SimpleNamespace(sizes={n: None for n in "abc"})
    programs = [SimpleNamespace(name=n, source_hash=lambda: "0") for n in "abc"]
    with pytest.raises(KeyboardInterrupt):
        choosing._measure(session, request, None, programs, 0, check)
    assert yielded == ["a", "b"] and closed == [True]


def test_the_combined_start_answers_as_the_labels_do():
    space = Space()
    sizes = [5, 10, 20, 80, 120, 200] * 5
    features = {c: [0.0] * len(sizes) for c, _ in space.columns}
    features["callee_size"] = [float(s) for s in sizes]
    inline = [s < 50 for s in sizes]
    point = seed_from_labels(space, features, inline, 100)
    assert point is not None and point[BUDGET] == 100
    assert point[weight_name("callee_size")] < 0 <= point[INTERCEPT]
    assert all(-space.weight <= v <= space.weight for k, v in point.items() if k != BUDGET)
    policy = policy_of(space, point)  # a point of the space: the reader takes it
    small = {c: 0 for c, _ in space.columns} | {"callee_size": 10}
    big = {c: 0 for c, _ in space.columns} | {"callee_size": 150}
    assert policy.advise(small, "dont_inline") == "inline"
    assert policy.advise(big, "dont_inline") == "default"
    assert seed_from_labels(space, features, [True] * len(sizes), 100) is None
    assert seed_from_labels(space, {"callee_size": sizes}, inline, 100) is None


def test_the_study_tries_the_extra_start_right_after_the_heuristic(tmp_path):
    from pipeline.policy import search
    from pipeline.policy.searched import seeds
    start = tuple(sorted({**seeds(Space())[1][1], INTERCEPT: 1.5}.items()))
    plain = search.SearchSettings((), {}, "tiny", "cycles", 3)
    assert "extra_seeds" not in plain.identity()  # the studies made before resume as they were
    settings = search.SearchSettings((), {}, "tiny", "cycles", 3, extra_seeds=(("classifier",
                                                                                start),))
    assert settings.identity()["extra_seeds"] == [["classifier", dict(start)]]
    study = search._study(tmp_path, settings, exists=False)
    assert [t.user_attrs["seed"] for t in study.get_trials(deepcopy=False)] == [
        "heuristic", "classifier", "inline-within-budget", "inline-small-callees"]
    assert study.get_trials(deepcopy=False)[1].system_attrs["fixed_params"] == dict(start)


# --------------------------------------------------------------------------- end to end


def test_select_policy_end_to_end(compiler, bundled_builds, tmp_path):
    """kahan and hamming at tiny, in cycles: two folds of one program, every kind made from
    the other program and measured on the held-out one, the A/A gate exactly 1, the kept kind
    made again from both and written; the same command again measures nothing new."""
    import subprocess

    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.build.policy_file import read_policy_file
    from dispatcher.core.decisions import read_dump
    labels = tmp_path / "labels"
    for name in ("kahan", "hamming"):
        built = bundled_builds.get(resolve_benchmark(name), dumps=True)
        (labels / name).mkdir(parents=True)
        sites_table(name, [read_dump(p) for p in built.decision_files]).to_csv(
            labels / name / "sites.csv", index=False)
    cfg = write_yaml(tmp_path / "config.yaml", {
        "store": str(tmp_path / "store"), "local": {"cpus": [FIRST_CPU]},
        "run": {"runs": 1, "timeout": 30, "size": "tiny", "perf": False},
        "measure": {"max_pairs": 1}, "compile": {"jobs": 2}})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "commands", "select-policy", "kahan", "hamming", "--labels",
           str(labels), "--folds", "2", "--trials", "2", "--classifier", "logistic",
           "--out", str(out), "--config", str(cfg)]
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    record = json.loads((out / "choice.json").read_text())
    assert record["folds"] == [["hamming"], ["kahan"]] and record["gates"] == [1.0, 1.0]
    assert set(record["kinds"]) == {"searched", "classifier", "combined"}
    with open(out / "choice.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["kind"], r["program"]) for r in rows) == sorted(
        (k, p) for k in ("searched", "classifier", "combined") for p in ("kahan", "hamming"))
    assert all(float(r["counted"]) > 0 and r["aa_low"] == "1" for r in rows)
    # each fold's policies never saw the program they were measured on
    for fold, program in ((0, "hamming"), (1, "kahan")):
        trained = read_policy_file(out / "folds" / str(fold) / "classifier.policy")
        assert trained.benchmarks == sorted({"kahan", "hamming"} - {program})
        for study in ("searched", "combined"):
            sidecar = json.loads((out / "folds" / str(fold) / study / "searched.json")
                                 .read_text())
            assert sidecar["benchmarks"] == sorted({"kahan", "hamming"} - {program})
    combined = json.loads((out / "folds" / "0" / "combined" / "search.json").read_text())
    assert [s[0] for s in combined["extra_seeds"]] == ["classifier"]
    kept = record["kept"]
    lines = first.stdout.splitlines()
    if kept is None:
        assert lines[-1].startswith("no kind passed")
        assert not (out / "selected.policy").exists()
    else:
        assert lines[-1].startswith(f"kept {kept}: {out / 'selected.policy'}")
        mine = record["kinds"][kept]
        assert mine["refused"] is None
        assert all(r["figure"] <= mine["figure"] for r in record["kinds"].values()
                   if r["refused"] is None)
        assert sorted(read_policy_file(out / "selected.policy").benchmarks) == [
            "hamming", "kahan"]
    # again: every study complete, every comparison in the store: the same record
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "choice.json").read_text()) == record


def test_bad_input_is_one_line(tmp_path):
    from tests.helpers import invoke
    r = invoke("select-policy", "kahan", "--kind", "classifier", "--out", str(tmp_path / "o"),
               "--config", str(write_yaml(tmp_path / "c.yaml", {"store": str(tmp_path / "s")})))
    assert "give --labels" in one_line_error(r)
    r = invoke("select-policy", "kahan", "hamming", "--folds", "3", "--kind", "searched",
               "--out", str(tmp_path / "o2"),
               "--config", str(write_yaml(tmp_path / "c2.yaml", {"store": str(tmp_path / "s")})))
    assert "3 folds of 2 program(s)" in one_line_error(r)
    r = invoke("select-policy", "no-such-benchmark", "--out", str(tmp_path / "o3"))
    assert "no-such-benchmark" in one_line_error(r)


def test_the_campaign_stage_is_off_unless_the_file_turns_it_on(tmp_path):
    from pipeline.campaign import plan, stages
    from pipeline.campaign import state as cstate
    data, source = campaign_data(tmp_path)
    off = plan.parse_campaign(data, source)
    assert stages.stage_command(off, "select") is None  # skipped: nothing to do
    assert plan.parse_campaign({**data, "select": {"enabled": False, "folds": 4}},
                               source).identity == off.identity  # earlier identities hold
    on = plan.parse_campaign({**data, "select": {"enabled": True, "folds": 2, "trials": 5,
                                                 "kinds": ["searched", "classifier"]}},
                             source)
    assert on.identity != off.identity
    assert stages.stage_command(on, "select") is None  # no labels: nothing to train on
    (on.dir / "labels").mkdir(parents=True)
    argv = stages.stage_command(on, "select")
    assert argv is not None and argv[0] == "select-policy"
    assert str(REPO / "benchmarks" / "kahan") in argv  # the training programs, by directory
    assert argv[argv.index("--labels") + 1] == str(on.dir / "labels")
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--kind"] == ["searched",
                                                                          "classifier"]
    assert argv[argv.index("--folds") + 1] == "2" and argv[argv.index("--trials") + 1] == "5"
    assert argv[argv.index("--out") + 1] == str(on.dir / "selected")
    searched_only = plan.parse_campaign({**data, "select": {"enabled": True,
                                                            "kinds": ["searched"]}}, source)
    assert "--labels" in stages.stage_command(searched_only, "select")  # labels/ is there
    for bad, key in (({"kinds": ["oracle"]}, "select.kinds"), ({"kinds": []}, "select.kinds"),
                     ({"folds": 1}, "select.folds"), ({"classifier": "svm"},
                                                      "select.classifier"),
                     ({"seed": -1}, "select.seed"), ({"metric": "joules"}, "select.metric")):
        with pytest.raises(plan.CampaignError, match=key):
            plan.parse_campaign({**data, "select": bad}, source)
    # a campaign.json written before the stage existed is read: the stage pending
    on_disk = {"version": 1, "identity": off.identity,
               "stages": {s: {"state": "done"} for s in cstate.STAGES if s != "select"}}
    (off.dir / cstate.STATE_FILE).write_text(json.dumps(on_disk))
    st = cstate.read_state(off)
    assert st.stages["select"].state == "pending" and st.next_stage() == "select"
