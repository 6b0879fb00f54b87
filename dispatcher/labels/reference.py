"""Labels from an aggressive reference (issue 35): ``measure-sites --reference
always-inline|TREE`` flips sites of that build back, alone, to learn where inlining hurts.

The heuristic's own tree only shows what one more or one fewer inlining does from where the
heuristic stands; the baselines say the gains are much further out (always-inline beats the
heuristic on most programs, but loses on lu's closure, deltablue's and setmap's growth).  So
the reference may be another build: ``always-inline`` (the constant policy file the compiler
evaluates) or a tree (an overrides file, e.g. a search's ``optimal.sexp``).  Each label takes
one site that build inlined by its own choice and builds it again with that site alone set
back to ``dont_inline``, against the reference build.  ``effect`` keeps its meaning,
log(reference time / tested time): above 0, the flip-back (``dont_inline``, the row's action)
made the program faster, so inlining there hurt: a ``dont_inline`` label; below 0, inlining
there paid: ``inline`` (``analysis.label_training.row_label``, unchanged).

Pure: which sites, and the overrides of one flip-back.  The labeller builds and measures.
"""
from __future__ import annotations

from collections.abc import Sequence

from dispatcher.core.decisions import Override
from dispatcher.core.site_records import SiteDecision
from dispatcher.core.tree import DONT_INLINE, INLINE, Tree
from dispatcher.search.focus import HotFunctions, site_heat

#: The rundir's copy of a tree reference (its file may change once the rundir is made).
REFERENCE_TREE = "reference.sexp"
#: The reasons of a decision the reference build *chose* (its policy's answer, its tree's
#: override, or the compiler's heuristic within that tree): an attribute's or a guard's is
#: not the reference's to flip back.
CHOSEN = ("policy", "override", "heuristic")


def flip_back_sites(tree: Tree, hot: HotFunctions, k: int) -> list[SiteDecision]:
    """The ``k`` hottest sites the reference build inlined by its own choice (``CHOSEN``),
    each set back to ``dont_inline``: heat as the sweep ranks it (the samples of the function
    holding the call plus its callee's, ``site_heat``), sites never sampled skipped, ties in
    tree order, a site decided in several rounds taken once (its earliest).  An inlined call
    with calls inside its body is a candidate too (flipping lu's closure back takes its body
    with it), unlike the heuristic's sweep, which flips leaves."""
    ranked = sorted(((site_heat(u, n.key, n.name, hot), i, u, r, n)
                     for i, (u, r, n) in enumerate(tree.calls())
                     if n.action == INLINE and n.reason in CHOSEN),
                    key=lambda x: (-x[0], x[1]))
    out: list[SiteDecision] = []
    seen: set[tuple[str, str]] = set()
    for heat, _, unit, round_, node in ranked:
        if heat > 0 and (unit, node.key) not in seen and len(out) < k:
            seen.add((unit, node.key))
            out.append(SiteDecision(unit=unit, round=round_, key=node.key, callee=node.name,
                                    action=DONT_INLINE, heuristic=INLINE))
    return out


def flipped_back(base: Sequence[Override], tree: Tree, site: SiteDecision) -> list[Override]:
    """The reference's own overrides (``base``: none for always-inline, the tree's for a
    tree) with ``site`` pinned to ``dont_inline``, in its round and the unit's later rounds
    (as ``winner.tree_with`` pins one: a later round could inline the call after all), each
    replacing an entry of the same site."""
    last = max((r for u, r, _ in tree.calls() if u == site.unit), default=site.round)
    pins = {(o.unit, o.round, o.key): o for o in base}
    for r in range(site.round, last + 1):
        pins[(site.unit, r, site.key)] = Override(site.unit, r, site.key, DONT_INLINE)
    return sorted(pins.values())
