"""FedSoft (Ruan and Joe-Wong 2022, "FedSoft: Soft clustered federated learning with proximal
local updating", AAAI 2022; authors' code github.com/ycruan/FedSoft).

Soft clustering: a client's data may come from several of the S cluster distributions at once.
Every τ rounds each client estimates its importance weights u_is, the share of its samples on
which cluster model c_s has the lowest loss; a client trains its own local model on its loss
plus (λ/2)·Σ_s u_is·‖w − c_s‖² (pulled to every center in proportion to its share), and each
center is the average of the local models weighted by the clients' importance to it,
v_is = u_is·n_i / Σ_j u_js·n_j.
"""

from __future__ import annotations


import numpy as np
import torch

from cflpipe.fl.local import Anchor
from cflpipe.fl.method import ROUND, ClientView, Context, Method, Payload, Placement, Update, stack_updates
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Models
from cflpipe.methods.clustered import lowest, mixture_table
from cflpipe.methods.ifca import random_models, sample_losses
from cflpipe.methods.personal import PersonalModels


def importance_weights(losses: np.ndarray, owner: np.ndarray, clients: int, smoother: float) -> np.ndarray:
    """u (clients × S): for each client, the share of its samples on which each cluster model has
    the lowest loss (`losses`: S × samples; ties to the lowest index), a share of 0 replaced by
    `smoother` (the authors' count smoother; the row then sums to slightly more than 1)."""
    s = losses.shape[0]
    best = lowest(losses.T) if losses.shape[1] else np.zeros(0, dtype=np.int64)
    counts = np.bincount(owner * s + best, minlength=clients * s).reshape(clients, s).astype(np.float64)
    sizes = np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
    shares = counts / sizes
    return np.where(counts == 0, smoother, shares)


class FedSoft(PersonalModels, Method):
    """FedSoft: soft clusters; local models pulled to every center by the client's share in it.

    Round t with t mod τ = 0 (τ = `estimation_interval`), before training: every client
    evaluates the S centers on its training samples and sends its importance weights u_is
    (`importance_weights`; off-round traffic: the S models down to every client not sampled this
    round, S numbers up from every client). Each
    sampled client receives the S centers, trains its local model (kept on the client, starting
    from the run's initial model) for the round's local steps on its loss plus
    (λ/2)·Σ_s u_is·‖w − c_s‖², keeps it and sends it. The server sets each center to the average
    of the received local models weighted by v_is ∝ u_is·n_i. Clients are evaluated with their
    local models (the paper's personalized models); their cluster, for clusters.parquet and the
    ARI/NMI, is argmax_s u_is, and the normalized u_i are written at every evaluation to
    `mixture.parquet` (client, cluster, weight).

    Where we differ from the authors' code, and why:
    - Participation: their server picks, for each center, `selection_size` clients with
      probability v_is; cflpipe's engine samples `clients_per_round` clients uniformly for every
      method, so that methods are compared under the same participation. The aggregation is
      their rule without selection (`do_selection: False`), c_s = Σ_i v_is·w_i, renormalized over
      the clients that trained this round: with every client sampled it is theirs exactly.
    - Optimizer: the run's SGD (training.lr, momentum), as for every method; theirs is Adam.
    - The pull: the shares are normalized to sum to 1, so its strength is λ; theirs is
      λ·Σ_s u_is, which the smoother σ makes up to S·σ (2e-4 at the defaults) larger. The sum of
      the S pulls is one pull towards the share-weighted mean of the centers (the same gradient),
      which the trainer then batches across clients.
    - The S centers start from independent random initializations (as theirs), the local models
      from the run's initial model (theirs from another one)."""

    checkpoint = ("centers", "importance")

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2, "lam": 1.0}

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        # Row 0 of random_models is the run's initial model, the local models' start.
        self.centers = random_models(ctx, ctx.hp.clusters + 1, purpose=0x50F7)[1:].clone()
        self.importance = np.full((ctx.num_clients, ctx.hp.clusters), 1.0 / ctx.hp.clusters)
        ctx.clients.add("importance", torch.full((ctx.hp.clusters,), 1.0 / ctx.hp.clusters, dtype=torch.float64,
                                                 device=ctx.device))

    def round_start(self, sampled: np.ndarray) -> None:
        if self.ctx.round % self.hp.estimation_interval:
            return
        # The sampled clients get the centers in their payload this round anyway: only the others'
        # copies are traffic down; every client's weights go up (and it keeps them).
        chosen = set(int(c) for c in sampled)
        answers = self.ctx.ask({c: Payload({"models": self.centers}, {"question": "importance"},
                                           held=("models",) if c in chosen else ())
                                for c in range(self.ctx.num_clients)})
        for c, answer in answers.items():
            self.importance[c] = answer.tensors["importance"].cpu().numpy()

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: None, scratch: None) -> Update:
        """A client's importance weights u_i (importance_weights) from the S centers' losses on
        its training samples."""
        if payload.meta.get("question") == ROUND and trained is not None:  # a new client keeps its model
            return view.update({}, trained, keep={cls.personal_table: trained.vector})
        if payload.meta.get("question") != "importance":
            return super().query(view, payload, trained, scratch)
        centers = payload.tensors["models"]
        x, y = view.data()
        losses = sample_losses(view.apply, centers, x, y) if len(y) else np.zeros((len(centers), 0))
        u = torch.from_numpy(importance_weights(losses, np.zeros(len(y), dtype=np.int64), 1, view.hp.smoother)[0])
        u = u.to(centers.device)
        return view.answer({"importance": u}, keep={"importance": u})

    def payload(self, client: int) -> Payload:
        return Payload({"models": self.centers})

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        # Σ_s (λ/2)·u_s·‖w − c_s‖² pulls w with λ·Σu towards the u-weighted mean of the centers:
        # one anchor. With the shares normalized the strength is λ for every client, so that the
        # batched trainer trains all clients together (see the class docstring).
        centers = payload.tensors["models"]
        shares = view.kept("importance").to(centers.dtype)
        target = (shares / shares.sum()) @ centers
        return ClientPlan(view.kept(cls.personal_table), (Anchor(target, view.hp.lam),)), None

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Trained, scratch: None) -> Update:
        return view.update({"model": trained.vector}, trained, keep={cls.personal_table: trained.vector})

    def aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        clients, vectors, sizes = stack_updates(updates)
        shares = torch.as_tensor(self.importance[clients], dtype=vectors.dtype, device=vectors.device)
        weights = shares * sizes[:, None]  # (clients × S): v_is up to a factor per center
        self.centers = (weights / weights.sum(0, keepdim=True)).T @ vectors

    def assignment(self) -> np.ndarray:
        return lowest(-self.importance)

    newcomer_rule = ("receives the S centers, computes its importance weights on its training samples, then trains a "
                     "local model of its own from the initial one as in a round (pulled to the centers by its "
                     "weights): served that model, in the cluster of its largest weight")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        answers = newcomers.ask({c: Payload({"models": self.centers}, {"question": "importance"}) for c in range(n)})
        newcomers.ask({c: Payload({"models": self.centers}, {"question": ROUND}, held=("models",)) for c in range(n)})
        clusters = np.full(n, -1, dtype=np.int64)
        for c, answer in answers.items():
            clusters[c] = int(lowest(-answer.tensors["importance"].cpu().numpy()[None])[0])
        return Placement(clusters, Models.own(newcomers.clients[self.personal_table]))

    def mixture(self) -> np.ndarray:
        return self.importance / self.importance.sum(axis=1, keepdims=True)

    def eval_tables(self) -> dict[str, dict[str, np.ndarray]]:
        """Each client's normalized importance weights u_i, long format: client, cluster, weight."""
        return {"mixture": mixture_table(self.mixture())}
