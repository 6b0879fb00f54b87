"""What the agent is: a deterministic zip of this package, whose sha256 is the version.

The master packs the package with ``pack`` (``workers/zipapp.py``) and ships the one file;
the agent's ``hello`` reports the sha256 of the archive it runs from, so the master can tell
a stale or damaged upload from its own.  Run from the source tree instead (in-process, or
``python3 -m workers.agent``), the version is that of the archive the sources would pack
into: the same number the master's zipapp has.
"""
from __future__ import annotations

import hashlib
import io
import os
import zipfile

from .cache import sha256_file

ARCHIVE_PACKAGE = "agent"  # the package's name inside the archive
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: no build time leaks in
LAUNCHER = (b'"""Runs the worker agent this archive holds: python3 agent.pyz --help."""\n'
            b"import sys\n\nfrom agent.__main__ import main\n\nsys.exit(main())\n")


def package_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def pack(source: str) -> bytes:
    """The zipapp of the package in ``source``: its ``*.py`` files (no ``__pycache__``)
    under ``agent/`` and a launcher as ``__main__.py``; entries sorted, stored
    uncompressed (no dependence on the zlib version), dated 1980-01-01, mode 0644."""
    entries = [("__main__.py", LAUNCHER)]
    for name in os.listdir(source):
        path = os.path.join(source, name)
        if name.endswith(".py") and not name.startswith(".") and os.path.isfile(path):
            with open(path, "rb") as f:
                entries.append(("%s/%s" % (ARCHIVE_PACKAGE, name), f.read()))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for arcname, data in sorted(entries):
            info = zipfile.ZipInfo(arcname, date_time=FIXED_TIME)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3  # Unix, whatever the packing host
            info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--
            zf.writestr(info, data)
    return buf.getvalue()


def agent_version() -> str:
    """The sha256 of the zipapp this code runs from (or would pack into)."""
    archive = getattr(globals().get("__loader__"), "archive", None)  # set by zipimport
    if isinstance(archive, str) and archive:
        return sha256_file(archive)
    return hashlib.sha256(pack(package_dir())).hexdigest()
