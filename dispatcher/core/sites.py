"""Where a call site's code lives: the rule shared by hot-code focus
(``dispatcher.search.focus``), the simulated backend's profiles and the labels' reports.

Pure and here in ``core`` so that every layer reads one rule (the simulation kept a copy of
it while it lived in ``search``).
"""
from __future__ import annotations

from dispatcher.core.tree import split_key


def site_function(unit: str, key: str) -> str:
    """The function whose code holds the call ``key`` of ``unit``: its innermost
    declaration frame, or the unit's top-level code."""
    for frame in reversed(split_key(key)):
        if frame.startswith("D(") and "@" in frame:
            return frame[2:frame.index("@")]
    return f"{unit}.entry"
