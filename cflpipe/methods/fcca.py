"""FCCA — Federated cINN Clustering Algorithm (seed paper 002, "Federated cINN Clustering for
Accurate Clustered Federated Learning"), with its +Per, +Prox and +Per+Prox variants.

The run's model is split into the global encoder f (the body: every layer but the last) and the
cluster-wise classifier h (the head); each client also owns a conditional invertible network
c(z; y) that maps the encoder's features z = f(x) of label y to N(0, I).

Client round (Algorithm 1): start from the global f and the client's cluster's h, train f and h
with cross-entropy for the run's local budget; then freeze f and train c for the paper's K
iterations by the conditional maximum likelihood of Eq. 3,
    E[(‖c(z; y)‖² + α‖c(z'; y')‖²)/2 − log|det J|],
where z' ~ N(0, I) carries the UNKNOWN label y' (a label the client lacks). f, h and c go up; f and
the cluster's h come down (c stays with the client, which continues training it next round).

Server (Sec. 3.3): for every client i and label y invert c_i on Gaussian noise ε1, ε2 (the same
noise for every client, redrawn each round); B_{y,i,j} = cosine(c_i⁻¹(ε1; y), c_j⁻¹(ε2; y)),
P_{y,i,j} = max(|B_{y,i,i}|, |B_{y,j,j}|), S = B ⊙ P, D = mean of S over labels
(`clustering.fcca_similarity`); k-means with M clusters on the rows of D, from scratch every round
(`kmeans_start: last`: from the last round's clusters). Then f ← average over the round's clients,
h_k ← average within cluster k, both weighted by the clients' training samples.

What reproduces at the paper's settings, and what does not: docs/reproduction.md.

Departures and readings where the paper is open, each an option where it can be (docs/fcca.md
has the text behind each and what was measured): one of K's iterations is a pass over the
client's data (`flow_epochs`, default; `flow_steps` reads it as a mini-batch step), at the run's
batch size, with the augmentation's z' drawn once per client and round and reused in every pass;
Adam for Algorithm 1's plain step, at the paper's η = 0.01 whatever the run's lr, its moments
afresh each round; the client keeps training its cINN across rounds; Eq. 4's cosine of the two
batches' means; k-means on D's rows less their own mean; coupling scales soft-clamped and
gradients clipped; "global"/"personalized" accuracy read as `intra_acc`/`acc_macro`; FCCA+Per's
personal classifier starts each round from the cluster's; with partial participation the server
clusters everyone it has heard from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Callable

import numpy as np
import torch
import zuko  # this module is imported only where FCCA runs
from torch import nn

from cflpipe.clustering import canonical_labels, fcca_similarity, kmeans
from cflpipe.fl.local import KEPT_MOMENTS, AdamStep, Anchor, SGDStep, steps_for
from cflpipe.fl.method import ROUND, SERVE, ClientView, Context, Method, Payload, Placement, Update, stack_updates
from cflpipe.fl.params import cluster_average, weighted_average
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Models, with_heads
from cflpipe.seeds import mix_seed
from cflpipe.methods.fcca_params import fcca_options

# Purposes of the seeded randomness (server noise, k-means, the clients' z' draws, the flow's
# batch stream and its initialization).
_NOISE, _KMEANS, _AUGMENT, _FLOW_STREAM, _FLOW_INIT = 0xF1, 0xF2, 0xF3, 0xF4, 0xF5


class ConditionalFlow(nn.Module):
    """c(z; y): a conditional RealNVP over `features` dimensions, conditioned on a one-hot label
    of `classes + 1` entries (the last one is the extra UNKNOWN label)."""

    def __init__(self, features: int, classes: int, blocks: int, hidden: int, clamp: float = 2.0):
        super().__init__()
        self.features, self.classes = features, classes
        # Scale coefficients soft-clamped to |log scale| < clamp, as the cINN's couplings are.
        affine = partial(zuko.transforms.MonotonicAffineTransform, slope=math.exp(-clamp))
        self.flow = zuko.flows.RealNVP(features, context=classes + 1, transforms=2 * blocks,
                                       univariate=affine, hidden_features=(hidden, hidden))
        if features % 2 == 0:
            for coupling in self.flow.transform.transforms:
                coupling.__class__ = SlicedGeneralCoupling

    def forward(self, z: torch.Tensor, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(c(z; context), log|det ∂c/∂z|) per row. The transform is built and applied inside
        forward so that a functional call (the batched trainer) sees its parameters."""
        return self.flow(context).transform.call_and_ladj(z)

    def inverse(self, u: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.flow(context).transform.inv(u)

    def onehot(self, labels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return onehot(labels, self.classes, dtype)


class SlicedCoupling(zuko.transforms.CouplingTransform):
    """zuko's coupling transform with its alternating (even/odd) mask read by strided slices
    instead of index gathers and index writes: the same values moved the same way, so the same
    numbers bit for bit, but the cINN's training ran a fifth to a quarter faster (the gathers and
    writes were a quarter of its time on 200 features)."""

    def __init__(self, meta, mask):
        super().__init__(meta, mask)
        self.first = int(self.idx_a[0])  # 0: the constant half sits at the even positions

    def split(self, x):
        return x[..., self.first::2], x[..., 1 - self.first::2]

    def merge(self, x_a, x_b, shape):
        pair = (x_a, x_b) if self.first == 0 else (x_b, x_a)
        return torch.stack(pair, dim=-1).flatten(-2)


class SlicedGeneralCoupling(zuko.flows.coupling.GeneralCouplingTransform):
    """zuko's lazy coupling, building SlicedCoupling (module level: a trainer in another process
    pickles the cINN)."""

    def forward(self, c=None):
        return SlicedCoupling(partial(self.meta, c), self.mask)


def onehot(labels: torch.Tensor, classes: int, dtype: torch.dtype) -> torch.Tensor:
    """The cINN's condition: one-hot over the `classes` labels and the extra UNKNOWN one."""
    return nn.functional.one_hot(labels, classes + 1).to(dtype)


@dataclass(frozen=True, eq=False)
class FlowLikelihood:
    """Eq. 3 as a plan loss (summed over the latent dimensions, as written). A training row is
    [z, onehot(y), z', onehot(y')] (built by the client before training, so the loss draws no
    randomness and vmaps); the targets are unused. An all-zero onehot(y') switches the row's
    augmentation off (FCCA itself always gives z' a label: an absent one, or the extra UNKNOWN
    label)."""

    features: int
    width: int  # classes + 1
    alpha: float

    def __call__(self, forward: Callable[..., tuple[torch.Tensor, torch.Tensor]], rows: torch.Tensor,
                 _targets: torch.Tensor) -> torch.Tensor:
        d, w = self.features, self.width
        z, context = rows[:, :d], rows[:, d:d + w]
        u, ladj = forward(z, context)
        nll = u.square().sum(-1) / 2 - ladj
        if self.alpha:
            noise, unknown = rows[:, d + w:2 * d + w], rows[:, 2 * d + w:]
            u2, ladj2 = forward(noise, unknown)
            nll = nll + self.alpha * unknown.sum(-1) * (u2.square().sum(-1) / 2 - ladj2)
        return nll.mean()


@lru_cache(maxsize=None)
def flow_likelihood(features: int, width: int, alpha: float) -> FlowLikelihood:
    """One loss object per setting: the batched trainer trains clients together only when their
    plans share their loss (by identity), as they did when the server held the one instance."""
    return FlowLikelihood(features, width, alpha)


def reconstructions(apply: Callable[..., torch.Tensor], module: "ConditionalFlow", flows: torch.Tensor,
                    samples: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The server's inversions c_i⁻¹(ε1; y) and c_i⁻¹(ε2; y) of every client's cINN (the rows
    of `flows`, parameter vectors of `module`) for every label y, on the same noise ε1, ε2
    (`samples` each, drawn from `generator`): two (clients × labels × samples × features)
    tensors. `apply(flows, *inputs, call=…)` applies the vectors (Context.apply: all cINNs at
    once where the trainer batches)."""
    labels, dtype = module.classes, flows.dtype
    noise = torch.randn(2, samples, module.features, generator=generator, dtype=dtype).to(flows.device)
    noise = noise.repeat(1, labels, 1)  # label-major: rows y·samples … (y+1)·samples − 1
    context = module.onehot(torch.arange(labels, device=flows.device).repeat_interleave(samples), dtype)
    context = context.repeat(2, 1)  # ε1's rows, then ε2's: one inversion per client
    both = apply(flows, noise.reshape(-1, module.features), context, call="inverse")
    both = both.view(len(flows), 2, labels, samples, -1)
    return both[:, 0], both[:, 1]


class _FCCAVariants:
    """A plugin's subclass of FCCA gets +Per, +Prox and +Per+Prox under its own name (@register
    reads them here, as ClusteredMethod's AWCFL/MCFL; the built-in FCCA's are declared in
    `fcca_params`, and a declared class may not state them itself)."""

    # Called by @register while the class is being defined, before mutmut's trampoline exists.
    @classmethod
    def variants(cls, name: str) -> tuple:  # pragma: no mutate block
        return fcca_options(name)


class FCCA(_FCCAVariants, Method):
    """FCCA: global encoder, cluster-wise classifiers, clients clustered by their cINNs' reconstructions."""

    @classmethod
    def check_hyperparams(cls, params):
        return {"clusters": 2, "flow_hidden": 8, "server_samples": 4, "flow_epochs": 0.1}  # 3 steps of 8

    checkpoint = ("global_model", "heads", "client_heads", "flows", "heard", "assign", "similarity")

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        hp = self.hp
        space, m = ctx.space, ctx.num_clients
        self.body_mask, self.head_mask = space.body, space.head
        self.num_classes = ctx.data.num_classes
        features = space.model.head.in_features
        devices = [ctx.device.index or 0] if ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # leaves the run's torch RNG as it was
            torch.manual_seed(mix_seed(ctx.seed, _FLOW_INIT))
            module = ConditionalFlow(features, self.num_classes, hp.flow_blocks, hp.flow_hidden, hp.flow_clamp)
        self.flow_space = ctx.add_space("flow", module)
        flow_init = ctx.initial["flow"]  # recorded by add_space: what every client's cINN starts from
        ctx.clients.add("flow", flow_init)
        if hp.flow_optimizer == "adam" and hp.flow_moments == "keep":
            for name in KEPT_MOMENTS[:2]:
                ctx.clients.add(f"flow_{name}", torch.zeros_like(flow_init))
            ctx.clients.add(f"flow_{KEPT_MOMENTS[2]}", torch.zeros(1, dtype=flow_init.dtype, device=flow_init.device))
        init_head = ctx.init[self.head_mask]
        if hp.personal:
            ctx.clients.add("head", init_head)
        # Server state: the global model (only its body is f; its head part stays the initial
        # head), the M cluster classifiers, the last classifier and cINN each client uploaded.
        self.global_model = ctx.init.clone()
        self.heads = init_head.repeat(hp.clusters, 1)
        self.client_heads = init_head.repeat(m, 1)
        self.flows = flow_init.repeat(m, 1)
        self.heard = np.zeros(m, dtype=bool)
        self.assign = np.zeros(m, dtype=np.int64)
        self.similarity = torch.full((m, m), float("nan"), dtype=torch.float64, device=ctx.device)
        self._flow_losses: list[float] = []

    # ------------------------------------------------------------------ server → client

    def payload(self, client: int) -> Payload:
        return Payload({"body": self.global_model[self.body_mask], "head": self.heads[self.assign[client]]})

    # ------------------------------------------------------------------ client

    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        start = view.initial["model"].clone()  # every entry is the body's or the head's
        start[view.space.body] = payload.tensors["body"]
        start[view.space.head] = payload.tensors["head"]
        anchors = (Anchor(start, view.hp.mu),) if view.hp.mu else ()
        return ClientPlan(start, anchors, then=lambda trained: cls.flow_plan(view, trained)), None

    @classmethod
    def flow_plan(cls, view: ClientView, trained: Trained) -> ClientPlan:
        """The cINN's training on the features of the encoder the client has just trained."""
        hp, classes = view.hp, view.classes
        x, y = view.data("train")
        z = view.apply(trained.vector[None], x, call="features", chunk=view.training.eval_batch_size)[0]
        dtype, n, d = z.dtype, len(y), z.shape[1]
        generator = view.torch_generator(_AUGMENT)
        noise = torch.randn(n, d, generator=generator, dtype=dtype).to(z.device)
        if hp.unknown == "extra":
            unknown = onehot(torch.full((n,), classes, device=z.device), classes, dtype)
        else:
            present = torch.bincount(y, minlength=classes).cpu() > 0
            absent = torch.nonzero(~present).flatten()
            if len(absent):
                picks = absent[torch.randint(len(absent), (n,), generator=generator)]
                unknown = onehot(picks.to(z.device), classes, dtype)
            else:  # a client with every label: the extra UNKNOWN label carries its augmentation
                unknown = onehot(torch.full((n,), classes, device=z.device), classes, dtype)
        rows = torch.cat([z, onehot(y, classes, dtype), noise, unknown], dim=1)
        clip = float(hp.flow_clip)
        kept = hp.flow_optimizer == "adam" and hp.flow_moments == "keep"
        rule = AdamStep(clip=clip, kept=kept) if hp.flow_optimizer == "adam" else SGDStep(clip=clip)
        moments = {name: view.kept(f"flow_{name}") for name in KEPT_MOMENTS} if kept else {}
        steps = hp.flow_steps
        if hp.flow_epochs is not None:
            steps = steps_for(n, view.training.batch_size, None, hp.flow_epochs)
        # The run's momentum and weight decay are the classifier's, not the cINN's.
        start = view.initial["flow"].clone() if hp.flow_restart else view.kept("flow")
        return ClientPlan(start, space="flow", loss=flow_likelihood(d, classes + 1, float(hp.alpha)), inputs=rows,
                          rule=rule, steps=steps, lr=hp.flow_lr, momentum=0.0, weight_decay=0.0,
                          stream=(_FLOW_STREAM,), companions=moments)

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Trained, scratch: None) -> Update:
        vector = trained.vector
        head = vector[view.space.head]
        flow = trained.then.vector if trained.then is not None else view.kept("flow")
        # The cINN's loss goes up beside the models, for the round's flow_nll (a diverged one is dropped).
        loss = {"flow_loss": trained.then.result.loss} if trained.then is not None and not trained.then.diverged else {}
        keep = {"flow": flow, **({"head": head} if view.hp.personal else {})}
        if trained.then is not None:  # the cINN's Adam moments, where the client keeps them
            keep.update({f"flow_{name}": value for name, value in trained.then.companions.items()})
        return view.update({"body": vector[view.space.body], "head": head, "flow": flow}, trained, keep=keep, **loss)

    # ------------------------------------------------------------------ server

    def round_start(self, sampled: np.ndarray) -> None:
        self._flow_losses = []

    def aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        self._flow_losses = [update.meta["flow_loss"] for update in updates.values() if "flow_loss" in update.meta]
        clients, bodies, weights = stack_updates(updates, "body")
        self.global_model[self.body_mask] = weighted_average(bodies, weights)
        index = torch.from_numpy(clients).to(self.flows.device)
        self.flows[index] = torch.stack([updates[c].tensors["flow"] for c in clients])
        self.client_heads[index] = torch.stack([updates[c].tensors["head"] for c in clients])
        self.heard[clients] = True
        self.recluster()

    def recluster(self) -> None:
        known = np.nonzero(self.heard)[0]
        generator = torch.Generator().manual_seed(mix_seed(self.ctx.seed, self.ctx.round, _NOISE))
        first, second = reconstructions(partial(self.ctx.apply, space="flow"), self.flow_space.model,
                                        self.flows[torch.from_numpy(known).to(self.flows.device)],
                                        self.hp.server_samples, generator)
        similarity = fcca_similarity(first, second, cosine=self.hp.cosine)
        labels = self.clustering(similarity, known)
        self.assign[known] = labels
        # Written into the kept matrix itself: a second (clients × clients) matrix was 800 MB at
        # 10,000 clients (#59).
        self.similarity.fill_(float("nan"))
        index = torch.from_numpy(known).to(self.similarity.device)
        self.similarity[index[:, None], index[None, :]] = similarity.to(self.similarity)
        weights = torch.from_numpy(self.ctx.train_sizes()[known]).to(self.heads)
        means, present = cluster_average(self.client_heads[torch.from_numpy(known).to(self.heads.device)],
                                         torch.from_numpy(labels), weights, self.hp.clusters)
        self.heads[present] = means[present]

    def clustering(self, similarity: torch.Tensor, known: np.ndarray) -> np.ndarray:
        """Sec. 3.3: k-means with M clusters on the rows of D over the clients heard from, from
        scratch every round (Sec. 1: "without relying on previous clustering solutions"), or, a
        diagnostic departure (`kmeans_start: last`), from the centres of the last round's clusters
        in this round's D (docs/fcca.md, "Told the groups"). A diagnostic's subclass replaces it:
        benchmarks/fcca_told_groups.py."""
        k = min(self.hp.clusters, len(known))
        points = similarity - similarity.mean(dim=1, keepdim=True) if self.hp.rows == "centered" else similarity
        last = self.assign[known]
        if self.hp.kmeans_start == "last" and len(np.unique(last)) == k:
            # the last round's clusters, as centres in this round's D: k-means continues from them
            members = torch.from_numpy(last).to(points.device)
            start = torch.stack([points[members == c].mean(0) for c in range(k)])
            return canonical_labels(kmeans(points, k, init=start).labels)
        return canonical_labels(kmeans(points, k, seed=self.ctx.rng(_KMEANS), init="k-means++").labels)

    # ------------------------------------------------------------------ evaluation

    def cluster_model(self, cluster: int) -> torch.Tensor:
        vector = self.global_model.clone()
        vector[self.head_mask] = self.heads[cluster]
        return vector

    def predictor(self, clients: np.ndarray | None = None) -> Models:
        if self.hp.personal:  # the global encoder with every client's own classifier, as FedPer's
            models = with_heads(self.global_model, self.head_mask, self.ctx.clients["head"], clients)
            return Models.own_of(models, clients, self.ctx.num_clients)
        return Models([self.cluster_model(k) for k in range(self.hp.clusters)], self.assign.copy())

    def assignment(self) -> np.ndarray | None:
        return self.assign.copy()

    newcomer_rule = ("receives the global encoder and the mean of the cluster classifiers and trains as a client does "
                     "in a round (its classifier, then its cINN), sending its cINN; the server's similarity D between "
                     "it and the participants it has heard from (Eq. 4, on fresh noise) joins it to the cluster of the "
                     "highest mean similarity; served that cluster's classifier on the global encoder (FCCA+Per: its "
                     "own classifier)")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        payload = Payload({"body": self.global_model[self.body_mask], "head": self.heads.mean(0)},
                          {"question": ROUND})
        answers = newcomers.ask({c: payload for c in range(n)})  # each keeps its cINN (and FCCA+Per its head)
        clusters = np.zeros(n, dtype=np.int64)
        known, done = np.nonzero(self.heard)[0], sorted(answers)
        if len(known) and done:
            flows = torch.cat([torch.stack([answers[c].tensors["flow"] for c in done]),
                               self.flows[torch.from_numpy(known).to(self.flows.device)]])
            generator = torch.Generator().manual_seed(mix_seed(newcomers.seed, newcomers.round, _NOISE))
            first, second = reconstructions(partial(self.ctx.apply, space="flow"), self.flow_space.model, flows,
                                            self.hp.server_samples, generator)
            similarity = fcca_similarity(first, second, cosine=self.hp.cosine)[:len(done), len(done):].cpu().numpy()
            held = self.assign[known]
            means = np.stack([similarity[:, held == k].mean(axis=1) if (held == k).any() else
                              np.full(len(done), -np.inf) for k in range(self.hp.clusters)], axis=1)
            clusters[done] = means.argmax(axis=1)
        if self.hp.personal:
            models = self.global_model.repeat(n, 1)
            models[:, self.head_mask] = newcomers.clients["head"]
            return Placement(clusters, Models.own(models))
        # it holds the encoder: its cluster's classifier is what is sent
        newcomers.ask({c: Payload({"head": self.heads[clusters[c]]}, {"question": SERVE}) for c in range(n)})
        return Placement(clusters, Models([self.cluster_model(k) for k in range(self.hp.clusters)], clusters))

    def round_metrics(self) -> dict[str, float]:
        """The mean cINN training loss (Eq. 3) of the round's clients."""
        return {"flow_nll": float(np.mean(self._flow_losses)) if self._flow_losses else float("nan")}

    def eval_tables(self) -> dict[str, dict[str, np.ndarray]]:
        """The server's similarity matrix D of the last clustering (the paper's Fig. 2), long
        format: client, other, value (NaN for clients the server has not heard from)."""
        return {"similarity": self.pair_table(self.similarity)}
