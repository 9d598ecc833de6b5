"""FLUX (Fenoglio et al. 2025, arXiv 2511.22305), reconstructed from the authors' code
(github.com/dariofenoglio98/FLUX at 43aadbe): the paper's method section cannot be read here, so
this follows the code's main (Flower) path; docs/research/flux-srfca.md has the file:line notes.

FedAvg until the accuracy of the global model stops rising fast; then, once, every client sends
a descriptor of its data as the global model sees it (the mean and spread of its projected
features, overall and per label), the server scales the descriptors, clusters them by DBSCAN
with a radius read off the data (the knee of the sorted nearest-neighbour distances), so the
number of clusters is found, not given, and FedAvg runs inside each cluster from then on.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from cflpipe.fl.method import ClientView, Context, Payload, Placement, Update
from cflpipe.methods.clustered import ClusterModels

# The authors' fixed seed of the random points the shared projection is fitted on: every
# client draws the same points, so all project their features alike.
PROJECTION_SEED = 1
# The authors' max_latent margin over the largest feature value the clients report.
LATENT_MARGIN = 1.02
# A label a client holds at most this many samples of gets the placeholder in its per-label slots.
FEW_SAMPLES, PLACEHOLDER = 1, -1.0


@functools.lru_cache(maxsize=4)
def shared_projection(dim: int, components: int, max_latent: float, points: int):
    """The PCA every client projects its features with: fitted on `points` random points uniform
    in [0, max_latent]^dim, drawn from the authors' fixed seed (a fixed random orthonormal map
    and a centring, the same for every client; each client derives it, a simulation once)."""
    from sklearn.decomposition import PCA

    random_points = np.random.RandomState(PROJECTION_SEED).uniform(0, max_latent, size=(points, dim))
    # The full SVD: sklearn's automatic choice turns randomized (and unseeded) beyond 500 columns.
    return PCA(n_components=min(components, dim, points), svd_solver="full").fit(random_points)


def descriptor(z: np.ndarray, y: np.ndarray, classes: int) -> np.ndarray:
    """A client's descriptor of its projected features z (n × C) and labels y: the mean and the
    standard deviation of every projected dimension, then per label 0…classes−1 the same of that
    label's rows (the placeholder −1 where the client holds at most one sample of the label).
    Length 2C + 2·classes·C."""
    c = z.shape[1]
    per_mean = np.full((classes, c), PLACEHOLDER)
    per_std = np.full((classes, c), PLACEHOLDER)
    for label in range(classes):
        rows = z[y == label]
        if len(rows) > FEW_SAMPLES:
            per_mean[label], per_std[label] = rows.mean(0), rows.std(0)
    return np.concatenate([z.mean(0), z.std(0), per_mean.ravel(), per_std.ravel()])


def scale_groups(descriptors: np.ndarray, group: int, reference: np.ndarray | None = None) -> np.ndarray:
    """Min-max scaling of each run of `group` consecutive columns, with one minimum and one
    maximum pooled over every client and column of the run (the authors' scaling 1); those of
    `reference`'s clients where given (a new client scaled as the participants were)."""
    reference = descriptors if reference is None else reference
    out = np.empty_like(descriptors)
    for start in range(0, descriptors.shape[1], group):
        block, pooled = descriptors[:, start:start + group], reference[:, start:start + group]
        low, high = pooled.min(), pooled.max()
        out[:, start:start + group] = (block - low) / (high - low) if high > low else 0.0
    return out


def knee_radius(points: np.ndarray, scaling: float) -> float:
    """DBSCAN's eps: the knee (Kneedle, convex and increasing) of the sorted distances of every
    point to its nearest other point, times `scaling`. Without a knee (the authors' code fails
    there), the median distance; never 0 (DBSCAN needs eps > 0)."""
    from kneed import KneeLocator
    from sklearn.neighbors import NearestNeighbors

    distances = np.sort(NearestNeighbors(n_neighbors=2).fit(points).kneighbors(points)[0][:, 1])
    with np.errstate(invalid="ignore", divide="ignore"):  # equal distances: no knee, not an error
        knee = KneeLocator(range(len(distances)), distances, curve="convex", direction="increasing").elbow \
            if len(distances) > 2 else None
    radius = distances[knee] if knee is not None else float(np.median(distances))
    return max(float(radius) * scaling, np.finfo(np.float64).tiny)


def dbscan_clusters(points: np.ndarray, eps: float) -> np.ndarray:
    """DBSCAN (min_samples 2, Euclidean) whose noise points each become a cluster of their own;
    clusters numbered in the order of their first client."""
    from sklearn.cluster import DBSCAN

    labels = DBSCAN(eps=eps, min_samples=2).fit_predict(points)
    found: dict[Any, int] = {}
    out = np.empty(len(labels), dtype=np.int64)
    for client, label in enumerate(labels):
        key = ("noise", client) if label == -1 else label
        out[client] = found.setdefault(key, len(found))
    return out


class FLUX(ClusterModels):
    """FLUX (reconstructed from the authors' code): FedAvg until accuracy stalls, then one DBSCAN clustering
    of descriptors of each client's features under the global model (K found), then FedAvg per cluster.

    Warm-up: FedAvg. At the start of every round but the first the sampled clients report the
    accuracy of the model they receive on their training data (one number each); from the fourth
    round (0-based 3) on, once the sample-weighted accuracy has risen by less than `th_round`
    from one round to the next (any pair so far), or the 0-based round reaches
    `max_round_fraction` of the rounds, that round clusters (`cluster_round` fixes the round
    instead).

    Clustering round, before training: every client reports the largest feature value of the
    global model on its training data; the server sends back 1.02 × their maximum; every client
    projects its features (`LayeredModel.features`, the head's input) with the shared PCA
    (`shared_projection`, C = the number of labels) and sends its descriptor (`descriptor`).
    The server scales them (`scale_groups`, groups of C), clusters them (`knee_radius`,
    `dbscan_clusters`) and every cluster starts from the global model; the round's updates are
    already averaged per cluster. The clustering is never revisited. Off-round traffic: the
    global model to the clients not sampled, the maxima and descriptors up.

    Departures from the authors' code, each because cflpipe's run differs:
    - The trigger's accuracy is the global model's on the sampled clients' training data, measured
      as they receive it; the code has every client report it on its local validation split after
      aggregation (a cflpipe scenario's validation split chooses rounds and hyper-parameters and
      is never trained on, so a method does not read it). The two measure the same model.
    - With fewer features than labels the projection keeps as many components as features.
    - The features are the input of the model's head (cflpipe's `features`); the code takes the
      flattened output of the last convolution of LeNet-5 and ResNet-9 (an MLP has none).
    - `max_latent` comes from the training data (the code: the clients' validation data).
    - Without a knee the radius is the median distance (the code fails).
    - Test-time assignment of unseen clients (the code's nearest centroid on the label-free
      half of the descriptor) has no use here: every client of a run is known and clustered."""

    # descriptors, descriptor_model, largest: the clustering round's, what a new client is placed by
    checkpoint = (*ClusterModels.checkpoint, "clustered", "trend", "descriptors", "descriptor_model", "largest")

    @classmethod
    def check_hyperparams(cls, params):
        return {"cluster_round": 1}

    def __init__(self, ctx):
        super().__init__(ctx, 1, np.zeros(ctx.num_clients, dtype=np.int64))
        self.clustered = False
        self.trend = np.zeros(0, dtype=np.float64)  # the weighted accuracy measured at each round's start
        self.descriptors = np.zeros((0, 0), dtype=np.float64)
        self.descriptor_model = ctx.init.clone()
        self.largest = float("nan")
        self._metrics: dict[str, float] = {}

    def round_start(self, sampled: np.ndarray) -> None:
        self._metrics = {}
        if self.clustered:
            return
        if self.hp.cluster_round is None:
            # round 0's model is the untrained one, which no gain is measured from: nothing asked
            accuracy = self._received_accuracy(sampled) if self.ctx.round > 0 else float("nan")
            self.trend = np.append(self.trend, accuracy)
            if self.ctx.round > 0:
                self._metrics["flux_accuracy"] = accuracy
        if self._clusters_now():
            self._cluster(sampled)

    def _received_accuracy(self, sampled: np.ndarray) -> float:
        """The sample-weighted accuracy of the global model on the sampled clients' training data
        (each client sends one number up: its count of correct predictions)."""
        payload = Payload({"model": self.centers[0]}, {"question": "accuracy"}, held=("model",))
        answers = self.ctx.ask({int(c): payload for c in sampled})
        sizes = self.ctx.train_sizes()
        correct = sum(float(answers[int(c)].tensors["correct"][0]) for c in sampled)
        total = sum(int(sizes[c]) for c in sampled)
        return correct / total if total else float("nan")

    def _clusters_now(self) -> bool:
        r = self.ctx.round  # 0-based
        if self.hp.cluster_round is not None:
            return r == self.hp.cluster_round
        # trend[i] was measured at the start of round i, after i rounds: the code's check after
        # its third round, here at the start of round 3 with three gains measured.
        if r < 3:
            return False
        gains = np.diff(self.trend[1:])
        return r >= self.hp.max_round_fraction * self.ctx.training.rounds or bool(np.any(gains < self.hp.th_round))

    def _cluster(self, sampled: np.ndarray) -> None:
        """Every client receives the global model (the sampled ones have it), sends the largest
        of its latent features, receives the largest of all and sends its descriptor."""
        ctx = self.ctx
        model = self.centers[0]
        chosen = set(int(client) for client in sampled)
        maxima = ctx.ask({c: Payload({"model": model}, {"question": "largest"}, held=("model",) if c in chosen else ())
                          for c in range(ctx.num_clients)})
        found = [float(a.tensors["largest"][0]) for a in maxima.values() if not a.tensors["largest"].isnan().all()]
        largest = torch.tensor([max(found, default=1.0)], dtype=torch.float32)
        payload = Payload({"model": model, "largest": largest}, {"question": "descriptor"}, held=("model",))
        answers = ctx.ask({c: payload for c in range(ctx.num_clients)})
        descriptors = np.stack([answers[c].tensors["descriptor"].double().cpu().numpy() for c in range(ctx.num_clients)])
        # A descriptor is 2C + 2·classes·C long (`descriptor`): C, the projection's width, from it.
        scaled = scale_groups(descriptors, self._width(descriptors))
        self.descriptors, self.descriptor_model, self.largest = descriptors, model.clone(), float(largest[0])
        eps = knee_radius(scaled, self.hp.eps_scaling)
        labels = dbscan_clusters(scaled, eps)
        self.clusters = labels
        self.centers = model.repeat(int(labels.max()) + 1, 1)
        self.clustered = True
        self._metrics.update(flux_eps=eps, flux_singletons=float(np.sum(np.bincount(labels) == 1)))

    def _width(self, descriptors: np.ndarray) -> int:
        return descriptors.shape[1] // (2 * (int(self.ctx.data.num_classes) + 1))

    newcomer_rule = ("before the clustering, served the global model; after it, computes its descriptor under the "
                     "model the clustering round used (in the projection of that round's largest feature) and joins "
                     "the cluster of the participant whose descriptor, scaled as theirs were, is nearest")

    def place(self, newcomers: Context) -> Placement:
        n = newcomers.num_clients
        clusters = np.zeros(n, dtype=np.int64)
        if self.clustered and len(self.descriptors):
            largest = torch.tensor([self.largest], dtype=torch.float32)
            payload = Payload({"model": self.descriptor_model, "largest": largest}, {"question": "descriptor"})
            answers = newcomers.ask({c: payload for c in range(n)})
            width = self._width(self.descriptors)
            reference = scale_groups(self.descriptors, width)
            for c, answer in answers.items():
                theirs = scale_groups(answer.tensors["descriptor"].double().cpu().numpy()[None], width, self.descriptors)
                clusters[c] = int(self.clusters[int(np.argmin(((reference - theirs) ** 2).sum(axis=1)))])
        return self.served(newcomers, clusters, list(self.centers), clusters)

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained: None, scratch: None) -> Update:
        """A client's answers: its count of training samples the model it holds predicts right
        ("accuracy"); the largest of its latent features ("largest"); its descriptor in the
        projection every client derives from the largest of all ("descriptor")."""
        question = payload.meta.get("question")
        if question not in ("accuracy", "largest", "descriptor"):
            return super().query(view, payload, trained, scratch)
        model = payload.tensors["model"]
        x, y = view.data()
        chunk = view.training.eval_batch_size
        if question == "accuracy":
            correct = float((view.apply(model[None], x, chunk=chunk)[0].argmax(1) == y).sum()) if len(y) else 0.0
            return view.answer({"correct": torch.tensor([correct], dtype=torch.float32)})
        features = view.apply(model[None], x, call="features", chunk=chunk)[0].reshape(len(x), -1).double().cpu().numpy()
        if question == "largest":
            return view.answer({"largest": torch.tensor([features.max() if features.size else float("nan")],
                                                        dtype=torch.float32)})
        projection = shared_projection(features.shape[1], view.classes, LATENT_MARGIN * float(payload.tensors["largest"][0]),
                                       view.hp.projection_points)
        c = projection.n_components_
        z = projection.transform(features) if len(features) else np.zeros((0, c))
        return view.answer({"descriptor": torch.from_numpy(descriptor(z, y.cpu().numpy(), view.classes).astype(np.float32))})

    def round_metrics(self) -> dict[str, Any]:
        return {**super().round_metrics(), **self._metrics}
