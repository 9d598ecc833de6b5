"""Local training without federation (the "NoFed" baseline)."""

from __future__ import annotations

import numpy as np

from cflpipe.fl.method import ClientView, Context, Method, Payload, Placement, Update
from cflpipe.fl.predictors import Models
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.methods.personal import PersonalModels


class Local(PersonalModels, Method):
    """Local: every client trains only its own model; nothing is communicated."""

    personal_table = "model"

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

    newcomer_rule = "trains a model of its own from the initial model for one round's local steps (nothing is sent)"

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        newcomers.ask({c: Payload(meta={"question": "own"}) for c in range(n)})  # each keeps what it trained
        return Placement(np.full(n, -1, dtype=np.int64), Models.own(newcomers.clients[self.personal_table]))

    @classmethod
    def query_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan | None, None]:
        if payload.meta.get("question") != "own":
            return super().query_plan(view, payload)
        return ClientPlan(view.initial["model"]), None

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: Trained | None, scratch: None) -> Update:
        if trained is None:
            return super().query(view, payload, trained, scratch)
        return view.update({}, trained, keep={"model": trained.vector})

