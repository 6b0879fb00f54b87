"""train-policy --labels: a policy from the labels tables measure-sites writes
(analysis.label_training).  The labelling rule on crafted rows (not-reached rows dropped,
replicates, contexts, the threshold); the features of a real heuristic build written into a
table and read back encode exactly as the dump's do; the command on tables of three made-up
benchmarks (parquet, CSV, both) trains a policy whose answers follow the labels; labels
combined with rewards; a malformed table is one line."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from analysis.label_training import (
    FEATURES,
    LabelsError,
    label_sites,
    read_sites_table,
    row_label,
    site_label,
)
from analysis.labels import ID_COLUMNS, OUTCOME_COLUMNS, write_table
from analysis.policy_training import KEY, combine, encode, training_set
from dispatcher.build.policy_file import read_policy_file
from dispatcher.core.decisions import feature_rows, read_dump
from tests.helpers import FASTER, NAN, NOTHING, SLOWER, planted, sites_table
from tests.helpers import cli as _cli


def row(context="alone", action="inline", status="measured", effect=0.05, low=0.03,
        high=0.07, trial="labels", heuristic_action=None, **rest):
    """One row of a labels table as the rule reads it."""
    if heuristic_action is None:
        heuristic_action = "dont_inline" if action == "inline" else "inline"
    return {"unit": "Main", "round": 0, "key": "C(Main.f@m.ml:1:0-9)", "context": context,
            "action": action, "status": status, "effect": effect, "low": low, "high": high,
            "trial": trial, "heuristic_action": heuristic_action, **rest}


# -- the rule -----------------------------------------------------------------------------

def test_a_row_labels_only_a_measured_significant_effect_beyond_the_threshold():
    assert row_label(row(**FASTER), 0.01) == "inline"
    assert row_label(row(action="dont_inline", **FASTER), 0.01) == "dont_inline"
    # slower: the reference's choice, the other action
    assert row_label(row(**SLOWER), 0.01) == "dont_inline"
    assert row_label(row(action="dont_inline", **SLOWER), 0.01) == "inline"
    # the interval reaches zero, or the effect is within the threshold: does not matter
    assert row_label(row(**NOTHING), 0.01) == "default"
    assert row_label(row(effect=0.02, low=0.001, high=0.04), 0.01) == "inline"
    assert row_label(row(effect=0.02, low=0.001, high=0.04), 0.03) == "default"
    assert row_label(row(effect=0.01, low=0.005, high=0.015), 0.01) == "default"  # not above
    # a flip alone at a site the heuristic specialised, slower: keep the heuristic's
    assert row_label(row(heuristic_action="specialise", **SLOWER), 0.01) == "default"
    assert row_label(row(context="removed", heuristic_action="specialise", **SLOWER),
                     0.01) == "dont_inline"
    # a row that was not measured says nothing: never "no effect"
    for status in ("not_reached", "same_binary", "unresolved", "failed"):
        assert row_label(row(status=status, effect=NAN, low=NAN, high=NAN), 0.01) is None


def test_a_site_without_a_measured_row_has_no_label_not_default():
    unmeasured = [row(status="not_reached", effect=NAN, low=NAN, high=NAN),
                  row(context="removed", status="same_binary", effect=NAN, low=NAN,
                      high=NAN),
                  row(trial="retest", status="unresolved", effect=NAN, low=NAN, high=NAN)]
    assert site_label(unmeasured, 0.01) is None
    # a measured row of another context labels it; the unmeasured ones change nothing
    assert site_label(unmeasured + [row(context="removed", **FASTER)], 0.01) == "inline"
    assert site_label(unmeasured + [row(context="removed", **NOTHING)], 0.01) == "default"


def test_contexts_alone_first_then_minimal_then_removed_the_first_that_decides():
    removed_inline = row(context="removed", action="dont_inline", **SLOWER)
    assert site_label([removed_inline], 0.01) == "inline"
    # an alone row that finds nothing does not hide a later context's decision (an
    # interaction: nothing alone, a decision beside the other one)
    assert site_label([removed_inline, row(**NOTHING)], 0.01) == "inline"
    # an alone row that decides wins over the later contexts
    assert site_label([removed_inline, row(action="inline", **SLOWER)], 0.01) == "dont_inline"
    # nothing decided anywhere: default
    assert site_label([row(context="removed", **NOTHING), row(**NOTHING)], 0.01) == "default"
    # a context whose comparisons disagree is default, and hides the later ones
    assert site_label([row(context="minimal", **FASTER),
                       row(context="minimal", action="dont_inline", **FASTER),
                       removed_inline], 0.01) == "default"
    # an alone row not reached: the next context decides
    alone_unreached = row(status="not_reached", effect=NAN, low=NAN, high=NAN)
    minimal = row(context="minimal", action="dont_inline", **FASTER)
    assert site_label([alone_unreached, removed_inline, minimal], 0.01) == "dont_inline"
    assert site_label([alone_unreached, removed_inline], 0.01) == "inline"


def test_replicates_must_agree_and_conflicting_labels_are_default():
    assert site_label([row(**FASTER), row(trial="retest", **FASTER)], 0.01) == "inline"
    # a retest that does not confirm takes the label away
    assert site_label([row(**FASTER), row(trial="retest", **NOTHING)], 0.01) == "default"
    assert site_label([row(**FASTER), row(trial="retest", **SLOWER)], 0.01) == "default"
    # a retest that was not measured confirms nothing and denies nothing
    assert site_label([row(**FASTER), row(trial="retest", status="failed", effect=NAN,
                                          low=NAN, high=NAN)], 0.01) == "inline"
    # a specialised site, both flips alone: inline is slower (keep specialising: no label),
    # dont_inline faster: dont_inline
    spec = {"heuristic_action": "specialise"}
    assert site_label([row(**SLOWER, **spec), row(action="dont_inline", **FASTER, **spec)],
                      0.01) == "dont_inline"
    # both flips faster than specialising: two labels conflict
    assert site_label([row(**FASTER, **spec), row(action="dont_inline", **FASTER, **spec)],
                      0.01) == "default"
    # two comparisons removed from winners that disagree
    assert site_label([row(context="removed", **FASTER),
                       row(context="removed", action="dont_inline", **FASTER)],
                      0.01) == "default"


def test_a_site_the_heuristic_specialised():
    """A removed row tests specialise itself (the site set back to the heuristic's):
    faster, the heuristic's is best (default); slower, the winner's action was better, which
    the row does not name: it says nothing."""
    spec = {"heuristic_action": "specialise", "action": "specialise"}
    assert row_label(row(context="removed", **spec, **FASTER), 0.01) == "default"
    assert row_label(row(context="removed", **spec, **SLOWER), 0.01) is None
    assert row_label(row(context="minimal", **spec, **NOTHING), 0.01) == "default"
    assert site_label([row(context="removed", **spec, **SLOWER)], 0.01) is None
    # it does not hide a context after it that says something
    assert site_label([row(context="minimal", **spec, **SLOWER),
                       row(context="removed", action="inline", **FASTER)], 0.01) == "inline"


def test_sites_without_features_or_measurement_are_left_out():
    """A site only a winner's inlining made has no heuristic action and no features in the
    table: labelled or not, it cannot be asked as the policy would see it."""
    features = {name: 1 for name in FEATURES}
    table = pd.DataFrame([
        {**row(**FASTER), **features},
        {**row(status="not_reached", effect=NAN, low=NAN, high=NAN), **features,
         "key": "unreached"},
        {**row(context="removed", heuristic_action=None, **SLOWER),
         **{name: None for name in FEATURES}, "round": 0, "key": "winner-only"},
    ])
    sites, left_out = label_sites(table, 0.01)
    assert list(sites["key"]) == ["C(Main.f@m.ml:1:0-9)"] and list(sites["label"]) == ["inline"]
    assert left_out == {"unmeasured": 1, "featureless": 1}


# -- real features -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dumps(bundled_builds):
    """The heuristic builds' decisions (with features) of three small bundled benchmarks."""
    from dispatcher.build.manifest import resolve_benchmark
    got = {}
    for name in ("kahan", "hamming", "bdd"):
        built = bundled_builds.get(resolve_benchmark(name), dumps=True)
        got[name] = [read_dump(p) for p in built.decision_files]
    return got


def test_features_from_a_table_encode_as_the_dump_features_do(dumps, tmp_path):
    """A table written (CSV and parquet) and read back: the labelled sites' features encode
    to the very numbers the rewards' path gives the same sites from the dump."""
    table = sites_table("kahan", dumps["kahan"], unreached=0)
    table.to_csv(tmp_path / "sites.csv", index=False)
    table.to_parquet(tmp_path / "sites.parquet", index=False)
    rows = pd.DataFrame(feature_rows(dumps["kahan"])).drop(columns=["callee", "action",
                                                                    "reason"])
    for path in (tmp_path / "sites.csv", tmp_path / "sites.parquet"):
        sites, left_out = label_sites(read_sites_table(path), 0.01)
        assert len(sites) == len(table) - 1  # the removed row is the first site's second
        assert left_out == {"unmeasured": 0, "featureless": 0}
        from_labels = encode(sites.assign(benchmark="kahan"))
        rewards = sites[KEY].assign(kind="call", net=0.0)
        from_dump = training_set({"kahan": rewards}, {"kahan": rows}, 0.01)
        assert from_labels.columns == from_dump.columns
        pd.testing.assert_frame_equal(from_labels.features, from_dump.features)
    assert "round" not in from_labels.columns  # a key, as in the rewards' path


def write_tables(root: Path, dumps) -> dict[str, dict[tuple, str]]:
    """Labels for three made-up benchmarks (a: parquet, b: CSV, c: both), features of three
    real builds; the planted label of each measured site, by (unit, round, key)."""
    planted_labels = {}
    for bench, source, formats in (("a", "kahan", ("parquet",)), ("b", "hamming", ("csv",)),
                                   ("c", "bdd", ("parquet", "csv"))):
        table = sites_table(bench, dumps[source])
        (root / bench).mkdir(parents=True)
        if len(formats) == 2:
            write_table(table, root / bench)  # measure-sites' own writer
        elif "parquet" in formats:
            table.to_parquet(root / bench / "sites.parquet", index=False)
        else:
            table.to_csv(root / bench / "sites.csv", index=False)
        measured = table[(table["status"] == "measured") & (table["context"] == "alone")]
        by_key = {(d.unit, d.round, d.key): d for dump in dumps[source]
                  for d in dump.decisions}
        planted_labels[bench] = {k: planted(by_key[k]) for k in
                                 zip(measured["unit"], measured["round"], measured["key"])}
    return planted_labels


def test_train_policy_from_labels_answers_as_labelled(dumps, tmp_path):
    labels = tmp_path / "labels"
    wanted = write_tables(labels, dumps)
    policy = tmp_path / "p.policy"
    r = _cli("train-policy", "--labels", "--classifier", "boosted", "--out", str(policy),
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for bench in "abc":
        (line,) = [x for x in lines if x.startswith(f"labels {bench}: ")]
        assert line.endswith(", 5 without a measured row left out"), line
        assert f"{len(wanted[bench])} sites labelled (" in line, line
    total = sum(len(w) for w in wanted.values())
    assert f"{total} call sites from 3 benchmark(s): " in r.stdout
    assert "boosted, each benchmark held out:" in lines
    assert sum(x.startswith(("  a: ", "  b: ", "  c: ")) for x in lines) == 3
    assert any(x.startswith("boosted overall: balanced accuracy ") and
               f"over the {total} sites of 3 benchmarks held out, pooled (chance 0.333: "
               "3 label(s) present)" in x
               for x in lines), r.stdout
    assert lines[-1] == f"boosted trained on a, b, c: {policy}"
    trained = read_policy_file(policy)
    assert trained.benchmarks == ["a", "b", "c"] and trained.threshold == 0.01
    assert trained.growth_budget == 100  # the default guard rail, in the file
    assert "round" not in trained.column_names and "callee_size" in trained.column_names
    # its answers, asked as the policy host asks (a decision's features), follow the labels;
    # one site in twenty of each benchmark (a prediction per site costs a classifier call)
    agree = n = 0
    for bench, source in (("a", "kahan"), ("b", "hamming"), ("c", "bdd")):
        asked = [d for dump in dumps[source] for d in dump.decisions
                 if (d.unit, d.round, d.key) in wanted[bench]]
        for d in asked[::20]:
            n += 1
            agree += trained.predict(d.features.row()) == \
                wanted[bench][(d.unit, d.round, d.key)]  # type: ignore[union-attr]
    assert n >= total // 20 and agree >= 0.95 * n, (agree, n)
    scores = pd.read_csv(policy.with_name("p.policy.scores.csv"))
    assert sorted(scores["held_out"]) == ["a", "b", "c"]


def test_too_few_benchmarks_or_no_better_than_chance_is_said(dumps, tmp_path):
    labels = tmp_path / "labels"
    write_tables(labels, dumps)
    one = _cli("train-policy", "a", "--labels", str(labels), "--classifier", "logistic",
               "--out", str(tmp_path / "one.policy"), cwd=tmp_path)
    assert one.returncode == 0, one.stderr
    assert one.stderr.splitlines() == [
        "fewer than 2 benchmarks have measured labels (a): no leave-one-benchmark-out figure"]
    assert (tmp_path / "one.policy").is_file()
    # two benchmarks, each labelled one way only: held out, each is answered the other way
    for bench, effect in (("a", FASTER), ("b", SLOWER)):
        path = labels / bench / ("sites.parquet" if bench == "a" else "sites.csv")
        table = read_sites_table(path)
        table = table[table["status"] == "measured"].assign(
            context="alone", action="inline", **effect)
        (tmp_path / "two" / bench).mkdir(parents=True)
        table.to_csv(tmp_path / "two" / bench / "sites.csv", index=False)
    two = _cli("train-policy", "--labels", str(tmp_path / "two"), "--classifier", "logistic",
               "--out", str(tmp_path / "two.policy"), cwd=tmp_path)
    assert two.returncode == 0, two.stderr
    assert "logistic overall: balanced accuracy 0.000 over the " in two.stdout
    assert "sites of 2 benchmarks held out, pooled (chance 0.500: 2 label(s) present)" \
        in two.stdout
    assert two.stderr.splitlines() == [
        "not above chance: logistic's balanced accuracy on benchmarks left out, 0.000, is not "
        "above 0.500 (1/2 labels present)"]


def test_labels_win_over_rewards_where_both_label_a_site(dumps, tmp_path):
    labelled = pd.DataFrame({"benchmark": "k", "unit": "M", "round": 0, "key": ["x", "y"],
                             "label": ["inline", "default"], "size": [1, 2]})
    rewarded = pd.DataFrame({"benchmark": ["k", "k", "j"], "unit": "M", "round": 0,
                             "key": ["y", "z", "x"], "label": "dont_inline",
                             "size": [2, 3, 4]})
    both = combine(labelled, rewarded)
    assert list(zip(both["benchmark"], both["key"], both["label"], both["source"])) == [
        ("k", "x", "inline", "labels"), ("k", "y", "default", "labels"),
        ("k", "z", "dont_inline", "rewards"), ("j", "x", "dont_inline", "rewards")]
    assert encode(both).columns == ["size"]


def test_train_policy_on_labels_and_rewards(dumps, tmp_path):
    """kahan has both labels and rewards (the rewards saying the opposite of every label),
    hamming rewards only, a labels only: the measured labels win where both label a site."""
    import yaml
    labels, rewards = tmp_path / "labels", tmp_path / "rewards"
    wanted = write_tables(labels, dumps)
    (labels / "a").rename(labels / "kahan")
    net = {"inline": 0.05, "dont_inline": -0.05, "default": 0.0}
    opposite = {"inline": -0.05, "dont_inline": 0.05, "default": 0.05}
    for name in ("kahan", "hamming"):
        out = rewards / name / "ridge" / "h"
        out.mkdir(parents=True)
        (rewards / name / "sources.json").write_text(json.dumps(
            {"benchmark": name, "directory": None, "rundirs": []}))
        decisions = [d for dump in dumps[name] for d in dump.decisions]
        labels_of = wanted["a"] if name == "kahan" else {}
        pd.DataFrame({"unit": [d.unit for d in decisions], "round": [d.round for d in decisions],
                      "key": [d.key for d in decisions], "kind": "call",
                      "net": [opposite[labels_of[(d.unit, d.round, d.key)]]
                              if (d.unit, d.round, d.key) in labels_of else net[planted(d)]
                              for d in decisions]}).to_csv(out / "rewards.csv", index=False)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"store": str(tmp_path / "store")}))
    policy = tmp_path / "both.policy"
    r = _cli("train-policy", "kahan", "hamming", "--labels", str(labels), "--rewards",
             str(rewards), "--hyper", "h", "--classifier", "boosted", "--config", str(cfg),
             "--out", str(policy), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    n = len(wanted["a"])
    assert f"labels and rewards: {n} sites labelled by both (the measured label kept; {n} of " \
        "them disagree)" in r.stdout
    assert read_policy_file(policy).benchmarks == ["hamming", "kahan"]
    trained = read_policy_file(policy)
    asked = [d for dump in dumps["kahan"] for d in dump.decisions
             if (d.unit, d.round, d.key) in wanted["a"]][::5]  # a classifier call each
    agree = sum(trained.predict(d.features.row()) == wanted["a"][(d.unit, d.round, d.key)]  # type: ignore[union-attr]
                for d in asked)
    assert agree >= 0.9 * len(asked), (agree, len(asked))


# -- bad tables ----------------------------------------------------------------------------

def test_a_malformed_table_is_refused_in_one_line(dumps, tmp_path):
    good = sites_table("a", dumps["kahan"])
    cases = [
        (good.drop(columns=["effect", "callee_size"]),
         "not a labels table: no column effect, callee_size (expected the table measure-sites "
         "writes"),
        (good.assign(status="great"),
         "row 1: status 'great': expected one of measured, not_reached, same_binary, "
         "unresolved, failed"),
        (good.assign(context="elsewhere"), "row 1: context 'elsewhere': expected one of alone"),
        (good.assign(action="maybe"), "row 1: action 'maybe': expected one of inline, "
                                      "dont_inline, specialise"),
        (good.assign(heuristic_action="maybe"), "row 1: heuristic_action 'maybe': expected "),
        (good.assign(effect="fast"),
         "row 1: status measured but effect 'fast': expected a finite number (log speedup)"),
        (good.assign(in_loop="sometimes"),
         "row 1: feature in_loop 'sometimes': expected a bool value or nothing"),
        (good.assign(callee_size="big"),
         "row 1: feature callee_size 'big': expected an int value or nothing"),
    ]
    for i, (table, message) in enumerate(cases):
        path = tmp_path / f"t{i}" / "a" / "sites.csv"
        path.parent.mkdir(parents=True)
        table.to_csv(path, index=False)
        with pytest.raises(LabelsError) as err:
            read_sites_table(path)
        assert str(err.value).startswith(f"{path}: {message}"), (str(err.value), message)
    # through the command: exit 2, one line naming the file, no traceback
    bad = tmp_path / "bad"
    (bad / "a").mkdir(parents=True)
    (bad / "a" / "sites.parquet").write_text("not parquet")
    (bad / "b").mkdir()
    good.to_csv(bad / "b" / "sites.csv", index=False)
    r = _cli("train-policy", "--labels", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == "", (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"train-policy: {bad / 'a' / 'sites.parquet'}: not a labels "
                               "table ("), r.stderr
    for args, start in (
            (("--labels", str(tmp_path / "nowhere")),
             f"train-policy: {tmp_path / 'nowhere'}: no such labels directory"),
            (("nope", "--labels", str(bad)),
             f"train-policy: unknown benchmark nope: no {bad / 'nope'}/sites.parquet or "
             "sites.csv (benchmarks there: a, b)"),
            (("--labels", str(tmp_path)),
             f"train-policy: {tmp_path}: no benchmark's labels there (expected "
             "<bench>/sites.parquet or <bench>/sites.csv")):
        r = _cli("train-policy", *args, cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.startswith(start), (args, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    # every feature column is needed, named as Features.row() names them
    assert "callee_size" in FEATURES and "round" in FEATURES


def test_an_empty_table_as_measure_sites_writes_it_reads_and_labels_nothing(tmp_path):
    write_table(pd.DataFrame(columns=ID_COLUMNS + OUTCOME_COLUMNS), tmp_path / "a")
    for name in ("sites.parquet", "sites.csv"):
        table = read_sites_table(tmp_path / "a" / name)
        sites, left_out = label_sites(table, 0.01)
        assert sites.empty and left_out == {"unmeasured": 0, "featureless": 0}
    r = _cli("train-policy", "--labels", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr == (
        f"train-policy: {tmp_path}: no site has a label (in the tables of a: no site with a "
        "measured row and features)\n"), r.stderr
