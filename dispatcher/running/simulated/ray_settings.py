"""The ``simulated.ray`` section: where the simulated slots' Ray actors run
(``ray_hosts``).  Apart from the actors' code so that the simulated backend's config can read
it without importing them."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dispatcher.core.validation import Reader
from dispatcher.running.ray.connection import parse_connection

MAX_ACTORS = 10_000


@dataclass(frozen=True)
class RayHosts:
    """The ``simulated.ray`` section: where the slots' actors run."""

    address: str = "auto"  # "auto" (this machine's cluster) or the head's GCS host:port
    actors: int = 8  # actor processes hosting the slots (at most the slots)
    auth: str = "token"  # "token" or "none", as ray.auth
    token_file: Optional[Path] = None
    start_timeout: float = 120.0  # for every actor to start and answer


def parse_section(value: Any, r: Reader, slots: int) -> RayHosts:
    """``simulated.ray`` (``slots``: simulated.slots, which the actors share)."""
    d = r.section({"simulated.ray": value}, "simulated.ray",
                  {"address", "actors", "auth", "token_file", "start_timeout"})
    address, auth, token = parse_connection(d, r, "simulated.ray")
    actors = r.positive_int(d, "actors", "simulated.ray.actors", min(RayHosts.actors, slots),
                            most=MAX_ACTORS)
    if actors > slots:
        raise r.fail("simulated.ray.actors", f"at most simulated.slots ({slots})", actors)
    start_timeout = r.positive_number(d, "start_timeout", "simulated.ray.start_timeout",
                                      RayHosts.start_timeout, most=3600,
                                      what="a positive number of seconds")
    return RayHosts(address=address, actors=actors, auth=auth, token_file=token,
                    start_timeout=start_timeout)
