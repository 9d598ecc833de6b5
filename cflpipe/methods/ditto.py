"""Ditto (Li, Hu, Beirami & Smith 2021, "Ditto: Fair and Robust Federated Learning Through
Personalization").

Two problems are solved at once. The global model w is trained exactly as FedAvg trains it (it
is what travels: w down, the client's new w up). Each sampled client also trains its personal
model v_i, kept on the client across rounds, on

    F_i(v) + (λ/2)·‖v − w^t‖²,

where w^t is the global model the client received this round (Algorithm 1: the pull is towards
the round's global model, not towards the client's locally updated copy). Clients are evaluated
with their personal models.

As in the authors' reference code (litian96/ditto, flearn/trainers_MTL/ditto.py), the personal
and the global updates see the same mini-batches: both go through `ctx.train`, whose batch
generator is derived from (seed, round, client). The reference interleaves the two updates batch
by batch; running them one after the other on the same batch sequence gives the same result,
because neither update reads the other's parameters (the pull is towards the fixed w^t).

λ: the paper tunes λ per data set (candidates 0.05…2; its dynamic variant picks per device
from {0.1, 1, 2}); the authors' released run scripts use λ = 1, the default here.
"""

from __future__ import annotations


from cflpipe.fl.local import Anchor
import numpy as np

from cflpipe.fl.method import ClientView, Context, Payload, Placement, Update
from cflpipe.fl.predictors import Models
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.methods.fedavg import FedAvg
from cflpipe.methods.personal import PersonalModels


class Ditto(PersonalModels, FedAvg):
    """Ditto: FedAvg global model plus a personal model per client pulled towards it by λ.

    v_i starts from the initial global model w^0, as in the reference code."""


    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[dict[str, ClientPlan], None]:
        received = payload.tensors["model"]
        # Both plans use the client's one batch stream of this round (see the module docstring).
        return {"model": ClientPlan(received),
                "personal": ClientPlan(view.kept("personal"), (Anchor(received, view.hp.lam),),
                                       steps=view.hp.personal_steps)}, None

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: dict[str, Trained], scratch: None) -> Update:
        personal = trained["personal"]
        # A diverged personal model reports its loss, so the engine's on_divergence rule sees it.
        record = personal if personal.diverged else trained["model"]
        # The personal model stays on the client: it is kept, not sent, so not counted.
        return view.update({"model": trained["model"].vector}, record, keep={"personal": personal.vector})

    newcomer_rule = ("receives the global model and trains a personal model of its own from the initial one with "
                     "Ditto's pull λ towards it, for one round (personal_steps), served that model")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        payload = Payload({"model": self.global_model}, {"question": "personal"})
        newcomers.ask({c: payload for c in range(n)})  # each keeps its personal model
        return Placement(np.full(n, -1, dtype=np.int64), Models.own(newcomers.clients[self.personal_table]))

    @classmethod
    def query_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan | None, None]:
        if payload.meta.get("question") != "personal":
            return super().query_plan(view, payload)
        return ClientPlan(view.kept("personal"), (Anchor(payload.tensors["model"], view.hp.lam),),
                          steps=view.hp.personal_steps), None

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: Trained | None, scratch: None) -> Update:
        if trained is None:
            return super().query(view, payload, trained, scratch)
        return view.update({}, trained, keep={"personal": trained.vector})

