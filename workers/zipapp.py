"""The worker agent as one file: ``agent-<sha256[:16]>.pyz``, runnable as ``python3 FILE``.

Deterministic (sorted entries, fixed dates and modes, no bytecode: ``workers.agent.version``),
so two builds of the same sources are byte-identical and the sha256 is the agent's version.
Content-addressed names let concurrent masters, even of different versions, share a
directory.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from workers.agent.version import pack, package_dir


def agent_zipapp_bytes(source: Path | str | None = None) -> bytes:
    """The zipapp of the agent package in ``source`` (default: ``workers/agent``)."""
    return pack(str(source) if source is not None else package_dir())


def build_agent_zipapp(dest_dir: Path | str, source: Path | str | None = None) -> Path:
    """Write the agent's zipapp into ``dest_dir`` (made if needed) -> its path.  A file of
    that name with the right content is left as it is; anything else under the name is
    replaced atomically."""
    data = agent_zipapp_bytes(source)
    sha = hashlib.sha256(data).hexdigest()
    dest_dir = Path(dest_dir)
    dest = dest_dir / f"agent-{sha[:16]}.pyz"
    try:
        if dest.read_bytes() == data:
            return dest
    except OSError:
        pass
    dest_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest_dir, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return dest
