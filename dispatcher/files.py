"""File helpers every writer of the project shares: content hashes, atomic writes, journals.

Atomic means a reader (or a crash) sees the old file or the new one, never half of one: write
a temporary file in the same directory, fsync it, rename it over the target.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path


def sha256_file(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_text_atomic(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path: Path, data) -> Path:
    return write_text_atomic(path, json.dumps(data, indent=1, sort_keys=True))


def append_json_line(path: Path, event: dict) -> None:
    """Append one event (stamped with ``time`` unless it has one) and fsync: journals and the
    batch log lose at most the line being written when the machine stops."""
    line = json.dumps({**event, "time": event.get("time", time.time())}, sort_keys=True)
    with open(path, "ab") as f:
        f.write(line.encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())
