"""File helpers every writer of the project shares: content hashes, atomic writes, journals.

Atomic means a reader (or a crash) sees the old file or the new one, never half of one: write
a temporary file in the same directory, fsync it, rename it over the target.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class TextFileError(ValueError):
    """A text file that cannot be read, or is not UTF-8; the message is one line naming it."""


def read_utf8(path: Path) -> str:
    """The text of ``path``; TextFileError (the path, and why: the OS error, or where the
    first byte that is not UTF-8 lies) if it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TextFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return utf8_text(data, path)


def utf8_text(data: bytes, path: Path) -> str:
    """``data`` (the bytes of ``path``) as text; TextFileError (the path, and where the first
    byte that is not UTF-8 lies) if it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise TextFileError(f"{path}: expected UTF-8 text ({exc.reason} at byte {exc.start}, "
                            f"line {line})") from None


def read_regular_bytes(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, which must be a regular file of at most ``limit`` bytes;
    TextFileError (one line naming it) otherwise.  A FIFO, a device or a directory is refused
    without blocking or reading it (opened non-blocking, judged by fstat); FileNotFoundError
    passes through (a file that may be absent is the caller's case)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise TextFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TextFileError(f"{path}: not a regular file")
        if st.st_size > limit:
            raise TextFileError(f"{path}: {st.st_size} bytes, more than the {limit} expected")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise TextFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TextFileError(f"{path}: more than the {limit} bytes expected")
    return data


def read_regular_text(path: Path, limit: int) -> str:
    """The UTF-8 text of ``path``, which must be a regular file of at most ``limit`` bytes
    (``read_regular_bytes``); TextFileError (one line naming it) otherwise."""
    data = read_regular_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TextFileError(f"{path}: expected UTF-8 text ({exc.reason} at byte "
                            f"{exc.start})") from None


def write_text_atomic(path: Path, text: str, durable: bool = True) -> Path:
    """``text`` into ``path``, whole or not at all; ``durable``: on disk before it replaces
    ``path`` (fsynced), else left to the kernel (a file that only copies what a journal
    holds)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def json_text(data: Any) -> str:
    """The text every JSON file of ours holds: indented by one, keys sorted."""
    return json.dumps(data, indent=1, sort_keys=True)


def records_json(items: Sequence[Any]) -> str:
    """A list of run records as JSON: one record a line, each record's keys sorted.  The
    files of runs (a rundir's measurements.json, the store's measurements and comparisons)
    hold most of what the master writes per candidate: ``json_text``'s indentation would
    take json's pure-Python encoder, about 6 times slower than the C one that writes a
    record on one line, and a record a line still reads and greps."""
    if not items:
        return "[]"
    return "[\n" + ",\n".join(json.dumps(item, sort_keys=True) for item in items) + "\n]"


_SERIALISED = "\0serialised"  # a string no field of ours holds
_SERIALISED_JSON = json.dumps(_SERIALISED)


def _with_serialised(head: str, text: str) -> str:
    """``head`` (JSON holding ``_SERIALISED`` once) with ``text`` in its place."""
    assert head.count(_SERIALISED_JSON) == 1
    return head.replace(_SERIALISED_JSON, text)


def json_text_with(data: Mapping[str, Any], key: str, text: str) -> str:
    """``json_text`` of ``data`` with ``key``'s value the JSON ``text`` already serialised
    (``records_json``'s, say), indented as it reads there, not serialised again."""
    return _with_serialised(json_text({**data, key: _SERIALISED}), text.replace("\n", "\n "))


def json_with(data: Mapping[str, Any], key: str, text: str) -> str:
    """``json.dumps(data, sort_keys=True)`` with ``key``'s value the JSON ``text`` already
    serialised (a long string escaped from pieces, say), not serialised again."""
    return _with_serialised(json.dumps({**data, key: _SERIALISED}, sort_keys=True), text)


def write_json_atomic(path: Path, data: Any) -> Path:
    return write_text_atomic(path, json_text(data))


@contextmanager
def atomic_output(path: Path | str, suffix: str | None = None) -> Iterator[Path]:
    """A temporary path beside ``path`` for a library that writes by file name or file object
    (pandas ``to_csv``/``to_parquet``, matplotlib ``savefig``); the file written there replaces
    ``path`` atomically when the ``with`` block ends without an exception::

        with atomic_output(out) as tmp:
            df.to_csv(tmp, index=False)

    The temporary file exists (empty) when the block starts, is named ``.<name>.<random><suffix>``
    (``suffix`` defaults to ``path``'s own, so a library that picks the format from the extension
    picks the right one) and gets the permissions a new file would (umask applied).  On success
    it is fsynced and renamed over ``path``; on an exception (KeyboardInterrupt included) it is
    removed and ``path`` keeps its old content.  ``path``'s directory must exist.
    """
    path = Path(path)
    directory = path.parent
    fd, name = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.",
                                suffix=path.suffix if suffix is None else suffix)
    tmp = Path(name)
    try:
        try:
            os.fchmod(fd, 0o666 & ~current_umask())
        finally:
            os.close(fd)
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)  # the library closed its own descriptor: sync by name
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def current_umask() -> int:
    """This process's umask, read without changing it (os.umask would, racing other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def append_json_line(path: Path, event: dict) -> None:
    """Append one event (stamped with ``time`` unless it has one) and fsync: journals and the
    batch log lose at most the line being written when the machine stops."""
    append_json_lines(path, [event])


def append_json_lines(path: Path, events: list[dict]) -> None:
    """Append events, a line each, in one write and one fsync (a journal's events decided
    together): the machine stopping loses at most the lines of that write, the last perhaps
    torn (a journal's reader cuts it)."""
    now = time.time()
    data = b"".join(json.dumps({**e, "time": e.get("time", now)}, sort_keys=True).encode()
                    + b"\n" for e in events)
    with open(path, "ab") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


# --------------------------------------------------------------------------- scratch directories

def owned_prefix(prefix: str) -> str:
    """A temporary directory's name prefix naming this process (``PREFIX<pid>-``), so that one
    a killed process left (SIGKILL runs no cleanup) can be told from a live one's
    (``sweep_orphans``)."""
    return f"{prefix}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to sweep
        return True
    return True


def sweep_orphans(prefix: str, directory: str | Path | None = None,
                  min_age_s: float = 3600.0) -> int:
    """Remove the directories ``owned_prefix(prefix)`` named in ``directory`` (default: the
    temporary directory) whose process is gone and that nothing changed for ``min_age_s``;
    the number removed.  Names without a pid, other users' directories, those of live
    processes (this one's included) and recent ones (a process of another pid namespace
    sharing the directory: its pid means nothing here) are left."""
    removed = 0
    try:
        entries = list(Path(directory or tempfile.gettempdir()).glob(f"{prefix}*-*"))
    except OSError:
        return 0
    for entry in entries:
        pid = entry.name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            st = entry.lstat()
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() \
                    and time.time() - st.st_mtime >= min_age_s:
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        except OSError:
            continue
    return removed
