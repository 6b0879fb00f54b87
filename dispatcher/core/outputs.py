"""A build's text outputs (its decision dumps, overrides.sexp, the compiler's output) as the
store and a search's rundir keep them: one gzip'd tar, ``outputs.tar.gz``.

One file instead of a dozen, about 18 times smaller: a search keeps every candidate's
outputs, and a candidate's dumps are hundreds of kilobytes as text.  The store packs them once
(``Store.commit_artifact``), and a rundir of format version 6 keeps a copy of that pack, so a
candidate's dumps cost one write and no compression more.  A directory written before holds
the same files uncompressed, side by side; ``read_outputs`` reads either.  To read a pack by
hand: ``tar -xzf outputs.tar.gz`` (or ``tar -xzOf outputs.tar.gz main.0.decisions.sexp``).
"""
from __future__ import annotations

import functools
import gzip
import io
import tarfile
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
    """Write ``files`` (name -> content) as one gzip'd tar, made in memory and compressed
    whole: each member's header (``TarInfo.tobuf``, the format ``tarfile`` writes by
    default), its bytes and their padding to a block, then the two empty blocks that end an
    archive and the padding to a record; the very bytes ``tarfile.open(mode="w")`` writes,
    without copying each member through a file object."""
    chunks: list[bytes] = []
    for name, data in sorted(files.items()):
        chunks += (_header(name, len(data)), data, bytes(-len(data) % tarfile.BLOCKSIZE))
    chunks.append(bytes(2 * tarfile.BLOCKSIZE))
    chunks.append(bytes(-sum(map(len, chunks)) % tarfile.RECORDSIZE))
    path.write_bytes(gzip.compress(b"".join(chunks), compresslevel=PACK_LEVEL, mtime=0))


@functools.lru_cache(maxsize=4096)
def _header(name: str, size: int) -> bytes:
    """A member's tar header: made once per name and size (a candidate's dumps are mostly
    its parent's, and ``tobuf`` is pure Python)."""
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
