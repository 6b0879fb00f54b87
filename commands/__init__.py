"""The user commands: parsing, wiring (``dispatcher.session``) and printing, nothing else.

The only package that imports both ``dispatcher`` and ``analysis``: data flows
search -> compile -> measure -> store (``dispatcher``) -> analyse (``analysis``), and the
commands sit on top of both.
"""
