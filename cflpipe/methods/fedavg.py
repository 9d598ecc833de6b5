"""FedAvg (McMahan et al. 2017)."""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.fl.local import Anchor
from cflpipe.fl.method import ClientView, Context, Method, Payload, Placement, Update, average_updates
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Models


class FedAvg(Method):
    """FedAvg: one global model, clients' models averaged weighted by their sample counts."""

    checkpoint = ("global_model",)
    streamed_means = ("model",)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.global_model = ctx.init.clone()

    def payload(self, client: int) -> Payload:
        return Payload({"model": self.global_model})

    # --- the client, over its view: it trains the model it received and sends it back
    @classmethod
    def client_anchors(cls, view: ClientView, payload: Payload) -> list[Anchor]:
        """Proximal pulls of the local objective (FedProx's)."""
        return []

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        return ClientPlan(payload.tensors["model"], cls.client_anchors(view, payload)), None

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Trained, scratch: None) -> Update:
        return view.update({"model": trained.vector}, trained)

    def aggregate(self, updates: dict[int, Update]) -> None:
        # The held path (play, a subclass's super()) in terms of the streamed one: the same bits.
        if updates:
            self.aggregate_means({key: average_updates(updates, key) for key in type(self).streamed_means})

    def aggregate_means(self, means: dict[str, torch.Tensor]) -> None:
        self.global_model = means["model"]

    def predictor(self, clients: np.ndarray | None = None) -> Models:
        return Models.shared(self.global_model, self.ctx.num_clients)

    newcomer_rule = "served the global model as it is (one model for every client)"

    def place(self, newcomers: Context) -> Placement:
        shared = np.zeros(newcomers.num_clients, dtype=np.int64)
        return self.served(newcomers, shared, [self.global_model], shared)
