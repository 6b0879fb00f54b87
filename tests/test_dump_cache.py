"""Reading decision dumps fast: the compiler's layout read line by line gives what the general
reader gives, and a dump's content is parsed once (``dispatcher.core.dump_cache``)."""
from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest

from dispatcher.core import decisions
from dispatcher.core.decisions import DecisionFileError, parse_dump
from dispatcher.core.dump_cache import DumpCache
from dispatcher.core.tree import Tree, TreeError, count
from dispatcher.running.simulated.programs import DUMPS_DIR

TESTS = Path(__file__).resolve().parent


def bundled_dumps(count: int = 8) -> dict[str, str]:
    """name -> text of the dumps of a few bundled programs (the compiler's own output)."""
    texts = {}
    for bundle in sorted(DUMPS_DIR.glob("*.tar.gz"))[:count]:
        with tarfile.open(bundle) as tar:
            for member in tar.getmembers():
                if decisions.DUMP_NAME.match(member.name):
                    f = tar.extractfile(member)
                    assert f is not None
                    texts[f"{bundle.name}/{member.name}"] = f.read().decode()
    return texts


def general(text: str, source: str, features: bool = True) -> decisions.DecisionDump:
    """The dump as the general reader (the s-expression reader) reads it."""
    fast = decisions._fast_dump
    decisions._fast_dump = lambda *_: None
    try:
        return parse_dump(text, source, features)
    finally:
        decisions._fast_dump = fast


def test_the_compilers_layout_reads_as_the_general_reader_reads_it():
    texts = bundled_dumps()
    texts.update({str(p): p.read_text() for p in TESTS.glob("golden/**/*.decisions.sexp")})
    fast = 0
    for name, text in texts.items():
        for features in (True, False):
            quick = decisions._fast_dump(text, name, features)
            if quick is not None:
                fast += 1
                assert quick == general(text, name, features), name
    assert fast >= len(bundled_dumps()) * 2  # every dump the compiler wrote took the fast path


DUMP = ('(inlining_decisions\n (version 2)\n (unit "Main")\n (round 0)\n'
        ' (overrides (entries 0) (matched 0) (unmatched 0)\n  (unmatched_keys ()))\n'
        ' (decisions\n{lines} ))\n')
LINE = ('  ((key "{key}") (callee "Main.f") (action dont_inline) (reason {reason})'
        '{rest})\n')


@pytest.mark.parametrize("key,reason,rest", [
    ('D(Main.run@main.ml:1:0-9)/C(Main.f@a \\"b\\".ml:2:3-4)', "heuristic",
     " (detail above_threshold)"),  # escapes in a key
    ("D(Main.run@main.ml:1:0-9)/C(Main.f@main.ml:2:3-4)", "(prevented (not_specialised x))", ""),
    ("D(Main.run@main.ml:1:0-9)/C(Main.f@main.ml:2:3-4)", "(prevented 12)", ""),  # a number
    ("D(Main.run@main.ml:1:0-9)/C(Main.f@main.ml:2:3-4)", "override",
     " (override dont_inline) (later_field x)"),  # a field it does not know: the general path
])
def test_lines_off_the_usual_layout_read_as_the_general_reader_reads_them(key, reason, rest):
    text = DUMP.format(lines=LINE.format(key=key, reason=reason, rest=rest))
    assert parse_dump(text, "d") == general(text, "d")


def test_a_version_1_dump_with_features_is_refused_on_either_path():
    text = DUMP.replace("(version 2)", "(version 1)").format(lines=LINE.format(
        key="D(Main.run@main.ml:1:0-9)/C(Main.f@main.ml:2:3-4)", reason="heuristic",
        rest=" (detail x) (features (round 0))"))
    with pytest.raises(DecisionFileError, match="features in a version 1 dump"):
        parse_dump(text, "d")


def test_a_dumps_content_is_parsed_once_and_its_tree_is_the_directorys(tmp_path):
    texts = {name.split("/")[-1]: text for name, text in bundled_dumps(1).items()}
    for name, text in texts.items():
        (tmp_path / name).write_text(text)
    cache = DumpCache()
    tree = cache.tree_of_dir(tmp_path)
    assert cache.misses == len(texts) and cache.hits == 0
    assert tree == Tree.from_dir(tmp_path)
    assert [p.roots for p in tree.parts] == [p.roots for p in Tree.from_dir(tmp_path).parts]
    again = cache.tree({n: t.encode() for n, t in texts.items()}, "elsewhere")
    assert cache.misses == len(texts) and cache.hits == len(texts)  # nothing parsed again
    assert again == tree
    assert [d.unit for d in cache.dumps({n: t.encode() for n, t in texts.items()}, "x")] == \
        sorted(d.unit for d in cache.dumps({n: t.encode() for n, t in texts.items()}, "x"))


def test_the_cache_keeps_its_capacity_and_a_bad_dump_is_an_error_each_time(tmp_path):
    texts = {name.split("/")[-1]: text.encode() for name, text in bundled_dumps(2).items()}
    cache = DumpCache(capacity=3)
    cache.dumps(texts, "x")
    assert len(cache._entries) == 3
    bad = DUMP.format(lines=LINE.format(key="D(Main.run@main.ml:1:0-9)/C(Main.g@m.ml:1:1-2)/I/"
                                             "C(Main.f@m.ml:2:3-4)", reason="heuristic",
                                        rest=" (detail x)"))
    for _ in range(2):
        with pytest.raises(TreeError, match="its parent call"):
            cache.tree({"main.0.decisions.sexp": bad.encode()}, "here")


def test_a_builds_counts_are_its_trees_without_making_the_tree():
    """A search journals every candidate's decision counts but draws from the trees of those
    it keeps only: the counts come from the decisions, equal to the tree's, and no round tree
    is made until the tree is asked for."""
    by_program: dict[str, dict[str, bytes]] = {}
    for name, text in bundled_dumps(47).items():
        program, dump = name.split("/")
        by_program.setdefault(program, {})[dump] = text.encode()
    assert len(by_program) >= 40
    for program, files in by_program.items():
        cache = DumpCache()
        built = cache.build(files, program)
        counts = built.counts()
        assert not any(p._tree for p in cache._entries.values())  # noqa: SLF001
        assert counts == count(built.tree) and sum(counts) > 0, program
        assert all(p._tree for p in cache._entries.values())  # noqa: SLF001


def test_a_cached_attribute_computed_in_one_thread_holds_up_no_other_object():
    """``dispatcher.core.lazy.cached`` takes no lock: while one thread computes an object's
    value (gated here), another thread gets another object's at once (with Python 3.11's
    ``functools.cached_property`` it would wait for the first), and each value is kept."""
    import threading

    from dispatcher.core.lazy import cached

    gate = threading.Event()
    calls: list[int] = []

    class Thing:
        def __init__(self, n: int, slow: bool):
            self.n, self.slow = n, slow

        @cached
        def value(self) -> int:
            calls.append(self.n)
            if self.slow:
                assert gate.wait(30)
            return self.n * 10

    slow, quick = Thing(1, True), Thing(2, False)
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(slow.value))
    t.start()
    for _ in range(3000):  # until the slow one is computing (a guard against hanging)
        if 1 in calls:
            break
        t.join(0.01)
    assert quick.value == 20  # not held up by the slow one
    gate.set()
    t.join(30)
    assert got == [10] and slow.value == 10 and quick.value == 20
    assert calls == [1, 2]  # each computed once, then kept


def test_a_dump_read_in_blocks_is_the_dump_and_tree_read_whole():
    """Every dump the compiler wrote (bundled programs, golden files) is read in blocks, one per
    top-level frame, into the very dump and round tree the whole reading gives, the tree's
    keys made from its blocks'."""
    from dispatcher.core.tree import round_tree
    texts = bundled_dumps(47)
    texts.update({str(p): p.read_text() for p in TESTS.glob("golden/**/*.decisions.sexp")})
    cache = DumpCache()
    in_blocks = 0
    for name, text in texts.items():
        parsed = cache._parsed(text.encode(), name)  # noqa: SLF001
        whole = parse_dump(text, name, features=False)
        assert parsed.dump == whole, name
        in_blocks += parsed.blocks is not None
        try:
            expected = round_tree(whole)
        except TreeError as exc:
            with pytest.raises(TreeError, match=re.escape(str(exc))):
                _ = parsed.tree
            continue
        assert parsed.tree == expected, name
        # its keys, the union of its blocks', are its nodes'
        assert parsed.tree.keys == frozenset(n.key for n in expected.preorder), name
    assert in_blocks >= len(bundled_dumps(47))  # every dump the compiler wrote


def _lines(*keys: str) -> str:
    return "".join(LINE.format(key=k, reason="heuristic", rest=" (detail x)") for k in keys)


def test_a_dump_that_differs_in_one_block_parses_that_block_alone():
    from dispatcher.core.tree import round_tree
    run = "D(Main.run@main.ml:1:0-9)/C(Main.f@main.ml:{}:3-4)"
    other = "D(Main.other@main.ml:9:0-9)/C(Main.g@main.ml:{}:3-4)"
    first = DUMP.format(lines=_lines(run.format(2), run.format(3), other.format(10),
                                     "C(Main.top@main.ml:20:0-5)"))
    second = first.replace(other.format(10), other.format(11))
    cache = DumpCache()
    a = cache._parsed(first.encode(), "a")  # noqa: SLF001
    assert (cache.block_misses, cache.block_hits) == (3, 0)
    b = cache._parsed(second.encode(), "b")  # noqa: SLF001
    assert (cache.block_misses, cache.block_hits) == (4, 2)  # the changed block alone
    assert b.blocks is not None and a.blocks is not None
    assert b.blocks[0] is a.blocks[0] and b.blocks[2] is a.blocks[2]
    for parsed, text in ((a, first), (b, second)):
        assert parsed.tree == round_tree(parse_dump(text, "x"))
    # a top-level frame whose lines are not together: read whole, to the same dump and tree
    apart = DUMP.format(lines=_lines(run.format(2), other.format(10), run.format(3)))
    parsed = cache._parsed(apart.encode(), "c")  # noqa: SLF001
    assert parsed.blocks is None
    assert parsed.dump == parse_dump(apart, "c", features=False)
    assert parsed.tree == round_tree(parse_dump(apart, "c"))
    # a key decided twice, each in its block's place: the whole reading's error
    twice = DUMP.format(lines=_lines(run.format(2), run.format(2), other.format(10)))
    with pytest.raises(TreeError, match="decided twice"):
        _ = cache._parsed(twice.encode(), "d").tree  # noqa: SLF001
    # a line that is no decision's, first or between two blocks: read whole, and refused so
    for stray in (DUMP.format(lines="  (stray)\n" + _lines(run.format(2), other.format(10))),
                  DUMP.format(lines=_lines(run.format(2)) + "  (stray)\n"
                              + _lines(other.format(10)))):
        with pytest.raises(DecisionFileError) as whole:
            parse_dump(stray, "e", features=False)
        with pytest.raises(DecisionFileError, match=re.escape(str(whole.value))):
            cache._parsed(stray.encode(), "e")  # noqa: SLF001


def test_a_build_directory_is_read_packed_or_plain_and_a_damaged_pack_is_one_line(tmp_path):
    """A search rundir's candidate (format 6) keeps its outputs packed, one of an earlier
    version keeps them plain: both readers give the same tree; a pack that is not one, or a
    dump in it that is not one, is an error naming the pack (and the dump)."""
    from dispatcher.core.outputs import OUTPUTS, pack, read_dumps_in

    golden = TESTS / "golden" / "rundir-v4" / "steps" / "00001" / "c0"
    files = {p.name: p.read_bytes() for p in golden.iterdir()
             if p.name.endswith((".decisions.sexp", "overrides.sexp"))}
    packed = tmp_path / "packed"
    packed.mkdir()
    pack(packed / OUTPUTS, files)
    whole = Tree.from_dir(golden)
    assert len(whole) and Tree.from_dir(packed) == whole
    assert DumpCache().tree_of_dir(packed) == whole == DumpCache().tree_of_dir(golden)
    assert [d.unit for d in read_dumps_in(packed)] == [d.unit for d in read_dumps_in(golden)]
    (packed / OUTPUTS).write_bytes(b"not a pack")
    for read in (Tree.from_dir, DumpCache().tree_of_dir):
        with pytest.raises(ValueError, match=rf"^{re.escape(str(packed / OUTPUTS))}: not a "
                                             r"gzip'd tar of a build's outputs \(.*\)$"):
            read(packed)
    pack(packed / OUTPUTS, {**files, "main.0.decisions.sexp": b"(oops"})
    with pytest.raises(DecisionFileError, match=re.escape(f"{packed / OUTPUTS}/main.0.")):
        Tree.from_dir(packed)


def test_a_pack_is_the_tar_tarfile_writes_and_tar_reads_it(tmp_path):
    """``pack`` lays the tar out itself (headers by ``TarInfo.tobuf``): the bytes
    ``tarfile``'s own writer gives for the same members, a long name and a non-ASCII one
    included, which ``tar(1)`` lists and extracts as they were."""
    import gzip
    import io
    import shutil
    import subprocess
    import tarfile

    from dispatcher.core.outputs import OUTPUTS, pack, unpack

    files = {"main.0.decisions.sexp": b"(a)\n" * 1000, "compiler-output.txt": b"",
             "m" * 120 + ".1.decisions.sexp": b"x" * 513, "\u00e9t\u00e9.0.decisions.sexp": b"y"}
    pack(tmp_path / OUTPUTS, files)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    assert gzip.decompress((tmp_path / OUTPUTS).read_bytes()) == raw.getvalue()
    assert unpack(tmp_path / OUTPUTS) == files
    if shutil.which("tar"):
        out = tmp_path / "out"
        out.mkdir()
        subprocess.run(["tar", "-xzf", str(tmp_path / OUTPUTS), "-C", str(out)], check=True)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == files


def test_a_pack_compresses_only_the_files_not_packed_before(tmp_path, monkeypatch):
    """Each file of a pack is a gzip member of its own, compressed once per name and
    content: a second pack that changes one file of five compresses that one (and the end
    of the tar, whose padding depends on the sizes) and none of the others, and both read
    back whole."""
    import gzip

    from dispatcher.core import outputs

    files = {f"m{i}.0.decisions.sexp": f"(pack test {i})\n".encode() * (300 + i)
             for i in range(5)}
    outputs.pack(tmp_path / "a.tar.gz", files)
    compressed: list[bytes] = []
    real = gzip.compress
    monkeypatch.setattr(outputs.gzip, "compress",
                        lambda data, **kw: compressed.append(data) or real(data, **kw))
    changed = {**files, "m2.0.decisions.sexp": b"(changed)\n"}
    outputs.pack(tmp_path / "b.tar.gz", changed)
    assert any(b"(changed)\n" in data for data in compressed)  # (and the tar's end)
    assert not any(files[name] in data for data in compressed for name in files)
    assert outputs.unpack(tmp_path / "a.tar.gz") == files
    assert outputs.unpack(tmp_path / "b.tar.gz") == changed
