"""FedTSDP — federated two-stage decoupling with adaptive personalization layers (Hangyu Zhu,
Yuxiang Fan and Zhenping Xie 2023, "Federated Two Stage Decoupling With Adaptive Personalization
Layers", arXiv:2308.15821;
seeds/003_08e2eff8a7c04c5c.txt, Algorithm 1).

Each round the sampled clients receive their cluster's shared layers (the first L_s layers), put
their own personalization layers behind them, train all layers for the local budget and upload
the whole model. The server holds public unlabeled samples (scenario `public:`) with sampling
weights W. It draws one weighted batch of them, computes every uploaded model's softmax outputs
on it, and the Hopkins statistic H of the flattened outputs (Eq. 6). Only if H > h_th:
  stage 1: Jensen–Shannon divergence between the clients' outputs (Eq. 5), DBSCAN (ε1, min_pts);
  stage 2: inside each stage-1 group, L2 distance of the model weights (Eq. 9), DBSCAN (ε2);
  the stage-2 groups, flattened, are the new clustering; the drawn batch's sampling weights grow
  by |D_pub|/|D_B| and W is normalized (Eq. 7–8); the number of shared layers shrinks, L_s ← L_s·ψ
  (Eq. 11), so personalization layers grow.
Otherwise last round's clustering stays. Then the clients' models are averaged within each
cluster, weighted by n_i; a client is evaluated (and trains next round) with its cluster's shared
layers and its own personalization layers.

Readings where the paper leaves a choice, each an option (docs/fedtsdp.md has why, with the
measurements): ψ applied as a constant at each clustering, not ψ^r (`dampening_schedule`); L_s a
real number, round(L_s) layers shared (`layer_rounding`); a layer is an entry of the model's
`layers` (a ResNet block counts as one); one weighted public batch a round for every client
(`public_batch`); Eq. 7–8 literally (the drawn batch takes nearly all the weight); JS divergence
with the natural log; Hopkins at m̃ = round(0.1·m) (the paper: m̃ ≪ m), one draw a round, uniform points in
the outputs' bounding box (`hopkins_fraction`, `hopkins_min_samples`, `hopkins_draws`); weight
distance on the whole model; ε1 = 0.15 as the paper's, ε2 relative to the stage-1 group's median
nearest-neighbour distance (`radii`, `eps_weights`; `absolute` is the paper's 3.5); every layer
shared at the start (`shared_layers`); DBSCAN's noise points of a stage as one cluster (`noise`:
the paper says nothing of them); the whole model up, the cluster's shared layers down; with
partial participation only the round's clients are clustered.

What it needs: every client every round and a local budget near the paper's 2 epochs (the gate
and both stages read one round's drift away from the model sent); `cflpipe validate` warns for
either.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from cflpipe.clustering import canonical_labels, dbscan_precomputed, hopkins, js_divergence_matrix
from cflpipe.errors import SpecError
from cflpipe.fl.method import ROUND, ClientView, Context, Method, Payload, Placement, Update, stack_updates
from cflpipe.fl.params import cluster_average
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.fl.predictors import Models

# Purposes of the server's randomness.
_PUBLIC_BATCH, _HOPKINS = 0x75D1, 0x75D2


# ε2 of the paper (a distance) and the multiplier of the relative reading.
PAPER_EPS_WEIGHTS = 3.5
RELATIVE_EPS_WEIGHTS = 2.0


def shared_layer_count(exact: float, rounding: str, num_layers: int) -> int:
    """The number of shared layers for the real-valued L_s."""
    whole = {"round": math.floor(exact + 0.5), "floor": math.floor(exact), "ceil": math.ceil(exact)}[rounding]
    return int(min(max(whole, 0), num_layers))


def dampened(exact: float, psi: float, schedule: str, round_number: int) -> float:
    """L_s after one clustering at round `round_number` (1-based): L_s·ψ, or L_s·ψ^r."""
    return exact * psi ** (round_number if schedule == "power" else 1)


def raised_sampling_weights(weights: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Eq. 7–8: the drawn batch's weights grow by |D_pub|/|D_B|, then all are normalized, so the
    batch that showed a clustering tendency is likely to be drawn again."""
    raised = np.asarray(weights, dtype=np.float64).copy()
    raised[batch] += len(raised) / len(batch)
    return raised / raised.sum()


def hopkins_samples(clients: int, fraction: float, floor: int) -> int:
    """m̃: round(fraction·m), at least `floor` and at least 1, at most m."""
    return min(clients, max(1, floor, round(fraction * clients)))


def neighbour_scale(distances: np.ndarray, min_pts: int) -> float:
    """The median over points of the distance to their (min_pts − 1)-th nearest other point: the
    k-distance DBSCAN's authors (Ester et al. 1996) read its ε from. 0 for a single point."""
    n = len(distances)
    if n < 2:
        return 0.0
    k = min(max(min_pts - 1, 1), n - 1)
    ordered = np.sort(distances + np.diag(np.full(n, np.inf)), axis=1)
    return float(np.median(ordered[:, k - 1]))


def two_stage_clusters(outputs: torch.Tensor, weights: torch.Tensor, eps_js: float, eps_weights: float,
                       min_pts: int, relative: bool = False, noise: str = "singletons") -> np.ndarray:
    """FedTSDP's two-stage decoupling of m clients: stage 1 DBSCAN on the JS divergence of the
    outputs (m × samples × classes), stage 2 DBSCAN on the L2 distance of the weights (m × P)
    inside each stage-1 group. With `relative` the stage-2 radius multiplies the group's own
    `neighbour_scale`. DBSCAN's noise points, in either stage, become `noise` (NOISE_READINGS):
    clusters of their own ("singletons"), one cluster of the stage's noise ("cluster": a stage-1
    noise group is split by stage 2 as any other), or -1, left to the caller ("previous").
    Labels 0, 1, … in order of first appearance (noise's -1 kept). The default is this function's
    first reading; the method passes its own `noise` (default "cluster")."""
    if noise not in NOISE_READINGS:
        raise ValueError(f"two_stage_clusters: noise must be one of {NOISE_READINGS}, got {noise!r}")
    first = _resolve_noise(dbscan_precomputed(js_divergence_matrix(outputs), eps_js, min_pts), noise)
    labels = np.full(len(first), -1, dtype=np.int64)
    next_label = 0
    as_double = weights.double()  # one float64 copy (a ResNet-18 per client is large)
    distances = torch.cdist(as_double, as_double).cpu().numpy()
    del as_double
    for group in np.unique(first[first >= 0]):
        members = np.flatnonzero(first == group)
        within = distances[np.ix_(members, members)]
        radius = eps_weights * neighbour_scale(within, min_pts) if relative else eps_weights
        second = _resolve_noise(dbscan_precomputed(within, max(radius, 1e-300), min_pts), noise)
        clustered = second >= 0
        labels[members[clustered]] = second[clustered] + next_label
        next_label += int(second.max(initial=-1)) + 1
    return _numbered(labels)


# What becomes of DBSCAN's noise points (fedtsdp's `noise` hyper-parameter).
NOISE_READINGS = ("singletons", "cluster", "previous")


def _resolve_noise(labels: np.ndarray, noise: str) -> np.ndarray:
    labels = labels.copy()
    found = np.flatnonzero(labels < 0)
    if noise == "singletons":
        labels[found] = labels.max(initial=-1) + 1 + np.arange(len(found))
    elif noise == "cluster":
        labels[found] = labels.max(initial=-1) + 1
    return _numbered(labels)


def _numbered(labels: np.ndarray) -> np.ndarray:
    """canonical_labels of the clustered points; noise's -1 stays."""
    out = labels.copy()
    kept = labels >= 0
    if kept.any():
        out[kept] = canonical_labels(labels[kept])
    return out


class FedTSDP(Method):
    """FedTSDP (Zhu et al.): Hopkins-gated two-stage clustering (JS of public outputs, then weights) with shrinking shared layers."""

    @classmethod
    def check_hyperparams(cls, params):
        # Radii that leave the fixture's 3 clients a round as noise, each its own cluster: every
        # round splits them, so every setting of the clustering shows in the state.
        return {"hopkins_threshold": 0.01, "dampening": 0.5, "public_batch": 8, "eps_js": 0.01,
                "eps_weights": 0.5, "radii": "absolute", "hopkins_min_samples": 1, "noise": "singletons"}

    checkpoint = ("centers", "clusters", "sampling_weights", "shared_exact", "last_hopkins", "last_clustered",
                  "times_clustered")

    def gate_note(self, rounds) -> str | None:
        if "clustering_ran" not in rounds:
            return None
        opened = int((rounds["clustering_ran"] > 0).sum())
        if not opened:
            return (f"never clustered: its Hopkins gate never opened (H <= hopkins_threshold "
                    f"{self.hp.hopkins_threshold:g} in every round; largest H {rounds['hopkins'].max():.3f})")
        counts = rounds["n_clusters"].dropna() if "n_clusters" in rounds else rounds[:0]
        if len(counts) and int(counts.max()) <= 1:
            return (f"never clustered: its Hopkins gate opened in {opened} of {len(rounds)} rounds, but the "
                    f"two-stage clustering never split the clients (one cluster in every evaluated round)")
        return None

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        num_layers = ctx.space.num_layers
        initial = {None: num_layers, "body": num_layers - 1}.get(self.hp.shared_layers, self.hp.shared_layers)
        if initial > num_layers:
            raise SpecError(f"methods.{ctx.method}.shared_layers: must be <= {num_layers} (the layers of model "
                            f"{ctx.training.model}), got {initial}")
        if ctx.data.public is None:
            raise SpecError(f"methods.{ctx.method}: fedtsdp needs the scenario's `public:` data")
        self.public = ctx.data.public
        self.centers = ctx.init[None, :].clone()
        self.clusters = np.zeros(ctx.num_clients, dtype=np.int64)
        self.sampling_weights = np.full(len(self.public), 1.0 / len(self.public))
        self.shared_exact = float(initial)
        self.last_hopkins = float("nan")
        self.last_clustered = 0.0
        self.times_clustered = 0
        self._round_shared = self.shared_count()
        self._mask = self.shared_mask()
        ctx.clients.add("model", ctx.init)

    def radii(self) -> tuple[float, float]:
        """(ε1, ε2): ε2 the given one, else the default of the `radii` reading."""
        default = RELATIVE_EPS_WEIGHTS if self.hp.radii == "relative" else PAPER_EPS_WEIGHTS
        return self.hp.eps_js, default if self.hp.eps_weights is None else self.hp.eps_weights

    def shared_count(self) -> int:
        return shared_layer_count(self.shared_exact, self.hp.layer_rounding, self.ctx.space.num_layers)

    def shared_mask(self) -> torch.Tensor:
        return self.ctx.space.first_layers(self.shared_count())

    # --- server → client: the cluster's shared layers
    def round_start(self, sampled: np.ndarray) -> None:
        self._round_shared = self.shared_count()
        self._mask = self.shared_mask()
        self.last_hopkins, self.last_clustered = float("nan"), 0.0

    def payload(self, client: int) -> Payload:
        # Which layers are shared this round is the server's decision, sent with them (a mask of
        # the layout every client has: not counted as bytes).
        return Payload({"shared": self.centers[self.clusters[client]][self._mask]}, meta={"shared": self._mask})

    # --- client: shared layers from the server + own personalization layers; all layers train
    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan, None]:
        start = view.kept("model")
        start[payload.meta["shared"]] = payload.tensors["shared"]
        return ClientPlan(start), None

    @classmethod
    def client_finish(cls, view: ClientView, payload: Payload, trained: Trained, scratch: None) -> Update:
        return view.update({"model": trained.vector}, trained, keep={"model": trained.vector})

    # --- server
    def aggregate(self, updates: dict[int, Update]) -> None:
        if not updates:
            return
        clients, vectors, weights = stack_updates(updates)
        if len(clients) >= 2:
            batch = self._draw_public_batch()
            outputs = self._outputs(vectors, self.public[batch])
            flat = outputs.reshape(len(clients), -1)
            samples = hopkins_samples(len(clients), self.hp.hopkins_fraction, self.hp.hopkins_min_samples)
            draws = self.ctx.rng(_HOPKINS)
            self.last_hopkins = float(np.mean([hopkins(flat, samples, seed=draws) for _ in range(self.hp.hopkins_draws)]))
            if self.last_hopkins > self.hp.hopkins_threshold:
                labels = two_stage_clusters(outputs, vectors, *self.radii(), self.hp.min_pts,
                                            relative=self.hp.radii == "relative", noise=self.hp.noise)
                self._recluster(clients[labels >= 0], labels[labels >= 0])
                self.sampling_weights = raised_sampling_weights(self.sampling_weights, batch)
                self.shared_exact = dampened(self.shared_exact, self.hp.dampening, self.hp.dampening_schedule,
                                             self.ctx.round + 1)
                self.last_clustered = 1.0
                self.times_clustered += 1
        means, present = cluster_average(vectors, torch.from_numpy(self.clusters[clients]), weights,
                                         len(self.centers))
        self.centers[present] = means[present]

    def _draw_public_batch(self) -> np.ndarray:
        size = min(self.hp.public_batch, len(self.public))
        rng = self.ctx.rng(_PUBLIC_BATCH)
        return np.sort(rng.choice(len(self.public), size=size, replace=False, p=self.sampling_weights))

    def _outputs(self, vectors: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Softmax outputs of each model on x: (models × samples × classes)."""
        return torch.softmax(self.ctx.apply(vectors, x).double(), dim=-1)

    def _recluster(self, clients: np.ndarray, labels: np.ndarray) -> None:
        """The clustered clients take the new clusters (their centers are averaged right after);
        clients not sampled, and noise points under `noise: previous`, keep the cluster they
        were in, with its model."""
        others = np.setdiff1d(np.arange(self.ctx.num_clients), clients)
        kept = np.unique(self.clusters[others])
        new = np.empty(self.ctx.num_clients, dtype=np.int64)
        new[clients] = labels
        offset = int(labels.max(initial=-1)) + 1
        new[others] = offset + np.searchsorted(kept, self.clusters[others])
        centers = torch.cat([self.ctx.init[None, :].repeat(offset, 1), self.centers[torch.from_numpy(kept)]])
        order = canonical_labels(new)
        # canonical_labels renumbers by first appearance; move the centers with their labels.
        mapping = np.empty(order.max() + 1, dtype=np.int64)
        mapping[order] = new
        self.centers = centers[torch.from_numpy(mapping)].clone()
        self.clusters = order

    # --- evaluation: the cluster's shared layers and the client's own personalization layers
    def predictor(self, clients: np.ndarray | None = None) -> Models:
        """Each client's own model with the shared layers of its cluster's."""
        mask = self.shared_mask()
        # the evaluated clients' models alone: a copy of every client's was 5.6 s at 10,000 (#59)
        every = self.ctx.clients["model"]
        models = every.clone() if clients is None else every[torch.from_numpy(clients).to(every.device)]
        clusters = self.clusters if clients is None else self.clusters[clients]
        # Cluster by cluster, run of shared columns by run (the first layers: one run): gathering
        # each client's cluster model first was a second (clients × parameters) matrix, 2 GiB at
        # 10,000 clients (#59).
        edges = torch.nonzero(torch.diff(mask.to(torch.int8), prepend=mask.new_zeros(1, dtype=torch.int8),
                                         append=mask.new_zeros(1, dtype=torch.int8))).flatten().tolist()
        for k in np.unique(clusters):
            rows = torch.from_numpy(np.flatnonzero(clusters == k)).to(models.device)
            for begin, end in zip(edges[::2], edges[1::2]):
                models[rows, begin:end] = self.centers[k, begin:end]
        return Models.own_of(models, clients, self.ctx.num_clients)

    def assignment(self) -> np.ndarray | None:
        return self.clusters.copy()

    newcomer_rule = ("receives the shared layers of the clusters' mean model and trains as a client does in a round; "
                     "its model's outputs on the server's public data join the cluster whose model's outputs are the "
                     "nearest in Jensen–Shannon divergence (FedTSDP's first stage); served that cluster's shared "
                     "layers with its own personalization layers")

    def place(self, newcomers: Context) -> Placement:
        n, mask = newcomers.num_clients, self.shared_mask()
        payload = Payload({"shared": self.centers.mean(0)[mask]}, {"shared": mask, "question": ROUND})
        answers = newcomers.ask({c: payload for c in range(n)})  # each keeps its model
        clusters = np.zeros(n, dtype=np.int64)
        done = sorted(answers)
        if done:
            vectors = torch.stack([answers[c].tensors["model"] for c in done])
            outputs = self._outputs(torch.cat([vectors, self.centers]), self.public)
            divergence = js_divergence_matrix(outputs)[:len(done), len(done):]
            clusters[done] = divergence.argmin(axis=1)
        models = newcomers.clients["model"].clone()
        models[:, mask] = self.centers[torch.from_numpy(clusters).to(self.centers.device)][:, mask]
        return Placement(clusters, Models.own(models))

    def round_metrics(self) -> dict[str, float]:
        return {"hopkins": self.last_hopkins, "clustering_ran": self.last_clustered,
                "shared_layers": float(self._round_shared)}
