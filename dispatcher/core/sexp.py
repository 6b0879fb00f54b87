"""The one s-expression tokenizer of ours (everything else reads through ``sexpdata``).

Why one of our own: it is the compiler's grammar, not a general one.  The patched compiler reads
policy files (``dispatcher.build.policy_file``) and writes decision dumps and observations
with one lexical grammar: strings in double quotes whose only escapes are ``\\"``, ``\\\\``,
``\\n`` and ``\\t`` (no raw newline inside), ``;`` comments to the end of the line, and atoms
made of any other characters up to a blank, a parenthesis, a quote or a semicolon.  A policy
file must be refused here exactly where the compiler would refuse it, with its line (sexpdata
reads other escapes and other atoms); and the compiler's dumps are read for every candidate on
the master's critical path, where this reader is several times faster than sexpdata.

- ``read_sexp``: one expression as sexpdata would give it (lists, ``Symbol``, str, int): the
  decision dumps and observations.
- ``scan``: the tokens with their lines, for a reader that says where a file is wrong (the
  policy file).
- ``STRING_BODY`` and ``unescape``: a string's inside, for the regular expressions that read
  a line of a known layout without the tokenizer (overrides, observations, dump lines).
"""
from __future__ import annotations

import re
from collections.abc import Iterator

import sexpdata

#: The inside of a string as the compiler writes it: the four escapes, no raw newline.
STRING_BODY = r'[^"\\\n]*(?:\\["\\nt][^"\\\n]*)*'
# Blanks and ;-comments: a comment runs to the line's end (it must: a shorter one would let
# the rest of its line be read as an atom)
# (blanks are the compiler's four: space, tab, newline, carriage return; not Python's \s, which
# also takes a form feed or a Unicode space the compiler reads as part of an atom)
_GAP = r'(?:[ \t\n\r]|;[^\n]*(?:\n|\Z))*'
#: One token after any blanks and comments: (, ), a string's inside, or an atom.
TOKEN = re.compile(_GAP + r'(?:(\()|(\))|"(' + STRING_BODY + r')"|([^ \t\n\r()";]+))')
_END = re.compile(_GAP + r'\Z')
_GAP_ONLY = re.compile(_GAP)
_ESCAPE = re.compile(r'\\(.)')
_UNESCAPE = {'"': '"', "\\": "\\", "n": "\n", "t": "\t"}
INT_ATOM = re.compile(r"-?[0-9]+$")  #: an atom read as an int
_ANY_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')  # to say why a string is not one


class SexpSyntaxError(ValueError):
    """Text outside the grammar, at ``line`` (1-based)."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


def unescape(body: str) -> str:
    """The text of a string the compiler wrote, its escapes undone."""
    return _ESCAPE.sub(lambda e: _UNESCAPE[e.group(1)], body) if "\\" in body else body


def read_sexp(text: str):
    """One s-expression as sexpdata would read it (lists, ``Symbol``, str, int), but several
    times faster: a dump is read for every candidate, on the master's critical path.

    Only for the compiler's own output; ValueError on anything it does not write."""
    stack: list[list] = [[]]
    top = stack[0]
    symbols: dict[str, sexpdata.Symbol] = {}
    pos = 0
    match = TOKEN.match
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
            top.append(unescape(string))
        elif INT_ATOM.match(atom):
            top.append(int(atom))
        else:
            sym = symbols.get(atom)
            if sym is None:
                sym = symbols[atom] = sexpdata.Symbol(atom)
            top.append(sym)
    if not _END.match(text, pos):
        raise ValueError(f"unexpected character at offset {pos}")
    if len(stack) != 1 or len(stack[0]) != 1:
        raise ValueError("expected exactly one complete s-expression")
    return stack[0][0]


def scan(text: str) -> Iterator[tuple[str, str, int]]:
    """The tokens of ``text`` as (kind, value, line): kind ``(``, ``)``, ``string`` (its
    text, escapes undone) or ``atom``.  SexpSyntaxError at a string that is not one."""
    pos, line = 0, 1
    match = TOKEN.match
    while (m := match(text, pos)) is not None:
        line += text.count("\n", pos, m.end())  # a token holds no newline: the gap's
        pos = m.end()
        opened, closed, string, atom = m.groups()
        if opened:
            yield "(", "(", line
        elif closed:
            yield ")", ")", line
        elif string is not None:
            yield "string", unescape(string), line
        else:
            yield "atom", atom, line
    if not _END.match(text, pos):
        start = _GAP_ONLY.match(text, pos).end()  # type: ignore[union-attr]  # what follows
        line += text.count("\n", pos, start)  # the gap is a '"' that opens no string
        bad = _ANY_STRING.match(text, start)
        escape = re.search(r'\\[^nt"\\]', bad.group()) if bad else None
        raise SexpSyntaxError(line, f"invalid escape {escape.group()} in a string" if escape
                              else "unterminated string")
