"""FedAvg (McMahan et al. 2017)."""

from __future__ import annotations

import torch

from cflpipe.fl.local import Anchor
from cflpipe.fl.method import Method, Payload, Update, average_updates
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.methods import HyperParams, register


@register("fedavg", HyperParams)
class FedAvg(Method):
    """FedAvg: one global model, clients' models averaged weighted by their sample counts."""

    checkpoint = ("global_model",)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.global_model = ctx.init.clone()

    def anchors(self, payload: Payload) -> list[Anchor]:
        return []

    def payload(self, client: int) -> Payload:
        return Payload({"model": self.global_model})

    def plan(self, client: int, payload: Payload) -> ClientPlan:
        return ClientPlan(payload.tensors["model"], self.anchors(payload))

    def finish(self, client: int, payload: Payload, trained: Trained) -> Update:
        return self.update(client, {"model": trained.vector}, trained)

    def aggregate(self, updates: dict[int, Update]) -> None:
        if updates:
            self.global_model = average_updates(updates)

    def eval_params(self, client: int) -> torch.Tensor:
        return self.global_model
