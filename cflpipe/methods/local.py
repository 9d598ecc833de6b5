"""Local training without federation (the "NoFed" baseline)."""

from __future__ import annotations

from cflpipe.fl.method import ClientView, Method, Payload, Update
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

