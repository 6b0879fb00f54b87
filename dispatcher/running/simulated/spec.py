"""The simulated backend's spec (``dispatcher.running.backend.MODULES``): its slots in this
process (``backend``) or in the actors of a Ray cluster (``ray_hosts``, ``simulated.ray``).
Apart from both so that neither imports the other's way back."""
from __future__ import annotations

from dispatcher.running.backend import Backend, BackendContext, BackendSpec
from dispatcher.running.simulated.backend import (
    SimulatedBackend,
    SimulatedConfig,
    parse_config,
    simulated_compiler,
)
from dispatcher.running.simulated.ray_hosts import RayHostedBackend


def start(config: SimulatedConfig, context: BackendContext) -> Backend:
    if config.ray is not None:  # the slots in Ray actors (none lent, as the Ray backend's)
        return RayHostedBackend(config)
    return SimulatedBackend(config, exact=context.exact)


BACKEND = BackendSpec(name="simulated", parse=parse_config,
                      worker_classes=lambda c: [c.worker_class],
                      master_cpus=lambda c: None, start=start, toolchain=simulated_compiler)
