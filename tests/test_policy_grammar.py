"""One grammar for policy files, enforced alike by the compiler and by Python.

A differential test: real policy files (the committed ones of ``results/``, one per model kind
but the constant, and the constant always-inline file) are mutated in a few hundred ways,
targeted (quoted keywords, margins out of 0..1, negative counts, columns naming no feature of
the compiler, a garbage training section, tree indices out of range or pointing back, deep
nesting, truncation, a file over the size bound, bytes that are not UTF-8, numbers and blanks
the other reader might take) and random (a token replaced by another), and each mutation is
read by both readers: ``dispatcher.build.policy_file.decode_policy_file`` and the compiler's
``-inlining-policy`` on a one-line unit.  Both must accept and refuse the same files, each
refusal one line naming the file (the compiler's with exit status 2), and where a mutation
targets a field, both lines name it.  Then the command's side: a FIFO, a directory and a
device named as a ``.policy`` are one line from ``run-benchmark --policy`` (exit 2) and from
the compiler, without waiting on them or reading them without end."""
from __future__ import annotations

import dataclasses
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dispatcher.build.policies import ALWAYS_INLINE_FILE
from dispatcher.build.policy_file import (
    MAX_POLICY_BYTES,
    MAX_POLICY_DEPTH,
    PolicyFileError,
    decode_policy_file,
    policy_bytes,
    read_policy_file,
)
from dispatcher.core.decisions import read_dump

ROOT = Path(__file__).resolve().parent.parent
#: Real policy files: what train-policy wrote for the committed results (an MLP, a logistic
#: model, boosted trees), and the constant file always-inline compiles with.
REAL = {
    "mlp": (ROOT / "results" / "policy.policy").read_bytes(),
    "logistic": (ROOT / "results" / "post-hoc" / "logistic" / "logistic.policy").read_bytes(),
    "boosted": (ROOT / "results" / "first-labels" / "policy-evaluation" /
                "policy.policy").read_bytes(),
    "constant": ALWAYS_INLINE_FILE,
    # format version 2: the searched policy with growth discounts
    "discounted": policy_bytes(dataclasses.replace(
        read_policy_file(ROOT / "results" / "searched-policy" / "searched.policy"),
        growth_discount=(("direct_call_of_indirect", 0.5), ("in_loop", 1.25)))),
}
KEYWORDS = ("inlining_policy", "version", "classifier", "training", "benchmarks", "sites",
            "table_sha256", "threshold", "guards", "margin", "ranges", "growth_budget",
            "growth_discount",
            "classes", "columns", "column", "model", "linear", "mean", "scale",
            "coefficients", "intercepts", "mlp", "activation", "layer", "weights", "biases",
            "trees", "baseline", "tree", "leaf", "split", "constant")


def _sub(text: str, pattern: str, repl: str, count: int = 1) -> str:
    out, n = re.subn(pattern, repl, text, count=count)
    assert n, (pattern, text[:200])
    return out


def _targeted() -> list[tuple[str, bytes, str | None]]:
    """(name, bytes, a word both refusals must contain or None) for each targeted mutation."""
    cases: list[tuple[str, bytes, str | None]] = []

    def add(name: str, text: str | bytes, field: str | None = None) -> None:
        cases.append((name, text.encode() if isinstance(text, str) else text, field))

    for kind, data in REAL.items():
        text = data.decode()
        add(f"{kind}: as written", text)
        # every keyword in double quotes, one at a time (where the file has it)
        for word in KEYWORDS:
            if re.search(rf"\({word}\b", text):
                add(f"{kind}: quoted ({word}", _sub(text, rf"\({word}\b", f'("{word}"'))
        add(f"{kind}: quoted class", _sub(text, r"\(classes (\w+)", r'(classes "\1"'))
        add(f"{kind}: quoted classifier", _sub(text, r"\(classifier (\w+)",
                                               r'(classifier "\1"'))
        add(f"{kind}: quoted ranges", _sub(text, r"\(ranges (\w+)", r'(ranges "\1"'))
        add(f"{kind}: quoted version", _sub(text, r"\(version (\d)\)", r'(version "\1")'))
        # the guard rails
        for margin, ok in (("-5", False), ("7", False), ("1.0000001", False), ("-0.0", True),
                           ("0", True), ("1", True), ("1e0", True), (".5", True),
                           ("5.", False), ("+0.5", False), ("nan", False), ("inf", False),
                           ("1e400", False), ("1e-400", True), ("0x1", False),
                           ("0.2 0.3", False), ("(0.2)", False)):
            add(f"{kind}: margin {margin}", _sub(text, r"\(margin [^)]*\)",
                                                   f"(margin {margin})"),
                None if ok else "margin")
        for budget in ("0", "-1", "1", "999999999", "1000000000", "none", '"none"', "007",
                       "1.5", "None"):
            add(f"{kind}: growth_budget {budget}",
                _sub(text, r"\(growth_budget [^)]*\)", f"(growth_budget {budget})"))
        for ranges in ("maybe", "True", "1", "()"):
            add(f"{kind}: ranges {ranges}", _sub(text, r"\(ranges \w+\)", f"(ranges {ranges})"),
                "ranges")
        for threshold, ok in (("-0.01", False), ("0", True), ("-0.0", True), ("1e308", True),
                              ("1e309", False), ("junk", False)):
            add(f"{kind}: threshold {threshold}",
                _sub(text, r"\(threshold [^)]*\)", f"(threshold {threshold})"),
                None if ok else "threshold")
        # the training identity
        training = re.search(r"\(training .*\)\)\n", text)
        assert training, kind
        head, tail = text[:training.start()], text[training.end():]
        for garbage, field in (("(training garbage)", "training"), ("(training)", "training"),
                               ("(training (sites 3) (table_sha256 \"\"))", "benchmarks"),
                               ("(training (benchmarks a b) (sites 3) (table_sha256 \"\"))",
                                "benchmarks"),
                               ('(training (benchmarks "a" "a") (sites 3) (table_sha256 ""))',
                                "benchmarks"),
                               ('(training (benchmarks "") (sites 3) (table_sha256 ""))',
                                "benchmarks"),
                               ('(training (benchmarks) (sites 0) (table_sha256 ""))', None),
                               ('(training (benchmarks "a\\tb") (sites 0) (table_sha256 ""))',
                                None),
                               ('(training (benchmarks "a") (sites -1) (table_sha256 ""))',
                                "sites"),
                               ('(training (benchmarks "a") (sites 1000000000) '
                                '(table_sha256 ""))', "sites"),
                               ('(training (benchmarks "a") (sites 999999999) '
                                '(table_sha256 ""))', None),
                               ('(training (benchmarks "a") (sites "12") (table_sha256 ""))',
                                "sites"),
                               ('(training (benchmarks "a") (sites 1.0) (table_sha256 ""))',
                                "sites"),
                               ('(training (benchmarks "a") (sites 3) (table_sha256 "'
                                + "A" * 64 + '"))', "table_sha256"),
                               ('(training (benchmarks "a") (sites 3) (table_sha256 "'
                                + "a" * 63 + '"))', "table_sha256"),
                               ('(training (benchmarks "a") (sites 3) (table_sha256 '
                                + "a" * 64 + '))', "table_sha256"),
                               ('(training (benchmarks "a") (sites 3) (table_sha256 "'
                                + "0" * 64 + '"))', None),
                               ('(training (benchmarks "a") (sites 3) (table_sha256 "") '
                                '(extra 1))', "training"),
                               ('(training (benchmarks "a") (sites 3) (sites 3) '
                                '(table_sha256 ""))', "sites")):
            add(f"{kind}: {garbage}", head + garbage + "\n" + tail, field)
        # column names
        if '(column "' in text:
            col = re.search(r'\(column "([^"]*)"', text)
            assert col
            for name, ok in (("depthx", False), ("round", False), ("DEPTH", False),
                             ("depth\\n", False), ("depth=3", False), ("d\u00e9pth", False),
                             ("inline_attribute", False),
                             ("inline_attribute=sometimes", False),
                             ("inline_attribute=(unroll 3)", True),
                             ("inline_attribute=(unroll -3)", True),
                             ("inline_attribute=(unroll )", False),
                             ("specialise_attribute=hint", False),
                             ("inlined_attribute=hint", True), ("evaluation=inline", True),
                             ("evaluation=inlined", False), ("lifting", True),
                             ("size_after_without_subfunctions", True), ("", False)):
                add(f"{kind}: column {name!r}",
                    text.replace(f'(column "{col.group(1)}"', f'(column "{name}"', 1),
                    None if ok else "column")
            add(f"{kind}: column name in Latin-1",
                text.replace(f'(column "{col.group(1)}"', '(column "d\xe9pth"', 1)
                .encode("latin-1"), "UTF-8")
            add(f"{kind}: column name with a raw newline",
                text.replace(f'(column "{col.group(1)}"', '(column "dep\nth"', 1), "string")
            add(f"{kind}: column name not UTF-8",
                text.replace(f'(column "{col.group(1)}"', '(column "dep\udcffth"', 1)
                .encode("utf-8", "surrogateescape"), "UTF-8")
            add(f"{kind}: column twice", text.replace(col.group(0), col.group(0) + ' 0.0 1.0) '
                                                      + col.group(0), 1))
            add(f"{kind}: every column renamed",
                re.sub(r'\(column "([^"]*)"', r'(column "x_\1"', text), "column")
            add(f"{kind}: column min above max",
                _sub(text, r'(\(column "[^"]*") (\S+) (\S+)\)', r"\1 1e300 -1e300)"), "column")
            add(f"{kind}: column as an atom",
                _sub(text, r'\(column "([^"]*)"', r"(column \1"), "column")
        # byte level
        add(f"{kind}: pickled", b"\x80" + data[1:])
        for bad in (b"\xff", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82"):
            add(f"{kind}: bytes {bad!r} in a comment", b"; " + bad + b"\n" + data, "UTF-8")
        add(f"{kind}: an emoji in a comment", "; \U0001F600\n" + text)
        add(f"{kind}: CRLF line ends", text.replace("\n", "\r\n"))
        add(f"{kind}: tabs for blanks", text.replace(" (", "\t("))
        add(f"{kind}: a form feed for a blank", text.replace(" (version", "\x0c(version", 1))
        add(f"{kind}: a no-break space for a blank", text.replace(" (version", "\xa0(version",
                                                                  1))
        add(f"{kind}: a byte order mark", "\ufeff" + text)
        add(f"{kind}: a NUL in a comment", "; \x00\n" + text)
        add(f"{kind}: empty", b"")
        add(f"{kind}: only a comment", "; nothing\n")
        add(f"{kind}: two policies", text + text)
        add(f"{kind}: a trailing atom", text + " x")
        add(f"{kind}: a stray ')'", text + ")")
        for cut in (1, 10, len(text) // 3, len(text) // 2, len(text) - 3, len(text) - 2):
            add(f"{kind}: truncated at {cut}", data[:cut])
        # sections
        v2 = "(growth_discount" in text
        # a version-1 file called 2 lacks the discounts; a version-2 file called 1 has one
        add(f"{kind}: version 1 <-> 2", _sub(text, r"\(version \d\)",
                                             "(version 1)" if v2 else "(version 2)"),
            "guards" if v2 else "growth_discount")
        add(f"{kind}: version 3", _sub(text, r"\(version \d\)", "(version 3)"), "version")
        add(f"{kind}: version 01", _sub(text, r"\(version (\d)\)", r"(version 0\1)"),
            "version")
        add(f"{kind}: version 1 1", _sub(text, r"\(version (\d)\)", r"(version \1 \1)"),
            "version")
        add(f"{kind}: no version", _sub(text, r"\(version \d\)", ""), "version")
        if v2:  # the discounts
            for bad, field in (('("in_loop" 0.5)', None), ("", None),
                               ('("direct_call_of_indirect" 0) ("in_loop" 1000)', None),
                               ('("in_loop" 1e3)', None), ('("in_loop" 1000.0001)', "weight"),
                               ('("in_loop" -0.5)', "weight"), ('("in_loop" -0.0)', None),
                               ('("in_loop" nan)', "weight"), ('("in_loop")', "growth_discount"),
                               ('("in_loop" 1 2)', "growth_discount"),
                               ('(in_loop 1)', "growth_discount"),
                               ('("round" 1)', "round"), ('("evaluation" 1)', "evaluation"),
                               ('("evaluation=inline" 1)', "evaluation"),
                               ('("" 1)', "growth_discount"),
                               ('("in_loop" 1) ("in_loop" 1)', "in_loop"),
                               ("in_loop", "growth_discount"), ("((x))", "growth_discount")):
                add(f"{kind}: growth_discount {bad}",
                    _sub(text, r"\(growth_discount (?:\([^()]*\) ?)*\)",
                         f"(growth_discount {bad})"), field)
            add(f"{kind}: growth_discount twice",
                _sub(text, r"\(growth_discount ", '(growth_discount) (growth_discount '),
                "growth_discount")
        add(f"{kind}: a section twice", _sub(text, r"(\(threshold [^)]*\))", r"\1 \1"),
            "threshold")
        add(f"{kind}: an unknown section", _sub(text, r"(\(threshold [^)]*\))",
                                                 r"\1 (comment 1)"))
        add(f"{kind}: a missing section", _sub(text, r"\(threshold [^)]*\)", ""), "threshold")
        add(f"{kind}: classifier other", _sub(text, r"\(classifier \w+\)",
                                              "(classifier forest)"), "classifier")
        add(f"{kind}: classes twice", _sub(text, r"\(classes (\w+)", r"(classes \1 \1"),
            "classes")
        add(f"{kind}: classes none", _sub(text, r"\(classes [^)]*\)", "(classes)"), "classes")
        # nesting
        for depth in (MAX_POLICY_DEPTH - 6, MAX_POLICY_DEPTH - 5, MAX_POLICY_DEPTH - 4):
            # the guards section sits at depth 2, a margin's value at depth 3 (+ depth)
            add(f"{kind}: margin nested {depth}",
                _sub(text, r"\(margin ([^)]*)\)", "(margin " + "(" * depth + r"\1"
                     + ")" * depth + ")"), "margin")
        add(f"{kind}: a comment nested at the limit",
            _sub(text, r"\(threshold", "(threshold" + " (x" * (MAX_POLICY_DEPTH - 2)
                 + ")" * (MAX_POLICY_DEPTH - 2)), "threshold")
        add(f"{kind}: a benchmark nested past the limit",
            _sub(text, r"\(benchmarks", "(benchmarks" + " (x" * (MAX_POLICY_DEPTH - 1)
                 + ")" * (MAX_POLICY_DEPTH - 1)), "deep")
    # the model of each kind
    mlp, logistic, boosted, constant = (REAL[k].decode() for k in
                                        ("mlp", "logistic", "boosted", "constant"))
    for name, text, field in (
            ("constant: (constant inline junk)",
             _sub(constant, r"\(constant inline\)", "(constant inline junk)"), "constant"),
            ("constant: (constant dont_inline)",
             _sub(constant, r"\(constant inline\)", "(constant dont_inline)"), "constant"),
            ("constant: (constant)", _sub(constant, r"\(constant inline\)", "(constant)"),
             "constant"),
            ("constant: (constant (inline))",
             _sub(constant, r"\(constant inline\)", "(constant (inline))"), "constant"),
            ("constant: two classes", _sub(constant, r"\(classes inline\)",
                                           "(classes inline default)"), "class"),
            ("constant: a column", _sub(constant, r"\(columns", '(columns (column "depth" 0 1)'),
             None),
            ("mlp: activation sigmoid", _sub(mlp, r"\(activation \w+\)", "(activation sigmoid)"),
             "activation"),
            ("mlp: activation twice", _sub(mlp, r"(\(activation \w+\))", r"\1 \1"),
             "activation"),
            ("mlp: no layer", re.sub(r"\(layer \(weights[^()]*(?:\([^()]*\)[^()]*)*\)"
                                     r"[^()]*\(biases[^)]*\)\)", "", mlp), "mlp"),
            ("mlp: a layer without biases", _sub(mlp, r"\(biases [^)]*\)", "(biases)"),
             "layer"),
            ("mlp: a short weight row", _sub(mlp, r"(\(weights\s*\(\S+) \S+", r"\1"),
             "weights"),
            ("mlp: a scale of 0", _sub(mlp, r"\(scale (\S+)", "(scale 0"), "scale"),
            ("mlp: a negative scale", _sub(mlp, r"\(scale (\S+)", "(scale -1.5"), "scale"),
            ("mlp: a mean short", _sub(mlp, r"\(mean (\S+) ", "(mean "), "mean"),
            ("logistic: a coefficient row short", _sub(logistic, r"(\(coefficients\s*\(\S+) \S+",
                                                       r"\1"), "coefficients"),
            ("logistic: an intercept more", _sub(logistic, r"\(intercepts ", "(intercepts 1.0 "),
             "intercepts"),
            ("logistic: a coefficient row more", _sub(logistic, r"(\(coefficients\s*(\([^)]*\)))",
                                                      r"\1 \2"), "coefficients"),
            ("logistic: scale 0.0", _sub(logistic, r"\(scale (\S+)", "(scale 0.0"), "scale"),
            ("logistic: model twice", _sub(logistic, r"\(model", "(model (constant inline)"),
             "model"),
            ("logistic: model kind forest", _sub(logistic, r"\(linear", "(forest"), "model"),
            ("boosted: no baseline", _sub(boosted, r"\(baseline [^)]*\)", ""), "baseline"),
            ("boosted: a baseline short", _sub(boosted, r"\(baseline (\S+) ", "(baseline "),
             "baseline"),
            ("boosted: a tree without nodes", _sub(boosted, r"\(tree (\d+) [^\n]*\n",
                                                    r"(tree \1)\n"), "tree"),
            ("boosted: a tree score out of range", _sub(boosted, r"\(tree \d+ ", "(tree 9 "),
             "tree"),
            ("boosted: a split feature out of range", _sub(boosted, r"\(split \d+ ",
                                                            "(split 999 "), "split feature"),
            ("boosted: a split feature -1", _sub(boosted, r"\(split \d+ ", "(split -1 "),
             "split feature"),
            ("boosted: a split pointing to itself",
             _sub(boosted, r"\(tree (\d+) \(split (\d+) (\S+) \d+ ", r"(tree \1 (split \2 \3 0 "),
             "split"),
            ("boosted: a split pointing back",
             _sub(boosted, r"\(tree 0 [^\n]*", "(tree 0 (split 3 27.5 1 2) (split 3 1.0 0 2) "
                                               "(leaf 1) (leaf 2))"), "split"),
            ("boosted: a deeper tree", _sub(boosted, r"\(tree 0 [^\n]*",
                                             "(tree 0 (split 3 27.5 1 4) (split 3 1.0 2 3) "
                                             "(leaf 1) (leaf 2) (leaf 3))"), None),
            ("boosted: a node nobody reaches", _sub(boosted, r"\(tree 0 [^\n]*",
                                                     "(tree 0 (leaf 1) (leaf 2))"), None),
            ("boosted: a child out of range", _sub(boosted, r"\(split (\d+) (\S+) (\d+) \d+\)",
                                                    r"(split \1 \2 \3 1000)"), "split"),
            ("boosted: a child of ten digits", _sub(boosted, r"\(split (\d+) (\S+) (\d+) \d+\)",
                                                     r"(split \1 \2 \3 0000000002)"), "split"),
            ("boosted: a leaf of two values", _sub(boosted, r"\(leaf (\S+)\)", r"(leaf \1 \1)"),
             "node"),
            ("boosted: a leaf +1", _sub(boosted, r"\(leaf \S+\)", "(leaf +1)"), "leaf"),
            ("boosted: a leaf 1_0", _sub(boosted, r"\(leaf \S+\)", "(leaf 1_0)"), "leaf"),
            ("boosted: a leaf with an Arabic digit", _sub(boosted, r"\(leaf \S+\)",
                                                          "(leaf \u0661)"), "leaf"),
            ("boosted: a leaf 1.", _sub(boosted, r"\(leaf \S+\)", "(leaf 1.)"), None),
            ("boosted: a leaf -.5e-3", _sub(boosted, r"\(leaf \S+\)", "(leaf -.5e-3)"), None),
            ("boosted: a leaf 1e", _sub(boosted, r"\(leaf \S+\)", "(leaf 1e)"), "leaf"),
            ("boosted: a leaf of 400 digits", _sub(boosted, r"\(leaf \S+\)",
                                                    "(leaf " + "9" * 400 + ")"), "leaf"),
            ("boosted: an escape \\q", _sub(boosted, r'\(benchmarks "', r'(benchmarks "\\q'),
             "escape"),
            ("boosted: an escaped quote", _sub(boosted, r'\(benchmarks "', r'(benchmarks "\\"'),
             None),
            ("boosted: an unterminated string", _sub(boosted, r'\(benchmarks "[^"]*"',
                                                     '(benchmarks "x'), "string"),
            ("boosted: a string at the end", boosted + '"', "string"),
    ):
        cases.append((name, text.encode(), field))
    # a million parentheses: neither reader may overflow its stack
    cases.append(("a million '('", b"(" * 10**6, "deep"))
    cases.append(("a million '()' nested", b"(" * 10**6 + b")" * 10**6, "deep"))
    # the size bound: a comment making a real file exactly the bound, and one byte more
    pad = MAX_POLICY_BYTES - len(REAL["constant"]) - 2
    cases.append(("constant: padded to the size bound", b";" + b"x" * pad + b"\n"
                  + REAL["constant"], None))
    cases.append(("constant: one byte over the size bound", b";" + b"x" * (pad + 1) + b"\n"
                  + REAL["constant"], "bytes"))
    return cases


_POOL = ("(", ")", '"x"', '""', "-1", "0", "1", "2", "999999999", "1e999", "nan", "0.5",
         "inline", "default", "none", "true", "x", "()", "(leaf 0)", "(split 0 0 1 2)",
         '"depth"', "(version 1)", "(column \"depth\" 0 1)", ";")


def _random(seed: int = 20261126, n: int = 120) -> list[tuple[str, bytes, str | None]]:
    """Random token-level mutations of the real files: a token replaced by one of a pool,
    deleted, or doubled (seeded: the same cases every run)."""
    rng = random.Random(seed)
    cases = []
    token = re.compile(r'"(?:[^"\\\n]|\\.)*"|[()]|[^\s()";]+')
    for i in range(n):
        kind = rng.choice(sorted(REAL))
        text = REAL[kind].decode()
        spans = [m.span() for m in token.finditer(text)]
        a, b = spans[rng.randrange(len(spans))]
        how = rng.randrange(3)
        new = rng.choice(_POOL) if how == 0 else "" if how == 1 else text[a:b] + " " + text[a:b]
        cases.append((f"random {i}: {kind} {text[a:b][:20]!r} -> {new!r}",
                      (text[:a] + new + text[b:]).encode(), None))
    return cases


def _compile(ocamlopt: Path, workdir: Path, policy: Path) -> subprocess.CompletedProcess:
    workdir.mkdir()
    (workdir / "main.ml").write_text("let f x = x + 1\n")
    # TMPDIR: the compiler's temporary .s, which a refused policy leaves, stays in workdir
    return subprocess.run([str(ocamlopt), "-O3", "-inlining-policy", str(policy), "-c",
                           "main.ml"], cwd=workdir, capture_output=True, text=True,
                          errors="replace", timeout=120,
                          env={**os.environ, "TMPDIR": str(workdir)})


def test_both_readers_accept_and_refuse_the_same_mutations(compiler, tmp_path):
    cases = _targeted() + _random()
    assert len(cases) >= 200 + 100
    paths = []
    for i, (_, data, _) in enumerate(cases):
        path = tmp_path / f"case-{i:03d}.policy"
        path.write_bytes(data)
        paths.append(path)
    with ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 2)) as pool:
        procs = list(pool.map(lambda ip: _compile(compiler.ocamlopt, tmp_path / f"w{ip[0]}",
                                                  ip[1]), enumerate(paths)))
    disagree, refused = [], 0
    for (name, data, field), path, proc in zip(cases, paths, procs):
        try:
            decode_policy_file(data, path)
            ours = None
        except PolicyFileError as exc:
            ours = str(exc)
        theirs = proc.stderr if proc.returncode != 0 else None
        if (ours is None) != (theirs is None):
            disagree.append(f"{name}: python {ours or 'accepts'}; compiler "
                            f"{theirs.strip() if theirs else 'accepts'}")
            continue
        if ours is None:
            assert proc.stderr == "", (name, proc.stderr)
            continue
        refused += 1
        assert theirs is not None
        # one line each, naming the file (the compiler: exit status 2, nothing on stdout)
        assert len(ours.splitlines()) == 1 and ours.startswith(f"{path}"), (name, ours)
        assert proc.returncode == 2 and proc.stdout == "", (name, proc.returncode, proc.stdout)
        assert len(theirs.splitlines()) == 1 and theirs.startswith(f"{path}:"), (name, theirs)
        if field is not None:
            assert field in ours and field in theirs, (name, field, ours, theirs)
    assert not disagree, "\n".join(disagree)
    # the mutations are not all refused, nor all accepted
    assert 100 < refused < len(cases) - 40, refused


def test_the_columns_known_are_the_compilers_features(compiler, tmp_path):
    """The features a column may name (Python's list) are those the compiler's dump writes,
    but ``round``: a site's key."""
    from dispatcher.build.policy_file import _NUMBER_FEATURES, _TEXT_FEATURES
    (tmp_path / "main.ml").write_text(
        "let[@inline never] g x = x * 2\nlet f x = g x + 1\n"
        "let () = print_int (f (int_of_string Sys.argv.(0)))\n")
    subprocess.run([str(compiler.ocamlopt), "-O3", "-dump-inlining-decisions", "-c",
                    "main.ml"], cwd=tmp_path, check=True, timeout=120)
    seen: set[str] = set()
    for dump in tmp_path.glob("main.*.decisions.sexp"):
        for d in read_dump(dump).decisions:
            assert d.features is not None
            seen |= {k for k, v in d.features.row().items() if v is not None}
    assert seen - {"round"} <= _NUMBER_FEATURES | set(_TEXT_FEATURES)
    assert "evaluation" in seen and "callee_size" in seen


def _run_benchmark(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commands", "run-benchmark", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("what", ["fifo", "directory", "device", "huge"])
def test_a_policy_that_is_not_a_regular_file_is_one_line(compiler, tmp_path, what):
    """A FIFO (nobody writing), a directory, /dev/zero and a file over the bound, named as a
    ``.policy``: one line from ``run-benchmark --policy`` (exit 2, no traceback) and from the
    compiler (exit 2), at once."""
    path = tmp_path / "p.policy"
    if what == "fifo":
        os.mkfifo(path)
    elif what == "directory":
        path.mkdir()
    elif what == "device":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.truncate(MAX_POLICY_BYTES + 1)
    proc = _run_benchmark("kahan", "--policy", str(path))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert str(path) in line and "Traceback" not in proc.stderr, line
    assert ("not a regular file" if what != "huge" else "bytes") in line, line
    proc = _compile(compiler.ocamlopt, tmp_path / "w", path)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"{path}: cannot read the inlining policy file ("), line
    assert ("not a regular file" if what != "huge" else "bytes") in line, line


def test_a_compile_error_names_the_users_policy_file_never_the_copy(compiler, tmp_path):
    """The compile service gives the compiler a copy of a policy's bytes, removed with its
    build: an error names the user's file instead (the bytes here are ones the compiler
    refuses, as if the Python reader had let them through), and so does the failure the
    store remembers and replays, for whichever file has those bytes."""
    import hashlib

    from dispatcher.build.manifest import resolve_benchmark
    from dispatcher.build.policies import PolicySpec
    from dispatcher.build.service import CompileError, CompileJob, CompileService
    from dispatcher.storage.store import Store
    data = b"(inlining_policy (version 1))\n"
    service = CompileService(Store(tmp_path / "store"), compiler)
    try:
        for source in (str(tmp_path / "mine.policy"), str(tmp_path / "yours.policy")):
            spec = PolicySpec("learned", source=source, digest=hashlib.sha256(data).hexdigest(),
                              data=data)
            with pytest.raises(CompileError) as err:
                service.compile(CompileJob(resolve_benchmark("kahan"), policy=spec))
            message = str(err.value)
            assert f"{source}:1:" in message and "inlining-policy-" not in message, message
            assert "inlining-policy-" not in err.value.output
    finally:
        service.close()


@pytest.mark.parametrize("what", ["fifo", "device"])
def test_an_overrides_policy_that_is_not_a_regular_file_is_one_line(tmp_path, what):
    """``--policy`` naming an overrides file (``.sexp``) that is a FIFO or a device: one line,
    at once (it was read without end, or waited on)."""
    path = tmp_path / "o.sexp"
    if what == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")
    proc = _run_benchmark("kahan", "--policy", str(path))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert f"{path}: not a regular file" in line and "Traceback" not in proc.stderr, line
