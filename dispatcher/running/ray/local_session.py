"""What ``address: auto`` means: the Ray cluster this machine runs for this user, and nothing
else (issue 36 item 4).

Ray's own ``auto`` takes the address in its session file (``<tmp>/ray/ray_current_cluster``,
written by the last ``ray start`` on the machine, by anyone) or else any raylet it sees running,
and then retries that address for minutes, a warning every few seconds: a stale file, or one
another user's (or another network namespace's) cluster left, hangs the command and may
join a cluster that is not the user's.  So ``auto`` is resolved here, at once, to a host:port
that Ray is then given:

- ``$RAY_ADDRESS``, when set: the user's own choice, checked as a configured address is;
- else the session file, when this user wrote it, it names an address of this machine (a
  head started here) or the GCS of a raylet this user runs here (a node that joined a head
  elsewhere), and something answers there;
- else the GCS address of a raylet this user runs on this machine, when exactly one answers.

Anything else is ``BackendUnavailable``: one line naming the file or saying that no cluster
of this user runs here, within seconds.  A cluster of another account is joined by giving
its address (``ray.address``).
"""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from dispatcher.core.files import TextFileError, read_regular_text
from dispatcher.running.backend import BackendUnavailable

SESSION_FILE = "ray_current_cluster"
ANSWER_S = 3.0  # for the GCS port to accept a connection: it is this machine's own
START_HINT = "start one with `ray start --head ...`, or give ray.address"


def session_file() -> Path:
    """Where Ray keeps the address of the last cluster started on this machine (its rule:
    ``$RAY_TMPDIR``, else ``$TMPDIR`` on Linux, else /tmp; then ``ray/``)."""
    base = os.environ.get("RAY_TMPDIR") or (
        os.environ.get("TMPDIR") if sys.platform.startswith("linux") else None) or "/tmp"
    return Path(base) / "ray" / SESSION_FILE


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.strip().rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port: {address!r}")
    return host.strip("[]"), int(port)


def is_local(host: str) -> bool:
    """Whether ``host`` is an address of this machine (in this network namespace): one a
    socket can be bound to."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM,
                                   flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        return False
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.bind((sockaddr[0], 0, *sockaddr[2:]))
            return True
        except OSError:
            continue
    return False


def answers(host: str, port: int, timeout: float = ANSWER_S) -> str | None:
    """None when something accepts a connection at host:port, else why not."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return None
    except OSError as exc:
        return exc.strerror or str(exc) or type(exc).__name__


def own_raylets() -> set[str]:
    """The GCS addresses that raylets run by this user on this machine were started with."""
    uid = os.getuid()
    found: set[str] = set()
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or os.path.basename(argv[0].decode(errors="replace")) != "raylet":
            continue
        for arg in argv[1:]:
            text = arg.decode(errors="replace")
            for flag in ("--gcs-address=", "--gcs_address="):
                if text.startswith(flag) and text[len(flag):] not in ("", "None"):
                    found.add(text[len(flag):])
    return found


def _session_problem(path: Path, raylets: set[str]) -> tuple[str | None, str]:
    """(the session file's address when it is this user's cluster on this machine and it
    answers, else None; why not).  ``raylets``: the GCS addresses of this user's raylets here
    (a node that joined a head elsewhere names the head's)."""
    try:
        owner = path.stat().st_uid
        text = read_regular_text(path, 4096).strip()
    except FileNotFoundError:
        return None, ""
    except (OSError, TextFileError) as exc:
        return None, f"{path}: cannot read it ({' '.join(str(exc).split())})"
    if owner != os.getuid():
        return None, (f"{path} was left by another user (uid {owner}): not a cluster this "
                      "user started")
    try:
        host, port = split_address(text)
    except ValueError:
        return None, f"{path}: not a Ray address ({text[:80]!r})"
    if not is_local(host) and text not in raylets:
        return None, (f"{path} names the cluster at {text}, neither an address of this "
                      "machine nor the head of a raylet this user runs here (a session file "
                      "another network or machine left)")
    why = answers(host, port)
    if why is not None:
        return None, (f"{path} names the cluster at {text}, which does not answer ({why}): "
                      "a stale session file (`ray stop` removes it)")
    return text, ""


def auto_address() -> str:
    """The host:port ``address: auto`` stands for (module docstring); BackendUnavailable,
    one line, when this user runs no cluster on this machine that answers."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        try:
            host, port = split_address(env)
        except ValueError:
            raise BackendUnavailable(f"ray: address auto: $RAY_ADDRESS is {env!r}, not the "
                                     "head's host:port") from None
        why = answers(host, port, 10.0)
        if why is not None:
            raise BackendUnavailable(f"ray: address auto: $RAY_ADDRESS names the cluster at "
                                     f"{env}, which does not answer ({why})")
        return env
    path = session_file()
    raylets = own_raylets()
    address, problem = _session_problem(path, raylets)
    if address is not None:
        return address
    live = []
    for a in sorted(raylets):
        try:
            host, port = split_address(a)
        except ValueError:
            continue
        if answers(host, port) is None:
            live.append(a)
    if len(live) == 1:
        return live[0]
    if len(live) > 1:
        raise BackendUnavailable(f"ray: address auto: this user runs several Ray clusters on "
                                 f"this machine ({', '.join(live)}): give ray.address")
    if problem:
        raise BackendUnavailable(f"ray: address auto: {problem}; {START_HINT}")
    raise BackendUnavailable(f"ray: address auto: no Ray cluster of this user runs on this "
                             f"machine ({path} does not exist); {START_HINT}")
