"""A dataset of the training data: the "processed data" level of reproduction (issue 24).

``train-policy`` trains from labels tables (``measure-sites``) and rewards (``assign-rewards``),
whose site features come from compiling each program's heuristic build.  A dataset holds the
same data in one place, with the features already taken, so that anyone can reload it and
``train-policy --dataset DIR`` trains from it alone (no compiler, no config) the very training
table, and so writes byte for byte the policy file ``--labels``/``--rewards`` write with the
same options.  docs/dataset.md documents every column.

Layout of ``DIR``:

- ``dataset.json``: format and version, what it was built from (with each input table's
  sha256), the thresholds of the stored labels, per benchmark what it holds, and the sha256 and
  size of every other file (a file that changed after the export is refused).
- ``<bench>/sites.parquet``: one row per call site: benchmark, unit, round, key, what the
  heuristic did, the site's features; with labels, the label at the dataset's threshold, the
  context it came from and every measured comparison of the site (``measurements``, a list of
  structs: action, context, trial, effect with its 95% interval, pairs, the metric it was
  measured in and its exact cycles effect, ...); with rewards, the rewards table's columns
  (``reward_*``) and the label they give.
- ``<bench>/trees.parquet`` (where search rundirs were given): one row per measured candidate
  tree: its digest and binary, speedup with its interval and pairs, and its decisions.

Rows of ``sites.parquet`` are in training order (the labels table's sites in the order of
their first rows, then the sites only rewards have, in the rewards' order; ``reward_order``
gives the rewards' own order): the classifiers see them in that order, so the order is data.
Labels are recomputed from ``measurements`` when training (``analysis.label_training``'s
rule), so any ``--label-threshold`` trains as it would from the labels tables.  Output is
deterministic: the same inputs give byte-identical files (no timestamps; rundirs and the
batch log by name, not path).  ``export-dataset`` writes ``VERSION``; every version of
``READABLE_VERSIONS`` reads (a version-1 measurement as in time, not counted:
``LATER_MEASUREMENT``).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from analysis.label_training import (
    CONTEXTS,
    FEATURES,
    MAX_ROUND,
    METRICS,
    STATUSES,
    TABLE_LIMIT,
    TRIALS,
    row_label,
    row_reference,
    site_label,
)
from analysis.label_training import _has_features as labels_row_has_features
from analysis.parquet import read_parquet_bytes
from analysis.policy_training import KEY, label
from dispatcher.core.decisions import Features, site_location
from dispatcher.core.files import (
    TextFileError,
    atomic_output,
    read_regular_bytes,
    read_regular_text,
)
from dispatcher.core.site_records import HEURISTIC
from dispatcher.core.validation import first_model_error, shown

FORMAT = "inlining-dataset"
#: Version 2: a measurement carries its ``metric`` and its exact ``cycles_effect`` and
#: ``cycles_size``; a benchmark's entry says whether its labels table had cycles effects.
#: Version 3: a measurement carries its ``reference`` (the build its site was set back from:
#: labels from always-inline's tree are other comparisons than the heuristic's), and a site
#: whose labels' features come from such a build keeps the heuristic build's own where they
#: differ (``heuristic_features``: the rewards' features).
VERSION = 3
#: The versions read: a version-1 dataset's measurements read as in time, not counted; a
#: version-1 or 2 dataset's as measured against the heuristic's build.
READABLE_VERSIONS = (1, 2, 3)
INDEX = "dataset.json"
SITES = "sites.parquet"
TREES = "trees.parquet"
ACTIONS = ("inline", "dont_inline", "specialise")

#: The site's features, as stored: every ``Features`` field but ``round`` (a key column).
SITE_FEATURES = [n for n in FEATURES if n not in KEY]
_KINDS = {f.name: str(f.type).split(" ")[0] for f in fields(Features)}

#: The fields of one measured comparison (a labels table's row, less the site's columns).
MEASUREMENT = [("context", "str"), ("action", "str"), ("trial", "str"), ("status", "str"),
               ("heuristic_action", "str"), ("effect", "float"), ("low", "float"),
               ("high", "float"), ("speedup", "float"), ("pairs", "int"), ("runs", "int"),
               ("disturbed_share", "float"), ("cpu_s", "float"), ("heat", "int"),
               ("decision", "int"), ("why", "str"), ("rundir", "str"), ("metric", "str"),
               ("cycles_effect", "float"), ("cycles_size", "str"), ("reference", "str")]
#: What a measurement of version 2 has that one of version 1 lacks, and what it reads as:
#: in wall time, with no cycles effect.
LATER_MEASUREMENT = {"metric": "time", "cycles_effect": None, "cycles_size": None}
#: What a measurement of version 3 has that one of version 2 lacks, and what it reads as:
#: measured against the heuristic's build (``label_training`` reads None so).
REFERENCED_MEASUREMENT = {"reference": None}
SITE_IDS = [("benchmark", "str"), ("unit", "str"), ("round", "int"), ("key", "str"),
            ("callee", "str"), ("location", "str"), ("heuristic_action", "str"),
            ("heuristic_reason", "str")]
TREE_COLUMNS = [("benchmark", "str"), ("rundir", "str"), ("step", "int"), ("candidate", "int"),
                ("dir", "str"), ("tree", "str"), ("sha256", "str"), ("mutation", "str"),
                ("failed", "bool"), ("error", "str"), ("speedup", "float"), ("low", "float"),
                ("high", "float"), ("pairs", "int"), ("confirmed", "bool"),
                ("unresolved", "bool"), ("candidate_median_s", "float"),
                ("reference_median_s", "float"), ("task_clock_ms", "float")]
_EXPECTED = ("expected a dataset as export-dataset writes: dataset.json and "
             "<bench>/sites.parquet")


class DatasetError(ValueError):
    """An input that cannot go into a dataset, or a dataset that cannot be read; the message
    is one line naming the file (and row or key) and what was expected."""


# -- values -------------------------------------------------------------------------------

def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


def _plain(v: Any) -> Any:
    """A Python value (numpy scalars unwrapped), None where absent."""
    if _missing(v):
        return None
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    return None if isinstance(v, float) and math.isnan(v) else v


def _convert(v: Any, kind: str, where: str) -> Any:
    """``v`` as a value of ``kind`` (str, int, float, bool), None where absent."""
    v = _plain(v)
    if v is None:
        return None
    if kind == "str":
        if not isinstance(v, str):
            raise DatasetError(f"{where}: {v!r}: expected text")
        return v
    if kind == "bool":
        if isinstance(v, bool):
            return v
        raise DatasetError(f"{where}: {v!r}: expected true or false")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise DatasetError(f"{where}: {v!r}: expected a number")
    if kind == "float":
        return float(v)
    if isinstance(v, float) and not v.is_integer():
        raise DatasetError(f"{where}: {v!r}: expected an integer")
    return int(v)


def _arrow_type(kind: str) -> Any:
    import pyarrow as pa
    return {"str": pa.string(), "int": pa.int64(), "float": pa.float64(),
            "bool": pa.bool_()}[kind]


def _kind_of_values(values: Sequence[Any]) -> str:
    """The narrowest kind holding every value present (rewards.csv's columns vary)."""
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return "bool"
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "int"
    if present and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                       for v in present):
        return "float"
    return "str"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- inputs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabelsInput:
    """One benchmark's labels table, checked (``read_sites_table``), and where it came from."""

    table: pd.DataFrame
    file: str  # sites.parquet or sites.csv
    sha256: str


@dataclass(frozen=True)
class RewardsInput:
    """One benchmark's rewards (``rewards.csv`` of the chosen model and hyperparameters) and
    the features of its heuristic build (``feature_rows``: unit, round, key, callee, action,
    reason and every feature)."""

    table: pd.DataFrame
    hyper: str  # the hyperparameters' directory name
    sha256: str
    features: pd.DataFrame


@dataclass(frozen=True)
class TreesInput:
    """One benchmark's measured candidates (``analysis.extract``: table and trees)."""

    table: pd.DataFrame
    decisions: Mapping[str, Sequence[tuple[str, int, str, str]]]  # by tree digest


@dataclass(frozen=True)
class Sources:
    """What a dataset is built from, as dataset.json records it."""

    labels: str | None = None  # the labels directory, as given
    rewards: str | None = None
    model: str | None = None
    hyper: str | None = None  # as asked: a directory name or ``best``
    #: the search rundirs the trees come from, by name: their settings (``rundir_settings``)
    rundirs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    batch_log: str | None = None  # its file name
    label_threshold: float = 0.01
    reward_threshold: float = 0.005


@dataclass
class Built:
    """A dataset in memory: each file's bytes by its path under the dataset, and the index."""

    files: dict[str, bytes] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)


# -- building -----------------------------------------------------------------------------

@dataclass
class _Site:
    ids: dict[str, Any]
    features: dict[str, Any] | None = None
    labels_features: bool | None = None
    features_reference: str = HEURISTIC  # the reference of the row the features came from
    label: str | None = None
    label_context: str | None = None
    measurements: list[dict[str, Any]] | None = None
    build_features: bool | None = None
    reward_order: int | None = None
    reward: dict[str, Any] | None = None
    # the heuristic build's features where the labels' came from another build and differ
    heuristic_features: dict[str, Any] | None = None


def _site_features(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    return {n: _convert(row.get(n), _KINDS[n], f"{where}: feature {n}") for n in SITE_FEATURES}


def _measurement(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One comparison of a labels table's row; its rundir by name (a dataset is read on other
    machines), no reason or size as None (a CSV table reads it so, a Parquet one as ""), no
    metric (a table from before the column) as ``time``."""
    m = {k: _convert(row.get(k), kind, f"{where}: {k}") for k, kind in MEASUREMENT}
    if m["rundir"] is not None:
        m["rundir"] = Path(m["rundir"]).name
    m["why"] = m["why"] or None
    m["metric"] = m["metric"] or "time"
    m["cycles_size"] = m["cycles_size"] or None
    return m


def _labels_sites(bench: str, given: LabelsInput, threshold: float, where: str
                  ) -> dict[tuple[str, int, str], _Site]:
    """The sites of a labels table, in the order of their first rows."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in given.table.to_dict("records"):
        r = {k: _plain(v) for k, v in r.items()}
        groups.setdefault((r["unit"], int(r["round"]), r["key"]), []).append(r)
    out = {}
    for (unit, rnd, key), rows in groups.items():
        at = f"{where}: site {key!r} (unit {unit}, round {rnd})"
        featured = next((r for r in rows if labels_row_has_features(r)), None)
        first = featured or rows[0]
        told = [(r, row_label(r, threshold)) for r in rows]
        context = next((c for c in CONTEXTS if any(r["context"] == c and got is not None
                                                    for r, got in told)), None)
        ids = {"benchmark": bench, "unit": unit, "round": rnd, "key": key,
               "callee": rows[0].get("callee") or None,
               "location": rows[0].get("location") or None,  # CSV reads "" as nothing
               "heuristic_action": first.get("heuristic_action"),
               "heuristic_reason": first.get("heuristic_reason") or None}
        out[(unit, rnd, key)] = _Site(
            ids={k: _convert(ids[k], kind, f"{at}: {k}") for k, kind in SITE_IDS},
            features=_site_features(featured, at) if featured is not None else None,
            labels_features=featured is not None,
            features_reference=(row_reference(featured) if featured is not None
                                else HEURISTIC),
            label=site_label(rows, threshold),
            label_context=context,
            measurements=[_measurement(r, at) for r in rows])
    return out


def reward_column(name: str) -> str:
    """A rewards.csv column's name in a dataset: ``reward_`` before it (once)."""
    return name if name.startswith("reward_") else f"reward_{name}"


def _add_rewards(sites: dict[tuple[str, int, str], _Site], bench: str, given: RewardsInput,
                 threshold: float, where: str) -> None:
    """The call rows of a rewards table, each joined with its site (added where new) and
    with the heuristic build's features."""
    table = given.table
    missing = [c for c in (*KEY, "kind", "net") if c not in table.columns]
    if missing:
        raise DatasetError(f"{where}: no column {', '.join(missing)} (expected the rewards.csv "
                           "assign-rewards writes: unit, round, key, kind, net, ...)")
    build = {}
    for r in given.features.to_dict("records"):
        r = {k: _plain(v) for k, v in r.items()}
        build[(r["unit"], int(r["round"]), r["key"])] = r
    calls = table[table["kind"] == "call"].to_dict("records")
    for order, r in enumerate(calls):
        r = {k: _plain(v) for k, v in r.items()}
        try:
            site = (_convert(r["unit"], "str", "unit"), _convert(r["round"], "int", "round"),
                    _convert(r["key"], "str", "key"))
            net = _convert(r["net"], "float", "net")
        except DatasetError as exc:
            raise DatasetError(f"{where}: call row {order + 1}: {exc}") from None
        at = f"{where}: site {site[2]!r} (unit {site[0]}, round {site[1]})"
        s = sites.get(site)
        if s is not None and s.reward_order is not None:
            raise DatasetError(f"{at}: two call rows (expected one per site)")
        dumped = build.get(site)
        if s is None:
            ids = {"benchmark": bench, "unit": site[0], "round": site[1], "key": site[2],
                   "callee": dumped.get("callee") if dumped else r.get("name"),
                   "location": site_location(site[2]),
                   "heuristic_action": dumped.get("action") if dumped else None,
                   "heuristic_reason": dumped.get("reason") if dumped else None}
            s = sites[site] = _Site(ids={k: _convert(ids[k], kind, f"{at}: {k}")
                                         for k, kind in SITE_IDS})
        s.build_features = dumped is not None
        s.reward_order = order
        s.reward = {reward_column(c): v for c, v in r.items()
                    if c not in (*KEY, "kind")}
        s.reward["reward_label"] = label(math.nan if net is None else net, threshold)
        if dumped is None:
            continue
        theirs = _site_features(dumped, f"{at}: the heuristic build's")
        if s.features is None:
            s.features = theirs
        elif s.labels_features and s.features != theirs and s.features_reference != HEURISTIC:
            # measured in another build (always-inline's tree): the site's context there is
            # not the heuristic build's, nor need its features be; training takes the labels'
            # where the labels decide the site, the build's where the rewards do
            s.heuristic_features = theirs
        elif s.labels_features and s.features != theirs:
            differ = next(n for n in SITE_FEATURES if s.features[n] != theirs[n])
            raise DatasetError(
                f"{at}: feature {differ} is {s.features[differ]!r} in the labels table but "
                f"{theirs[differ]!r} in the heuristic build (a dataset holds one set of "
                "features per site: measure the labels and compile with the same compiler)")


#: What dataset.json records of each search rundir the trees come from.
RUNDIR_SETTINGS = ("task", "algorithm", "seed", "steps", "size", "runs", "max_pairs",
                   "worker_class", "compiler")


def rundir_settings(rundir: Path) -> dict[str, Any]:
    """A search rundir's settings as dataset.json records them (its experiment.json: task,
    algorithm, size, runs, compiler identity, ...); DatasetError if unreadable."""
    from dispatcher.core.records import RecordError, read_experiment
    try:
        experiment = read_experiment(rundir / "experiment.json")
    except RecordError as exc:
        raise DatasetError(str(exc)) from None
    return {k: getattr(experiment, k) for k in RUNDIR_SETTINGS}


def _parquet(columns: dict[str, list[Any]], types: dict[str, Any]) -> bytes:
    """A Parquet file of ``columns`` (in order), deterministic: no pandas metadata, no
    timestamps, one row group."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    schema = pa.schema([pa.field(n, types[n]) for n in columns])
    table = pa.Table.from_pydict(columns, schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", row_group_size=max(1, table.num_rows))
    return bytes(sink.getvalue().to_pybytes())


def _sites_file(sites: Sequence[_Site], with_labels: bool, reward_kinds: dict[str, str] | None
                ) -> bytes:
    import pyarrow as pa
    columns: dict[str, list[Any]] = {k: [s.ids[k] for s in sites] for k, _ in SITE_IDS}
    types = {k: _arrow_type(kind) for k, kind in SITE_IDS}
    for n in SITE_FEATURES:
        columns[n] = [s.features[n] if s.features else None for s in sites]
        types[n] = _arrow_type("str" if _KINDS[n] == "str" else _KINDS[n])
    if with_labels:
        columns["labels_features"] = [s.labels_features for s in sites]
        columns["label"] = [s.label for s in sites]
        columns["label_context"] = [s.label_context for s in sites]
        columns["measurements"] = [s.measurements for s in sites]
        types.update(labels_features=pa.bool_(), label=pa.string(), label_context=pa.string(),
                     measurements=pa.list_(pa.struct([pa.field(k, _arrow_type(kind))
                                                      for k, kind in MEASUREMENT])))
    if reward_kinds is not None:
        columns["build_features"] = [s.build_features for s in sites]
        columns["reward_order"] = [s.reward_order for s in sites]
        columns["heuristic_features"] = [s.heuristic_features for s in sites]
        types.update(build_features=pa.bool_(), reward_order=pa.int64(),
                     heuristic_features=pa.struct([
                         pa.field(n, _arrow_type("str" if _KINDS[n] == "str" else _KINDS[n]))
                         for n in SITE_FEATURES]))
        for c, kind in reward_kinds.items():
            columns[c] = [None if s.reward is None else _reward_value(s.reward.get(c), kind)
                          for s in sites]
            types[c] = _arrow_type(kind)
    return _parquet(columns, types)


def _reward_value(v: Any, kind: str) -> Any:
    if v is None or kind != "str":
        return float(v) if kind == "float" and v is not None else v
    return v if isinstance(v, str) else str(v)


def _trees_file(bench: str, given: TreesInput) -> tuple[bytes, int]:
    import pyarrow as pa
    table = given.table.copy()
    table["rundir"] = [Path(str(c)).name for c in table["chain"]]
    table = table.rename(columns={"ci_low": "low", "ci_high": "high"})
    table = table.sort_values(["rundir", "step", "candidate", "dir"], kind="stable")
    rows = [{k: _plain(v) for k, v in r.items()} for r in table.to_dict("records")]
    where = f"{bench}: trees"
    columns: dict[str, list[Any]] = {}
    types: dict[str, Any] = {}
    for name, kind in TREE_COLUMNS:
        columns[name] = [_convert(r.get(name), kind, f"{where}: {name}") for r in rows]
        types[name] = _arrow_type(kind)
    columns["benchmark"] = [bench] * len(rows)
    for name in sorted(c for c in table.columns if c.startswith("gc_")):
        columns[name] = [_convert(r.get(name), "float", f"{where}: {name}") for r in rows]
        types[name] = pa.float64()
    decision = pa.struct([pa.field("unit", pa.string()), pa.field("round", pa.int64()),
                          pa.field("key", pa.string()), pa.field("action", pa.string())])
    columns["decisions"] = [
        None if r.get("tree") is None else
        [{"unit": u, "round": int(n), "key": k, "action": a}
         for u, n, k, a in sorted(given.decisions[r["tree"]])] for r in rows]
    types["decisions"] = pa.list_(decision)
    return _parquet(columns, types), len(rows)


def build_dataset(labels: Mapping[str, LabelsInput], rewards: Mapping[str, RewardsInput],
                  trees: Mapping[str, TreesInput], sources: Sources) -> Built:
    """The files of a dataset and its index, from each benchmark's labels table, rewards
    (with its heuristic build's features) and measured trees; DatasetError (one line) for an
    input that does not fit."""
    built = Built()
    with_labels, with_rewards = sources.labels is not None, sources.rewards is not None
    per_bench: dict[str, dict[tuple[str, int, str], _Site]] = {}
    for bench in sorted(set(labels) | set(rewards)):
        sites: dict[tuple[str, int, str], _Site] = {}
        if bench in labels:
            where = f"{sources.labels}/{bench}/{labels[bench].file}"
            sites = _labels_sites(bench, labels[bench], sources.label_threshold, where)
        if bench in rewards:
            where = (f"{sources.rewards}/{bench}/{sources.model}/{rewards[bench].hyper}"
                     "/rewards.csv")
            _add_rewards(sites, bench, rewards[bench], sources.reward_threshold, where)
        per_bench[bench] = sites
    reward_kinds: dict[str, str] | None = None
    if with_rewards:
        names: dict[str, list[Any]] = {}
        for bench_sites in per_bench.values():
            for s in bench_sites.values():
                for c, v in (s.reward or {}).items():
                    names.setdefault(c, []).append(v)
        reward_kinds = {c: ("str" if c == "reward_label" else _kind_of_values(names[c]))
                        for c in sorted(names)}
    benchmarks: dict[str, dict[str, Any]] = {}
    for bench, bench_sites in per_bench.items():
        rows = list(bench_sites.values())
        built.files[f"{bench}/{SITES}"] = _sites_file(rows, with_labels, reward_kinds)
        entry: dict[str, Any] = {"labels": bench in labels, "rewards": bench in rewards,
                                 "sites": len(rows)}
        if bench in labels:
            entry["labels_rows"] = len(labels[bench].table)
            entry["labelled_sites"] = sum(s.label is not None for s in rows)
            entry["labelled_without_features"] = sum(  # left out of training, as from labels
                s.label is not None and not s.labels_features for s in rows)
            # a table from before the column has none (train-policy --require-sign-agreement
            # refuses it, as it refuses the table)
            entry["cycles_effects"] = "cycles_effect" in labels[bench].table.columns
        if bench in rewards:
            entry["reward_sites"] = sum(s.reward_order is not None for s in rows)
        benchmarks[bench] = entry
    for bench in sorted(trees):
        data, n = _trees_file(bench, trees[bench])
        built.files[f"{bench}/{TREES}"] = data
        benchmarks.setdefault(bench, {"labels": False, "rewards": False, "sites": 0})
        benchmarks[bench]["trees"] = n
    built_from: dict[str, Any] = {}
    if with_labels:
        built_from["labels"] = {"directory": sources.labels, "tables": {
            b: {"file": labels[b].file, "sha256": labels[b].sha256} for b in sorted(labels)}}
    if with_rewards:
        built_from["rewards"] = {"directory": sources.rewards, "model": sources.model,
                                 "hyper": sources.hyper, "tables": {
                                     b: {"hyper": rewards[b].hyper, "sha256": rewards[b].sha256}
                                     for b in sorted(rewards)}}
    if trees:
        built_from["trees"] = {"rundirs": {n: dict(sources.rundirs[n])
                                           for n in sorted(sources.rundirs)},
                               "batch_log": sources.batch_log}
    built.index = {
        "format": FORMAT, "version": VERSION, "built_from": built_from,
        "label_threshold": sources.label_threshold if with_labels else None,
        "reward_threshold": sources.reward_threshold if with_rewards else None,
        "benchmarks": {b: benchmarks[b] for b in sorted(benchmarks)},
        "files": {p: {"sha256": _sha256(d), "bytes": len(d)}
                  for p, d in sorted(built.files.items())}}
    return built


def index_text(index: Mapping[str, Any]) -> str:
    return json.dumps(index, indent=1, sort_keys=True) + "\n"


def write_dataset(built: Built, out: Path) -> list[Path]:
    """Write ``built`` into ``out`` (made if needed), each file atomically, dataset.json last;
    the files of an earlier dataset there that this one lacks are removed.  ``out`` must be
    new, empty or a dataset whose dataset.json reads (``read_index``: DatasetError otherwise,
    before anything is written, and nothing there is touched)."""
    old: dict[str, Any] = {}
    if out.exists():
        if not out.is_dir():
            raise DatasetError(f"{out}: not a directory (expected a new or empty directory, "
                               "or a dataset to replace)")
        if os.path.lexists(out / INDEX):  # a dataset, checked before anything is replaced
            old = read_index(out)["files"]
        elif any(out.iterdir()):
            raise DatasetError(f"{out}: not empty and not a dataset (no {INDEX}): expected a "
                               "new or empty directory, or a dataset to replace")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for rel, data in sorted(built.files.items()):
        path = out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as tmp:
            tmp.write_bytes(data)
        written.append(path)
    with atomic_output(out / INDEX) as tmp:  # a new file's permissions, as the others
        tmp.write_text(index_text(built.index), encoding="utf-8")
    written.append(out / INDEX)
    for rel in sorted(set(old) - set(built.files)):  # (read_index: <bench>/*.parquet only)
        stale = out / rel
        if stale.is_file() and stale.resolve().is_relative_to(out.resolve()):
            stale.unlink()
            if stale.parent != out and not any(stale.parent.iterdir()):
                stale.parent.rmdir()
    return written


# -- reading ------------------------------------------------------------------------------

@dataclass
class Dataset:
    """A dataset read back and checked: its index and each benchmark's sites, as rows of
    Python values (the files' exact values)."""

    root: Path
    index: dict[str, Any]
    sites: dict[str, list[dict[str, Any]]]

    def _with(self, what: str) -> list[str]:
        return sorted(b for b, e in self.index["benchmarks"].items() if e.get(what))

    @property
    def labelled(self) -> list[str]:
        """The benchmarks that had a labels table."""
        return self._with("labels")

    @property
    def rewarded(self) -> list[str]:
        """The benchmarks that had rewards."""
        return self._with("rewards")

    @property
    def version(self) -> int:
        return int(self.index["version"])

    def has_cycles_effects(self, bench: str) -> bool:
        """Whether the labels of ``bench`` carry their cycles effects: exported (version 2)
        from a labels table with the ``cycles_effect`` column."""
        return bool(self.index["benchmarks"][bench].get("cycles_effects"))

    @property
    def has_labels(self) -> bool:
        return "labels" in self.index["built_from"]

    @property
    def has_rewards(self) -> bool:
        return "rewards" in self.index["built_from"]

    @property
    def model(self) -> str | None:
        return self.index["built_from"].get("rewards", {}).get("model")

    @property
    def hyper(self) -> str | None:
        return self.index["built_from"].get("rewards", {}).get("hyper")

    def labels_table(self, bench: str) -> pd.DataFrame:
        """The labels table the sites of ``bench`` came from, as ``read_sites_table`` reads
        it for the labelling: one row per measured comparison, the site's features on each
        (None where the table had none), so ``label_sites`` labels it as it did the table;
        without ``cycles_effect`` and ``cycles_size`` where that table had no cycles effects
        (``has_cycles_effects``), as the table itself lacked them."""
        rows = []
        for s in self.sites[bench]:
            if s.get("measurements") is None:
                continue
            features = {n: s[n] if s["labels_features"] else None for n in SITE_FEATURES}
            ids = {k: s[k] for k, _ in SITE_IDS if k != "heuristic_action"}
            for m in s["measurements"]:
                rows.append({**ids, **features, **m})
        counted = self.has_cycles_effects(bench)
        columns = ([k for k, _ in SITE_IDS] + SITE_FEATURES
                   + [k for k, _ in MEASUREMENT if k != "heuristic_action"
                      and (counted or k not in ("cycles_effect", "cycles_size"))])
        table = pd.DataFrame(rows, columns=columns, dtype=object)
        for c in ("effect", "low", "high") + (("cycles_effect",) if counted else ()):
            table[c] = table[c].astype(float)
        table["round"] = table["round"].astype(int)
        return table

    def rewards_table(self, bench: str) -> pd.DataFrame:
        """The call rows of ``bench``'s rewards (unit, round, key, kind, net), in their
        order."""
        rows = sorted((s for s in self.sites[bench] if s.get("reward_order") is not None),
                      key=lambda s: s["reward_order"])
        return pd.DataFrame({"unit": [s["unit"] for s in rows],
                             "round": [s["round"] for s in rows],
                             "key": [s["key"] for s in rows], "kind": ["call"] * len(rows),
                             "net": [math.nan if s["reward_net"] is None else s["reward_net"]
                                     for s in rows]})

    def build_features(self, bench: str) -> pd.DataFrame:
        """The heuristic build's features of ``bench``'s reward sites, as ``train-policy``
        takes them from the decision dumps: unit, round, key, then every feature (a site's
        ``heuristic_features`` where its labels' came from another build)."""
        rows = [{"unit": s["unit"], "round": s["round"], "key": s["key"],
                 **(s.get("heuristic_features") or {n: s[n] for n in SITE_FEATURES})}
                for s in self.sites[bench] if s.get("build_features")]
        return pd.DataFrame(rows)


def _fail_index(path: Path, what: str) -> DatasetError:
    return DatasetError(f"{path}: {what} ({_EXPECTED})")


#: The largest dataset.json read (the full campaign's is a few kB).
INDEX_LIMIT = 64 << 20
_STRICT = ConfigDict(extra="forbid", strict=True)
_Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
_Count = Annotated[int, Field(ge=0)]
_Finite = Annotated[float, Field(allow_inf_nan=False)]
#: A benchmark's name, as manifests name them (dispatcher.build.manifest.NAME_RE): a name of
#: one directory in the dataset, never a path.
_Bench = Annotated[str, Field(pattern=r"^[a-z0-9_-]+$", max_length=255)]
#: A rundir by its name (one path component, on one line).
_RundirName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$", max_length=255)]
#: Text that error lines and reports may name: one line.
_Line = Annotated[str, Field(pattern=r"^[^\x00-\x1f]*$", max_length=4096)]


class _LabelsTableEntry(BaseModel):
    model_config = _STRICT
    file: _Line  # the table's name (informative: the labels are in the dataset)
    sha256: _Sha256


class _LabelsFrom(BaseModel):
    model_config = _STRICT
    directory: _Line
    tables: dict[_Bench, _LabelsTableEntry]


class _RewardsTableEntry(BaseModel):
    model_config = _STRICT
    hyper: _Line
    sha256: _Sha256


class _RewardsFrom(BaseModel):
    model_config = _STRICT
    directory: _Line
    model: _Line
    hyper: _Line
    tables: dict[_Bench, _RewardsTableEntry]


class _RundirSettings(BaseModel):
    """``RUNDIR_SETTINGS`` of one search rundir, as ``rundir_settings`` records them."""

    model_config = _STRICT
    task: _Line
    algorithm: _Line
    seed: int
    steps: _Count
    size: _Line
    runs: _Count
    max_pairs: Optional[_Count]
    worker_class: Optional[_Line]
    compiler: Optional[_Line]


class _TreesFrom(BaseModel):
    model_config = _STRICT
    rundirs: dict[_RundirName, _RundirSettings]
    batch_log: Optional[_Line]


class _BuiltFrom(BaseModel):
    model_config = _STRICT
    labels: Optional[_LabelsFrom] = None
    rewards: Optional[_RewardsFrom] = None
    trees: Optional[_TreesFrom] = None


class _BenchmarkEntry(BaseModel):
    model_config = _STRICT
    labels: bool
    rewards: bool
    sites: _Count
    labels_rows: Optional[_Count] = None
    labelled_sites: Optional[_Count] = None
    labelled_without_features: Optional[_Count] = None
    reward_sites: Optional[_Count] = None
    trees: Optional[_Count] = None
    cycles_effects: Optional[bool] = None  # version 2, with labels


class _FileEntry(BaseModel):
    model_config = _STRICT
    sha256: _Sha256
    bytes: Annotated[int, Field(ge=0, le=TABLE_LIMIT)]


class _Index(BaseModel):
    """The shape of dataset.json, as ``build_dataset`` writes it: checked whole on every
    read (it names the files read and what they hold: nothing in it is taken on trust)."""

    model_config = _STRICT
    format: Literal["inlining-dataset"]
    version: Literal[1, 2, 3]
    built_from: _BuiltFrom
    label_threshold: Optional[_Finite]
    reward_threshold: Optional[_Finite]
    benchmarks: dict[_Bench, _BenchmarkEntry]
    # a benchmark's sites or trees: never a path that leaves the dataset
    files: dict[Annotated[str, Field(pattern=r"^[a-z0-9_-]+/(sites|trees)\.parquet$")],
                _FileEntry]


def _index_error(path: Path, exc: ValidationError) -> DatasetError:
    """The first error of dataset.json's validation: ``FILE: KEY: MESSAGE, got VALUE``."""
    key, message = first_model_error(exc)
    return _fail_index(path, f"{key}: {message}")


def read_index(root: Path) -> dict[str, Any]:
    """dataset.json, checked whole (``_Index``): a regular file of at most ``INDEX_LIMIT``
    bytes, UTF-8 JSON (a FIFO, a device or a directory is refused without waiting on it), of
    this format and version, no key unknown, every value of its type and range; benchmarks
    named as manifests name them, files only ``<bench>/sites.parquet`` or ``trees.parquet``
    of a benchmark it lists.  DatasetError (one line naming the file and the key)
    otherwise."""
    path = root / INDEX
    if not root.is_dir():
        raise DatasetError(f"{root}: no such dataset directory ({_EXPECTED})")
    try:
        index = json.loads(read_regular_text(path, INDEX_LIMIT))
    except FileNotFoundError:
        raise _fail_index(path, "no such file") from None
    except TextFileError as exc:
        raise DatasetError(f"{exc} ({_EXPECTED})") from None
    except (ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise _fail_index(path, f"not a dataset index ({reason})") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise _fail_index(path, f"not a dataset index (no \"format\": \"{FORMAT}\")")
    version = index.get("version")
    if type(version) is not int or version not in READABLE_VERSIONS:  # not True, not 1.0
        *earlier, last = map(str, READABLE_VERSIONS)
        readable = f"{', '.join(earlier)} or {last}" if earlier else last
        raise DatasetError(f"{path}: dataset version {shown(version)}: expected {readable} "
                           f"(this version of export-dataset and train-policy reads versions "
                           f"{readable}: export it again)")
    try:
        record = _Index.model_validate(index)
    except ValidationError as exc:
        raise _index_error(path, exc) from None
    for name, value in index["built_from"].items():
        if value is None:  # absent, not null, where the dataset was not built from it
            raise _fail_index(path, f"built_from.{name}: expected an object, got None")
    for rel in record.files:
        if rel.split("/")[0] not in record.benchmarks:
            raise _fail_index(path, f"files.{rel}: a file of no benchmark it lists")
    if record.built_from.labels is not None and record.label_threshold is None:
        raise _fail_index(path, "label_threshold: expected a number (the dataset has labels)")
    for bench, entry in record.benchmarks.items():
        if version == 1 and entry.cycles_effects is not None:
            raise _fail_index(path, f"benchmarks.{bench}.cycles_effects: not a key of version 1")
    return index


#: The columns ``_sites_file`` writes besides the site's ids and features and the rewards'
#: ``reward_*`` columns (whatever ``rewards.csv`` held).
_SITE_COLUMNS = frozenset({"labels_features", "label", "label_context", "measurements",
                           "build_features", "reward_order", "reward_label",
                           "heuristic_features"})
_LABELS = ("inline", "dont_inline", "default")
_KIND_NAMES = {"int": "an integer", "bool": "true or false", "str": "text"}
#: The fields of a measurement in each version.
_MEASUREMENT_FIELDS = {
    1: [(k, kind) for k, kind in MEASUREMENT
        if k not in LATER_MEASUREMENT and k not in REFERENCED_MEASUREMENT],
    2: [(k, kind) for k, kind in MEASUREMENT if k not in REFERENCED_MEASUREMENT],
    3: MEASUREMENT}


def _check_measurement(at: str, m: Any, version: int) -> None:
    expected = _MEASUREMENT_FIELDS[version]
    if not isinstance(m, dict) or set(m) != {k for k, _ in expected}:
        fields_ = sorted(m) if isinstance(m, dict) else type(m).__name__
        raise DatasetError(f"{at}: measurement with fields {shown(fields_)}: expected "
                           f"{', '.join(k for k, _ in expected)} (dataset version {version})")
    choices = {"status": STATUSES, "context": CONTEXTS, "action": ACTIONS, "trial": TRIALS,
               **({"metric": METRICS} if version >= 2 else {})}
    for k, allowed in choices.items():
        if m[k] not in allowed:
            raise DatasetError(f"{at}: measurement {k} {shown(m[k])}: expected one of "
                               f"{', '.join(allowed)}")
    if m["heuristic_action"] is not None and m["heuristic_action"] not in ACTIONS:
        raise DatasetError(f"{at}: measurement heuristic_action {shown(m['heuristic_action'])}"
                           f": expected one of {', '.join(ACTIONS)} or nothing")
    for k, kind in expected:
        try:
            _convert(m[k], kind, f"{at}: measurement {k}")
        except DatasetError:
            raise DatasetError(f"{at}: measurement {k} {shown(m[k])}: expected "
                               f"{'text' if kind == 'str' else 'a number'} or nothing") from None
    if version >= 2:
        cycles = m["cycles_effect"]
        if cycles is not None and not math.isfinite(cycles):
            raise DatasetError(f"{at}: measurement cycles_effect {shown(cycles)}: expected a "
                               "finite number (a log ratio of estimated cycles) or nothing")
        size = m["cycles_size"]
        if size is not None and not (size and size.isprintable()):
            raise DatasetError(f"{at}: measurement cycles_size {shown(size)}: expected a size's "
                               "name on one line or nothing")
    if version >= 3:
        reference = m["reference"]
        if reference is not None and not (reference and reference.isprintable()):
            raise DatasetError(f"{at}: measurement reference {shown(reference)}: expected "
                               "heuristic, always-inline, tree:NAME or nothing")
    if m["status"] == "measured":
        if not all(isinstance(m[k], float) and math.isfinite(m[k])
                   for k in ("effect", "low", "high")):
            raise DatasetError(f"{at}: a measured comparison without a finite effect, "
                               "low and high (log speedup)")
        if not m["low"] <= m["effect"] <= m["high"]:
            raise DatasetError(f"{at}: measurement effect {m['effect']!r} outside its interval "
                               f"(low {m['low']!r}, high {m['high']!r}): expected low <= "
                               "effect <= high")


def _check_sites(path: Path, rows: list[dict[str, Any]], columns: set[str], index: dict,
                 bench: str) -> None:
    """Every column and value training reads, so a hand-edited file fails in one line."""
    needed = [k for k, _ in SITE_IDS] + SITE_FEATURES
    if "labels" in index["built_from"]:
        needed += ["labels_features", "label", "label_context", "measurements"]
    if "rewards" in index["built_from"]:
        needed += ["build_features", "reward_order", "reward_net",
                   *(["heuristic_features"] if index["version"] >= 3 else [])]
    missing = [c for c in needed if c not in columns]
    if missing:
        raise DatasetError(f"{path}: no column {', '.join(missing)} ({_EXPECTED})")
    known = {k for k, _ in SITE_IDS} | set(SITE_FEATURES) | _SITE_COLUMNS
    unknown = sorted(c for c in columns if c not in known and not c.startswith("reward_"))
    if unknown:
        raise DatasetError(f"{path}: column {shown(unknown[0])}: not a column export-dataset "
                           f"writes ({_EXPECTED})")
    for i, s in enumerate(rows):
        at = f"{path}: row {i + 1}"
        if s["benchmark"] != bench:
            raise DatasetError(f"{at}: benchmark {shown(s['benchmark'])}: expected {bench!r}")
        for k in ("unit", "key"):
            if not isinstance(s[k], str) or not s[k] or not s[k].isprintable():
                raise DatasetError(f"{at}: {k} {shown(s[k])}: expected text on one line")
        if type(s["round"]) is not int or not 0 <= s["round"] <= MAX_ROUND:
            raise DatasetError(f"{at}: round {shown(s['round'])}: expected an integer from 0 "
                               f"to {MAX_ROUND}")
        for k, kind in [(k, kind) for k, kind in SITE_IDS if k not in ("unit", "key", "round")
                        ] + [(n, _KINDS[n]) for n in SITE_FEATURES]:
            if not _of_kind(s[k], kind):
                raise DatasetError(f"{at}: {k} {shown(s[k])}: expected "
                                   f"{_KIND_NAMES[kind]} or nothing")
        for k in ("labels_features", "build_features"):
            if s.get(k) is not None and not isinstance(s[k], bool):
                raise DatasetError(f"{at}: {k} {shown(s[k])}: expected true or false")
        for k in ("label", "reward_label"):
            if s.get(k) is not None and s[k] not in _LABELS:
                raise DatasetError(f"{at}: {k} {shown(s[k])}: expected one of "
                                   f"{', '.join(_LABELS)} or nothing")
        if s.get("label_context") is not None and s["label_context"] not in CONTEXTS:
            raise DatasetError(f"{at}: label_context {shown(s['label_context'])}: expected "
                               f"one of {', '.join(CONTEXTS)} or nothing")
        order = s.get("reward_order")
        if order is not None and (type(order) is not int or order < 0):
            raise DatasetError(f"{at}: reward_order {shown(order)}: expected a count or "
                               "nothing")
        net = s.get("reward_net")
        if net is not None and not (isinstance(net, (int, float)) and not isinstance(net, bool)
                                    and math.isfinite(net)):
            raise DatasetError(f"{at}: reward_net {shown(net)}: expected a finite number or "
                               "nothing")
        _check_heuristic_features(at, s)
        measurements = s.get("measurements")
        if measurements is not None and not isinstance(measurements, list):
            raise DatasetError(f"{at}: measurements {shown(measurements)}: expected a list")
        for m in measurements or ():
            _check_measurement(at, m, index["version"])


def _of_kind(value: Any, kind: str) -> bool:
    """Whether a stored value is nothing or of ``kind`` (bool, int or str; not a bool for an
    int)."""
    return value is None or (isinstance(value, bool) if kind == "bool" else
                             type(value) is int if kind == "int" else isinstance(value, str))


def _check_heuristic_features(at: str, s: Mapping[str, Any]) -> None:
    """A site's ``heuristic_features``: nothing, or every feature, typed, on a site with both
    the labels' features and the build's."""
    got = s.get("heuristic_features")
    if got is None:
        return
    if not isinstance(got, dict) or set(got) != set(SITE_FEATURES):
        raise DatasetError(f"{at}: heuristic_features: expected every feature of a site "
                           "(a struct of the site's feature columns) or nothing")
    if not (s.get("labels_features") and s.get("build_features")):
        raise DatasetError(f"{at}: heuristic_features on a site without both the labels' "
                           "features and the heuristic build's: expected nothing")
    for n in SITE_FEATURES:
        if not _of_kind(got[n], _KINDS[n]):
            raise DatasetError(f"{at}: heuristic_features.{n} {shown(got[n])}: expected "
                               f"{_KIND_NAMES[_KINDS[n]]} or nothing")


def _read_listed(root: Path, rel: str, entry: Mapping[str, Any]) -> bytes:
    """The bytes of a file dataset.json lists, checked against its sha256: a regular file
    inside ``root`` (a link that leads out of the dataset is refused) of at most
    ``TABLE_LIMIT`` bytes."""
    path = root / rel
    try:
        inside = path.resolve().is_relative_to(root.resolve())
    except (OSError, RuntimeError):  # a link loop
        inside = False
    if not inside and os.path.lexists(path):
        raise DatasetError(f"{path}: a link out of the dataset ({INDEX} lists it as one of its "
                           "files)")
    try:
        data = read_regular_bytes(path, TABLE_LIMIT)
    except FileNotFoundError:
        raise DatasetError(f"{path}: missing ({INDEX} lists it)") from None
    except TextFileError as exc:
        raise DatasetError(f"{exc} ({INDEX} lists it as one of its files)") from None
    if _sha256(data) != entry["sha256"]:
        raise DatasetError(f"{path}: sha256 {_sha256(data)[:16]}..., but {INDEX} says "
                           f"{entry['sha256'][:16]}... (the file changed after "
                           "export-dataset wrote it: export it again)")
    return data


def read_dataset(root: Path) -> Dataset:
    """A dataset, checked: its index (``read_index``), the size and sha256 of every file it
    lists (a file changed after the export is refused), and every column and value training
    reads (``_check_sites``)."""
    index = read_index(root)
    data = {rel: _read_listed(root, rel, entry) for rel, entry in sorted(index["files"].items())}
    sites = {}
    for bench, entry in sorted(index["benchmarks"].items()):
        if not (entry.get("labels") or entry.get("rewards")):
            continue
        rel = f"{bench}/{SITES}"
        path = root / rel
        if rel not in index["files"]:
            raise DatasetError(f"{root / INDEX}: benchmark {bench} has labels or rewards, "
                               f"but no {rel} is listed ({_EXPECTED})")
        try:
            table = read_parquet_bytes(data[rel])
        except Exception as exc:  # pyarrow's errors have no common base but Exception
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise DatasetError(f"{path}: not a sites table ({reason})") from None
        rows = table.to_pylist()
        _check_sites(path, rows, set(table.column_names), index, bench)
        for s in rows:  # before the fields: in wall time, not counted; against the heuristic
            for m in s.get("measurements") or ():
                if index["version"] < 2:
                    m.update(LATER_MEASUREMENT)
                if index["version"] < 3:
                    m.update(REFERENCED_MEASUREMENT)
        sites[bench] = rows
    return Dataset(root=root, index=index, sites=sites)


# -- rewards: the hyperparameters train-policy chooses ------------------------------------

def best_hyper(fits: pd.DataFrame, model: str) -> str | None:
    """The hyperparameters of ``model`` with the best mean held-out score in a ``fits.csv``
    (R^2, then rank correlation; with neither, the first by name); None: no fit of it."""
    fits = fits[fits["model"] == model]
    if fits.empty:
        return None
    # by held-out R^2, then rank correlation; with neither (too few candidates to hold any
    # out), the first setting by name
    for score in ("r2", "spearman"):
        means = fits.groupby("hyperparameters")[score].mean().dropna()
        if not means.empty:
            return str(means.idxmax())
    return str(sorted(fits["hyperparameters"])[0])

