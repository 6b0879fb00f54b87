"""Policy training inputs, validation and selection: what ``train-policy`` and
``export-dataset`` decide, below the commands that word it.

- ``selection``: the measured gate and the rule that keeps a classifier
"""
