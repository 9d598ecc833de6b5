"""FedAvgM: FedAvg with server momentum (Hsu, Qi and Brown 2019, "Measuring the Effects of
Non-Identical Data Distribution for Federated Visual Classification", arXiv:1909.06335).

The server treats the difference between the global model and the clients' weighted average as
a pseudo-gradient Δ and takes a momentum step on it:

    v ← β·v + Δ,    w ← w − η·v            (Nesterov: w ← w − η·(β·v + Δ))

With β = 0 and η = 1 this is FedAvg. The defaults are the paper's best momentum (β = 0.9) with
η = 1; its effective learning rate is η/(1 − β), so η ≈ 1 − β keeps FedAvg's step size. Momentum carries the direction of past rounds across rounds
in which only a few, skewed clients are sampled, which is what helps on non-IID data. The
velocity v is server state: it is checkpointed (resume gives the same bytes) and never sent.
"""

from __future__ import annotations

import torch
from pydantic import Field

from cflpipe.fl.method import stack_updates
from cflpipe.fl.params import weighted_average
from cflpipe.methods import HyperParams, register
from cflpipe.methods.fedavg import FedAvg


class FedAvgMParams(HyperParams):
    server_momentum: float = Field(0.9, ge=0, lt=1, description="β: momentum of the server's pseudo-gradient")
    server_lr: float = Field(1.0, gt=0, description="η: server learning rate (1 with β = 0 is FedAvg)")
    nesterov: bool = Field(False, description="Nesterov momentum: step along β·v + Δ instead of v")


@register("fedavgm", FedAvgMParams)
class FedAvgM(FedAvg):
    """FedAvgM (Hsu et al. 2019): FedAvg whose server steps along a momentum of the averaged update."""

    checkpoint = ("global_model", "velocity")

    def __init__(self, ctx):
        super().__init__(ctx)
        self.velocity = torch.zeros_like(self.global_model)

    def aggregate(self, updates) -> None:
        if not updates:
            return
        _, vectors, weights = stack_updates(updates)
        delta = self.global_model - weighted_average(vectors, weights)
        self.velocity = self.hp.server_momentum * self.velocity + delta
        step = self.hp.server_momentum * self.velocity + delta if self.hp.nesterov else self.velocity
        self.global_model = self.global_model - self.hp.server_lr * step
