"""Reading overrides files: every bad file is refused in one line naming the file and entry."""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from dispatcher.build.manifest import resolve_benchmark
from dispatcher.build.service import CompileJob, CompileService
from dispatcher.core import decisions
from dispatcher.core.decisions import (
    MAX_OVERRIDES,
    DecisionFileError,
    Override,
    overrides_text,
    parse_overrides,
    read_overrides,
)
from dispatcher.storage.store import Store

GOLDEN = Path(__file__).resolve().parent / "golden"
HEAD = "(inlining_overrides (version 1)\n (overrides\n"
KEY = "D(Main.run@main.ml:4:8-134)/C(Main.helper@main.ml:7:18-26)"


def entries(*lines: str) -> str:
    return HEAD + "\n".join(lines) + "))\n"


def refused(text: str | bytes, tmp_path: Path, name: str = "ov.sexp") -> str:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(DecisionFileError) as err:
        read_overrides(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message[len(f"{path}: "):]


def golden_overrides() -> list[Path]:
    files = sorted(GOLDEN.glob("rundir-*/steps/*/*/overrides.sexp"))
    assert files
    return files


def test_search_files_read_the_same_in_any_layout():
    """The master's own layout takes a fast path; any other layout (comments, fields in
    another order) the general reader.  Both must give the same entries."""
    for path in golden_overrides():
        canonical = read_overrides(path)
        assert canonical and overrides_text(canonical) == path.read_text()
        text = path.read_text()
        reordered = re.sub(r"\(\(unit (\S+)\) \(round (\d+)\) \(key (\"(?:[^\"\\]|\\.)*\")\) "
                           r"\(action (\w+)\)\)",
                           r"((action \4) ; pinned\n ( key \3)(round \2)(unit \1))", text)
        assert reordered != text
        assert parse_overrides("; written by hand\n" + reordered) == canonical


@pytest.mark.parametrize("key", ['C(a"b)', "C(a\\b)", "C(a\nb)", "C(a\tb)", "C(a\\\"b)"])
def test_escaped_keys_round_trip_on_both_paths(key):
    pins = [Override("Main", 0, key, "inline")]
    text = overrides_text(pins)
    assert parse_overrides(text) == pins
    assert parse_overrides("; comment\n" + text) == pins


def test_conflicting_entries_are_refused_naming_both(tmp_path):
    message = refused(entries(f'((unit Main) (round 0) (key "{KEY}") (action inline))',
                              '((unit Main) (round 1) (key "C(x)") (action inline))',
                              f'((unit Main) (round 0) (key "{KEY}") (action dont_inline))'),
                      tmp_path)
    assert message == (f"override 2: conflicting actions for key {KEY!r} in unit Main round 0: "
                       "dont_inline here, inline in override 0")


def test_repeated_entries_that_agree_are_kept():
    pin = f'((unit Main) (round 0) (key "{KEY}") (action inline))'
    assert parse_overrides(entries(pin, pin)) == [Override("Main", 0, KEY, "inline")] * 2


@pytest.mark.parametrize("data, reason, line", [
    (b'(inlining_overrides (version 1) (overrides\n((unit Main) (round 0) (key "C(\xff)") '
     b'(action inline))))\n', "invalid start byte", 2),  # a key
    (b"\xfe\xff(inlining_overrides (version 1) (overrides))\n", "invalid start byte", 1),
    (b'; caf\xe9\n(inlining_overrides (version 1) (overrides))\n', "invalid continuation byte",
     1),  # Latin-1 in a comment
])
def test_text_that_is_not_utf8_is_refused_naming_where(tmp_path, data, reason, line):
    at = next(i for i, b in enumerate(data) if b > 127)
    assert refused(data, tmp_path) == f"expected UTF-8 text ({reason} at byte {at}, line {line})"


@pytest.mark.parametrize("field, message", [
    ("(key 123)", "key: expected a call-site key in double quotes, got the number 123"),
    ("(key 1.5)", "key: expected a call-site key in double quotes, got the number 1.5"),
    ("(key -7e3)", "key: expected a call-site key in double quotes, got the number -7e3"),
    ("(key foo)", "key: expected a call-site key in double quotes, got the atom foo"),
    ('(key "")', "key: expected a call-site key in double quotes, got the string ''"),
    ("(unit 42)", "unit: expected a module name (an atom or a string), got the number 42"),
    ("(round -1)", "round: expected a non-negative integer, got the number -1"),
    ("(round 123456789)", "round: expected a non-negative integer, got the number 123456789"),
    ('(action "inline")', "action: expected one of inline, dont_inline, specialise, got the "
     "string 'inline'"),
])
@pytest.mark.parametrize("layout", ["master", "by hand"])
def test_a_wrong_value_is_refused_naming_the_entry(tmp_path, field, message, layout):
    """In the master's layout (fast path) and in another one (general reader) alike."""
    values = {"unit": "(unit Main)", "round": "(round 0)", "key": f'(key "{KEY}")',
              "action": "(action inline)"}
    values[field[1:].split()[0]] = field
    fields = [values[n] for n in ("unit", "round", "key", "action")]
    if layout == "by hand":
        fields.reverse()
    good = f'((unit Main) (round 0) (key "{KEY}") (action inline))'
    assert refused(entries(good, f"({' '.join(fields)})"), tmp_path) == f"override 1: {message}"


@pytest.mark.parametrize("entry, message", [
    ('((unit Main) (unit Util) (round 0) (key "C(x)") (action inline))',
     "override 0: field unit given twice"),
    ('((unit Main) (round 0) (key "C(x)") (action inline) (why not))',
     "override 0: unknown field why (expected one of unit, round, key, action)"),
    ('((unit Main) (round 0) (action inline))', "override 0: missing field (key ...)"),
])
def test_malformed_entries_are_refused(tmp_path, entry, message):
    assert refused(entries(entry), tmp_path) == message


def test_a_second_overrides_section_is_refused(tmp_path):
    """The compiler refuses it; the master must not read only one of them."""
    text = HEAD + '((unit Main) (round 0) (key "C(x)") (action inline)))\n (overrides))\n'
    assert refused(text, tmp_path) == "(overrides ...) given twice"


def _many(n: int) -> str:
    """``n`` distinct entries, all for one unit and round: the compiler's worst case."""
    return overrides_text(Override("Main", 0, f"{KEY}/I/C(Main.f@main.ml:{i}:0-9)", "inline")
                          for i in range(n))


def test_more_entries_than_the_limit_are_refused_quickly(tmp_path):
    text = _many(MAX_OVERRIDES + 1)
    t0 = time.perf_counter()
    assert refused(text, tmp_path) == (f"{MAX_OVERRIDES + 1:,} override entries, more than "
                                       f"the limit of {MAX_OVERRIDES:,} (compiler/README.md)")
    assert time.perf_counter() - t0 < 20  # about 0.4 s here; sexpdata took 23 s for 300,000


def test_the_limit_holds_for_files_laid_out_by_hand(tmp_path, monkeypatch):
    monkeypatch.setattr(decisions, "MAX_OVERRIDES", 3)
    text = "; by hand\n" + _many(4)
    assert refused(text, tmp_path) == "4 override entries, more than the limit of 3 " \
        "(compiler/README.md)"
    assert len(parse_overrides("; by hand\n" + _many(3))) == 3


def test_a_file_at_the_limit_compiles(compiler, tmp_path):
    """The limit holds with margin: a file of MAX_OVERRIDES entries that match nothing, all
    for one unit and round (the dump lists them all), compiles; the compiler died of a stack
    overflow near 260,000 such entries."""
    path = tmp_path / "limit.sexp"
    path.write_text(_many(MAX_OVERRIDES))
    t0 = time.perf_counter()
    pins = tuple(read_overrides(path))
    read_s = time.perf_counter() - t0
    assert len(pins) == MAX_OVERRIDES and read_s < 20  # about 0.7 s here
    service = CompileService(Store(tmp_path / "store"), compiler)
    try:
        compiled = service.compile(CompileJob(resolve_benchmark("kahan"), pins))
    finally:
        service.close()
    (main0,) = [d for d in compiled.artifact.dumps()
                if (d.unit, d.round) == ("Main", 0)]
    assert main0.override_entries == MAX_OVERRIDES
    assert len(main0.unmatched_keys) == MAX_OVERRIDES


def test_a_compile_key_made_from_the_lines_escapes_is_the_key_of_the_whole_text():
    """``compile_key`` hashes the identity's JSON; given the overrides' JSON made from each
    line's own escape (``overrides_json``), it is the same key, for keys with quotes,
    backslashes, tabs, control and non-ASCII characters, with a policy or not, and for no
    overrides at all."""
    import hashlib
    import json

    from dispatcher.core.decisions import canonical_lines, overrides_json
    from dispatcher.storage.store import compile_key

    odd = [Override("M\u00e9\"x", 0, 'D(a\\b"c@f.ml:1)/C(\u00e9\U0001F600\t@x)', "inline"),
           Override("M", 1, "k\x7f\x01\n", "dont_inline"), Override("M", 0, KEY, "inline")]
    for overrides in (odd, odd[2:], []):
        unique, _ = canonical_lines(overrides)
        text = overrides_text(overrides)
        assert overrides_json(unique) == json.dumps(text)
        for policy in (None, "policy-identity"):
            identity = {"compiler": "c\u00e9", "sources": "s", "flags": ["-O3", "-inline", "200"],
                        "overrides": text, **({"policy": policy} if policy else {})}
            whole = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
            args = ("c\u00e9", "s", ("-O3", "-inline", "200"), text, policy)
            assert compile_key(*args) == whole == compile_key(*args, overrides_json(unique))
