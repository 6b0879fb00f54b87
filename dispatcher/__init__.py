"""The master: search, building, running and storing, in layers.

Each layer is a subpackage that imports only from itself and the layers below it, so a reader
can take the layers bottom up and never meet a name from above, and a change to a layer can
only break those above it.  Bottom first:

``core``
    Formats and pure rules: files, statistics, decision files and trees, the rundir's records
    and layout, the strict YAML loader and reader of configs and manifests (``validation``).
    No threads, no processes, no network.
``storage``
    The content-addressed store of compiled candidates and units, and its garbage collection.
``build``
    Building programs: the compiler's identity (``toolchain``), benchmark manifests, the
    ocamlopt driver and unit cache, the compile service, inlining policies and their host.
``running``
    Running them on workers: the backend contract and the backends (local, ssh, ray/), the
    agent client, the scheduler and the measurement service.
``search``
    The search over decision trees: its pure rules, hot-code focus, and the chains.

On top, the modules directly in ``dispatcher/`` assemble the layers: ``config`` (the YAML
config), ``session`` (config -> store -> compile service -> backend -> scheduler ->
measurement service), ``cpu_split`` (CPUs for compiles and for runs), ``planning`` (the chains
of a campaign, new or resumed) and ``compare`` (builds measured against the heuristic build),
so that each command only parses, calls and prints.  Nothing in ``dispatcher/`` imports
``analysis/``, ``pipeline/`` or ``commands/`` (they sit above it), ``workers/`` imports nothing from
``dispatcher/`` (it runs alone on worker machines), and no modules import one another in a
circle, not even for types only.  ``tests/test_layers.py`` checks all of it from ``LAYERS``.
"""

#: The layers of ``dispatcher/``, bottom first; the modules directly in it form the top layer.
LAYERS = ("core", "storage", "build", "running", "search", "labels")
