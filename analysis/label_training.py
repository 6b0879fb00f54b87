"""Training labels from measured sites: the tables ``measure-sites`` writes
(``labels/<bench>/sites.parquet``, the same rows in ``sites.csv``), one row per measured label.

A row compares the tree with ``action`` at one site against its reference, in a ``context``:
``alone`` (the flip alone on the heuristic's tree, reference the heuristic's build),
``minimal`` (the decision removed from the minimal winning subset, reference that subset's
build) or ``removed`` (removed from a search winner's tree, reference the winner).  ``effect``
is the log speedup of the tested tree over its reference, log(reference time / tested time),
with its 95% interval ``low``..``high``: above 0, ``action`` made the program faster.

The labelling rule (docs/policies.md, "Labels from measured sites"):

1. **A row.**  Only a ``measured`` row says anything: ``not_reached`` (the flip's code is not
   what runs), ``same_binary``, ``unresolved`` and ``failed`` rows are dropped, and are never
   evidence of "no effect".  A measured row gives a label when its interval excludes zero and
   ``|effect|`` exceeds the threshold ``t`` (log-speedup units: 0.01 is about 1%): ``effect >
   t`` with ``low > 0``: ``action``; ``effect < -t`` with ``high < 0``: the other action
   (``inline`` <-> ``dont_inline``: the reference's choice beats ``action``).  Any other
   measured row gives ``default`` (no effect worth deciding: the heuristic decides).  Where
   the heuristic *specialised* (the policy's way to keep that is ``default``): an ``alone``
   flip, slower, gives ``default``; a ``removed``/``minimal`` row tests ``specialise`` itself
   (the site set back to the heuristic's): faster gives ``default``, slower says the winner's
   action was better without saying which (it is not in the row): no label.
2. **Replicates.**  The rows of one site with the same context, action and ``reference``
   (the ``labels`` trial and any ``retest``; a table without the column: ``heuristic``) are
   replicates of one comparison; rows of another reference (``measure-sites --reference
   always-inline``: a site set back from always-inline's build) are another comparison of
   the same context, whose label must agree with the first's: it gives a label only where
   every replicate that says anything gives that same label, else ``default``.  They are not
   pooled: a label must be reproduced on its own, which is what a retest is for (with 95%
   intervals one null comparison in twenty looks significant).
3. **Contexts.**  A site's label comes from its most relevant context that decides it
   (``inline`` or ``dont_inline``): ``alone`` (what a policy deciding one site on the
   heuristic's tree does), then ``minimal``, then ``removed`` (more of the other decisions
   changed with it).  Within a context the labels its comparisons give (at most one per
   action) decide; two different ones conflict, and the site is ``default``.  A context
   that finds no effect does not hide a decision a later one measured: a decision that
   matters only with another taken (an interaction) finds nothing alone, and its ``minimal``
   and ``removed`` rows are its only evidence (``bench/search_truth``: with ``alone``
   first whatever it said, no planted interaction was ever labelled).  A site measured
   somewhere that no context decides is ``default``.
4. **Left out**: a site no row of which says anything (none measured) gets no label at all;
   a site without features (not in the heuristic build's dump: only a winner's inlining made
   it) cannot be encoded as the policy would see it, and is left out too.

**Sign agreement** (``agreement``, ``train-policy --require-sign-agreement``; docs/policies.md):
a row's label may rest on its wall effect only where its cycles effect (``cycles_effect``, the
same two binaries counted under cachegrind) agrees in sign.  A wall-time row whose effect is
significant and beyond the threshold (the rows whose label is the sign of their wall effect)
says nothing, as if not measured, when its cycles effect is of the other sign, below
``CYCLES_ZERO`` in size (the flip changed no executed instruction worth counting: code layout
on the measuring machine, not something features can predict), or missing.  A wall effect
that is not significant (or within the threshold) says ``default`` as before: it has no sign to
agree with, and a cycles effect the clock cannot see is not a label.  A row measured in an exact
metric says nothing by itself: its wall effect is its retest row's, which is judged.

Features come from the table itself (the heuristic build's dump, one column per
``Features`` field), typed as the dump types them, so that ``numeric_features`` encodes
them exactly as it encodes a dump's (and as the policy host encodes an observation).
"""
from __future__ import annotations

import hashlib
import io
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.labels import CYCLES_COLUMNS, ID_COLUMNS, OUTCOME_COLUMNS, REFERENCE_COLUMN
from analysis.parquet import parquet_frame
from analysis.policy_training import KEY
from dispatcher.core.decisions import Features
from dispatcher.core.files import TextFileError, read_regular_bytes

TABLE_NAMES = ("sites.parquet", "sites.csv")  # the first found is read (same content)
CONTEXTS = ("alone", "minimal", "removed")  # in order of precedence
STATUSES = ("measured", "not_reached", "same_binary", "unresolved", "failed")
TRIALS = ("labels", "retest")
ACTIONS = ("inline", "dont_inline", "specialise")  # specialise: a removed row's, set back
OTHER = {"inline": "dont_inline", "dont_inline": "inline"}
DEFAULT_LABEL_THRESHOLD = 0.01  # |log speedup|: about 1%
#: |log ratio| of estimated cycles below which a flip changed nothing worth counting (0.01%)
CYCLES_ZERO = 1e-4

#: The feature columns, named as ``Features.row()`` names them, and the kind of each.
FEATURES = [f.name for f in fields(Features)]
_KINDS = {f.name: str(f.type).split(" ")[0] for f in fields(Features)}
#: The features every decision of a version-2 dump has: a row without one of them has no
#: features (its site is not in the heuristic build's dump).
_ALWAYS = [f.name for f in fields(Features)
           if f.default is MISSING and f.name not in ("threshold", *KEY)]
#: What the labelling reads besides the features.
COLUMNS = ["unit", "round", "key", "heuristic_action", "action", "context", "status",
           "effect", "low", "high", "trial"]
#: Every column measure-sites writes (analysis.labels): a table with any other is not one.
KNOWN_COLUMNS = frozenset([*ID_COLUMNS, *FEATURES, *OUTCOME_COLUMNS, "metric", *CYCLES_COLUMNS,
                           REFERENCE_COLUMN])
METRICS = ("time", "instructions", "cycles")
#: The largest table read (a labels table of a whole campaign is a few hundred kB).
TABLE_LIMIT = 256 << 20
#: The largest inlining round a table may name (the policy grammar's nine digits).
MAX_ROUND = 999_999_999


class LabelsError(ValueError):
    """A labels table that cannot be read or does not hold what measure-sites writes; the
    message is one line and names the file."""


# -- the rule -----------------------------------------------------------------------------

def in_time(row: Mapping[str, Any]) -> bool:
    """Whether a row's effect is in wall time (a table without ``metric``: it is)."""
    metric = row.get("metric")
    return not isinstance(metric, str) or metric == "time"


def signs_agree(row: Mapping[str, Any], threshold: float) -> bool:
    """Whether a measured row passes the sign-agreement rule (module docstring): an exact
    row never does; a wall-time row does unless its wall effect is significant and beyond
    ``threshold`` while its cycles effect is missing, below ``CYCLES_ZERO`` or of the other
    sign."""
    if not in_time(row):
        return False
    effect, low, high = float(row["effect"]), float(row["low"]), float(row["high"])
    if not ((effect > threshold and low > 0) or (effect < -threshold and high < 0)):
        return True
    counted = row.get("cycles_effect")
    if counted is None or _missing(counted):
        return False
    cycles = float(counted)
    return abs(cycles) >= CYCLES_ZERO and (cycles > 0) == (effect > 0)


def row_label(row: Mapping[str, Any], threshold: float,
              agreement: bool = False) -> str | None:
    """The label one row of a labels table gives (rule 1): ``inline`` or ``dont_inline``,
    ``default`` (measured, without an effect beyond ``threshold`` that its interval confirms,
    or the heuristic's own choice shown best), or ``None``: the row says nothing a label can
    say (not measured; or a ``specialise`` set back in a winner, slower, where which action the
    winner took instead is not in the row; with ``agreement``, a row that fails the
    sign-agreement rule)."""
    if row["status"] != "measured":
        return None
    if agreement and not signs_agree(row, threshold):
        return None
    effect, low, high = float(row["effect"]), float(row["low"]), float(row["high"])
    action = str(row["action"])
    heuristic = row.get("heuristic_action")
    if effect > threshold and low > 0:  # action beats the reference's choice
        if action in OTHER:
            return action
        return "default" if heuristic == "specialise" else None
    if effect < -threshold and high < 0:  # the reference's choice beats action
        if row["context"] == "alone" and heuristic == "specialise":
            return "default"  # the reference specialised: the policy keeps it by default
        return OTHER.get(action)
    return "default"


def site_label(rows: Iterable[Mapping[str, Any]], threshold: float,
               agreement: bool = False) -> str | None:
    """The label of one site from all its rows (rules 2-4); ``None``: no row of it says
    anything (none measured), so it has no label and is left out."""
    told = [(r, got) for r in rows
            if (got := row_label(r, threshold, agreement)) is not None]
    if not told:
        return None
    references = {row_reference(r) for r, _ in told}
    for context in CONTEXTS:
        verdicts = set()
        for action in ACTIONS:
            for reference in references:  # another reference: another comparison
                replicates = {got for r, got in told if r["context"] == context and
                              r["action"] == action and row_reference(r) == reference}
                if replicates:
                    verdicts.add(replicates.pop() if len(replicates) == 1 else "default")
        decided = verdicts - {"default"}
        if len(decided) > 1:  # this context's comparisons disagree
            return "default"
        if decided:
            return decided.pop()
    return "default"


def row_reference(row: Mapping[str, Any]) -> str:
    """The reference a row was measured against (a table without the column: heuristic)."""
    value = row.get(REFERENCE_COLUMN)
    return "heuristic" if value is None or _missing(value) else str(value)


def _has_features(row: Mapping[str, Any]) -> bool:
    return all(not _missing(row.get(name)) for name in _ALWAYS)


def label_sites(table: pd.DataFrame, threshold: float, agreement: bool = False
                ) -> tuple[pd.DataFrame, dict[str, int]]:
    """One row per site with a label (``unit``, ``round``, ``key``, ``label``, then its
    features) from a checked labels table (``read_sites_table``), in the order of the sites'
    first rows; and how many sites were left out: ``unmeasured`` (no row says anything: none
    measured, or with ``agreement`` none that passes the sign-agreement rule) and
    ``featureless`` (labelled, but not in the heuristic build's dump, so without the features a
    policy would see: a site only a winner's inlining made); and ``disagree``: the measured
    wall-time rows the sign-agreement rule set aside (only with ``agreement``)."""
    out = []
    left_out = {"unmeasured": 0, "featureless": 0, **({"disagree": 0} if agreement else {})}
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in table.to_dict("records"):
        groups.setdefault((r["unit"], r["round"], r["key"]), []).append(r)
        if agreement and r["status"] == "measured" and in_time(r) and \
                not signs_agree(r, threshold):
            left_out["disagree"] += 1
    for (unit, rnd, key), rows in groups.items():
        got = site_label(rows, threshold, agreement)
        if got is None:
            left_out["unmeasured"] += 1
            continue
        featured = next((r for r in rows if _has_features(r)), None)
        if featured is None:
            left_out["featureless"] += 1
            continue
        features = {name: featured.get(name) for name in FEATURES if name not in KEY}
        out.append({"unit": unit, "round": rnd, "key": key, "label": got, **features})
    columns = KEY + ["label"] + [n for n in FEATURES if n not in KEY]
    return pd.DataFrame(out, columns=columns), left_out


# -- the tables ---------------------------------------------------------------------------

def table_path(labels_dir: Path, bench: str) -> Path | None:
    """The labels table of ``bench`` under ``labels_dir`` (parquet first), None if none.
    Anything by the table's name counts (a FIFO, a directory, a dangling link): the reader
    refuses it in one line, rather than the benchmark being passed over in silence."""
    for name in TABLE_NAMES:
        if os.path.lexists(labels_dir / bench / name):
            return labels_dir / bench / name
    return None


def labelled_benchmarks(labels_dir: Path) -> list[str]:
    """The benchmarks with a labels table under ``labels_dir``, by name."""
    return sorted(p.name for p in labels_dir.iterdir()
                  if p.is_dir() and table_path(labels_dir, p.name) is not None)


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or \
        value is pd.NA


def _typed(value: Any, kind: str) -> Any:
    """A feature's value as the dump gives it (int, bool, str or None); ValueError if it is
    not one of its kind."""
    if _missing(value):
        return None
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if isinstance(value, (bool, int, float)) or hasattr(value, "item"):
            number = float(value)
            if number in (0.0, 1.0):
                return bool(number)
        raise ValueError(value)
    if kind == "int":
        if isinstance(value, bool):
            raise ValueError(value)
        number = float(value)  # ValueError for text that is not a number
        if not number.is_integer():
            raise ValueError(value)
        return int(number)
    if not isinstance(value, str):
        raise ValueError(value)
    return value


def read_sites_table(path: Path) -> pd.DataFrame:
    """A labels table, checked (``read_labels_file``)."""
    return read_labels_file(path)[0]


def read_labels_file(path: Path) -> tuple[pd.DataFrame, str]:
    """A labels table, checked, and the sha256 of the bytes it was read from (read once): a
    regular file of at most ``TABLE_LIMIT`` bytes (a FIFO, a device or a directory is refused
    without waiting on it); the columns the labelling reads and every feature, and no column
    measure-sites does not write; known statuses, contexts, actions, trials and metrics; unit
    and key on one line, rounds 0..``MAX_ROUND``; for a measured row a finite effect within
    its finite interval; a finite cycles effect or none; each feature of its kind.
    LabelsError (one line, naming the file, the row and the column) otherwise."""
    expected = ("expected the table measure-sites writes: one row per measured label, with "
                "unit, round, key, heuristic_action, action, context, status, effect, low, "
                "high, trial and the site's features")
    try:
        data = read_regular_bytes(path, TABLE_LIMIT)
    except FileNotFoundError:
        raise LabelsError(f"{path}: no such labels table ({expected})") from None
    except TextFileError as exc:
        raise LabelsError(f"{exc} ({expected})") from None
    try:
        if path.suffix == ".parquet":
            table = parquet_frame(data)
        else:
            table = pd.read_csv(io.BytesIO(data), keep_default_na=False, na_values=[""])
    except Exception as exc:  # unreadable, not parquet, not CSV, empty
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise LabelsError(f"{path}: not a labels table ({reason}; {expected})") from None
    return _checked(path, table, expected), hashlib.sha256(data).hexdigest()


def _first(bad: Any) -> int:
    return int(bad.to_numpy().nonzero()[0][0])


def _shown(value: Any) -> str:
    """A cell's value as an error names it (a numpy scalar as the number it holds)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _one_line_text(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and value.isprintable()


def _checked(path: Path, table: pd.DataFrame, expected: str) -> pd.DataFrame:
    unknown = [str(c) for c in table.columns if c not in KNOWN_COLUMNS]
    if unknown:
        raise LabelsError(f"{path}: column {unknown[0][:60]!r}: not a column measure-sites "
                          f"writes ({expected})")
    # an empty table (a labels rundir that measured nothing yet) may lack the features
    missing = [c for c in COLUMNS + (FEATURES if len(table) else []) if c not in table.columns]
    if missing:
        raise LabelsError(f"{path}: not a labels table: no column {', '.join(missing)} "
                          f"({expected})")
    table = table.reset_index(drop=True)
    choices = {"status": STATUSES, "context": CONTEXTS, "action": ACTIONS, "trial": TRIALS,
               "heuristic_action": ACTIONS}
    for column, allowed in choices.items():
        for i, value in enumerate(table[column]):
            if column == "heuristic_action" and _missing(value):
                continue  # a site the heuristic's tree lacks (only a winner inlined its way)
            if value not in allowed:
                raise LabelsError(f"{path}: row {i + 1}: {column} {_shown(value)}: expected one of "
                                  f"{', '.join(allowed)}")
    table["heuristic_action"] = table["heuristic_action"].map(
        lambda v: None if _missing(v) else v).astype(object)
    if "metric" in table.columns:  # absent (a table from before it): time
        for i, value in enumerate(table["metric"]):
            if not _missing(value) and value not in METRICS:
                raise LabelsError(f"{path}: row {i + 1}: metric {_shown(value)}: expected one of "
                                  f"{', '.join(METRICS)} or nothing")
    if REFERENCE_COLUMN in table.columns:  # absent (a table from before it): heuristic
        for i, value in enumerate(table[REFERENCE_COLUMN]):
            if not _missing(value) and not _one_line_text(value):
                raise LabelsError(f"{path}: row {i + 1}: reference {_shown(value)}: expected "
                                  "heuristic, always-inline, tree:NAME or nothing")
        table[REFERENCE_COLUMN] = table[REFERENCE_COLUMN].map(
            lambda v: "heuristic" if _missing(v) else v).astype(object)
    for column in ("unit", "key"):
        for i, value in enumerate(table[column]):
            if not _one_line_text(value):
                raise LabelsError(f"{path}: row {i + 1}: {column} {_shown(value)}: expected "
                                  "text on one line")
    rounds = pd.to_numeric(table["round"], errors="coerce")
    bad = rounds.isna() | (rounds % 1 != 0) | (rounds < 0) | (rounds > MAX_ROUND)
    if bad.any():
        i = _first(bad)
        raise LabelsError(f"{path}: row {i + 1}: round {_shown(table['round'][i])}: expected "
                          f"an integer from 0 to {MAX_ROUND}")
    table["round"] = rounds.astype(int)
    for column in ("effect", "low", "high"):
        numbers = pd.to_numeric(table[column], errors="coerce")
        bad = (table["status"] == "measured") & ~numbers.map(
            lambda v: isinstance(v, float) and math.isfinite(v))
        if bad.any():
            i = int(bad.to_numpy().nonzero()[0][0])
            raise LabelsError(f"{path}: row {i + 1}: status measured but {column} "
                              f"{_shown(table[column][i])}: expected a finite number (log "
                              "speedup)")
        table[column] = numbers.astype(float)
    measured = table["status"] == "measured"
    outside = measured & ((table["low"] > table["effect"]) | (table["effect"] > table["high"]))
    if outside.any():
        i = _first(outside)
        raise LabelsError(f"{path}: row {i + 1}: effect {_shown(table['effect'][i])} outside "
                          f"its interval (low {_shown(table['low'][i])}, high "
                          f"{_shown(table['high'][i])}): expected low <= effect <= high")
    if "cycles_effect" in table.columns:  # a table from before it: no cycles effects
        numbers = pd.to_numeric(table["cycles_effect"], errors="coerce")
        bad = (numbers.isna() & table["cycles_effect"].map(lambda v: not _missing(v))) | \
            numbers.isin([math.inf, -math.inf])
        if bad.any():
            i = _first(bad)
            raise LabelsError(f"{path}: row {i + 1}: cycles_effect "
                              f"{_shown(table['cycles_effect'][i])}: expected a number "
                              "(a finite log ratio of estimated cycles) or nothing")
        table["cycles_effect"] = numbers.astype(float)
    for name in FEATURES:
        if name in KEY or name not in table.columns:
            continue
        kind = "text" if _KINDS[name] == "str" else _KINDS[name]
        typed = []
        for i, value in enumerate(table[name]):
            try:
                typed.append(_typed(value, _KINDS[name]))
            except (ValueError, TypeError, OverflowError):
                raise LabelsError(f"{path}: row {i + 1}: feature {name} {_shown(value)}: expected "
                                  f"{'an' if kind == 'int' else 'a'} {kind} value or "
                                  "nothing") from None
        table[name] = pd.Series(typed, index=table.index, dtype=object)
    return table
