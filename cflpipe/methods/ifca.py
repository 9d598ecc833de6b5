"""IFCA — the Iterative Federated Clustering Algorithm (Ghosh, Chung, Yin and Ramchandran 2020,
"An efficient framework for clustered federated learning", NeurIPS 2020), model-averaging variant.

Each round the server sends all K cluster models to every sampled client (bytes down = K models).
The client evaluates the loss of each on its whole training set, keeps the cluster ĵ with the
lowest loss, runs local SGD from θ_ĵ and uploads the trained model together with ĵ. The server
averages the uploaded models of each cluster (clusters nobody picked keep their model).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from cflpipe.fl.local import predict
from cflpipe.fl.method import Capabilities, Context, Payload, Update
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.methods.clustered import ClusterModels
from cflpipe.metrics import per_client_mean
from cflpipe.methods import HyperParams, register
from cflpipe.models import build_model


class IFCAParams(HyperParams):
    clusters: int = Field(2, ge=1, description="number of cluster models K (the paper's k; 2 by default, "
                                               "set it to the expected number of groups)")


def random_models(ctx: Context, count: int, purpose: int) -> torch.Tensor:
    """`count` freshly initialized parameter vectors of the run's model, (count × P): row 0 is the
    run's own initial model (ctx.init), row k > 0 is the model built after seeding torch with
    a value derived from (run seed, purpose, k). The global torch RNG is left as it was."""
    rows = [ctx.init.clone()]
    for k in range(1, count):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(np.random.SeedSequence([ctx.seed, purpose, k]).generate_state(1)[0]))
            model = build_model(ctx.training.model, ctx.data.input_shape, ctx.data.num_classes)
        rows.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach()
                    .to(dtype=ctx.init.dtype, device=ctx.device))
    return torch.stack(rows)


def train_losses(ctx: Context, models: torch.Tensor, client: int | None = None) -> np.ndarray:
    """Mean training loss of every model (rows of `models`) on one client's training set,
    (K,), or with client=None on every client's, (clients × K) — one pass over the pooled
    training data per model."""
    space, split = ctx.space, ctx.data.train
    if client is None:
        x, y = split.x, split.y
        owner = split.owner.cpu().numpy()
    else:
        x, y = split.of(client)
    columns = []
    for vector in models:
        space.load(vector)
        _, loss = predict(space, x, y)
        loss = loss.double().cpu().numpy()
        if client is None:
            columns.append(per_client_mean(owner, loss, ctx.num_clients))
        else:
            columns.append(np.array([loss.mean() if len(loss) else np.nan]))
    losses = np.stack(columns, axis=1)
    return losses if client is None else losses[0]


def lowest(losses: np.ndarray) -> np.ndarray:
    """argmin over the last axis; NaN (no data, diverged model) counts as +inf, ties go to the
    lowest index."""
    return np.argmin(np.where(np.isnan(losses), np.inf, losses), axis=-1).astype(np.int64)


@register("ifca", IFCAParams)
class IFCA(ClusterModels):
    """IFCA: all K cluster models go to each client, which trains (and joins) the one with the lowest loss.

    Initialization follows the paper: K models initialized at random, each from its own seed
    (model 0 is the run's initial model). Aggregation is the model-averaging variant, weighted by
    the clients' sample counts (the paper's clients all hold the same number of samples, where
    this equals its plain average).

    Evaluation: a client is evaluated with the cluster whose model has the lowest loss on its
    training data, re-estimated for every client at each evaluation round (the paper's cluster
    identity estimate, applied also to clients not sampled lately). This refresh is an
    evaluation step, not training, so its models are not counted as bytes; it does not change
    training, because a sampled client re-picks its cluster from all K models anyway."""

    capabilities = Capabilities(clustered=True, k_param="clusters")

    def __init__(self, ctx: Context):
        super().__init__(ctx, ctx.hp.clusters, np.zeros(ctx.num_clients, dtype=np.int64))
        self.centers = random_models(ctx, ctx.hp.clusters, purpose=0x1FCA)

    def cluster_payload(self, client: int) -> Payload:
        return Payload({"models": self.centers})

    def plan(self, client: int, payload: Payload) -> ClientPlan:
        # The client's cluster identity estimate is client-side work before training; it is
        # noted in the payload's meta (the client's own scratch) for finish().
        models = payload.tensors["models"]
        chosen = int(lowest(train_losses(self.ctx, models, client)))
        payload.meta["chosen"] = chosen
        return ClientPlan(models[chosen])

    def cluster_finish(self, client: int, payload: Payload, trained: Trained) -> Update:
        cluster = torch.tensor([payload.meta["chosen"]], dtype=torch.int64, device=trained.vector.device)
        return self.update(client, {"model": trained.vector, "cluster": cluster}, trained)

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        for client, update in updates.items():
            self.clusters[client] = int(update.tensors["cluster"][0])
        super().cluster_aggregate(updates)

    def cluster_eval_models(self) -> tuple[list[torch.Tensor], np.ndarray]:
        self.clusters = lowest(train_losses(self.ctx, self.centers))
        return super().cluster_eval_models()
