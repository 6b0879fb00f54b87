"""Labels: each inlining decision's effect measured directly (``measure-sites``,
docs/labels.md): which of a search winner's decisions carry its gain (delta debugging), and
single flips of the heuristic's hottest sites, each a paired comparison with its interval."""
