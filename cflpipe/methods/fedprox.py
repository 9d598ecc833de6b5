"""FedProx (Li et al. 2020)."""

from __future__ import annotations

from pydantic import Field

from cflpipe.fl.local import Anchor
from cflpipe.fl.method import Payload
from cflpipe.methods import HyperParams, register
from cflpipe.methods.fedavg import FedAvg


class FedProxParams(HyperParams):
    mu: float = Field(0.01, ge=0, description="proximal strength pulling local models to the global one")


@register("fedprox", FedProxParams)
class FedProx(FedAvg):
    """FedProx: FedAvg whose local objective adds (mu/2)·||w − w_global||²."""

    @classmethod
    def client_anchors(cls, hp, payload: Payload) -> list[Anchor]:
        return [Anchor(payload.tensors["model"], hp.mu)]
