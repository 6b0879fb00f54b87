"""The compiler's two s-expression files: decision dumps (read) and overrides (written).

Formats are documented in ``compiler/README.md``; both are version 1.  A dump is what the
patched ``ocamlopt`` reports it really did for one compilation unit and round; an overrides
file pins decisions by the same keys, so a tool copies a dump, flips actions, feeds it back.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sexpdata

from dispatcher.files import write_text_atomic

FORMAT_VERSION = 1
ACTIONS = ("inline", "dont_inline", "specialise")
DUMP_NAME = re.compile(r"^(?P<prefix>.+)\.(?P<round>\d+)\.decisions\.sexp$")


class DecisionFileError(ValueError):
    """A dump or overrides file that does not follow the documented format."""


@dataclass(frozen=True)
class Decision:
    """One decision the inliner took at one call site."""

    unit: str
    round: int
    key: str
    callee: str
    action: str  # inline | dont_inline | specialise
    reason: str  # heuristic | attribute | override | prevented
    guard: str | None = None  # what prevented it, when reason == "prevented"
    detail: str | None = None  # the heuristic's own reason, when reason == "heuristic"
    override: str | None = None  # the action an override asked for, if any

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


# The compiler's writer (``sexp_string`` in the patch) escapes only these four characters.
_GAP = r'(?:\s|;[^\n]*(?:\n|\Z))*'  # blanks and ;-comments (a comment runs to the line's end)
_TOKEN = re.compile(_GAP + r'(?:(\()|(\))|"((?:[^"\\]|\\["\\nt])*)"|([^\s()";]+))')
_SPACE = re.compile(_GAP + r'\Z')
_ESCAPE = re.compile(r'\\(.)')
_UNESCAPE = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
_INT = re.compile(r"-?[0-9]+$")


def read_sexp(text: str):
    """One s-expression as sexpdata would read it (lists, ``Symbol``, str, int), but several
    times faster: a dump is read for every candidate, on the master's critical path.

    Only for the compiler's own output; ValueError on anything it does not write."""
    stack: list[list] = [[]]
    top = stack[0]
    symbols: dict[str, sexpdata.Symbol] = {}
    pos = 0
    match = _TOKEN.match
    while (m := match(text, pos)) is not None:
        pos = m.end()
        opened, closed, string, atom = m.groups()
        if opened:
            top = []
            stack.append(top)
        elif closed:
            if len(stack) == 1:
                raise ValueError(f"unbalanced ')' before offset {pos}")
            done = stack.pop()
            top = stack[-1]
            top.append(done)
        elif string is not None:
            top.append(_ESCAPE.sub(lambda e: _UNESCAPE[e.group(1)], string)
                       if "\\" in string else string)
        elif _INT.match(atom):
            top.append(int(atom))
        else:
            sym = symbols.get(atom)
            if sym is None:
                sym = symbols[atom] = sexpdata.Symbol(atom)
            top.append(sym)
    if not _SPACE.match(text, pos):
        raise ValueError(f"unexpected character at offset {pos}")
    if len(stack) != 1 or len(stack[0]) != 1:
        raise ValueError("expected exactly one complete s-expression")
    return stack[0][0]


def parse_dump(text: str, source: str = "<dump>") -> DecisionDump:
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
    if version != FORMAT_VERSION:
        raise DecisionFileError(f"{source}: version {version}, expected {FORMAT_VERSION}")
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
        decisions.append(Decision(
            unit=unit, round=round_, key=_text(_one(f, "key", where)),
            callee=_text(_one(f, "callee", where)), action=_text(_one(f, "action", where)),
            reason=reason, guard=guard,
            detail=_text(f["detail"][0]) if "detail" in f else None,
            override=_text(f["override"][0]) if "override" in f else None))
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


def dump_files(directory: Path | str) -> list[Path]:
    return sorted(p for p in Path(directory).iterdir() if DUMP_NAME.match(p.name))


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") \
        .replace("\t", "\\t") + '"'


def overrides_text(overrides: Iterable[Override]) -> str:
    """Canonical text: sorted, de-duplicated, so equal override sets hash equally."""
    unique = sorted(set(overrides))
    seen: dict[tuple[str, int, str], str] = {}
    for o in unique:
        prev = seen.setdefault((o.unit, o.round, o.key), o.action)
        if prev != o.action:
            raise ValueError(f"conflicting overrides for {o.key!r} in {o.unit} round {o.round}: "
                             f"{prev} and {o.action}")
    lines = [f"  ((unit {_quote(o.unit)}) (round {o.round}) (key {_quote(o.key)}) "
             f"(action {o.action}))" for o in unique]
    body = "\n".join(lines)
    return f"(inlining_overrides (version {FORMAT_VERSION})\n (overrides\n{body}))\n"


def write_overrides(path: Path | str, overrides: Iterable[Override]) -> Path:
    """Write atomically (temp file then rename): readers never see half a file."""
    return write_text_atomic(Path(path), overrides_text(overrides))


def parse_overrides(text: str, source: str = "<overrides>") -> list[Override]:
    """Read an overrides file, with a one-line error naming the file for anything malformed.

    The compiler checks the same things with line and column; this lets the master refuse a
    bad file before it starts compiling anything.
    """
    try:
        form = sexpdata.loads(text)
    except Exception as exc:
        raise DecisionFileError(f"{source}: not a valid s-expression ({exc})") from None
    if not isinstance(form, list) or not form or _sym(form[0]) != "inlining_overrides":
        raise DecisionFileError(
            f"{source}: expected (inlining_overrides (version 1) (overrides ...))")
    sections = _fields(form[1:], source)
    if sections.get("version") != [FORMAT_VERSION]:
        raise DecisionFileError(f"{source}: expected (version {FORMAT_VERSION})")
    if "overrides" not in sections:
        raise DecisionFileError(f"{source}: missing (overrides ...)")
    out = []
    for i, entry in enumerate(sections["overrides"]):
        where = f"{source}: override {i}"
        if not isinstance(entry, list):
            raise DecisionFileError(f"{where}: expected ((unit U) (round N) (key K) (action A))")
        f = _fields(entry, where)
        unknown = set(f) - {"unit", "round", "key", "action"}
        if unknown:
            raise DecisionFileError(f"{where}: unknown field {sorted(unknown)[0]}")
        try:
            round_ = _one(f, "round", where)
            if not isinstance(round_, int) or isinstance(round_, bool) or round_ < 0:
                raise DecisionFileError(f"{where}: round: expected a non-negative integer")
            out.append(Override(unit=_text(_one(f, "unit", where)), round=round_,
                                key=_text(_one(f, "key", where)),
                                action=_text(_one(f, "action", where))))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, DecisionFileError):
                raise
            raise DecisionFileError(f"{where}: {exc}") from None
    return out


def read_overrides(path: Path | str) -> list[Override]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise DecisionFileError(f"{path}: cannot read ({exc.strerror})") from None
    return parse_overrides(text, str(path))
