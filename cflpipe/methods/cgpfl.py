"""CGPFL (Tang, Guo & Guo 2022, "Personalized Federated Learning with Contextualized
Generalization", IJCAI).

The server keeps K generalized models Ω_k ("contexts"). Each client has a personalized model θ_i
(kept across rounds) and, during a round, a local model w_i: CGPFL is pFedMe's bi-level problem
with K generalized models in place of one global model,

    min_Ω Σ_i F_i(w_i),  F_i(w) = min_θ { f_i(θ) + (λ/2)·‖θ − w‖² }  (the Moreau envelope),
    with each local model w_i tied to the generalized model it is associated with.

A round:
1. Association (server): each sampled client is associated with the generalized model nearest
   (L2, torch.cdist argmin) to its last uploaded local model (the initial model before its first
   upload) and receives only that model ("pull").
2. Client: w = Ω_k; for every local step, on one mini-batch, θ approximately solves
   min_θ ℓ(θ; batch) + (λ/2)·‖θ − w‖² by `inner_steps` gradient steps of size `personal_lr`
   (warm-started from the client's θ_i), then w ← w − η·λ·(w − θ) (a step on the envelope's
   gradient, η = the run's lr with its momentum and weight decay). w is uploaded ("push"); θ
   stays on the client as its personalized model.
3. Server: the uploaded local models are associated with their nearest generalized model
   (E-step) and each generalized model moves to the sample-weighted mean of its members,
   Ω_k ← (1 − β)·Ω_k + β·mean_{i∈k} w_i (β = 1: plain average, as pFedMe's β). A generalized
   model without sampled members keeps its value.

So the generalized models are updated from the members' personalized models through the local
models that track them. Clients are evaluated with their personalized models θ_i (a client never
sampled keeps the initial model); `assignment()` is each client's last association. K = 1 is pFedMe.

Not verified against the paper's text (it is not among the seed papers and was not reachable
here): the defaults λ = 15, inner_steps = 5, personal_lr = 0.05 follow pFedMe's MNIST setting
(λ = 15, K = 5 inner steps; pFedMe's personal lr 0.1 was taken down to 0.05 so that
personal_lr·λ stays well inside the inner solver's stability bound of 2 for a CNN) and K = 3
generalized models is our choice; CGPFL-Heur's adaptive trade-off is not implemented. The
generalized models all start as the initial model, so they are told apart by k-means++ seeding
(D² sampling, server randomness `ctx.rng`) on the first uploads; how the paper initializes them
is not known to us.
"""

from __future__ import annotations

import numpy as np
import torch

from cflpipe.fl.local import MoreauStep
from cflpipe.fl.method import ROUND, ClientView, Context, Method, Payload, Placement, Update, stack_updates
from cflpipe.fl.params import cluster_average
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Models
from cflpipe.methods.personal import PersonalModels

_SEEDING = 0xC6  # purpose of the server randomness that seeds the generalized models


def nearest(vectors: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """Index of the nearest center (L2) of every row; ties go to the lowest index."""
    distances = torch.cdist(vectors, centers, compute_mode="donot_use_mm_for_euclid_dist")
    return distances.argmin(dim=1)


class CGPFL(PersonalModels, Method):
    """CGPFL: pFedMe-style personalized models tied to the nearest of K generalized models."""

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2}

    checkpoint = ("local", "centers", "seeded", "clusters")

    def __init__(self, ctx):
        super().__init__(ctx)
        k = self.hp.clusters  # θ_i, on the clients, is the "personal" table of PersonalModels
        self.local = ctx.table("local", ctx.init)            # last uploaded w_i, on the server
        self.centers = ctx.init.repeat(k, 1)                 # Ω_k
        self.seeded = torch.zeros(k, dtype=torch.bool, device=ctx.device)
        # Until a client is first sampled its association is 0 (written to clusters.parquet).
        self.clusters = np.zeros(ctx.num_clients, dtype=np.int64)

    def round_start(self, sampled: np.ndarray) -> None:
        clients = np.asarray(sampled, dtype=np.int64)
        if len(clients):
            rows = torch.from_numpy(clients).to(self.local.device)
            self.clusters[clients] = nearest(self.local[rows], self.centers).cpu().numpy()

    def payload(self, client: int) -> Payload:
        return Payload({"model": self.centers[self.clusters[client]]})

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        # The network trains θ (from the client's last θ_i); w starts at the received Ω_k and
        # moves by the envelope's gradient (MoreauStep).
        rule = MoreauStep(view.hp.lam, view.hp.inner_steps, view.hp.personal_lr)
        return ClientPlan(view.kept("personal"), rule=rule, companions={"local": payload.tensors["model"]}), None

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Trained, scratch: None) -> Update:
        # θ stays on the client: it is kept, not sent, so only w is counted as sent.
        return view.update({"model": trained.companions["local"]}, trained, keep={"personal": trained.vector})

    def aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        clients, vectors, weights = stack_updates(updates)
        self.seed_centers(vectors)
        chosen = nearest(vectors, self.centers)
        means, present = cluster_average(vectors, chosen, weights, self.hp.clusters)
        beta = self.hp.beta
        self.centers[present] = (1 - beta) * self.centers[present] + beta * means[present]
        self.clusters[clients] = chosen.cpu().numpy()
        rows = torch.from_numpy(clients).to(self.local.device)
        self.local[rows] = vectors

    def seed_centers(self, vectors: torch.Tensor) -> None:
        """k-means++ seeding of the generalized models not seeded yet, from this round's uploads:
        the first uniformly, each next one with probability ∝ squared distance to the nearest
        seeded model. Rows identical to a seeded model are never picked, so with fewer distinct
        uploads than K the rest wait for a later round."""
        if bool(self.seeded.all()):
            return
        rng = self.ctx.rng(_SEEDING)
        for slot in torch.nonzero(~self.seeded).flatten().tolist():
            if bool(self.seeded.any()):
                d = torch.cdist(vectors, self.centers[self.seeded], compute_mode="donot_use_mm_for_euclid_dist")
                weights = d.min(dim=1).values.double().pow(2).cpu().numpy()
                if not np.isfinite(weights).all() or weights.sum() <= 0:
                    return
                pick = int(rng.choice(len(weights), p=weights / weights.sum()))
            else:
                pick = int(rng.integers(len(vectors)))
            self.centers[slot] = vectors[pick]
            self.seeded[slot] = True

    def assignment(self) -> np.ndarray | None:
        return self.clusters.copy()

    newcomer_rule = ("receives the generalized model nearest its (initial) local model, trains its personalized model "
                     "θ and local model w as a client does in a round, keeps θ (what serves it) and joins the "
                     "generalized model nearest the w it sends")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        start = int(nearest(newcomers.init[None], self.centers)[0])
        payload = Payload({"model": self.centers[start]}, {"question": ROUND})
        answers = newcomers.ask({c: payload for c in range(n)})
        clusters = np.full(n, -1, dtype=np.int64)
        for c, answer in answers.items():
            clusters[c] = int(nearest(answer.tensors["model"][None], self.centers)[0])
        return Placement(clusters, Models.own(newcomers.clients[self.personal_table]))
