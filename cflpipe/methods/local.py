"""Local training without federation (the "NoFed" baseline)."""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.fl.method import Capabilities, ClientView, Method, Payload, Update
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.methods import HyperParams, register


@register("local", HyperParams)
class Local(Method):
    """Local: every client trains only its own model; nothing is communicated."""

    capabilities = Capabilities(personalized=True)

    def __init__(self, ctx):
        super().__init__(ctx)
        ctx.clients.add("model", ctx.init)

    def payload(self, client: int) -> Payload:
        return Payload()

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        return ClientPlan(view.kept("model")), None

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Trained, scratch: None) -> Update:
        # The model stays on the client: nothing in `tensors`, so nothing is counted as sent.
        return view.update({}, trained, keep={"model": trained.vector})

    def aggregate(self, updates: dict[int, Update]) -> None:
        pass  # nothing reaches the server; the engine keeps each client's model in its store

    def eval_params(self, client: int) -> torch.Tensor:
        return self.ctx.clients.get("model", client)

    def eval_models(self) -> tuple[list[torch.Tensor], np.ndarray]:
        return list(self.ctx.clients["model"]), np.arange(self.ctx.num_clients)
