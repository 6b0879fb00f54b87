"""Policy training inputs, validation and selection: what ``train-policy`` and
``export-dataset`` decide, below the commands that word it.

- ``inputs``: the one reader of labels, rewards and heuristic-build feature tables
- ``training``: train-policy's steps (sources, training table, validation, the kept policy)
- ``validation``: fold policies measured on the benchmark each never saw
- ``selection``: the measured gate and the rule that keeps a classifier
- ``export``: export-dataset's inputs made one dataset
"""
