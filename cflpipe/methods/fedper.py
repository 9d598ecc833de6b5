"""FedPer (Arivazhagan et al. 2019, "Federated Learning with Personalization Layers").

The network is split into base layers (the body: every layer but the decision layer) and
personalization layers (the head: the last fully-connected layer, `ParamSpace.head`). Each
sampled client trains the whole network locally, starting from the server's body and its own
head; only the body travels in either direction and the server averages it (weighted by the
clients' sample counts, as FedAvg). The head never leaves the client and is kept across rounds.

FedPer's paper lets the number of personalization layers vary; this implementation fixes it to
the models' head (the last layer), which is the split FedAC and FedTSDP compare against.
"""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.fl.method import ROUND, ClientView, Context, Method, Payload, Placement, Update, stack_updates
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Models, with_heads
from cflpipe.fl.params import weighted_average


class FedPer(Method):
    """FedPer: shared body averaged on the server, personal head kept on each client."""

    checkpoint = ("global_model",)

    def __init__(self, ctx):
        super().__init__(ctx)
        space = ctx.space
        self.body_mask = space.body
        self.head_mask = space.head
        # The server's model; only its body part is ever sent or updated. Its head part stays
        # the initial head, which is also every client's head until that client first trains.
        self.global_model = ctx.init.clone()
        ctx.clients.add("head", ctx.init[self.head_mask])

    # --- server → client: the body only
    def payload(self, client: int) -> Payload:
        return Payload({"body": self.global_model[self.body_mask]})

    # --- client: body from the server + own head, all layers trained; only the body goes up
    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        start = view.initial["model"].clone()  # a model without layers has neither body nor head: its initial one
        start[view.space.body] = payload.tensors["body"]
        start[view.space.head] = view.kept("head")
        return ClientPlan(start), None

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Trained, scratch: None) -> Update:
        vector = trained.vector
        return view.update({"body": vector[view.space.body]}, trained, keep={"head": vector[view.space.head]})

    # --- server: average the bodies (each client keeps the head it trained, in the client store)
    def aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        _, bodies, weights = stack_updates(updates, "body")
        self.global_model[self.body_mask] = weighted_average(bodies, weights)

    # --- evaluation: the global body with the client's own head (a client never sampled still
    # has the initial, untrained head, so its accuracy is that of a random decision layer)
    def client_models(self, clients: Context | None = None, only: np.ndarray | None = None) -> torch.Tensor:
        """The global body with each client's own head (of `clients`' store: the participants' by
        default), for the clients in `only` (sorted ids) where given."""
        return with_heads(self.global_model, self.head_mask, (clients or self.ctx).clients["head"], only)

    newcomer_rule = ("receives the shared body and trains body and its own head as a client does in a round, then "
                     "keeps the head: served the shared body with that head")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        payload = Payload({"body": self.global_model[self.body_mask]}, {"question": ROUND})
        newcomers.ask({c: payload for c in range(n)})  # each keeps the head it trained
        return Placement(np.full(n, -1, dtype=np.int64), Models.own(self.client_models(newcomers)))

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: Trained | None, scratch: None) -> Update:
        if trained is None:
            return super().query(view, payload, trained, scratch)
        return view.update({}, trained, keep={"head": trained.vector[view.space.head]})

    def predictor(self, clients: np.ndarray | None = None) -> Models:
        return Models.own_of(self.client_models(only=clients), clients, self.ctx.num_clients)
