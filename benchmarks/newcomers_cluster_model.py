"""FedAC and FedSoft serving a new client its cluster's model: a diagnostic for #69 item 8, not a
method (docs/new-clients.md, "Each method's rule").

FedAC and FedSoft serve every client its own personal model; a new client (scenario
new_clients) is placed by each method's own rule, which trains its personal model for one round
from the initial model, as the method starts every participant's. These subclasses keep that
placement (the same round, the same cluster) and serve the new client the model of its cluster
instead: FedAC's centre Ω_k, FedSoft's centre of its largest importance weight.

    PYTHONPATH=benchmarks cflpipe train --config config/experiments/changing_clients_embedded.yaml \\
        --scenario rot-new --method fedac_cluster --seed 0 \\
        --set 'methods.fedac_cluster={"method": "newcomers_cluster_model:FedACClusterModel"}'
"""

from __future__ import annotations

import numpy as np

from cflpipe.methods import register
from cflpipe.methods.fedac import FedAC
from cflpipe.methods.fedac_params import FedACParams
from cflpipe.methods.fedsoft import FedSoft
from cflpipe.methods.fedsoft_params import FedSoftParams


def cluster_served(method, newcomers, placement):
    """The placement's clusters, served each cluster's centre (the mean of the centres where a
    new client is in none)."""
    centers = list(method.centers)
    index = np.where(placement.clusters >= 0, placement.clusters, len(centers))
    return method.served(newcomers, placement.clusters, [*centers, method.centers.mean(0)], index)


@register("fedac_cluster_model", FedACParams)
class FedACClusterModel(FedAC):
    """FedAC, a new client served its cluster's centre Ω_k (a diagnostic)."""

    def place(self, newcomers):
        return cluster_served(self, newcomers, super().place(newcomers))


@register("fedsoft_cluster_model", FedSoftParams)
class FedSoftClusterModel(FedSoft):
    """FedSoft, a new client served the centre of its largest importance weight (a diagnostic)."""

    def place(self, newcomers):
        return cluster_served(self, newcomers, super().place(newcomers))
