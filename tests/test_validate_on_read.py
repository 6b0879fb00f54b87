"""Files that carry a tree, labels or a model are validated on every read, not only when
written (issue 36, item 1): a campaign's state (``campaign.json``), a labels table
(``sites.parquet``/``sites.csv``, what ``train-policy --labels`` and ``export-dataset`` read)
and a dataset (``dataset.json`` and its ``sites.parquet``, what ``train-policy --dataset``
reads and ``export-dataset --out`` replaces).

Each reader gets tampered copies of a real file made by its real writer (``write_state``,
``analysis.labels.write_table``, ``export-dataset``), through the command as a user types it
(in this process, CliRunner): every one is refused in one line naming the file and the field,
exit 2, no traceback, nothing waited on (a FIFO, /dev/zero), and the file left as it was."""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.label_training import read_labels_file
from analysis.labels import write_table
from pipeline.campaign import plan
from pipeline.campaign import state as cstate
from tests.helpers import invoke, one_line_error
from tests.test_fail_early import campaign_file, sim_config

REPO = Path(__file__).resolve().parent.parent
LABELS = REPO / "results" / "labels-cycles"  # tables with the cycles effect and metric


def _big(path: Path, size: int) -> None:
    """``path`` replaced by a sparse file of ``size`` bytes (nothing is written to disk)."""
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(size)


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


# -- campaign.json (run-campaign --status, run-campaign) ----------------------------------

def _state(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def mutate(path: Path) -> None:
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data, indent=1))
    return mutate


def _stage(key: str, value: Any) -> Callable[[Path], None]:
    return _state(lambda d: d["stages"]["search"].__setitem__(key, value))


CAMPAIGN_CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "state of another type": (_stage("state", 5), "stages.search.state: input should be "),
    "unknown state": (_stage("state", "finished"), "stages.search.state: input should be "),
    "started as text": (_stage("started", "yesterday"), "stages.search.started: input should "
                                                        "be a valid number"),
    "finished NaN": (lambda p: p.write_text(p.read_text().replace('"finished": 2.0',
                                                                  '"finished": NaN')),
                     "stages.search.finished: input should be a finite number, got nan"),
    "finished infinite": (_stage("finished", math.inf), "stages.search.finished: input "
                                                         "should be a finite number"),
    "runs as text": (_stage("runs", "3"), "stages.search.runs: input should be a valid "
                                          "integer, got '3'"),
    "runs negative": (_stage("runs", -3), "stages.search.runs: input should be greater than "
                                          "or equal to 0"),
    "runs true": (_stage("runs", True), "stages.search.runs: input should be a valid integer"),
    "exit as text": (_stage("exit", "x"), "stages.search.exit: input should be a valid "
                                          "integer"),
    "note a number": (_stage("note", 5), "stages.search.note: input should be a valid string"),
    "unknown stage key": (_stage("extra", 1), "stages.search.extra: extra inputs are not "
                                              "permitted"),
    "unknown stage": (_state(lambda d: d["stages"].__setitem__("deploy", {"state": "done"})),
                      "stages.deploy: extra inputs are not permitted"),
    "a stage missing": (_state(lambda d: d["stages"].pop("labels")),
                        "stages.labels: field required"),
    "unknown key": (_state(lambda d: d.__setitem__("owner", "me")),
                    "owner: extra inputs are not permitted"),
    "identity a number": (_state(lambda d: d.__setitem__("identity", 5)),
                          "identity: input should be a valid string"),
    "inputs a list": (_state(lambda d: d.__setitem__("inputs", ["a"])),
                      "inputs: input should be a valid dictionary"),
    "an input's digest a number": (_state(lambda d: d.__setitem__("inputs", {"/a": 5})),
                                   "inputs./a: input should be a valid string"),
    "an input named across lines": (_state(lambda d: d.__setitem__("inputs",
                                                                   {"a\nb": "0" * 64})),
                                    "inputs.'a\\nb'.[key]: string should match pattern"),
    "version true": (_state(lambda d: d.__setitem__("version", True)),
                     "version: state format version True; this run-campaign reads 1"),
    "version as text": (_state(lambda d: d.__setitem__("version", "1")),
                        "version: state format version '1'"),
    "a list": (lambda p: p.write_text("[]"), "not a campaign state (expected a JSON object)"),
    "truncated": (lambda p: p.write_text(p.read_text()[:50]), "not a campaign state (not "
                                                              "JSON: "),
    "empty": (lambda p: p.write_text(""), "not a campaign state (not JSON: Expecting value"),
    "not UTF-8": (lambda p: p.write_bytes(b"\xff" + p.read_bytes()), "expected UTF-8 text"),
    "nested too deep": (lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
                        "not a campaign state (not JSON: maximum recursion depth"),
    "too big": (lambda p: _big(p, cstate.STATE_LIMIT + 1), "bytes, more than the "),
    "a FIFO": (_fifo, "not a regular file"),
    "a directory": (_directory, "not a regular file"),
    "/dev/zero": (_dev_zero, "not a regular file"),
}


@pytest.mark.parametrize("case", list(CAMPAIGN_CASES))
def test_a_tampered_campaign_state_is_one_line_naming_the_key(tmp_path, case):
    mutate, expected = CAMPAIGN_CASES[case]
    source = campaign_file(tmp_path, sim_config(tmp_path))
    c = plan.load_campaign(source)
    c.dir.mkdir()
    cstate.write_state(c, cstate.new_state(c).with_stage(
        "search", state="done", started=1.0, finished=2.0, runs=1, exit=0))
    path = c.dir / cstate.STATE_FILE
    assert cstate.read_state(c).stages["search"].state == "done"  # as written, it reads
    mutate(path)
    before = path.read_bytes() if path.is_file() else None
    for args in (("--status",), ()):  # shown, or run: refused before anything runs
        line = one_line_error(invoke("run-campaign", "--config", str(source), *args,
                                     cwd=tmp_path))
        assert line.startswith(f"run-campaign: {path}: "), line
        assert expected in line, (line, expected)
    if before is not None:
        assert path.read_bytes() == before  # nothing rewritten over it
    assert not (c.dir / "logs").exists()  # no stage ran


# -- labels tables (train-policy --labels, export-dataset --labels) -----------------------

def _rows(change: Callable[[pd.DataFrame], Any]) -> Callable[[Path], None]:
    """Change the table as a pandas user would, and write it back in its own format."""
    def mutate(path: Path) -> None:
        table = pd.read_parquet(path) if path.suffix == ".parquet" else \
            pd.read_csv(path, keep_default_na=False, na_values=[""])
        changed = change(table)
        table = table if changed is None else changed
        if path.suffix == ".parquet":
            table.to_parquet(path, index=False)
        else:
            table.to_csv(path, index=False)
    return mutate


def _measured(column: str, value: Any) -> Callable[[pd.DataFrame], Any]:
    def change(table: pd.DataFrame) -> None:
        i = table.index[table["status"] == "measured"][0]
        table[column] = table[column].astype(object)
        table.loc[i, column] = value
    return change


def _cell(column: str, value: Any) -> Callable[[pd.DataFrame], Any]:
    def change(table: pd.DataFrame) -> None:
        table[column] = table[column].astype(object)
        table.loc[0, column] = value
    return change


LABELS_CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "unknown status": (_rows(_cell("status", "great")),
                       "row 1: status 'great': expected one of measured"),
    "unknown action": (_rows(_cell("action", "maybe")),
                       "row 1: action 'maybe': expected one of inline, dont_inline"),
    "unknown metric": (_rows(lambda t: t.assign(metric="joules")),
                       "row 1: metric 'joules': expected one of time, instructions, cycles"),
    "effect NaN": (_rows(_measured("effect", math.nan)),
                   "status measured but effect nan: expected a finite number"),
    "effect infinite": (_rows(_measured("effect", math.inf)),
                        "status measured but effect inf: expected a finite number"),
    "effect outside its interval": (_rows(_measured("low", 5.0)),
                                    "outside its interval (low 5.0, high "),
    "cycles effect infinite": (_rows(_cell("cycles_effect", -math.inf)),
                               "row 1: cycles_effect -inf: expected a number (a finite log ratio"),
    "unit a number": (_rows(lambda t: t.assign(unit=5)), "row 1: unit 5: expected text"),
    "key across lines": (_rows(_cell("key", "a\nb")),
                         "row 1: key 'a\\nb': expected text on one line"),
    "round fractional": (_rows(_cell("round", 1.5)), "row 1: round 1.5: expected an integer"),
    "round out of range": (_rows(_cell("round", 10 ** 15)),
                           "row 1: round 1000000000000000: expected an integer from 0 to "),
    "feature of another kind": (_rows(lambda t: t.assign(depth="deep")),
                                "row 1: feature depth 'deep': expected an int value"),
    "unknown column": (_rows(lambda t: t.assign(owner="me")),
                       "column 'owner': not a column measure-sites writes"),
    "a column missing": (_rows(lambda t: t.drop(columns=["trial"])),
                         "not a labels table: no column trial"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2]), ": "),
    "empty": (lambda p: p.write_bytes(b""), "not a labels table ("),
    "not UTF-8 / not Parquet": (lambda p: p.write_bytes(b"\xff\xfe" + p.read_bytes()),
                                "not a labels table ("),
    "too big": (lambda p: _big(p, (256 << 20) + 1), "bytes, more than the "),
    "a FIFO": (_fifo, "not a regular file"),
    "a directory": (_directory, "not a regular file"),
    "/dev/zero": (_dev_zero, "not a regular file"),
}


@pytest.fixture(scope="module")
def written_labels(tmp_path_factory) -> Path:
    """kahan's committed labels, written again by measure-sites' own writer (both formats)."""
    out = tmp_path_factory.mktemp("labels") / "kahan"
    write_table(pd.read_parquet(LABELS / "kahan" / "sites.parquet"), out)
    return out


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
@pytest.mark.parametrize("case", list(LABELS_CASES))
def test_a_tampered_labels_table_is_one_line_naming_the_row_and_column(
        written_labels, tmp_path, case, fmt):
    mutate, expected = LABELS_CASES[case]
    table = tmp_path / "labels" / "kahan" / f"sites.{fmt}"
    table.parent.mkdir(parents=True)
    shutil.copy(written_labels / table.name, table)
    read_labels_file(table)  # as written, it reads
    mutate(table)
    commands: list[tuple[str, ...]] = [("train-policy", "--labels", "labels", "--classifier",
                                        "logistic", "--out", "x.policy")]
    if case in ("unknown status", "a FIFO", "effect outside its interval"):
        commands.append(("export-dataset", "--labels", "labels", "--out", "ds"))
    for args in commands:
        line = one_line_error(invoke(*args, cwd=tmp_path))
        assert line.startswith(f"{args[0]}: labels/kahan/sites.{fmt}: "), line
        assert expected in line, (line, expected)
    assert not (tmp_path / "x.policy").exists() and not (tmp_path / "ds").exists()


# -- datasets (train-policy --dataset, export-dataset --out over one) ---------------------

def _rehash(root: Path) -> None:
    """dataset.json's sizes and digests made those of the files as they are now (what a
    careful forger does, so that the file's own content is what is judged)."""
    index = json.loads((root / "dataset.json").read_text())
    for rel in index["files"]:
        data = (root / rel).read_bytes()
        index["files"][rel] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (root / "dataset.json").write_text(json.dumps(index, indent=1, sort_keys=True))


def _index(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / "dataset.json"
        index = json.loads(path.read_text())
        change(index)
        path.write_text(json.dumps(index, indent=1, sort_keys=True))
    return mutate


def _sites(change: Callable[[list[dict[str, Any]]], Any]) -> Callable[[Path], None]:
    def mutate(root: Path) -> None:
        path = root / "kahan" / "sites.parquet"
        rows = pq.read_table(path).to_pylist()
        change(rows)
        pq.write_table(pa.Table.from_pylist(rows), path)
        _rehash(root)
    return mutate


def _measurement(key: str, value: Any) -> Callable[[list[dict[str, Any]]], Any]:
    def change(rows: list[dict[str, Any]]) -> None:
        first = next(r for r in rows if r["measurements"])
        first["measurements"][0][key] = value
    return change


def _row(key: str, value: Any) -> Callable[[list[dict[str, Any]]], Any]:
    return lambda rows: rows[0].__setitem__(key, value)


def _all_rows(key: str, value: Any) -> Callable[[list[dict[str, Any]]], Any]:
    def change(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            r[key] = value
    return change


def _drop_measurement_field(key: str) -> Callable[[list[dict[str, Any]]], Any]:
    return lambda rows: [m.pop(key) for r in rows for m in r["measurements"] or ()]


def _truncated(path: Path, size: int) -> None:
    """``path`` cut to ``size`` bytes, dataset.json agreeing."""
    path.write_bytes(path.read_bytes()[:size])
    _rehash(path.parent.parent)


def _link_out(path: Path) -> None:
    outside = path.parent.parent.parent / "elsewhere.parquet"
    shutil.copy(path, outside)
    path.unlink()
    path.symlink_to(outside)


SITES = "kahan/sites.parquet"
DATASET_CASES: dict[str, tuple[Callable[[Path], object], str, str]] = {
    # dataset.json
    "unknown key": (_index(lambda d: d.__setitem__("owner", "me")), "dataset.json",
                    "owner: extra inputs are not permitted"),
    "threshold NaN": (lambda r: (r / "dataset.json").write_text(
        (r / "dataset.json").read_text().replace('"label_threshold": 0.01',
                                                 '"label_threshold": NaN')),
        "dataset.json", "label_threshold: input should be a finite number, got nan"),
    "threshold as text": (_index(lambda d: d.__setitem__("label_threshold", "0.01")),
                          "dataset.json", "label_threshold: input should be a valid number"),
    "version true": (_index(lambda d: d.__setitem__("version", True)), "dataset.json",
                     "dataset version True: expected 1, 2 or 3"),
    "a benchmark's labels as text": (
        _index(lambda d: d["benchmarks"]["kahan"].__setitem__("labels", "yes")),
        "dataset.json", "benchmarks.kahan.labels: input should be a valid boolean"),
    "a count negative": (_index(lambda d: d["benchmarks"]["kahan"].__setitem__("sites", -1)),
                         "dataset.json", "benchmarks.kahan.sites: input should be greater"),
    "a benchmark named across lines": (
        _index(lambda d: d["benchmarks"].__setitem__("ka\nhan", d["benchmarks"].pop("kahan"))),
        "dataset.json", "benchmarks.'ka\\nhan'.[key]: string should match pattern"),
    "a benchmark named ..": (
        _index(lambda d: d["benchmarks"].__setitem__("..", d["benchmarks"].pop("kahan"))),
        "dataset.json", "benchmarks.'..'.[key]: string should match pattern"),
    "built_from.labels a list": (_index(lambda d: d["built_from"].__setitem__("labels", [])),
                                 "dataset.json", "built_from.labels: input should be a valid "
                                                 "dictionary"),
    "a file out of the dataset": (
        _index(lambda d: d["files"].__setitem__("../x", {"sha256": "0" * 64, "bytes": 1})),
        "dataset.json", "files.'../x'.[key]: string should match pattern"),
    "an absolute file": (
        _index(lambda d: d["files"].__setitem__("/etc/passwd", {"sha256": "0" * 64,
                                                                "bytes": 1})),
        "dataset.json", "files./etc/passwd.[key]: string should match pattern"),
    "a file of no benchmark": (
        _index(lambda d: d["files"].__setitem__("other/sites.parquet", {"sha256": "0" * 64,
                                                                        "bytes": 1})),
        "dataset.json", "files.other/sites.parquet: a file of no benchmark it lists"),
    "a digest a number": (_index(lambda d: d["files"][SITES].__setitem__("sha256", 5)),
                          "dataset.json", "files.'kahan/sites.parquet'.sha256: input should "
                                          "be a valid string"),
    "the index a list": (lambda r: (r / "dataset.json").write_text("[]"), "dataset.json",
                         "not a dataset index (no \"format\""),
    "the index truncated": (lambda r: (r / "dataset.json").write_text(
        (r / "dataset.json").read_text()[:40]), "dataset.json", "not a dataset index ("),
    "the index nested too deep": (lambda r: (r / "dataset.json").write_text(
        "[" * 100_000 + "]" * 100_000), "dataset.json", "maximum recursion depth"),
    "the index not UTF-8": (lambda r: (r / "dataset.json").write_bytes(
        b"\xff" + (r / "dataset.json").read_bytes()), "dataset.json", "expected UTF-8 text"),
    "the index too big": (lambda r: _big(r / "dataset.json", (64 << 20) + 1), "dataset.json",
                          "bytes, more than the "),
    "the index a FIFO": (lambda r: _fifo(r / "dataset.json"), "dataset.json",
                         "not a regular file"),
    "the index a directory": (lambda r: _directory(r / "dataset.json"), "dataset.json",
                              "not a regular file"),
    "the index /dev/zero": (lambda r: _dev_zero(r / "dataset.json"), "dataset.json",
                            "not a regular file"),
    # a sites table
    "sites a FIFO": (lambda r: _fifo(r / SITES), SITES, "not a regular file"),
    "sites a link out of the dataset": (lambda r: _link_out(r / SITES), SITES,
                                        "a link out of the dataset"),
    "sites changed": (lambda r: (r / SITES).write_bytes((r / SITES).read_bytes()[:-1] + b"x"),
                      SITES, "(the file changed after export-dataset wrote it"),
    "sites truncated": (lambda r: _truncated(r / SITES, 500), SITES, "not a sites table ("),
    "unknown status": (_sites(_measurement("status", "great")), SITES,
                       "row 1: measurement status 'great': expected one of measured"),
    "effect infinite": (_sites(_measurement("effect", math.inf)), SITES,
                        "row 1: a measured comparison without a finite effect"),
    "effect outside its interval": (_sites(_measurement("low", 5.0)), SITES,
                                    "row 1: measurement effect "),
    "a measurement without its trial": (_sites(_drop_measurement_field("trial")), SITES,
                                        "row 1: measurement with fields "),
    "unknown metric": (_sites(_measurement("metric", "wall")), SITES,
                       "row 1: measurement metric 'wall': expected one of time, instructions, "
                       "cycles"),
    "a measurement without its metric": (_sites(_measurement("metric", None)), SITES,
                                         "row 1: measurement metric None: expected one of "),
    "cycles effect infinite": (_sites(_measurement("cycles_effect", math.inf)), SITES,
                               "row 1: measurement cycles_effect inf: expected a finite "
                               "number"),
    "cycles size across lines": (_sites(_measurement("cycles_size", "ti\nny")), SITES,
                                 "row 1: measurement cycles_size 'ti\\nny': expected a size's "
                                 "name on one line"),
    "a version-1 measurement in a version-2 dataset": (
        _sites(_drop_measurement_field("cycles_size")), SITES,
        "row 1: measurement with fields "),
    "cycles_effects in a version-1 index": (_index(lambda d: d.__setitem__("version", 1)),
                                            "dataset.json", "benchmarks.kahan.cycles_effects: "
                                                            "not a key of version 1"),
    "a label outside inline/dont_inline/default": (_sites(_row("label", "maybe")), SITES,
                                                   "row 1: label 'maybe': expected one of "
                                                   "inline, dont_inline, default"),
    "unknown label context": (_sites(_row("label_context", "nowhere")), SITES,
                              "row 1: label_context 'nowhere': expected one of alone"),
    "round negative": (_sites(_row("round", -1)), SITES,
                       "row 1: round -1: expected an integer from 0 to "),
    "unit a number": (_sites(_all_rows("unit", 5)), SITES, "row 1: unit 5: expected text"),
    "key across lines": (_sites(_row("key", "a\nb")), SITES,
                         "row 1: key 'a\\nb': expected text on one line"),
    "feature of another kind": (_sites(_all_rows("depth", "deep")), SITES,
                                "row 1: depth 'deep': expected an integer or nothing"),
    "labels_features as text": (_sites(_all_rows("labels_features", "yes")), SITES,
                                "row 1: labels_features 'yes': expected true or false"),
    "unknown column": (_sites(_all_rows("owner", "me")), SITES,
                       "column 'owner': not a column export-dataset writes"),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    """A dataset as export-dataset writes it, of kahan's and nbody's committed labels."""
    root = tmp_path_factory.mktemp("exported")
    for bench in ("kahan", "nbody"):
        (root / "labels" / bench).mkdir(parents=True)
        shutil.copy(LABELS / bench / "sites.csv", root / "labels" / bench / "sites.csv")
    got = invoke("export-dataset", "--labels", "labels", "--out", "ds", cwd=root)
    assert got.exit_code == 0, got.stderr
    return root


@pytest.mark.parametrize("case", list(DATASET_CASES))
def test_a_tampered_dataset_is_one_line_naming_the_file_and_field(exported, tmp_path, case):
    from analysis.dataset import read_dataset
    mutate, file, expected = DATASET_CASES[case]
    shutil.copytree(exported / "ds", tmp_path / "ds")
    shutil.copytree(exported / "labels", tmp_path / "labels")
    read_dataset(tmp_path / "ds")  # as written, it reads
    mutate(tmp_path / "ds")
    line = one_line_error(invoke("train-policy", "--dataset", "ds", "--classifier", "logistic",
                                 "--out", "x.policy", cwd=tmp_path))
    assert line.startswith(f"train-policy: ds/{file}: "), line
    assert expected in line, (line, expected)
    assert not (tmp_path / "x.policy").exists()
    if file == "dataset.json":  # export-dataset --out refuses to replace it: nothing touched
        before = {p: p.read_bytes() for p in (tmp_path / "ds").rglob("*") if p.is_file()
                  and not p.is_symlink()}
        line = one_line_error(invoke("export-dataset", "--labels", "labels", "--out", "ds",
                                     cwd=tmp_path))
        assert line.startswith(f"export-dataset: ds/{file}: "), line
        assert expected in line, (line, expected)
        assert {p: p.read_bytes() for p in before} == before
