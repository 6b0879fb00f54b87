"""The compiler's two s-expression files: decision dumps (read) and overrides (written).

Formats are documented in ``compiler/README.md``.  A dump is what the patched ``ocamlopt``
reports it really did for one compilation unit and round (versions 1 and 2 are read; version 2
adds each decision's features, ``Features``); an overrides file (version 1) pins decisions by
the same keys, so a tool copies a dump, flips actions, feeds it back.
"""
from __future__ import annotations

import json
import operator
import re
from collections.abc import Iterable, Sequence
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

import sexpdata

from dispatcher.core.files import (
    TextFileError,
    read_regular_bytes,
    utf8_text,
    write_text_atomic,
)
from dispatcher.core.lazy import cached
from dispatcher.core.sexp import INT_ATOM, STRING_BODY, read_sexp, unescape

FORMAT_VERSION = 1  # of the overrides file
DUMP_VERSIONS = (1, 2)  # the decision dumps this module reads
ACTIONS = ("inline", "dont_inline", "specialise")
ADVICE = ("inline", "dont_inline", "default")  # a policy's answers (compiler/README.md)
DUMP_NAME = re.compile(r"^(?P<prefix>.+)\.(?P<round>\d+)\.decisions\.sexp$")


class DecisionFileError(ValueError):
    """A dump or overrides file that does not follow the documented format."""


@dataclass(frozen=True)
class Features:
    """What the inliner knew of a call site when it decided it (dump version 2, and each
    observation of the policy channel); every field is documented in compiler/README.md,
    "Features".  The first group is always present; the second (from ``evaluation`` on) only
    where the heuristic evaluated the site's benefit, else None.  ``row()`` gives one row of
    a feature table."""

    round: int
    depth: int
    args: int
    known_args: int
    callee_size: int
    threshold: int | None  # None: no inlining budget left (the site is prevented)
    toplevel: bool
    branch_depth: int
    recursive: bool
    self_call: bool
    in_loop: bool
    in_recursive_function: bool
    via_stub: bool
    inline_attribute: str  # always | never | hint | default | (unroll N)
    inlined_attribute: str
    specialise_attribute: str  # always | never | default
    specialised_attribute: str
    evaluation: str | None = None
    size_before: int | None = None
    size_after: int | None = None
    size_after_without_subfunctions: int | None = None
    remove_call: int | None = None
    remove_alloc: int | None = None
    remove_prim: int | None = None
    remove_branch: int | None = None
    direct_call_of_indirect: int | None = None
    requested_inline: int | None = None
    evaluated_benefit: int | None = None
    lifting: bool | None = None
    accepted: bool | None = None

    def row(self) -> dict[str, Any]:
        """The features as one flat row (name -> value, None where absent)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: name -> kind (int, bool or str, from its annotation) of every feature.
_FEATURE_KINDS = {f.name: str(f.type).split(" ")[0] for f in fields(Features)}
#: The features every version-2 decision has (``threshold`` may be absent).
_REQUIRED_FEATURES = tuple(f.name for f in fields(Features)
                           if f.default is MISSING and f.name != "threshold")
_EVALUATION_KINDS = ("inline_estimate", "inline", "inline_with_subfunctions", "specialise",
                     "specialise_with_subfunctions")


_INT_TEXT = re.compile(r"-?[0-9]+\Z")
_ATTRIBUTE_TEXT = re.compile(r"(?:always|never|hint|default|\(unroll -?[0-9]+\))\Z")
# One (name value) pair of a features list as the compiler writes it, and a whole list of them.
_PAIR = r"\(([a-z_]+) (\(unroll -?[0-9]+\)|[^()\s\"]+)\)"
_FEATURE_PAIR = re.compile(_PAIR)
_FEATURES_BODY = re.compile(r"(?:\s*" + _PAIR + r")*\s*\Z")


def _feature_value(name: str, text: str, where: str) -> Any:
    """One feature's value from its text, checked against its type."""
    kind = _FEATURE_KINDS.get(name)
    if kind is None:
        raise DecisionFileError(f"{where}: features: unknown field {name}")
    if kind == "int":
        if not _INT_TEXT.match(text):
            raise DecisionFileError(f"{where}: features: {name}: expected an integer, got {text}")
        return int(text)
    if kind == "bool":
        if text not in ("true", "false"):
            raise DecisionFileError(f"{where}: features: {name}: expected true or false, "
                                    f"got {text}")
        return text == "true"
    if name == "evaluation":
        if text not in _EVALUATION_KINDS:
            raise DecisionFileError(f"{where}: features: {name}: expected one of "
                                    f"{', '.join(_EVALUATION_KINDS)}, got {text}")
        return text
    if not _ATTRIBUTE_TEXT.match(text):
        raise DecisionFileError(f"{where}: features: {name}: expected always, never, hint, "
                                f"default or (unroll N), got {text}")
    return text


def _evaluation(text: str) -> str:
    if text not in _EVALUATION_KINDS:
        raise ValueError(text)
    return text


def _attribute_text(text: str) -> str:
    if not _ATTRIBUTE_TEXT.match(text):
        raise ValueError(text)
    return text


_BOOLS = {"true": True, "false": False}
#: name -> converter of its text (ValueError or KeyError when it is not one).
_CONVERT: dict[str, Any] = {
    name: (int if kind == "int" else _BOOLS.__getitem__ if kind == "bool"
           else _evaluation if name == "evaluation" else _attribute_text)
    for name, kind in _FEATURE_KINDS.items()}


def _features(pairs: Sequence[tuple[str, str]], where: str) -> Features:
    try:
        values = {name: _CONVERT[name](text) for name, text in pairs}
    except (KeyError, ValueError):
        values = {}
    if len(values) != len(pairs):  # something is wrong: find it, for its message
        values = {}
        for name, text in pairs:
            if name in values:
                raise DecisionFileError(f"{where}: features: {name} given twice")
            values[name] = _feature_value(name, text, where)
    missing = [n for n in _REQUIRED_FEATURES if n not in values]
    if missing:
        raise DecisionFileError(f"{where}: features: missing {', '.join(missing)}")
    values.setdefault("threshold", None)
    return Features(**values)


def _text_of(value: Any) -> str:
    """A feature's value, read as an s-expression, back as the text the compiler wrote."""
    if isinstance(value, list):
        return "(" + " ".join(_text_of(v) for v in value) + ")"
    return _sym(value) or str(value)


def parse_features(items: Sequence, where: str) -> Features:
    """The fields of ``(features ...)`` (without its head), read as s-expressions, as a
    ``Features``; a one-line DecisionFileError naming ``where`` and the field otherwise."""
    pairs = []
    for item in items:
        name = _sym(item[0]) if isinstance(item, list) and len(item) == 2 else None
        if name is None:
            raise DecisionFileError(f"{where}: features: expected (name value), got "
                                    f"{_text_of(item)}")
        pairs.append((name, _text_of(item[1])))
    return _features(pairs, where)


def parse_features_text(body: str, where: str) -> Features:
    """``parse_features`` from the text between ``(features`` and its closing parenthesis:
    a dump is read for every candidate, and a regular expression reads the compiler's layout
    several times faster than the s-expression reader."""
    if _FEATURES_BODY.match(body):
        return _features(_FEATURE_PAIR.findall(body), where)
    try:
        items = read_sexp("(" + body + ")")
    except ValueError as exc:
        raise DecisionFileError(f"{where}: features: not an s-expression ({exc})") from None
    return parse_features(items, where)


@dataclass(frozen=True)
class Decision:
    """One decision the inliner took at one call site."""

    unit: str
    round: int
    key: str
    callee: str
    action: str  # inline | dont_inline | specialise
    reason: str  # heuristic | attribute | override | policy | prevented
    guard: str | None = None  # what prevented it, when reason == "prevented"
    detail: str | None = None  # the heuristic's own reason, when reason == "heuristic"
    override: str | None = None  # the action an override asked for, if any
    # Dump version 2 (None in version 1): what the inliner knew of the site; with a policy
    # channel, the policy's advice and the heuristic's own action, which it may have replaced.
    features: Features | None = None
    advice: str | None = None  # inline | dont_inline | default
    heuristic: str | None = None  # the heuristic's action, when a policy was asked

    @property
    def prevented(self) -> bool:
        return self.reason == "prevented"


@dataclass(frozen=True)
class DecisionDump:
    unit: str
    round: int
    decisions: tuple[Decision, ...]
    override_entries: int = 0
    overrides_matched: int = 0
    unmatched_keys: tuple[str, ...] = ()


@dataclass(frozen=True, order=True)
class Override:
    unit: str
    round: int
    key: str
    action: str

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"override action {self.action!r}: expected one of {ACTIONS}")

    @cached
    def line(self) -> str:
        """Its line in the canonical text (``overrides_text``), made once per object: the
        overrides of a unit a flip left alone are the same objects from one candidate to the
        next (``tree.to_overrides``)."""
        return (f"  ((unit {_quote(self.unit)}) (round {self.round}) (key {_quote(self.key)}) "
                f"(action {self.action}))")

    @cached
    def order(self) -> tuple[int, str]:
        """(round, key): its place among its unit's pins, made once per object (one sort of
        a unit's pins per candidate: ``tree.to_overrides``)."""
        return (self.round, self.key)

    @cached
    def line_json(self) -> str:
        """Its line as the inside of a JSON string (``json.dumps(line)`` less its quotes),
        made once per object: a compile key hashes the canonical text as JSON
        (``overrides_json``)."""
        return json.dumps(self.line)[1:-1]


def _sym(x) -> str | None:
    return x.value() if isinstance(x, sexpdata.Symbol) else None


def _text(x) -> str:
    if isinstance(x, sexpdata.Symbol):
        return x.value()
    if isinstance(x, (str, int)):
        return str(x)
    raise TypeError(f"expected an atom, got {x!r}")


def _flatten(items):
    for x in items:
        if isinstance(x, list):
            yield from _flatten(x)
        else:
            yield x


def _fields(items: Sequence, where: str) -> dict:
    """((name value...) ...) -> {name: [values]}."""
    out = {}
    for item in items:
        if not isinstance(item, list) or not item or _sym(item[0]) is None:
            raise DecisionFileError(f"{where}: expected (field value) pairs, got {item!r}")
        out[_sym(item[0])] = item[1:]
    return out


def _one(fields: dict, name: str, where: str):
    values = fields.get(name)
    if values is None or len(values) != 1:
        raise DecisionFileError(f"{where}: expected exactly one ({name} ...)")
    return values[0]


# A decision's features in the compiler's layout (the last field of a decision's line, no
# strings), cut out of the dump before the s-expression reader sees it and read by
# ``parse_features_text``.
_FEATURES_BLOCK = re.compile(r" \(features([^\"\n]*)\)\)\n")


# A dump in the compiler's own layout (``save_decisions`` in the patch): its head, one line per
# decision with its fields in the compiler's order, and its tail.  ``_fast_dump`` reads such a
# dump line by line without the s-expression reader (a dump is read for every candidate);
# anything else (another layout, an atom that would read as a number, an unknown field) goes
# to the general reader, which also says what is wrong.
_STR = '"(' + STRING_BODY + ')"'
_NAME = r'([A-Za-z_][^ \t\n\r()";]*)'  # an atom that reads as a symbol, not a number
_DUMP_HEAD = re.compile(
    r'\(inlining_decisions\n \(version ([0-9]+)\)\n \(unit (?:' + _STR + '|' + _NAME
    + r')\)\n \(round ([0-9]+)\)\n \(overrides \(entries ([0-9]+)\) \(matched ([0-9]+)\) '
    r'\(unmatched [0-9]+\)\n  \(unmatched_keys \(((?:"' + STRING_BODY + r'"(?: "'
    + STRING_BODY + r'")*)?)\)\)\)\n \(decisions\n')
_DUMP_LINE = re.compile(
    r'  \(\(key ' + _STR + r'\) \(callee (?:' + _STR + '|' + _NAME + r')\) \(action '
    + _NAME + r'\) \(reason (?:' + _NAME + r'|\(prevented ([^()"\n]*(?:\([^()"\n]*\))?)\))\)'
    r'(?: \(detail ' + _NAME + r'\))?(?: \(override ' + _NAME + r'\))?'
    r'(?: \(advice ' + _NAME + r'\) \(heuristic ' + _NAME + r'\))?')
# The rest of a decision's line, after ``_DUMP_LINE``: ``)`` or `` (features ...))`` without
# '"', checked with string methods in ``_fast_dump`` (the regex's scan of the features' few
# hundred characters was half of reading a dump).
_FEATURES_HEAD = " (features"
_DUMP_TAIL = re.compile(r'\n? \)\)\n?\Z')  # (an empty list of decisions has a blank line)
_GUARD_TOKEN = re.compile(r'[^ ()]+')
_STR_IN_LIST = re.compile(_STR)


@dataclass(frozen=True)
class FastHead:
    """A dump's head in the compiler's own layout, and where its decisions' lines start."""

    version: int
    unit: str
    round: int
    override_entries: int
    overrides_matched: int
    unmatched_keys: tuple[str, ...]
    end: int

    def dump(self, decisions: tuple[Decision, ...]) -> DecisionDump:
        """The dump of this head with ``decisions``."""
        return DecisionDump(unit=self.unit, round=self.round, decisions=decisions,
                            override_entries=self.override_entries,
                            overrides_matched=self.overrides_matched,
                            unmatched_keys=self.unmatched_keys)


def fast_head(text: str) -> FastHead | None:
    """The head of ``text`` if it is in the compiler's own layout with a version this reader
    knows, else None (the general reader says what is wrong)."""
    head = _DUMP_HEAD.match(text)
    if head is None:
        return None
    version_text, unit_string, unit_atom, round_text, entries, matched, keys = head.groups()
    version = int(version_text)
    if version not in DUMP_VERSIONS:
        return None
    return FastHead(version, unit_atom if unit_string is None else unescape(unit_string),
                    int(round_text), int(entries), int(matched),
                    tuple(unescape(k) for k in _STR_IN_LIST.findall(keys)), head.end())


def fast_lines(text: str, head: FastHead, pos: int, end: int, source: str,
               features: bool) -> tuple[list[Decision], int] | None:
    """The decisions of the lines of ``text`` from ``pos`` on, up to ``end`` at most, and
    where they stop (at the first line that is not a decision's); None if a line is one the
    general reader must read (it then says what is wrong)."""
    unit, round_, version = head.unit, head.round, head.version
    decisions: list[Decision] = []
    match = _DUMP_LINE.match
    while (m := match(text, pos, end)) is not None:
        stop = text.find("\n", m.end(), end)
        if stop < 0:
            break
        tail = text[m.end():stop]
        if tail == ")":
            feature_text = None
        elif tail.startswith(_FEATURES_HEAD) and tail.endswith("))") and '"' not in tail:
            feature_text = tail[len(_FEATURES_HEAD):-2]
        else:
            break
        pos = stop + 1
        (key, callee_string, callee_atom, action, reason, guard_text, detail, override,
         advice, heuristic) = m.groups()
        guard = None
        if reason is None:
            tokens = _GUARD_TOKEN.findall(guard_text)
            if not tokens or not all(t[0].isalpha() or t[0] == "_" for t in tokens):
                return None  # an empty guard, or one the general reader reads as numbers
            reason, guard = "prevented", " ".join(tokens)
        parsed = None
        if feature_text is not None:
            if version < 2:
                return None  # the general reader says what is wrong
            if features:
                parsed = parse_features_text(feature_text, f"{source}: decision {len(decisions)}")
        decisions.append(Decision(
            unit=unit, round=round_, key=unescape(key),
            callee=callee_atom if callee_string is None else unescape(callee_string),
            action=action, reason=reason, guard=guard, detail=detail, override=override,
            features=parsed, advice=advice, heuristic=heuristic))
    return decisions, pos


def fast_tail(text: str, pos: int) -> bool:
    """Whether ``text`` ends at ``pos`` as a dump in the compiler's layout ends."""
    return _DUMP_TAIL.match(text, pos) is not None


#: A block of decisions' lines as the compiler writes them, from the newline before its first:
#: that line (its key's text up to its first '/', or its end, is the group: its top-level
#: frame) and every line after it whose key starts with the same text followed by '/' or its
#: end.  The regular expression walks the lines, not Python.
_LINE_BLOCK = re.compile(r'\n  \(\(key "([^/"\n]*)[^\n]*(?:\n  \(\(key "\1[/"][^\n]*)*')


def fast_blocks(text: str, pos: int) -> list[tuple[int, int]] | None:
    """The decisions' lines from ``pos`` (a line's start) cut into blocks, (start, end) each,
    one per run of lines whose keys start with the same text up to their first '/' (their
    top-level frame: a key's ancestors share it, so a block's tree needs no other block);
    None when a top-level frame comes back after another one's block (no block may then be
    read alone).  Lines that are not a decision's stay in the block before them.  The lines
    are not checked: ``fast_lines`` reads each block, and a block it does not read to its end
    is not one."""
    blocks: list[tuple[int, int]] = []
    seen: set[str] = set()
    group: str | None = None
    start = end = pos
    for m in _LINE_BLOCK.finditer(text, pos - 1):
        first, at = m.group(1), m.start() + 1
        if group is None:
            if at != pos:
                return None  # another line first: the whole reading says what it is
            group = first
        elif first != group:
            if first in seen:
                return None
            seen.add(group)
            blocks.append((start, at))
            start, group = at, first
        end = m.end()
    if group is None:
        return []
    blocks.append((start, min(end + 1, len(text))))
    return blocks


def _fast_dump(text: str, source: str, features: bool) -> DecisionDump | None:
    """The dump of ``text`` if it is in the compiler's own layout (as the general reader
    reads it), else None."""
    head = fast_head(text)
    if head is None:
        return None
    got = fast_lines(text, head, head.end, len(text), source, features)
    if got is None or not fast_tail(text, got[1]):
        return None
    return head.dump(tuple(got[0]))


def parse_dump(text: str, source: str = "<dump>", features: bool = True) -> DecisionDump:
    """A decision dump's text -> its record; DecisionFileError (one line naming ``source``)
    if it is not one.  ``features=False``: the decisions without their features, neither read
    nor checked (a tree needs none of them)."""
    fast = _fast_dump(text, source, features)
    if fast is not None:
        return fast
    blocks: list[str] = []

    def cut(m: re.Match) -> str:
        blocks.append(m.group(1))
        return f" (features {len(blocks) - 1}))\n"

    if "(features" in text:
        text = _FEATURES_BLOCK.sub(cut, text)
    try:
        form = read_sexp(text)
    except ValueError:
        try:  # not the compiler's plain output: the general reader, and its error message
            form = sexpdata.loads(text)
        except Exception as exc:  # sexpdata raises several types
            raise DecisionFileError(f"{source}: not an s-expression ({exc})") from None
    if not isinstance(form, list) or not form or _sym(form[0]) != "inlining_decisions":
        raise DecisionFileError(f"{source}: expected (inlining_decisions ...)")
    top = _fields(form[1:], source)
    version = _one(top, "version", source)
    if version not in DUMP_VERSIONS:
        raise DecisionFileError(f"{source}: version {version}, expected one of "
                                f"{', '.join(map(str, DUMP_VERSIONS))}")
    unit = _text(_one(top, "unit", source))
    round_ = int(_one(top, "round", source))
    ov = _fields(top.get("overrides", []), f"{source}: overrides")
    decisions = []
    for i, entry in enumerate(top.get("decisions", [])):
        where = f"{source}: decision {i}"
        f = _fields(entry, where)
        reason = _one(f, "reason", where)
        guard = None
        if isinstance(reason, list):  # (prevented self_call), (prevented (not_specialised x))
            guard = " ".join(_text(g) for g in _flatten(reason[1:]))
            reason = _sym(reason[0])
        else:
            reason = _text(reason)
        parsed = None
        if "features" in f:
            if version < 2:
                raise DecisionFileError(f"{where}: features in a version {version} dump")
            value = f["features"]
            if not features:
                pass
            elif len(value) == 1 and isinstance(value[0], int) and 0 <= value[0] < len(blocks):
                parsed = parse_features_text(blocks[value[0]], where)
            else:
                parsed = parse_features(value, where)
        decisions.append(Decision(
            unit=unit, round=round_, key=_text(_one(f, "key", where)),
            callee=_text(_one(f, "callee", where)), action=_text(_one(f, "action", where)),
            reason=reason, guard=guard,
            detail=_text(f["detail"][0]) if "detail" in f else None,
            override=_text(f["override"][0]) if "override" in f else None,
            features=parsed,
            advice=_text(f["advice"][0]) if "advice" in f else None,
            heuristic=_text(f["heuristic"][0]) if "heuristic" in f else None))
    unmatched = ov.get("unmatched_keys", [[]])[0]
    return DecisionDump(
        unit=unit, round=round_, decisions=tuple(decisions),
        override_entries=int(ov.get("entries", [0])[0]),
        overrides_matched=int(ov.get("matched", [0])[0]),
        unmatched_keys=tuple(_text(k) for k in unmatched))


def read_dump(path: Path | str) -> DecisionDump:
    path = Path(path)
    return parse_dump(path.read_text(), str(path))


def read_dumps(paths: Iterable[Path | str]) -> list[DecisionDump]:
    """Dumps sorted by (unit, round), the order every consumer wants."""
    return sorted((read_dump(p) for p in paths), key=lambda d: (d.unit, d.round))


def feature_rows(dumps: Iterable[DecisionDump]) -> list[dict[str, Any]]:
    """One row per decision that has features (version-2 dumps): its unit, round, key, callee,
    action and reason, then every feature; what a feature table (``pandas.DataFrame(rows)``)
    for training is made of."""
    return [{"unit": d.unit, "round": d.round, "key": d.key, "callee": d.callee,
             "action": d.action, "reason": d.reason, **d.features.row()}
            for dump in dumps for d in dump.decisions if d.features is not None]


def dump_files(directory: Path | str) -> list[Path]:
    return sorted(p for p in Path(directory).iterdir() if DUMP_NAME.match(p.name))


_ESCAPED = re.compile(r'[\\"\n\t]')


def _quote(s: str) -> str:
    if _ESCAPED.search(s) is None:  # nearly every key: nothing to escape
        return '"' + s + '"'
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") \
        .replace("\t", "\\t") + '"'


#: ``Override``'s own order, as a tuple: several times faster to sort by than its comparisons.
_OVERRIDE_ORDER = operator.attrgetter("unit", "round", "key", "action")
_LINE = operator.attrgetter("line")


class SortedOverrides(tuple):
    """Overrides in the canonical order (unit, round, key) with one per site, as
    ``tree.to_overrides`` makes them: ``canonical_lines`` takes them as they are, neither
    sorted nor checked again.  Made only where that order is guaranteed."""

    __slots__ = ()


def canonical_lines(overrides: Iterable[Override]) -> tuple[tuple[Override, ...],
                                                          tuple[str, ...]]:
    """The overrides sorted and de-duplicated, and each one's line of the canonical text;
    ValueError for two actions at one site.  Overrides already in that order are only
    checked, not sorted again; ``SortedOverrides`` not even checked."""
    if isinstance(overrides, SortedOverrides):
        return overrides, tuple(map(_LINE, overrides))
    items = list(overrides)
    order = list(map(_OVERRIDE_ORDER, items))
    if all(a < b for a, b in zip(order, order[1:])):  # sorted, no two equal
        unique = items
    else:
        unique = sorted(set(items), key=_OVERRIDE_ORDER)
    for prev, o in zip(unique, unique[1:]):  # one site's entries are neighbours
        if (prev.unit, prev.round, prev.key) == (o.unit, o.round, o.key):
            raise ValueError(f"conflicting overrides for {o.key!r} in {o.unit} round "
                             f"{o.round}: {prev.action} and {o.action}")
    return tuple(unique), tuple(map(_LINE, unique))


_FILE_HEAD = f"(inlining_overrides (version {FORMAT_VERSION})\n (overrides\n"
_FILE_TAIL = "))\n"
_LINE_JSON = operator.attrgetter("line_json")


def overrides_file(lines: Iterable[str]) -> str:
    """The overrides file of these lines (``canonical_lines``', or a part of them)."""
    return _FILE_HEAD + "\n".join(lines) + _FILE_TAIL


def overrides_json(overrides: Iterable[Override]) -> str:
    """``json.dumps`` of the overrides file of ``overrides`` (in canonical order, as
    ``canonical_lines`` gives them), made from each one's ``line_json``: JSON escapes a text
    character by character, so the escape of a text is its pieces' escapes joined, and the
    lines of a unit a flip left alone are escaped once, not for every candidate."""
    return (json.dumps(_FILE_HEAD)[:-1] + "\\n".join(map(_LINE_JSON, overrides))
            + json.dumps(_FILE_TAIL)[1:])


def overrides_text(overrides: Iterable[Override]) -> str:
    """Canonical text: sorted, de-duplicated, so equal override sets hash equally."""
    return overrides_file(canonical_lines(overrides)[1])


def write_overrides(path: Path | str, overrides: Iterable[Override]) -> Path:
    """Write atomically (temp file then rename): readers never see half a file."""
    return write_text_atomic(Path(path), overrides_text(overrides))


#: The most entries an overrides file may hold.  The compiler's dump lists every key that
#: matched nothing, and with the default 8 MiB stack it dies of a stack overflow past about
#: 260,000 entries for one unit and round (measured, compiler/README.md); a search's files hold
#: a few thousand.  Reading 100,000 entries takes about a second on the master.
MAX_OVERRIDES = 100_000

# An overrides file in the layout ``overrides_text`` writes (sections and fields in its order,
# no comments) is read entry by entry with one regular expression, several times faster than
# the token reader; any other layout takes the general path, which also says what is wrong.
_STRING = '"(' + STRING_BODY + ')"'
_HEAD = re.compile(r'\s*\(\s*inlining_overrides\s*\(\s*version\s+' + str(FORMAT_VERSION)
                   + r'\s*\)\s*\(\s*overrides(?=[\s()])')
_ENTRY = re.compile(r'\s*\(\s*\(\s*unit\s*(?:' + _STRING + r'|\s([^\s()";]+))\s*\)\s*'
                    r'\(\s*round\s+([0-9]+)\s*\)\s*\(\s*key\s*' + _STRING + r'\s*\)\s*'
                    r'\(\s*action\s+([^\s()";]+)\s*\)\s*\)')
_TAIL = re.compile(r'\s*\)\s*\)\s*\Z')
_ENTRY_FIELDS = ("unit", "round", "key", "action")


def _atom(text: str):
    """An atom as ``read_sexp`` gives it: an int for digits, else a ``Symbol``."""
    return int(text) if INT_ATOM.match(text) else sexpdata.Symbol(text)


def _fast_entries(text: str) -> list[tuple] | None:
    """(unit string, unit atom, round, key, action) per entry of a file in the master's own
    layout; None for any other text."""
    head = _HEAD.match(text)
    if head is None:
        return None
    rows = []
    pos = head.end()
    match = _ENTRY.match
    while (m := match(text, pos)) is not None:
        rows.append(m.groups())
        pos = m.end()
    return rows if _TAIL.match(text, pos) else None


def _general_entries(text: str, source: str) -> list:
    """The entries of any well-formed overrides file, each as its s-expression."""
    try:
        form = read_sexp(text)
    except ValueError:
        try:  # not in the compiler's syntax: the general reader, and its error message
            form = sexpdata.loads(text)
        except Exception as exc:  # sexpdata raises several types
            raise DecisionFileError(f"{source}: not a valid s-expression ({exc})") from None
    if not isinstance(form, list) or not form or _sym(form[0]) != "inlining_overrides":
        raise DecisionFileError(
            f"{source}: expected (inlining_overrides (version 1) (overrides ...))")
    sections = {}
    for section in form[1:]:
        name = _sym(section[0]) if isinstance(section, list) and section else None
        if name not in ("version", "overrides"):
            raise DecisionFileError(f"{source}: expected (version {FORMAT_VERSION}) and "
                                    f"(overrides ...), got {sexpdata.dumps(section)[:60]}")
        if name in sections:
            raise DecisionFileError(f"{source}: ({name} ...) given twice")
        sections[name] = section[1:]
    if sections.get("version") != [FORMAT_VERSION]:
        raise DecisionFileError(f"{source}: expected (version {FORMAT_VERSION})")
    if "overrides" not in sections:
        raise DecisionFileError(f"{source}: missing (overrides ...)")
    return sections["overrides"]


def _entry_fields(entry, where: str) -> dict:
    """An entry's s-expression as {field: value}, each of the four fields at most once."""
    if not isinstance(entry, list):
        raise DecisionFileError(f"{where}: expected ((unit U) (round N) (key K) (action A))")
    fields = {}
    for item in entry:
        if not isinstance(item, list) or len(item) != 2 or _sym(item[0]) is None:
            raise DecisionFileError(f"{where}: expected (field value) pairs, got "
                                    f"{sexpdata.dumps(item)[:60]}")
        name = _sym(item[0])
        if name not in _ENTRY_FIELDS:
            raise DecisionFileError(f"{where}: unknown field {name} (expected one of "
                                    f"{', '.join(_ENTRY_FIELDS)})")
        if name in fields:
            raise DecisionFileError(f"{where}: field {name} given twice")
        fields[name] = item[1]
    return fields


def _number(value) -> bool:
    """An atom that reads as a number (sexpdata makes ints and floats of them)."""
    if isinstance(value, sexpdata.Symbol):
        value = value.value()
        try:
            float(value)
        except ValueError:
            return False
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _describe(value) -> str:
    if isinstance(value, list):
        return "a list"
    if _number(value):
        return f"the number {value.value() if isinstance(value, sexpdata.Symbol) else value}"
    if isinstance(value, sexpdata.Symbol):
        return f"the atom {value.value()}"
    return f"the string {value!r}"


def _entry(fields: dict, where: str) -> Override:
    """One entry's fields checked as the compiler checks them, and more strictly in two ways:
    a key must be a quoted string (every real key holds parentheses, which an atom cannot) and
    a unit a name, not a number."""
    for name in _ENTRY_FIELDS:
        if name not in fields:
            raise DecisionFileError(f"{where}: missing field ({name} ...)")
    unit, round_, key, action = (fields[n] for n in _ENTRY_FIELDS)
    if _number(unit) or not isinstance(unit, (str, sexpdata.Symbol)) or unit == "":
        raise DecisionFileError(f"{where}: unit: expected a module name (an atom or a string), "
                                f"got {_describe(unit)}")
    if (not isinstance(round_, int) or isinstance(round_, bool)
            or not 0 <= round_ < 10 ** 8):  # the compiler reads at most 8 digits
        raise DecisionFileError(f"{where}: round: expected a non-negative integer, "
                                f"got {_describe(round_)}")
    if not isinstance(key, str) or isinstance(key, sexpdata.Symbol) or not key:
        raise DecisionFileError(f"{where}: key: expected a call-site key in double quotes, "
                                f"got {_describe(key)}")
    if _sym(action) not in ACTIONS:
        raise DecisionFileError(f"{where}: action: expected one of {', '.join(ACTIONS)}, "
                                f"got {_describe(action)}")
    return Override(unit=unit.value() if isinstance(unit, sexpdata.Symbol) else unit,
                    round=round_, key=key, action=action.value())


def parse_overrides(text: str, source: str = "<overrides>") -> list[Override]:
    """Read an overrides file, with a one-line error naming the file (and the entry, counted
    from 0) for anything malformed, conflicting or too large.

    The compiler checks the same things with line and column; this lets the master refuse a
    bad file before it starts compiling anything.  Entries come back in file order, an entry
    repeated with the same action included.
    """
    rows = _fast_entries(text)
    entries: list = rows if rows is not None else _general_entries(text, source)
    if len(entries) > MAX_OVERRIDES:
        raise DecisionFileError(f"{source}: {len(entries):,} override entries, more than the "
                                f"limit of {MAX_OVERRIDES:,} (compiler/README.md)")
    out = []
    seen: dict[tuple[str, int, str], tuple[int, str]] = {}
    for i, entry in enumerate(entries):
        if rows is not None:
            unit_string, unit_atom, round_, key, action = entry
            unit = unit_atom if unit_string is None else unescape(unit_string)
            key = unescape(key)
            if (unit and key and action in ACTIONS and len(round_) <= 8
                    and (unit_atom is None or unit_atom[0].isalpha())):
                o = Override(unit, int(round_), key, action)
            else:  # the general check, for its message
                o = _entry({"unit": unit if unit_atom is None else _atom(unit_atom),
                            "round": int(round_), "key": key, "action": _atom(action)},
                           f"{source}: override {i}")
        else:
            o = _entry(_entry_fields(entry, f"{source}: override {i}"),
                       f"{source}: override {i}")
        first = seen.setdefault((o.unit, o.round, o.key), (i, o.action))
        if first[1] != o.action:
            raise DecisionFileError(
                f"{source}: override {i}: conflicting actions for key {o.key!r} in unit "
                f"{o.unit} round {o.round}: {o.action} here, {first[1]} in override {first[0]}")
        out.append(o)
    return out


#: The most bytes an overrides file may have: MAX_OVERRIDES entries of keys up to about 2 KB
#: each.  A FIFO, a device or a directory is refused without being waited on or read.
MAX_OVERRIDES_BYTES = 256 * 1024 * 1024


def read_overrides(path: Path | str) -> list[Override]:
    path = Path(path)
    try:
        text = utf8_text(read_regular_bytes(path, MAX_OVERRIDES_BYTES), path)
    except FileNotFoundError:
        raise DecisionFileError(f"{path}: cannot read (No such file or directory)") from None
    except TextFileError as exc:
        raise DecisionFileError(str(exc)) from None
    return parse_overrides(text, str(path))


_SITE = re.compile(r"@([^@()/]+:\d+:\d+-\d+)\)\Z")  # ...@file:line:start-end)


def site_location(key: str) -> str | None:
    """The source location (``file:line:start-end``) of a key's call site, its last
    segment (the innermost of an inlined chain ``main.ml:1:9-53>stdlib.ml:489:18-56``): the
    same in every unit that has a copy of that code (inlined into it)."""
    m = _SITE.search(key)
    return m.group(1).rsplit(">", 1)[-1] if m else None


@dataclass(frozen=True)
class OverrideReach:
    """What a build's overrides did not reach: entries that matched no call site (the
    compiler's dumps list them as unmatched), and entries whose site's code was also
    copied into another unit (inlined there) and decided again there, otherwise than the
    override asks: the override did not reach the copy that runs."""

    unmatched: tuple[Override, ...]
    elsewhere: tuple[tuple[Override, Decision], ...]

    def line(self, source: object) -> str | None:
        """One line naming ``source`` (the overrides file) with the counts and the first
        keys; None when every override reached its code."""
        parts = []
        if self.unmatched:
            first = ", ".join(f"{o.unit} round {o.round} {o.key}" for o in self.unmatched[:3])
            parts.append(f"{len(self.unmatched)} override(s) matched no call site "
                         f"(first: {first})")
        if self.elsewhere:
            first = ", ".join(f"{o.unit} round {o.round} {o.key} ({o.action}): "
                              f"{d.action} in {d.unit} round {d.round}"
                              for o, d in self.elsewhere[:2])
            parts.append(f"{len(self.elsewhere)} overridden site(s) whose code was inlined "
                         f"into another unit and decided again there (first: {first})")
        if not parts:
            return None
        return f"warning: {source}: " + "; ".join(parts)


def override_reach(overrides: Iterable[Override],
                   dumps: Iterable[DecisionDump]) -> OverrideReach:
    """Which of ``overrides`` the build whose decision ``dumps`` these are did not reach."""
    dumps = list(dumps)
    unmatched_keys = {(d.unit, d.round): set(d.unmatched_keys) for d in dumps}
    by_location: dict[str, list[Decision]] = {}
    for dump in dumps:
        for d in dump.decisions:
            loc = site_location(d.key)
            if loc is not None:
                by_location.setdefault(loc, []).append(d)
    unmatched, elsewhere = [], []
    for o in overrides:
        if o.key in unmatched_keys.get((o.unit, o.round), ()):
            unmatched.append(o)
            continue
        loc = site_location(o.key)
        copies = by_location.get(loc, []) if loc is not None else []
        copy = next((d for d in copies if d.unit != o.unit and d.action != o.action), None)
        if copy is not None:
            elsewhere.append((o, copy))
    return OverrideReach(tuple(unmatched), tuple(elsewhere))
