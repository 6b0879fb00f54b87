"""A build's text outputs (its decision dumps, overrides.sexp, the compiler's output) as the
store and a search's rundir keep them: one gzip'd tar, ``outputs.tar.gz``.

One file instead of a dozen, about 16 times smaller: a search keeps every candidate's
outputs, and a candidate's dumps are hundreds of kilobytes as text.  The store packs them once
(``Store.commit_artifact``), each file compressed apart and once per content (most of a
candidate's dumps are its parent's), and a rundir of format version 6 keeps a copy of that
pack, so a candidate's dumps cost one write and no compression more.  A directory written
before holds the same files uncompressed, side by side; ``read_outputs`` reads either.  To
read a pack by hand: ``tar -xzf outputs.tar.gz`` (or ``tar -xzOf outputs.tar.gz
main.0.decisions.sexp``).
"""
from __future__ import annotations

import collections
import functools
import gzip
import hashlib
import io
import tarfile
import threading
import zlib
from collections.abc import Mapping
from pathlib import Path

from dispatcher.core.decisions import DUMP_NAME, DecisionDump, parse_dump

OUTPUTS = "outputs.tar.gz"
OVERRIDES = "overrides.sexp"
COMPILER_OUTPUT = "compiler-output.txt"

#: gzip's level for packed outputs.  The master packs every candidate's dumps: level 3 takes
#: less than half the CPU of level 6 (4 ms against 9 for 770 KB of dumps) for a pack 40%
#: larger (the dumps still compress about 18 times).
PACK_LEVEL = 3


def is_output(name: str) -> bool:
    """Whether a file of a build's directory is one of its text outputs."""
    return name in (OVERRIDES, COMPILER_OUTPUT) or DUMP_NAME.match(name) is not None


def pack(path: Path, files: Mapping[str, bytes]) -> None:
    """Write ``files`` (name -> content) as one gzip'd tar: the tar ``tarfile.open(mode="w")``
    writes (each member's header, its bytes padded to a block, two empty blocks, the padding
    to a record), compressed one member at a time, as a gzip stream of several members
    (which gzip, ``tar -xzf`` and Python read as one).  A candidate's dumps are mostly its
    parent's, byte for byte: each member is compressed once per name and content
    (``_member``), and only the new ones cost compression."""
    members = [_member(name, data) for name, data in sorted(files.items())]
    size = sum(_raw_size(name, len(data)) for name, data in files.items())
    path.write_bytes(b"".join(members) + _end_member(-(size + 2 * tarfile.BLOCKSIZE)
                                                     % tarfile.RECORDSIZE))


#: Members kept compressed, by name and the sha256 of their content: a candidate's dozen
#: dumps, for the trees the chains draw from and the candidates in flight (a member is a few
#: to 50 KB: tens of MB at most).
_MEMBERS: collections.OrderedDict[tuple[str, bytes], bytes] = collections.OrderedDict()
_MEMBERS_MAX = 1024
_MEMBERS_LOCK = threading.Lock()


def _member(name: str, data: bytes) -> bytes:
    """One file of a pack as a gzip member of its own: its header, bytes and padding."""
    key = (name, hashlib.sha256(data).digest())
    with _MEMBERS_LOCK:
        member = _MEMBERS.get(key)
        if member is not None:
            _MEMBERS.move_to_end(key)
            return member
    member = gzip.compress(b"".join((_header(name, len(data)), data,
                                     bytes(-len(data) % tarfile.BLOCKSIZE))),
                           compresslevel=PACK_LEVEL, mtime=0)
    with _MEMBERS_LOCK:
        _MEMBERS[key] = member
        while len(_MEMBERS) > _MEMBERS_MAX:
            _MEMBERS.popitem(last=False)
    return member


def _raw_size(name: str, size: int) -> int:
    return len(_header(name, size)) + size + (-size % tarfile.BLOCKSIZE)


@functools.lru_cache(maxsize=64)
def _end_member(padding: int) -> bytes:
    """The two empty blocks that end a tar, and ``padding`` zero bytes to fill its record."""
    return gzip.compress(bytes(2 * tarfile.BLOCKSIZE + padding), compresslevel=PACK_LEVEL,
                         mtime=0)


@functools.lru_cache(maxsize=4096)
def _header(name: str, size: int) -> bytes:
    """A member's tar header (what ``tarfile`` writes: several blocks for a long or
    non-ASCII name), made once per name and size: ``tobuf`` is pure Python."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def unpack(path: Path) -> dict[str, bytes]:
    """name -> content of the plain files in a gzip'd tar written by ``pack`` (decompressed
    whole, then read: faster than tarfile's stream); tarfile.ReadError if it is not one."""
    try:
        raw = gzip.decompress(path.read_bytes())
    except (gzip.BadGzipFile, zlib.error, EOFError) as exc:
        raise tarfile.ReadError(f"{path}: {exc}") from None
    out = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        for member in tar.getmembers():
            f = tar.extractfile(member) if member.isfile() and "/" not in member.name else None
            if f is not None:
                out[member.name] = f.read()
    return out


def read_outputs(directory: Path) -> dict[str, bytes]:
    """name -> content of the text outputs a directory keeps: its pack when it has one, else
    its plain files (a directory written before packing); ValueError (one line naming the
    pack) if the pack is not one."""
    packed = directory / OUTPUTS
    try:
        return unpack(packed)
    except FileNotFoundError:
        return {p.name: p.read_bytes() for p in directory.iterdir() if is_output(p.name)}
    except tarfile.TarError as exc:
        raise ValueError(f"{packed}: not a gzip'd tar of a build's outputs "
                         f"({' '.join(str(exc).split())[:200]})") from None


def place(directory: Path) -> str:
    """What to name, in an error, the place a directory's outputs are read from: its pack,
    or the directory of plain files."""
    return str(directory / OUTPUTS) if (directory / OUTPUTS).exists() else str(directory)


def read_dumps_in(directory: Path) -> list[DecisionDump]:
    """The decision dumps a directory keeps (packed or plain), sorted by (unit, round)."""
    files = read_outputs(directory)
    at = place(directory)
    return sorted((parse_dump(data.decode(), f"{at}/{name}") for name, data in files.items()
                   if DUMP_NAME.match(name)), key=lambda d: (d.unit, d.round))
