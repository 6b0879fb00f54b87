"""dispatcher.core.sexp: the one tokenizer of ours, the compiler's grammar (its reason is in its
docstring).  ``read_sexp`` reads what sexpdata reads, for the compiler's output; ``scan`` says
where a file leaves the grammar."""
from __future__ import annotations

import pytest
import sexpdata

from dispatcher.core.sexp import SexpSyntaxError, read_sexp, scan, unescape


@pytest.mark.parametrize("text", [
    '(inlining_decisions (version 3) (unit "Main") (round 0))',
    '(a (b "c\\n\\"d\\\\") -12 x.y ; a comment\n e)',
    '((key "C(Main.f@main.ml:1:2-3)") (action inline))',
])
def test_read_sexp_reads_what_sexpdata_reads(text):
    assert read_sexp(text) == sexpdata.loads(text)


def test_a_comment_runs_to_the_end_of_its_line():
    assert list(scan("; only\n")) == []
    assert list(scan("(a ; b c\n d)")) == [("(", "(", 1), ("atom", "a", 1), ("atom", "d", 2),
                                            (")", ")", 2)]


def test_scan_gives_strings_their_text_and_tokens_their_line():
    got = list(scan('(x\n "a\\\\b\\t" 1.5)'))
    assert got == [("(", "(", 1), ("atom", "x", 1), ("string", "a\\b\t", 2),
                   ("atom", "1.5", 2), (")", ")", 2)]
    assert unescape('q\\"\\n') == 'q"\n'


@pytest.mark.parametrize("text, line, message", [
    ('(a\n\n "a\\qb")', 3, "invalid escape \\q in a string"),
    ('(a\n "abc', 2, "unterminated string"),
    ('(a "x\ny")', 1, "unterminated string"),  # no raw newline inside a string
])
def test_scan_says_where_a_string_is_not_one(text, line, message):
    with pytest.raises(SexpSyntaxError) as err:
        list(scan(text))
    assert err.value.line == line and str(err.value) == message
