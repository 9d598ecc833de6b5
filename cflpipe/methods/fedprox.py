"""FedProx (Li et al. 2020)."""

from __future__ import annotations


from cflpipe.fl.local import Anchor
from cflpipe.fl.method import ClientView, Payload
from cflpipe.methods.fedavg import FedAvg


class FedProx(FedAvg):
    """FedProx: FedAvg whose local objective adds (mu/2)·||w − w_global||²."""

    @classmethod
    def client_anchors(cls, view: ClientView, payload: Payload) -> list[Anchor]:
        return [Anchor(payload.tensors["model"], view.hp.mu)]
