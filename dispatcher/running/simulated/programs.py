"""The simulated compiler: a real program's decision tree, and a candidate's overrides applied
to it.

Each program starts from the real dumps of its heuristic build (``-O3 -dump-inlining-decisions``
with the patched compiler), bundled for the bundled benchmarks in ``dumps/<name>.tar.gz``
(``scripts/simulation-dumps`` makes them again) and, for a benchmark directory of one's own,
generated once with the real compiler and cached.  A simulated compile applies the candidate's
overrides to that tree as the real compiler would, as far as a tree can tell:

- a pin with the site's own action changes nothing but the reason (``override``);
- a pin to ``dont_inline`` on an inlined (or specialised) call makes it a plain call: what was
  decided inside its body goes;
- a pin to ``inline`` (or ``specialise``) on a plain call brings in the callee's body: the
  decisions of the callee's top-level declaration (any unit's, round 0), re-keyed under the
  call (``<call>/I/...``), as the heuristic took them there, pins applied in turn;
- a pin on a prevented site is honoured only where its guard lets an override past
  (``tree.honourable``), else the site stays prevented (what the real compiler does);
- a pin on a key the tree does not have matches nothing, and the dump lists it as unmatched.

Later rounds are kept as they were but for their own pins (the real compiler decides them
again; the tree cannot know how).  The binary is a small file whose content, and so whose
sha256, is fixed by the decisions taken and the model: two override sets giving the same
decisions give the same binary, measured once, as with the real compiler.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import random
import re
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from dispatcher.build.manifest import BUNDLED_DIR, Benchmark
from dispatcher.core.decisions import DUMP_NAME, Decision, Override, parse_dump
from dispatcher.core.sexp import STRING_BODY, unescape
from dispatcher.core.sites import site_function
from dispatcher.core.tree import (
    CALL,
    DECL,
    DONT_INLINE,
    Node,
    RoundTree,
    Tree,
    flip,
    flippable,
    from_dumps,
    guard_class,
    honourable,
    split_key,
)
from dispatcher.running.simulated.elf import nameable
from dispatcher.running.simulated.model import Condition, Effect, ProgramModel

DUMPS_DIR = Path(__file__).resolve().parent / "dumps"
SOURCE_FILE = "source.json"  # in a bundle: what the dumps were made from
MAX_DEPTH = 64  # frames: a call inlined into itself this deep is not expanded further

# A decision's line in the compiler's dump: its key, and its features (the line's last field).
_LINE_KEY = re.compile(r'^\s*\(\(key "(' + STRING_BODY + r')"\)')
_LINE_FEATURES = re.compile(r" (\(features [^\"\n]*\))\)\s*$")


class SimulationError(RuntimeError):
    """A program the simulation cannot model (no dumps bundled and none can be made); one
    line."""


@dataclass(frozen=True)
class Program:
    """A program as the simulated compiler knows it: the tree of its heuristic build, each
    dump's file name, each site's features as the compiler wrote them, and the top-level
    declarations whose bodies an ``inline`` pin brings in."""

    name: str
    tree: Tree
    files: Mapping[tuple[str, int], str]  # (unit, round) -> dump file name
    features: Mapping[tuple[str, int, str], str]  # site -> its "(features ...)" text
    decls: Mapping[str, tuple[str, Node]]  # callee -> (its unit, its declaration), round 0
    source: Mapping[str, str]  # what the dumps were made from (benchmark, compiler, hash)


@dataclass(frozen=True)
class Compiled:
    """A simulated compile: the tree the compiler "took" and, per (unit, round), the
    overrides it was given, matched and left unmatched (for the dump)."""

    tree: Tree
    entries: Mapping[tuple[str, int], int]
    unmatched: Mapping[tuple[str, int], tuple[str, ...]]
    # a site brought in by an inlining -> the declaration's site it copies (its features)
    origins: Mapping[tuple[str, int, str], tuple[str, int, str]]

    def taken(self) -> dict[tuple[str, int, str], str]:
        """(unit, round, key) -> action of every call."""
        return {(u, r, k): a for u, r, k, a in self.tree.decisions()}

    def identity(self) -> str:
        """sha256 of the decisions taken (sorted): the binary's identity."""
        text = "\n".join(f"{u}\t{r}\t{k}\t{a}" for u, r, k, a in sorted(self.tree.decisions()))
        return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------- programs


def program_from_dumps(name: str, texts: Mapping[str, str],
                       source: Mapping[str, str] | None = None) -> Program:
    """A program from its heuristic build's dump files (file name -> text)."""
    dumps = []
    files: dict[tuple[str, int], str] = {}
    features: dict[tuple[str, int, str], str] = {}
    for fname, text in sorted(texts.items()):
        dump = parse_dump(text, fname)
        dumps.append(dump)
        files[(dump.unit, dump.round)] = fname
        for line in text.splitlines():
            k, f = _LINE_KEY.match(line), _LINE_FEATURES.search(line)
            if k and f:
                key = unescape(k.group(1))
                features[(dump.unit, dump.round, key)] = f.group(1)
    tree = from_dumps(dumps)
    decls: dict[str, tuple[str, Node]] = {}
    for part in tree.parts:
        if part.round == 0:
            for node in part.roots:
                if node.kind == DECL:
                    decls.setdefault(node.name, (part.unit, node))
    return Program(name, tree, files, features, decls, dict(source or {}))


def read_bundle(path: Path) -> Program:
    """A program from a bundle (a gzip'd tar of dumps and ``source.json``)."""
    texts: dict[str, str] = {}
    source: dict[str, str] = {}
    with tarfile.open(path, "r:gz") as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.isfile() else None
            if f is None:
                continue
            data = f.read().decode()
            if member.name == SOURCE_FILE:
                source = json.loads(data)
            elif DUMP_NAME.match(member.name):
                texts[member.name] = data
    if not texts:
        raise SimulationError(f"{path}: no decision dumps in it")
    return program_from_dumps(path.name.split(".")[0], texts, source)


def write_bundle(path: Path, texts: Mapping[str, str], source: Mapping[str, str]) -> None:
    """Write a bundle atomically: the dumps (file name -> text) and ``source.json``."""
    files = {**{n: t.encode() for n, t in texts.items()},
             SOURCE_FILE: json.dumps(dict(source), sort_keys=True, indent=1).encode()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tarfile.open(tmp, "w:gz", compresslevel=9) as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)


def make_bundle(bench: Benchmark, path: Path) -> None:
    """Build ``bench``'s heuristic build with the real patched compiler, keeping its dumps as
    a bundle at ``path``.  SimulationError (one line) if it cannot be built."""
    from dispatcher.build.driver import BuildError, build_benchmark
    from dispatcher.build.toolchain import CompilerNotFound, locate_compiler
    try:
        compiler = locate_compiler()
    except CompilerNotFound as exc:
        raise SimulationError(f"{bench.name}: no dumps bundled, and none can be made: "
                              f"{exc}") from None
    work = Path(tempfile.mkdtemp(prefix="simulation-dumps-"))
    try:
        built = build_benchmark(bench, work / "build", compiler.ocamlopt, dump_decisions=True)
        texts = {f.name: f.read_text() for f in built.decision_files}
    except (BuildError, OSError) as exc:
        raise SimulationError(f"{bench.name}: cannot make its dumps: {exc}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_bundle(path, texts, {"benchmark": bench.name, "source_hash": bench.source_hash(),
                               "compiler": compiler.identity,
                               "flags": " ".join(bench.flags)})


def bundle_path(bench: Benchmark, cache_dir: Path) -> Path:
    """Where ``bench``'s dumps are: bundled (a bundled benchmark), else in ``cache_dir``
    under its source hash."""
    bundled = DUMPS_DIR / f"{bench.name}.tar.gz"
    if bench.directory.resolve() == (BUNDLED_DIR / bench.name).resolve() and bundled.is_file():
        return bundled
    return cache_dir / f"{bench.name}-{bench.source_hash()[:16]}.tar.gz"


def load_program(bench: Benchmark, cache_dir: Path) -> Program:
    """``bench`` as a simulated program: its bundled dumps, or those made once (real
    compiler) and cached in ``cache_dir``."""
    path = bundle_path(bench, cache_dir)
    if not path.is_file():
        make_bundle(bench, path)
    return read_bundle(path)


def _callee(program: Program, calls: Mapping[tuple[str, int, str], str], unit: str,
            round_: int, key: str, depth: int = 0) -> str | None:
    """The callee of the call ``key`` in (unit, round) when a compile of ``program`` can
    decide it (None: it cannot): a call of the heuristic tree, or one that inlining or
    specialising a call brings in (``<call>/I/<rest>``: the callee's declaration's call
    ``<decl>/<rest>``, round 0, re-keyed under the call, as ``_Compile.body`` does)."""
    found = calls.get((unit, round_, key))
    if found is not None or depth >= MAX_DEPTH:
        return found
    frames = split_key(key)
    for i in range(len(frames) - 1, 0, -1):
        if frames[i] not in ("I", "S") or i + 1 >= len(frames):
            continue
        name = _callee(program, calls, unit, round_, "/".join(frames[:i]), depth + 1)
        decl = program.decls.get(name) if name is not None else None
        if decl is None:
            continue
        decl_unit, node = decl
        inner = _callee(program, calls, decl_unit, 0,
                        f"{node.key}/{'/'.join(frames[i + 1:])}", depth + 1)
        if inner is not None:
            return inner
    return None


def unknown_sites(program: Program, model: ProgramModel) -> list[tuple[str, Condition]]:
    """The decisions ``model``'s effects name (as ``effects[i]``, ``effects[i].requires[j]``)
    that no compile of ``program`` can take: a unit, round or key its tree does not have,
    even with calls inlined.  An effect on one would never hold, silently."""
    calls = {(u, r, n.key): n.name for u, r, n in program.tree.calls()}
    out = []
    for i, e in enumerate(model.effects):
        named = [(f"effects[{i}]", e.when)] + [(f"effects[{i}].requires[{j}]", c)
                                               for j, c in enumerate(e.requires)]
        out += [(where, c) for where, c in named
                if _callee(program, calls, c.unit, c.round, c.key) is None]
    return out


# --------------------------------------------------------------------------- the compile


def _rekey(node: Node, old: str, new: str, origins: dict[str, str]) -> Node:
    """``node`` and its subtree with the key prefix ``old`` replaced by ``new``; ``origins``
    gets new key -> old key."""
    key = new + node.key[len(old):]
    origins[key] = node.key
    return replace(node, key=key,
                   children=tuple(_rekey(c, old, new, origins) for c in node.children))


class _Compile:
    """One compile of one (unit, round): its pins, those that matched, where the sites an
    inlining brought in come from."""

    def __init__(self, program: Program, unit: str, round_: int, pins: Mapping[str, str]):
        self.program, self.unit, self.round, self.pins = program, unit, round_, pins
        self.used: set[str] = set()
        self.origins: dict[tuple[str, int, str], tuple[str, int, str]] = {}

    def body(self, call: Node, step: str) -> tuple[Node, ...]:
        """What inlining (``step`` "I") or specialising ("S") ``call`` brings in: its
        callee's declaration's nodes, re-keyed under the call; none when the callee has no
        top-level declaration in the program or the key is already deep."""
        found = self.program.decls.get(call.name)
        if found is None or call.key.count("/") >= MAX_DEPTH:
            return ()
        decl_unit, decl = found
        keys: dict[str, str] = {}
        body = tuple(_rekey(c, decl.key, f"{call.key}/{step}", keys) for c in decl.children)
        for new, old in keys.items():
            self.origins[(self.unit, self.round, new)] = self.origins.get(
                (decl_unit, 0, old), (decl_unit, 0, old))
        return body

    def apply(self, node: Node) -> Node:
        """``node`` as this compile decides it, and its subtree."""
        if node.kind == CALL:
            pin = self.pins.get(node.key)
            if pin is not None:
                self.used.add(node.key)
                if node.prevented and pin != node.action \
                        and not honourable(guard_class(node)):
                    node = replace(node, override=pin)  # the guard stops the override too
                elif pin == node.action:
                    node = replace(node, reason="override", guard=None, detail=None,
                                   override=pin)
                elif pin == DONT_INLINE:
                    node = replace(node, action=pin, reason="override", guard=None,
                                   detail=None, override=pin, children=())
                else:
                    node = replace(node, action=pin, reason="override", guard=None,
                                   detail=None, override=pin,
                                   children=self.body(node, "I" if pin == "inline" else "S"))
        if not node.children:
            return node
        kids = tuple(self.apply(c) for c in node.children)
        return node if all(a is b for a, b in zip(kids, node.children)) else \
            replace(node, children=kids)


def compile_tree(program: Program, overrides: Iterable[Override]) -> Compiled:
    """The tree a compile of ``program`` with ``overrides`` takes (module docstring)."""
    by_part: dict[tuple[str, int], dict[str, str]] = {}
    for o in overrides:
        by_part.setdefault((o.unit, o.round), {})[o.key] = o.action
    parts = []
    entries: dict[tuple[str, int], int] = {}
    unmatched: dict[tuple[str, int], tuple[str, ...]] = {}
    origins: dict[tuple[str, int, str], tuple[str, int, str]] = {}
    for part in program.tree.parts:
        pins = by_part.get((part.unit, part.round), {})
        if not pins:
            parts.append(part)
            continue
        c = _Compile(program, part.unit, part.round, pins)
        parts.append(RoundTree(part.unit, part.round, tuple(c.apply(n) for n in part.roots)))
        entries[(part.unit, part.round)] = len(pins)
        unmatched[(part.unit, part.round)] = tuple(sorted(set(pins) - c.used))
        origins.update(c.origins)
    return Compiled(Tree(tuple(parts)), entries, unmatched, origins)


# --------------------------------------------------------------------------- its output


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") \
        .replace("\t", "\\t") + '"'


def _reason(d: Decision) -> str:
    if d.reason != "prevented":
        return d.reason
    words = (d.guard or "unknown").split()
    return f"(prevented {words[0] if len(words) == 1 else '(' + ' '.join(words) + ')'})"


def _line(d: Decision, features: str | None) -> str:
    fields = [f"(key {_quote(d.key)})", f"(callee {_quote(d.callee)})", f"(action {d.action})",
              f"(reason {_reason(d)})"]
    if d.detail is not None and d.reason == "heuristic":
        fields.append(f"(detail {d.detail})")
    if d.override is not None:
        fields.append(f"(override {d.override})")
    if features is not None:
        fields.append(features)
    return "  (" + " ".join(fields) + ")"


def _decisions(unit: str, round_: int, node: Node) -> Iterable[Decision]:
    for n in node.walk():
        if n.kind == CALL:
            yield Decision(unit, round_, n.key, n.name, n.decided, n.reason or "heuristic",
                           n.guard, n.detail, n.override)


def dump_texts(program: Program, compiled: Compiled) -> dict[str, str]:
    """The compile's decision dumps (file name -> text), as the patched compiler writes them
    (version 2: each decision with the features of its site in the heuristic build)."""
    out = {}
    for part in compiled.tree.parts:
        pid = (part.unit, part.round)
        lines = []
        for n in part.roots:
            for d in _decisions(part.unit, part.round, n):
                site = (part.unit, part.round, d.key)
                lines.append(_line(d, program.features.get(compiled.origins.get(site, site))))
        unmatched = compiled.unmatched.get(pid, ())
        entries = compiled.entries.get(pid, 0)
        keys = " ".join(_quote(k) for k in unmatched)
        body = "\n".join(lines)
        out[program.files[pid]] = (
            f"(inlining_decisions\n (version 2)\n (unit {_quote(part.unit)})\n"
            f" (round {part.round})\n (overrides (entries {entries}) "
            f"(matched {entries - len(unmatched)}) (unmatched {len(unmatched)})\n"
            f"  (unmatched_keys ({keys})))\n (decisions\n{body}\n ))\n")
    return out


def plant_effects(program: Program, count: int, log_speedup: float,
                  seed: int = 0) -> tuple[Effect, ...]:
    """``count`` planted effects on ``program`` for a bench: each a flip of a round-0 leaf
    (one the compiler honours) gaining ``log_speedup``; every third one gains only when the
    one before it is flipped too (an interaction).  Seeded: the same sites for the same
    seed."""
    rng = random.Random(f"plant/{program.name}/{seed}")
    leaves = [x for x in flippable(program.tree, 0) if not x.node.prevented]
    chosen = rng.sample(leaves, min(count, len(leaves)))
    effects: list[Effect] = []
    for i, (unit, round_, node) in enumerate(chosen):
        when = Condition(unit, round_, node.key, flip(node.decided))
        requires = (effects[-1].when,) if i % 3 == 2 else ()
        effects.append(Effect(when, log_speedup, requires))
    return tuple(effects)


# --------------------------------------------------------------------------- its profile


def functions_of(program: Program) -> tuple[str, ...]:
    """The functions a profile of ``program`` can name (sorted): those its calls lie in and
    those they call, as far as a symbol can name them."""
    names = set()
    for unit, _, node in program.tree.calls():
        names.add(site_function(unit, node.key))
        names.add(node.name)
    return tuple(sorted(n for n in names if nameable(n)))


def function_heat(program: Program, model: ProgramModel, seed: int) -> dict[str, float]:
    """Each running function's share of ``program``'s time under ``model`` (its
    ``function_heat``): the functions holding a planted decision run with at least
    ``planted_heat`` of the samples, and at least the share its effect saves."""
    planted: dict[str, float] = {}
    for e in model.effects:
        least = max(model.planted_heat, 1.0 - math.exp(-e.log_speedup))
        for c in (e.when, *e.requires):
            f = site_function(c.unit, c.key)
            planted[f] = max(planted.get(f, 0.0), least)
    return model.function_heat(program.name, functions_of(program), planted, seed)
