"""export-dataset and train-policy --dataset (analysis.dataset): a dataset exported from labels
tables trains, with no compiler and no config, the very policy file the tables train, byte for
byte; exported twice it is the same bytes; with rewards the training table is the one the
rewards and the heuristic build's features give; a malformed dataset is one line, exit 2; a
measurement keeps the metric its label was measured in and its exact cycles effect, and a
dataset of version 1 (before them) still reads and trains the same policy."""
from __future__ import annotations

import hashlib
import json
import math
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from analysis.dataset import (
    INDEX,
    VERSION,
    DatasetError,
    LabelsInput,
    RewardsInput,
    Sources,
    build_dataset,
    read_dataset,
    write_dataset,
)
from analysis.label_training import FEATURES, label_sites, read_sites_table
from analysis.policy_training import KEY, combine, encode, reward_sites, table_sha256, train
from dispatcher.build.policy_file import policy_text
from tests.helpers import cli as _cli
from tests.helpers import invoke, one_line_error

REPO = Path(__file__).resolve().parent.parent
LABELS = REPO / "results" / "first-labels" / "labels"
# nbody: unmeasured sites and sites without features; fannkuch: both actions; orbit: inline
SMALL = ("nbody", "fannkuch", "orbit")
#: A dataset of version 1, as export-dataset wrote it before measurements kept their metric
#: and cycles effect: the SMALL part of results/first-labels/dataset (exported from LABELS,
#: docs/dataset.md), its sites.parquet files as written, dataset.json less the other
#: benchmarks and the trees.
OLD_DATASET = REPO / "tests" / "golden" / "dataset-v1"
#: Labels tables with exact labels (metric cycles, confirmed in time) and cycles effects.
EXACT_LABELS = REPO / "results" / "site-agreement" / "labels"


def _one_line(r: subprocess.CompletedProcess, prog: str) -> str:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.fixture
def labels(tmp_path: Path) -> Path:
    """Three committed labels tables: nbody as Parquet, fannkuch as CSV, orbit as both."""
    out = tmp_path / "labels"
    for bench, names in (("nbody", ("sites.parquet",)), ("fannkuch", ("sites.csv",)),
                         ("orbit", ("sites.parquet", "sites.csv"))):
        (out / bench).mkdir(parents=True)
        for name in names:
            shutil.copy(LABELS / bench / name, out / bench / name)
    return out


def test_a_dataset_trains_the_policy_its_labels_train_byte_for_byte(labels, tmp_path):
    first = _cli("export-dataset", "--labels", "labels", "--out", "ds", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert "nbody: 12 sites, 52 label rows, 8 sites labelled at 0.01" in first.stdout
    assert first.stdout.strip().splitlines()[-1].startswith("ds: 3 benchmarks, 3 files, ")
    again = _cli("export-dataset", "--labels", "labels", "--out", "again", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert _files(tmp_path / "ds") == _files(tmp_path / "again")  # byte for byte
    index = json.loads((tmp_path / "ds" / INDEX).read_text())
    assert sorted(index["files"]) == [f"{b}/sites.parquet" for b in sorted(SMALL)]
    assert index["label_threshold"] == 0.01 and index["version"] == VERSION == 3
    # training needs neither a compiler nor a config: none is there
    nothing = {"INLINING_COMPILER_PREFIX": str(tmp_path / "no-compiler")}
    for options in ((), ("--classifier", "boosted", "--label-threshold", "0.003")):
        a = _cli("train-policy", "--labels", "labels", *options, "--out", "a.policy",
                 cwd=tmp_path)
        b = _cli("train-policy", "--dataset", "ds", *options, "--out", "b.policy",
                 cwd=tmp_path, env=nothing)
        assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
        assert (tmp_path / "a.policy").read_bytes() == (tmp_path / "b.policy").read_bytes()
        assert (tmp_path / "a.policy.scores.csv").read_bytes() == \
            (tmp_path / "b.policy.scores.csv").read_bytes()
        assert a.stdout.replace("a.policy", "b.policy") == b.stdout  # the same report
    # exported again over itself: the same bytes; a directory that is not a dataset is not
    # overwritten
    over = _cli("export-dataset", "--labels", "labels", "--out", "ds", cwd=tmp_path)
    assert over.returncode == 0 and _files(tmp_path / "ds") == _files(tmp_path / "again")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    line = _one_line(_cli("export-dataset", "--labels", "labels", "--out", "mine",
                          cwd=tmp_path), "export-dataset")
    assert "mine: not empty and not a dataset (no dataset.json)" in line
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"


def test_a_malformed_dataset_is_one_line(labels, tmp_path):
    good = tmp_path / "good"
    sources = Sources(labels="labels")
    tables = {b: LabelsInput(read_sites_table(next((labels / b).glob("sites.*"))),
                             "sites", "0" * 64) for b in SMALL}
    write_dataset(build_dataset(tables, {}, {}, sources), good)
    assert sorted(read_dataset(good).labelled) == sorted(SMALL)

    def broken(name: str) -> Path:
        path = tmp_path / name
        shutil.copytree(good, path)
        return path

    (broken("no-index") / INDEX).unlink()
    index = json.loads((good / INDEX).read_text())
    (broken("version") / INDEX).write_text(json.dumps({**index, "version": 99}))
    (broken("not-json") / INDEX).write_text("{")
    changed = broken("changed") / "orbit" / "sites.parquet"
    changed.write_bytes((good / "nbody" / "sites.parquet").read_bytes())
    (broken("missing") / "fannkuch" / "sites.parquet").unlink()
    cases = {
        "no-index": f"{tmp_path}/no-index/dataset.json: no such file (expected a dataset as "
                    "export-dataset writes",
        "version": f"{tmp_path}/version/dataset.json: dataset version 99: expected 1",
        "not-json": f"{tmp_path}/not-json/dataset.json: not a dataset index (",
        "changed": f"{changed}: sha256 ",
        "missing": f"{tmp_path}/missing/fannkuch/sites.parquet: missing (dataset.json lists "
                   "it)",
        "nowhere": f"{tmp_path}/nowhere: no such dataset directory",
    }
    for name, message in cases.items():
        with pytest.raises(DatasetError) as err:
            read_dataset(tmp_path / name)
        assert str(err.value).startswith(message), (str(err.value), message)
        assert "\n" not in str(err.value)
    assert "the file changed after export-dataset wrote it" in _one_line(
        _cli("train-policy", "--dataset", "changed", cwd=tmp_path), "train-policy")
    assert _one_line(_cli("train-policy", "--dataset", "version", cwd=tmp_path),
                     "train-policy").startswith("train-policy: version/dataset.json: dataset "
                                                "version 99: expected 1, 2 or 3 (")
    assert _one_line(_cli("train-policy", "--dataset", "good", "--labels", "labels",
                          cwd=tmp_path), "train-policy") == \
        "train-policy: --dataset: not with --labels or --rewards (a dataset holds the " \
        "labels and rewards it was exported from)"
    assert "nothing to export" in _one_line(_cli("export-dataset", cwd=tmp_path),
                                            "export-dataset")


def _feature_rows(table: pd.DataFrame) -> list[dict]:
    """Feature rows as a heuristic build's dump gives them (unit, round, key, callee, action,
    reason, then every feature), one per featured site of a labels table."""
    rows = {}
    for r in table.to_dict("records"):
        if r["callee_size"] is None or (r["unit"], r["round"], r["key"]) in rows:
            continue
        rows[(r["unit"], r["round"], r["key"])] = {
            "unit": r["unit"], "round": r["round"], "key": r["key"], "callee": r["callee"],
            "action": r["heuristic_action"], "reason": r["heuristic_reason"],
            **{n: r[n] for n in FEATURES if n not in ("unit", "key")}}
    return list(rows.values())


def test_with_rewards_the_training_table_is_the_rewards_and_builds(labels, tmp_path):
    """Rewards for every featured site of nbody and fannkuch, for two sites only the build
    has, and for nbody's featureless sites (given features by the build); the build has more
    decisions than rewards (with absent features: other column types).  The dataset's site
    table is the one the labels, rewards and build give, and so is the policy."""
    tables = {b: read_sites_table(next((labels / b).glob("sites.*"))) for b in SMALL}
    rewards, builds = {}, {}
    for i, bench in enumerate(("nbody", "fannkuch")):
        rows = _feature_rows(tables[bench])
        extra = [{**rows[0], "key": rows[0]["key"] + f"/I/C(Extra.f{j}@x.ml:1:0-9)",
                  "callee_size": 7 + j} for j in range(2)]
        featureless = [{**rows[0], "unit": u, "round": r, "key": k} for u, r, k in
                       tables[bench][KEY].drop_duplicates().itertuples(index=False)
                       if k not in {x["key"] for x in rows}]
        unrewarded = [{**rows[-1], "key": "C(Other.g@y.ml:2:0-9)", "lifting": None,
                       "depth": None, "evaluation": None}]
        builds[bench] = pd.DataFrame(rows + extra + featureless + unrewarded)
        called = rows + extra + featureless
        rewards[bench] = pd.DataFrame({
            "unit": [r["unit"] for r in called], "round": [r["round"] for r in called],
            "key": [r["key"] for r in called], "kind": "call",
            "name": [r["callee"] for r in called], "depth": 0,
            "net": [(-1) ** (j + i) * 0.01 * (j % 4) for j in range(len(called))],
            "supported": [j % 2 == 0 for j in range(len(called))],
            "optimal": ["inline" if j % 3 else None for j in range(len(called))]})[::-1]
    sources = Sources(labels="labels", rewards="rewards", model="ridge", hyper="h")
    built = build_dataset({b: LabelsInput(t, "sites", "0" * 64) for b, t in tables.items()},
                          {b: RewardsInput(rewards[b], "h", "0" * 64, builds[b])
                           for b in rewards}, {}, sources)
    write_dataset(built, tmp_path / "ds")
    ds = read_dataset(tmp_path / "ds")
    assert ds.labelled == sorted(SMALL) and ds.rewarded == ["fannkuch", "nbody"]
    for threshold, label_threshold in ((0.005, 0.01), (0.015, 0.003)):
        direct = combine(
            pd.concat([label_sites(t, label_threshold)[0].assign(benchmark=b)
                       for b, t in sorted(tables.items())], ignore_index=True),  # as trained
            reward_sites(rewards, {b: f.drop(columns=["callee", "action", "reason"])
                                   for b, f in builds.items()}, threshold))
        via = combine(
            pd.concat([label_sites(ds.labels_table(b), label_threshold)[0].assign(benchmark=b)
                       for b in ds.labelled], ignore_index=True),
            reward_sites({b: ds.rewards_table(b) for b in ds.rewarded},
                         {b: ds.build_features(b) for b in ds.rewarded}, threshold))
        assert (direct["source"] == "rewards").sum() >= 10  # extra and featureless sites
        one, two = encode(direct), encode(via)
        assert table_sha256(one) == table_sha256(two)
        assert policy_text(train(one, "logistic", threshold)) == \
            policy_text(train(two, "logistic", threshold))
    # a site whose features the labels table and the build disagree on cannot be one row
    differ = builds["fannkuch"].copy()
    differ.loc[0, "callee_size"] += 1
    with pytest.raises(DatasetError, match=r"feature callee_size is \d+ in the labels table "
                                           r"but \d+ in the heuristic build"):
        build_dataset({"fannkuch": LabelsInput(tables["fannkuch"], "sites", "0" * 64)},
                      {"fannkuch": RewardsInput(rewards["fannkuch"], "h", "0" * 64, differ)},
                      {}, sources)
    # ... unless its labels were measured in another build (measure-sites --reference
    # always-inline): the site's context there, and so its features, are that build's; the
    # dataset keeps the heuristic build's beside them, each measurement its reference, and
    # trains what the tables train, with and without the labels
    table = tables["fannkuch"].copy()
    if "reference" not in table.columns:
        table["reference"] = "heuristic"
    unit, rnd, key = (differ.loc[0, k] for k in KEY)
    mask = (table["unit"] == unit) & (table["round"] == rnd) & (table["key"] == key)
    table.loc[mask, "reference"] = "always-inline"
    built = build_dataset({"fannkuch": LabelsInput(table, "sites", "0" * 64)},
                          {"fannkuch": RewardsInput(rewards["fannkuch"], "h", "0" * 64, differ)},
                          {}, sources)
    write_dataset(built, tmp_path / "aggressive")
    ds = read_dataset(tmp_path / "aggressive")
    features = ds.build_features("fannkuch").set_index(KEY)
    assert features.loc[(unit, rnd, key), "callee_size"] == differ.loc[0, "callee_size"]
    labelled = ds.labels_table("fannkuch")
    at = labelled[(labelled["key"] == key) & (labelled["round"] == rnd)]
    assert set(at["callee_size"]) == {differ.loc[0, "callee_size"] - 1}
    assert set(at["reference"]) == {"always-inline"}
    assert {r for r in labelled["reference"]} == {"always-inline", "heuristic"}
    feats = differ.drop(columns=["callee", "action", "reason"])
    for labels_in in (True, False):
        parts = [reward_sites({"fannkuch": rewards["fannkuch"]}, {"fannkuch": feats}, 0.005),
                 reward_sites({"fannkuch": ds.rewards_table("fannkuch")},
                              {"fannkuch": ds.build_features("fannkuch")}, 0.005)]
        if labels_in:
            parts = [combine(label_sites(t, 0.01)[0].assign(benchmark="fannkuch"), p)
                     for t, p in zip((table, ds.labels_table("fannkuch")), parts)]
        one, two = encode(parts[0]), encode(parts[1])
        assert table_sha256(one) == table_sha256(two)
    # edited by hand: heuristic features of the wrong type are one line naming the row
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "aggressive" / "fannkuch" / "sites.parquet"
    rows = pq.read_table(path).to_pylist()
    i = next(i for i, r in enumerate(rows) if r["heuristic_features"] is not None)
    rows[i]["heuristic_features"] = {**rows[i]["heuristic_features"], "in_loop": 3}
    pq.write_table(pa.Table.from_pylist(rows), path)
    index = json.loads((tmp_path / "aggressive" / INDEX).read_text())
    index["files"]["fannkuch/sites.parquet"] = {
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "bytes": path.stat().st_size}
    (tmp_path / "aggressive" / INDEX).write_text(json.dumps(index))
    with pytest.raises(DatasetError, match=rf"sites.parquet: row {i + 1}: "
                                           r"heuristic_features.in_loop 3: expected true or "
                                           "false or nothing"):
        read_dataset(tmp_path / "aggressive")


@pytest.fixture(scope="module")
def built_dumps(bundled_builds):
    """The heuristic builds' decisions (with features) of two small bundled benchmarks."""
    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.core.decisions import read_dump
    got = {}
    for name in ("kahan", "hamming"):
        built = bundled_builds.get(resolve_benchmark(name), dumps=True)
        got[name] = [read_dump(p) for p in built.decision_files]
    return got


def test_export_with_rewards_compiles_once_and_trains_without_a_compiler(built_dumps,
                                                                          tmp_path):
    """kahan has labels and rewards, hamming rewards only: export-dataset compiles the
    heuristic builds for the rewards' features; train-policy --dataset then writes the policy
    train-policy --labels --rewards writes, with no compiler and no config."""
    import yaml

    from tests.helpers import planted, sites_table
    labels, rewards = tmp_path / "labels", tmp_path / "rewards"
    (labels / "kahan").mkdir(parents=True)
    sites_table("kahan", built_dumps["kahan"]).to_parquet(labels / "kahan" / "sites.parquet",
                                                          index=False)
    net = {"inline": 0.05, "dont_inline": -0.05, "default": 0.0}
    for i, name in enumerate(("kahan", "hamming")):
        for hyper, sign in (("h1", 1), ("h2", -1)):
            out = rewards / name / "ridge" / hyper
            out.mkdir(parents=True)
            decisions = [d for dump in built_dumps[name] for d in dump.decisions]
            pd.DataFrame({"unit": [d.unit for d in decisions],
                          "round": [d.round for d in decisions],
                          "key": [d.key for d in decisions], "kind": "call",
                          "net": [sign * net[planted(d)] for d in decisions]}).to_csv(
                out / "rewards.csv", index=False)
        (rewards / name / "sources.json").write_text(json.dumps(
            {"benchmark": name, "directory": None, "rundirs": []}))
        # best: h1 for kahan, h2 for hamming
        pd.DataFrame({"model": "ridge", "hyperparameters": ["h1", "h2"],
                      "r2": [0.5, 0.2] if i == 0 else [0.1, 0.3],
                      "spearman": 0.0}).to_csv(rewards / name / "fits.csv", index=False)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"store": str(tmp_path / "store")}))
    done = _cli("export-dataset", "--labels", "labels", "--rewards", "rewards", "--config",
                str(cfg), "--out", "ds", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    index = json.loads((tmp_path / "ds" / INDEX).read_text())
    assert index["built_from"]["rewards"]["tables"]["kahan"]["hyper"] == "h1"
    assert index["built_from"]["rewards"]["tables"]["hamming"]["hyper"] == "h2"
    a = _cli("train-policy", "--labels", "labels", "--rewards", "rewards", "--config",
             str(cfg), "--classifier", "boosted", "--out", "a.policy", cwd=tmp_path)
    b = _cli("train-policy", "--dataset", "ds", "--classifier", "boosted", "--out",
             "b.policy", cwd=tmp_path,
             env={"INLINING_COMPILER_PREFIX": str(tmp_path / "no-compiler")})
    assert a.returncode == 0 and b.returncode == 0, (a.stderr, b.stderr)
    assert "labels and rewards: " in b.stdout
    assert (tmp_path / "a.policy").read_bytes() == (tmp_path / "b.policy").read_bytes()
    # the dataset's rewards are those of one model and hyperparameters: no others asked
    line = _one_line(_cli("train-policy", "--dataset", "ds", "--hyper", "h2", cwd=tmp_path),
                     "train-policy")
    assert line == "train-policy: --hyper h2: ds holds the rewards of --hyper best " \
                   "(export-dataset chose them; export again for others)"


def test_the_trees_of_search_rundirs(tmp_path):
    """The golden rundirs' measured candidates: one row each, the figure analysis.extract
    gives, the tree's decisions; labels rundirs of a batch log passed over; the same bytes
    twice; a dataset of trees alone trains nothing, in one line."""
    from analysis.extract import extract
    log = tmp_path / "batch.log"
    golden = REPO / "tests" / "golden"
    log.write_text((golden / "batch.log").read_text().replace(
        '"rundir": "rundir-', f'"rundir": "{golden}/rundir-') + json.dumps(
        {"algorithm": "sites", "rundir": str(golden / "labels-v1"), "steps": 1,
         "task": "tinysum", "time": 1.0}) + "\n")
    for out in ("one", "two"):
        r = _cli("export-dataset", "--batch-log", str(log), "--out", out, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("tinysum: 18 trees\n")
    assert _files(tmp_path / "one") == _files(tmp_path / "two")
    trees = pd.read_parquet(tmp_path / "one" / "tinysum" / "trees.parquet")
    want = extract([golden / "rundir-v1", golden / "rundir-v2"])["tinysum"]
    assert len(trees) == len(want.table) == 18
    assert list(trees["rundir"].unique()) == ["rundir-v1", "rundir-v2"]
    measured = trees[~trees["failed"]]
    assert measured["speedup"].tolist() == pytest.approx(
        want.table[~want.table["failed"].astype(bool)]["speedup"].tolist())
    row = trees.iloc[-1]
    assert [(d["unit"], d["round"], d["key"], d["action"]) for d in row["decisions"]] == \
        sorted(want.trees[row["tree"]].decisions())
    index = json.loads((tmp_path / "one" / INDEX).read_text())
    assert sorted(index["built_from"]["trees"]["rundirs"]) == ["rundir-v1", "rundir-v2"]
    assert _one_line(_cli("train-policy", "--dataset", "one", cwd=tmp_path),
                     "train-policy") == "train-policy: one: no benchmark's labels or rewards " \
                                        "there"


def _measured_rows(table: pd.DataFrame) -> list[tuple]:
    """(site, context, action, trial, metric, cycles effect, cycles size) of each row of a
    labels table, in its order; no metric (a table from before the column) as time."""
    def plain(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v
    return [(r["unit"], int(r["round"]), r["key"], r["context"], r["action"], r["trial"],
             plain(r.get("metric")) or "time", plain(r.get("cycles_effect")),
             plain(r.get("cycles_size")))
            for r in table.to_dict("records")]


def test_a_measurement_keeps_its_metric_and_cycles_effect(tmp_path):
    """Exact labels (kahan: counted in cycles, the ones that matter confirmed in time) and
    labels timed with their cycles effect (orbit) keep, per comparison, the metric it was
    measured in, its cycles effect and the size it was counted at; train-policy
    --require-sign-agreement trains from the dataset the policy it trains from the tables;
    an unknown metric is one line."""
    labels = tmp_path / "labels"
    for bench in ("kahan", "orbit"):
        (labels / bench).mkdir(parents=True)
        shutil.copy(EXACT_LABELS / bench / "sites.csv", labels / bench / "sites.csv")
    done = invoke("export-dataset", "--labels", "labels", "--out", "ds", cwd=tmp_path)
    assert done.exit_code == 0, done.output
    ds = read_dataset(tmp_path / "ds")
    assert ds.version == 3
    for bench in ("kahan", "orbit"):
        assert ds.index["benchmarks"][bench]["cycles_effects"] is True
        table = read_sites_table(labels / bench / "sites.csv")
        kept = [(s["unit"], s["round"], s["key"], m["context"], m["action"], m["trial"],
                 m["metric"], m["cycles_effect"], m["cycles_size"])
                for s in ds.sites[bench] for m in s["measurements"]]
        assert sorted(kept, key=repr) == sorted(_measured_rows(table), key=repr)
        back = ds.labels_table(bench)
        assert sorted(_measured_rows(back), key=repr) == sorted(_measured_rows(table), key=repr)
    metrics = {m["metric"] for s in ds.sites["kahan"] for m in s["measurements"]}
    assert metrics == {"cycles", "time"}  # the exact labels and their confirmations
    assert any(m["cycles_effect"] is not None and m["cycles_size"] == "tiny"
               for s in ds.sites["orbit"] for m in s["measurements"])
    # sign agreement judges the dataset's cycles effects as it judges the tables'
    outs = {}
    for source, name in (("labels", "a.policy"), ("ds", "b.policy")):
        option = "--labels" if source == "labels" else "--dataset"
        got = invoke("train-policy", option, source, "--classifier", "logistic",
                     "--require-sign-agreement", "--out", name, cwd=tmp_path)
        assert got.exit_code == 0, got.output
        assert "set aside: a significant wall effect without a cycles effect" in got.stdout
        outs[source] = got.stdout.replace(name, "x.policy")
    assert outs["labels"] == outs["ds"]
    assert (tmp_path / "a.policy").read_bytes() == (tmp_path / "b.policy").read_bytes()
    # a measurement of an unknown metric: one line naming the file and the row
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "ds" / "kahan" / "sites.parquet"
    rows = pq.read_table(path).to_pylist()
    rows[2]["measurements"][0]["metric"] = "wall"
    pq.write_table(pa.Table.from_pylist(rows), path)
    index = json.loads((tmp_path / "ds" / INDEX).read_text())
    index["files"]["kahan/sites.parquet"] = {
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "bytes": path.stat().st_size}
    (tmp_path / "ds" / INDEX).write_text(json.dumps(index))
    line = one_line_error(invoke("train-policy", "--dataset", "ds", "--out", "c.policy",
                                 cwd=tmp_path))
    assert line == ("train-policy: ds/kahan/sites.parquet: row 3: measurement metric 'wall': "
                    "expected one of time, instructions, cycles"), line


def test_a_dataset_of_version_1_reads_in_wall_time_and_trains_the_same_policy(labels,
                                                                              tmp_path):
    """A dataset of the first labels campaign (version 1, written before measurements kept
    their metric and cycles effect) reads with every measurement in time,
    not counted; it trains the policy a dataset of today's version exported from the same
    labels tables trains, byte for byte; --require-sign-agreement refuses it in one line, and a
    dataset exported from tables without cycles effects too."""
    old = read_dataset(OLD_DATASET)
    assert old.version == 1
    assert all(not old.has_cycles_effects(b) for b in old.labelled)
    got = {(m["metric"], m["cycles_effect"], m["cycles_size"])
           for rows in old.sites.values() for s in rows for m in s["measurements"] or ()}
    assert got == {("time", None, None)}
    assert "cycles_effect" not in old.labels_table("nbody").columns
    assert invoke("export-dataset", "--labels", "labels", "--out", "new",
                  cwd=tmp_path).exit_code == 0
    outs = {}
    for source, name in ((str(OLD_DATASET), "a.policy"), ("new", "b.policy")):
        got_ = invoke("train-policy", "--dataset", source, "--classifier", "logistic",
                      "--out", name, cwd=tmp_path)
        assert got_.exit_code == 0, got_.output
        outs[source] = got_.stdout.replace(name, "x.policy")
    assert outs[str(OLD_DATASET)] == outs["new"]
    assert (tmp_path / "a.policy").read_bytes() == (tmp_path / "b.policy").read_bytes()
    line = one_line_error(invoke("train-policy", "--dataset", str(OLD_DATASET),
                                 "--require-sign-agreement", "--out", "c.policy",
                                 cwd=tmp_path))
    assert line == (f"train-policy: --require-sign-agreement: {OLD_DATASET} is a dataset of "
                    "version 1, which keeps no cycles effects: export it again from its labels "
                    "tables (export-dataset --labels)")
    line = one_line_error(invoke("train-policy", "--dataset", "new", "--require-sign-agreement",
                                 "--out", "c.policy", cwd=tmp_path))
    assert line.startswith("train-policy: new/fannkuch: exported from a labels table with no "
                           "cycles_effect column"), line
    assert not (tmp_path / "c.policy").exists()
