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

import torch.nn.functional as F
from cflpipe.errors import SpecError
from cflpipe.fl.method import ClientView, Context, Payload, Placement, Update, stack_updates
from cflpipe.fl.params import cluster_average
from cflpipe.fl.plan import ClientPlan, Trained
from cflpipe.methods.clustered import LOSSES, ClusterModels, asked_losses, lowest
from cflpipe.methods.intercluster_params import AWCFLParams, MCFLParams
from cflpipe.models import build_model
from cflpipe.seeds import seed32


def random_models(ctx: Context, count: int, purpose: int) -> torch.Tensor:
    """`count` freshly initialized parameter vectors of the run's model, (count × P): row 0 is the
    run's own initial model (ctx.init), row k > 0 is the model built after seeding torch with
    a value derived from (run seed, purpose, k). The global torch RNG is left as it was."""
    rows = [ctx.init.clone()]
    for k in range(1, count):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed32(ctx.seed, purpose, k))
            model = build_model(ctx.training.model, ctx.data.input_shape, ctx.data.num_classes)
        rows.append(torch.nn.utils.parameters_to_vector(model.parameters()).detach()
                    .to(dtype=ctx.init.dtype, device=ctx.device))
    return torch.stack(rows)


# Rows per applied chunk for the losses (predict()'s default before models were applied through
# the trainer; a different chunking would move the losses in their last bits).
LOSS_CHUNK = 8192


def sample_losses(apply, models: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> np.ndarray:
    """Every model's (rows of `models`) loss on every sample, (K × samples), float64: the K
    models applied together (batched where the trainer batches) by `apply` (Context.apply)."""
    logits = apply(models, x, chunk=LOSS_CHUNK)  # (K × rows × classes)
    return torch.stack([F.cross_entropy(out, y, reduction="none") for out in logits]).double().cpu().numpy()


def mean_losses(view: ClientView, models: torch.Tensor) -> np.ndarray:
    """Each model's mean loss on the client's training data, float64 (NaN without data): the
    client's cluster identity estimate, in its round and when the server asks (evaluation,
    placement of a new client)."""
    x, y = view.data()
    per_sample = sample_losses(view.apply, models, x, y)
    return per_sample.mean(axis=1) if per_sample.shape[1] else np.full(len(models), np.nan)


class IFCA(ClusterModels):
    """IFCA: all K cluster models go to each client, which trains (and joins) the one with the lowest loss.

    Initialization follows the paper: K models initialized at random, each from its own seed
    (model 0 is the run's initial model). Aggregation is the model-averaging variant, weighted by
    the clients' sample counts (the paper's clients all hold the same number of samples, where
    this equals its plain average).

    Restarts (`restarts` R > 1): the paper's remedy for a random initialization that lands two
    groups in one model (its analysis needs a good start and suggests several random ones). R
    independent sets of K random models train side by side for `restart_rounds` rounds: every
    sampled client picks its lowest-loss model in each set and trains each pick (R× the local
    work and traffic, on independent batch streams), each set averages its own uploads. After
    the last restart round the set with the lowest IFCA objective (the mean over the round's
    clients of the loss of their chosen model) is kept and the others dropped. Until then the
    run reports the set that led in the last round. `restarts: 1` (default) is Algorithm 1.

    Evaluation: a client is evaluated with the cluster whose model has the lowest loss on its
    training data, re-estimated for every evaluated client at each evaluation round (the paper's
    cluster identity estimate, applied also to clients not sampled lately): the server asks them
    for their losses (Context.ask, the question a new client is asked). This refresh is an
    evaluation step, not training, so its traffic is not counted; it does not change training,
    because a sampled client re-picks its cluster from all K models anyway."""

    sends_all_models = True  # every client picks among all K (MCFL needs nothing more)

    checkpoint = (*ClusterModels.checkpoint, "tracks", "best_track")

    @classmethod
    def check_hyperparams(cls, params):
        # Two restarts, the best kept at the end of round 2 of 4: resume, state and trainer
        # checks cover the switch from two sets to one (the variants take one initialization).
        if issubclass(params, (AWCFLParams, MCFLParams)):
            return {"clusters": 2}
        return {"clusters": 2, "restarts": 2, "restart_rounds": 2}

    def __init__(self, ctx: Context):
        super().__init__(ctx, ctx.hp.clusters, np.zeros(ctx.num_clients, dtype=np.int64))
        if ctx.hp.restarts > 1 and (self.awcfl_beta is not None or self.mcfl):
            raise SpecError(f"methods.{ctx.method}.restarts: the AWCFL and MCFL variants take one initialization "
                            f"(restarts: 1), got {ctx.hp.restarts}")
        # Restart r's K models are rows r·K … r·K + K − 1; restart 0 is Algorithm 1's own start.
        self.centers = random_models(ctx, ctx.hp.clusters * ctx.hp.restarts, purpose=0x1FCA)
        self.tracks = int(ctx.hp.restarts)  # restarts still training (1 once the best is kept)
        self.best_track = 0  # the restart reported until one is kept: the lowest loss of the last round

    def cluster_payload(self, client: int) -> Payload:
        return Payload({"models": self.centers})

    # --- the client, over its view: it picks, in each set of K models, the one with the lowest
    # loss on its training data (its cluster identity estimate), trains each pick and returns
    # its picks with the trained models
    @classmethod
    def client_plan(cls, view: ClientView, payload: Payload) -> tuple[ClientPlan | dict[str, ClientPlan], dict]:
        models, k = payload.tensors["models"], view.hp.clusters
        tracks = len(models) // k
        losses = mean_losses(view, models).reshape(tracks, k)
        chosen = lowest(losses)
        scratch = {"chosen": chosen, "loss": losses[np.arange(tracks), chosen]}
        if tracks == 1:
            return ClientPlan(models[int(chosen[0])]), scratch
        # Each restart trains on its own batch stream, as independent runs would.
        return {f"restart{r}": ClientPlan(models[r * k + int(chosen[r])], stream=(r,) if r else ())
                for r in range(tracks)}, scratch

    @classmethod
    def query(cls, view: ClientView, payload: Payload, trained, scratch) -> Update:
        if payload.meta.get("question") == LOSSES:  # its cluster identity estimate, as it makes it in a round
            # sent as float32, 4 bytes a loss as every method's answer: a pick could differ from
            # the client's own only between losses within float32's rounding of each other
            return view.answer({"losses": torch.from_numpy(mean_losses(view, payload.tensors["models"])).float()})
        return super().query(view, payload, trained, scratch)

    @classmethod
    def cluster_client_finish(cls, view: ClientView, payload: Payload, trained: Trained | dict[str, Trained],
                              scratch: dict) -> Update:
        device = payload.tensors["models"].device
        cluster = torch.as_tensor(scratch["chosen"], dtype=torch.int64, device=device)
        if isinstance(trained, Trained):
            update = view.update({"model": trained.vector, "cluster": cluster}, trained)
        else:
            runs = [trained[f"restart{r}"] for r in range(len(trained))]
            record = next((t for t in runs if t.diverged), runs[0])
            loss = torch.as_tensor(scratch["loss"], dtype=torch.float64, device=device)
            update = view.update({**{f"model{r}": t.vector for r, t in enumerate(runs)}, "cluster": cluster,
                                  "loss": loss}, record)
        return update

    def cluster_aggregate(self, updates: dict[int, Update]) -> None:
        if self.tracks == 1:
            for client, update in updates.items():
                self.clusters[client] = int(update.tensors["cluster"][0])
            super().cluster_aggregate(updates)
            return
        if not updates:
            return
        k = self.hp.clusters
        for r in range(self.tracks):
            clients, vectors, weights = stack_updates(updates, f"model{r}")
            chosen = torch.stack([updates[c].tensors["cluster"][r] for c in clients]).cpu()
            means, present = cluster_average(vectors, chosen, weights, k)
            block = self.centers[r * k:(r + 1) * k]
            block[present] = means[present]
        # IFCA's objective on the round's clients, per restart: the loss of each client's chosen
        # model before training, averaged over the round's clients.
        objective = torch.stack([u.tensors["loss"] for u in updates.values()]).mean(0)
        self.best_track = int(lowest(objective.cpu().numpy()[None, :])[0])
        for client, update in updates.items():
            self.clusters[client] = int(update.tensors["cluster"][self.best_track])
        if self.ctx.round + 1 >= self.hp.restart_rounds:  # keep the best restart, drop the others
            self.centers = self.centers[self.best_track * k:(self.best_track + 1) * k].clone()
            self.tracks, self.best_track = 1, 0

    def cluster_models(self, clients: np.ndarray | None = None) -> tuple[list[torch.Tensor], np.ndarray]:
        """Clients choose their cluster again by loss on their training data; in a sampled
        evaluation only the sampled ones, the others keep the cluster they last chose."""
        models = self._best_models()
        which = np.arange(self.ctx.num_clients) if clients is None else np.asarray(clients, dtype=np.int64)
        self.clusters[which] = lowest(asked_losses(self.ctx, models, which, counted=False))
        return list(models), self.clusters.copy()

    newcomer_rule = ("receives the K cluster models, sends its training loss under each and is served the one of "
                     "lowest loss (IFCA's own choice)")

    def place(self, newcomers: Context) -> Placement:
        return self.place_by_loss(newcomers, self._best_models())

    def _best_models(self) -> torch.Tensor:
        k = self.hp.clusters
        return self.centers[self.best_track * k:(self.best_track + 1) * k]
