"""StoCFL (Zeng, Fan, Ye, Yu, Zhou and Luo 2023, "Stochastic clustered federated learning",
arXiv:2303.00897; authors' code github.com/dunzeng/StoCFL, StoCFL-FCC.py).

Clients are clustered by how the same fixed anchor model moves on their data: the first time a
client is sampled it trains the anchor (the initial model) for a few epochs and sends its
movement ψ_i = anchor − trained. Every client starts as a cluster of its own; each round the
sampled clusters (those with sampled members) are represented by the mean ψ of their sampled
members, and pairs of clusters whose representations have cosine similarity ≥ τ are united,
most similar first. Training is bi-level: a global model trained by FedAvg over every sampled
client, and one model per cluster trained by its sampled members with a proximal pull μ to the
global model. New clients and clusters join at any round (stochastic participation).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cflpipe.clustering import canonical_labels
from cflpipe.fl.local import Anchor, steps_for
from cflpipe.fl.method import ClientView, Context, Method, Payload, Placement, Update
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Models


def cosine_matrix(rows: torch.Tensor) -> torch.Tensor:
    unit = rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.T


class StoCFL(Method):
    """StoCFL: clients united into clusters by the cosine similarity of how a fixed anchor model moves on their data.

    Round start: every sampled client not seen before trains the anchor (the run's initial model)
    for `observe_epochs` epochs and sends ψ_i = anchor − trained (off-round traffic: the anchor
    down, ψ up; the server keeps every ψ). The sampled clients are grouped by their current
    cluster; each such cluster is represented by the plain mean ψ of its sampled members; the
    pairs of these clusters, most similar first, are united while their cosine similarity is at
    least τ (union-find; a pair already in one cluster is skipped). The united cluster keeps the
    model of the larger one (the lower id on a tie, as the authors' `unite`), or the only model
    of the two. A client never sampled is a cluster of its own until it is, so under partial
    participation the number of clusters (and the ARI) counts the clients not yet heard from.

    Training: each sampled client receives the global model g and its cluster's model (a cluster
    without one yet starts from g), trains g plainly and the cluster model with the pull
    (μ/2)·‖w − g‖², and sends both. g becomes the plain mean of the returned global models, each
    sampled cluster's model the plain mean of its members' (the authors' code averages without
    sample weights; so do we). Clients are evaluated with their cluster's model, or with g while
    their cluster has none (never sampled since it formed).

    Memory: the server keeps every observed ψ and one model slot per client (the clusters are
    named by a member), (clients × parameters) each; fine at the embedded scales, large at
    thousands of clients with big models."""

    checkpoint = ("global_model", "psi", "observed", "cluster_of", "models", "has_model")

    @classmethod
    def check_hyperparams(cls, params):
        return {"tau": 0.0}

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        m, p = ctx.num_clients, ctx.init.numel()
        self.anchor = ctx.init.clone()
        self.global_model = ctx.init.clone()
        self.psi = ctx.table("psi", ctx.init.new_zeros(p))
        self.observed = np.zeros(m, dtype=bool)
        self.cluster_of = np.arange(m, dtype=np.int64)  # a cluster is named by one of its members
        self.models = ctx.table("models", ctx.init.new_zeros(p))
        self.has_model = np.zeros(m, dtype=bool)
        self._united = 0

    # ------------------------------------------------------------------ clustering

    def round_start(self, sampled: np.ndarray) -> None:
        self._united = 0
        new = [int(c) for c in sampled if not self.observed[c]]
        if new:
            payload = Payload({"model": self.anchor}, {"question": "observe"})
            for c, answer in self.ctx.ask({c: payload for c in new}).items():
                self.psi[c] = answer.tensors["psi"]
                self.observed[c] = True
        seen = [int(c) for c in sampled if self.observed[c]]
        clusters = sorted({int(self.cluster_of[c]) for c in seen})
        if len(clusters) < 2:
            return
        members = {k: [c for c in seen if self.cluster_of[c] == k] for k in clusters}
        directions = torch.stack([self.psi[members[k]].mean(0) for k in clusters])
        similarity = cosine_matrix(directions).cpu().numpy()
        pairs = [(-similarity[a, b], clusters[a], clusters[b]) for a in range(len(clusters))
                 for b in range(a + 1, len(clusters))]
        for negative, i, j in sorted(pairs):
            if -negative < self.hp.tau:
                break
            self._unite(i, j)

    def _unite(self, i: int, j: int) -> None:
        i, j = int(self.cluster_of[i]), int(self.cluster_of[j])
        if i == j:
            return
        i, j = min(i, j), max(i, j)
        size_i, size_j = int((self.cluster_of == i).sum()), int((self.cluster_of == j).sum())
        # The larger cluster's model goes on (the lower id's on a tie, as the authors'), or the
        # only one there is.
        if self.has_model[j] and (size_i < size_j or not self.has_model[i]):
            self.models[i] = self.models[j]
            self.has_model[i] = True
        self.cluster_of[self.cluster_of == j] = i
        self.has_model[j] = False
        self._united += 1

    # ------------------------------------------------------------------ training

    def payload(self, client: int) -> Payload:
        k = int(self.cluster_of[client])
        cluster_model = self.models[k] if self.has_model[k] else self.global_model
        return Payload({"global": self.global_model, "cluster": cluster_model})

    @classmethod
    def query_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        """A client's first sampling: `observe_epochs` passes from the anchor model it is sent
        (its own batch stream); query sends ψ = anchor − trained."""
        if payload.meta.get("question") != "observe":
            return super().query_plan(view, payload)
        t = view.training
        return ClientPlan(payload.tensors["model"], steps=steps_for(view.samples, t.batch_size, None, view.hp.observe_epochs),
                          stream=(0x0B5,)), None

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: Trained | None, scratch: None) -> Update:
        if trained is None:
            return super().query(view, payload, trained, scratch)
        return view.update({"psi": payload.tensors["model"] - trained.vector}, trained)

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[dict[str, ClientPlan], None]:
        g = payload.tensors["global"]
        return {"global": ClientPlan(g), "cluster": ClientPlan(payload.tensors["cluster"], (Anchor(g, view.hp.mu),))}, None

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: dict[str, Trained], scratch: None) -> Update:
        cluster = trained["cluster"]
        record = cluster if cluster.diverged else trained["global"]
        return view.update({"global": trained["global"].vector, "cluster": cluster.vector}, record)

    def aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        clients = sorted(updates)
        self.global_model = torch.stack([updates[c].tensors["global"] for c in clients]).mean(0)
        for k in sorted({int(self.cluster_of[c]) for c in clients}):
            mine = [c for c in clients if self.cluster_of[c] == k]
            self.models[k] = torch.stack([updates[c].tensors["cluster"] for c in mine]).mean(0)
            self.has_model[k] = True

    # ------------------------------------------------------------------ evaluation

    def predictor(self, clients: np.ndarray | None = None) -> Models:
        keys = np.where(self.has_model[self.cluster_of], self.cluster_of, -1)
        distinct, index = np.unique(keys, return_inverse=True)
        models = [self.global_model if k < 0 else self.models[k] for k in distinct]
        return Models(models, index.astype(np.int64))

    def assignment(self) -> np.ndarray:
        return canonical_labels(self.cluster_of)

    newcomer_rule = ("trains the anchor model for observe_epochs and sends ψ = anchor − trained; it joins the cluster "
                     "whose mean ψ over its observed members is the most cosine-similar, at least τ (StoCFL's own "
                     "uniting rule), served that cluster's model (or the global model where it has none), else "
                     "stays a cluster of its own, served the global model")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        answers = newcomers.ask({c: Payload({"model": self.anchor}, {"question": "observe"}) for c in range(n)})
        seen = np.flatnonzero(self.observed)
        named = sorted({int(self.cluster_of[c]) for c in seen})
        # as assignment() numbers them; a new client that joins none is a cluster of its own
        numbered = {int(raw): int(c) for raw, c in zip(self.cluster_of, canonical_labels(self.cluster_of))}
        own = max(numbered.values(), default=-1) + 1
        clusters = np.arange(own, own + n, dtype=np.int64)
        models, index = [self.global_model], np.zeros(n, dtype=np.int64)
        if named and answers:
            members = {k: seen[self.cluster_of[seen] == k] for k in named}
            directions = torch.stack([self.psi[members[k]].mean(0) for k in named])
            done = sorted(answers)
            psi = torch.stack([answers[c].tensors["psi"] for c in done])
            similarity = cosine_matrix(torch.cat([psi, directions]))[:len(done), len(done):].cpu().numpy()
            for row, c in enumerate(done):
                best = int(np.argmax(similarity[row]))
                if similarity[row, best] >= self.hp.tau:
                    k = named[best]
                    clusters[c] = numbered[k]
                    if self.has_model[k]:
                        models.append(self.models[k])
                        index[c] = len(models) - 1
        return self.served(newcomers, clusters, models, index)

    def round_metrics(self) -> dict[str, Any]:
        return {"stocfl_united": float(self._united), "stocfl_observed": float(self.observed.sum())}
