"""The user commands, one module each: a command parses its arguments, calls into
``dispatcher`` (through a ``dispatcher.session.Session`` when it compiles or measures) and
``analysis``, and prints; what it computes or decides lives in those packages.

The commands sit on top: ``dispatcher`` and ``workers`` import neither ``analysis`` nor
``commands``, and ``analysis`` (which reads what ``dispatcher`` writes) never imports
``commands`` (``tests/test_layers.py``).  Data flows search -> compile -> measure -> store
(``dispatcher``) -> analyse (``analysis``).
"""
