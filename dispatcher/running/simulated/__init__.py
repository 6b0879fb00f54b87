"""A simulated worker and compiler, for benches and tests of the whole master at scale.

Behind the same seams as the real ones (the backend contract, ``dispatcher.running.backend``,
and the compile service's ``Builder``), so everything above them (the scheduler, the
measurement service, the search chains, the rundirs) runs unchanged: a slot "runs" a binary
by sleeping the time a performance model gives it, a build "compiles" by applying the
candidate's overrides to a real decision tree and sleeping its modelled compile time.  Hundreds
of slots fit on a 2-CPU machine.  Never the default: a config names ``backend: simulated``.

``model``: the performance model (data); ``programs``: the real trees and the simulated
compile; ``backend``: the slots, the builder and the config section; ``ray_hosts``: the
same slots hosted by the actors of a Ray cluster (``simulated.ray``, read by
``ray_settings``); ``spec``: the backend's spec, starting one or the other.
docs/simulation.md.
"""
