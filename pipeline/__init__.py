"""The pipeline: the procedures the commands run, between ``analysis/`` and ``commands/``.

A command parses its arguments, calls one entry point here (or in the layers below) and words
the result; what a procedure decides (the campaign's stages and budget, which policy is kept,
what a training set is made of, how a long run stops and reports) lives here, testable without
a command line.  It imports ``dispatcher/`` and ``analysis/``, never ``commands/``; it never
prints to stdout or exits: it returns records and raises errors of one line.

- ``pipeline.campaign``: the campaign's plan, stage runner, budget and publishing
- ``pipeline.policy``: training inputs, policy validation and selection
- ``pipeline.longrun``: the long-run protocol (graceful stop, status lines, the one progress
  writer)
- ``pipeline.searches``: run_training_experiments' search chains, under that protocol
- ``pipeline.sites``: measure-sites' labellers and labels tables, under that protocol
- ``pipeline.evaluation``: builds measured against the heuristic and the baselines
  (run-benchmark, run-all-benchmarks, run-plugin-benchmark)
- ``pipeline.rewards``: assign-rewards' procedure
"""
