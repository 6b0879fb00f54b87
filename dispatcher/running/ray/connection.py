"""How a config section joins a Ray cluster (``address``, ``auth``, ``token_file``): shared by
the ``ray`` backend and ``simulated.ray``, apart from the cluster manager so that reading a
config does not import it."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from dispatcher.core.validation import Reader

_ADDRESS_RE = re.compile(r"^[A-Za-z0-9._%-]+:[0-9]{1,5}$|^\[[0-9A-Fa-f:.%]+\]:[0-9]{1,5}$")


def parse_connection(d: dict, r: Reader, section: str) -> tuple[str, str, Optional[Path]]:
    """``address``, ``auth`` and ``token_file`` of ``section``, with their defaults: auto,
    token, none."""
    address = d.get("address", "auto")
    if not isinstance(address, str) or not (address == "auto" or _ADDRESS_RE.match(address)):
        raise r.fail(f"{section}.address", "auto or the head's host:port", address)
    auth = d.get("auth", "token")
    if auth not in ("token", "none"):
        raise r.fail(f"{section}.auth", "token or none", auth)
    token_file = d.get("token_file")
    token = None if token_file is None else r.local_path(token_file, f"{section}.token_file")
    if token is not None and auth != "token":
        raise r.fail(f"{section}.token_file", f"no token file with {section}.auth: none",
                     token_file)
    return address, auth, token
