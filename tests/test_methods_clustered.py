"""The clustered methods IFCA, CFL, FL+HC, FeSEM and FedGroup: each server step on hand-made
vectors, resume equality, and (slow) end-to-end scenarios with planted groups."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from cflpipe.clustering import nearest_center, pairwise_sq_distances
from cflpipe.fl.engine import Run, train_run
from cflpipe.fl.runs import resolve_run
from cflpipe.fl.local import LocalResult
from cflpipe.fl.method import ClientStore, ClientView, Context, local_update, receive, Update
from cflpipe.fl.plan import Trained
from cflpipe.registry import all_methods
from cflpipe.methods.cfl_params import CFLParams
from cflpipe.methods.fedgroup_params import FedGroupParams
from cflpipe.methods.fesem_params import FeSEMParams
from cflpipe.methods.flhc_params import FLHCParams
from cflpipe.methods.kmeans_cfl_params import KMeansCFLParams
from cflpipe.methods.cfl import CFL
from cflpipe.methods.fedgroup import FedGroup
from cflpipe.methods.fesem import FeSEM
from cflpipe.methods.flhc import FLHC
from cflpipe.methods.clustered import asked_losses, lowest
from cflpipe.models import build_model
from cflpipe.methods.kmeans_cfl import KMeansCFL
from cflpipe.spec import parse_spec

torch.set_num_threads(1)

CLUSTERED = ("ifca", "cfl", "flhc", "fesem", "fedgroup")


# ---------------------------------------------------------------------------- helpers


class FakeContext:
    """The parts of fl.method.Context the server steps use; the trainer returns a plan's start +
    a planted per-client update, so every round's uploads are known exactly."""

    def __init__(self, hp, num_clients: int, dim: int, deltas: torch.Tensor | None = None, seed: int = 0):
        self.hp, self.seed, self.round = hp, seed, 0
        self.device = torch.device("cpu")
        self.init = torch.zeros(dim)
        self.num_clients = num_clients
        self.deltas = deltas
        self.training = SimpleNamespace(on_divergence="stop")
        self.method = self.scenario = "test"
        self.trained: list[tuple[int, int, int | None]] = []  # (round, client, steps)
        self.anchors: list = []
        self.extra_bytes_down = self.extra_bytes_up = 0
        self.clients = ClientStore(num_clients, self.device)  # what Context.table makes its tables in

    # The real questions to clients outside the round (their traffic, their divergence).
    ask = Context.ask
    table = Context.table

    def train_sizes(self) -> np.ndarray:
        return np.full(self.num_clients, 10)

    def rng(self, *purpose: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.round, *purpose, 0x5E])

    def view(self, client: int) -> ClientView:
        """A client's view without data, layout or store: these clients only train what they receive."""
        return ClientView(client, self.round, self.hp, self.training, int(self.train_sizes()[client]), None,
                          {"model": self.init}, None, None, None, self.seed)

    train = Context.train

    def run(self, plans):
        out = {}
        for client, plan in plans.items():
            self.trained.append((self.round, int(client), plan.steps))
            self.anchors.append(list(plan.anchors))
            out[client] = Trained(plan.start + self.deltas[client], LocalResult(0.5, 1, 1))
        return out


def play_round(method, ctx, sampled) -> dict:
    """One engine round without the engine: hooks in order, bytes as the engine counts them
    (sampled clients' payloads and updates plus the traffic the method reported to the context,
    shown apart as off_round_bytes_* when there is any)."""
    sampled = np.asarray(sampled, dtype=np.int64)
    ctx.extra_bytes_down = ctx.extra_bytes_up = 0
    method.round_start(sampled)
    updates, down, up = {}, 0, 0
    for client in sampled:
        payload = method.payload(int(client))
        down += payload.nbytes
        update = local_update(method, int(client), payload)
        up += update.nbytes
        updates[int(client)] = update
    receive(method, updates)
    row = {"bytes_down": down + ctx.extra_bytes_down, "bytes_up": up + ctx.extra_bytes_up,
           **method.round_metrics()}
    if ctx.extra_bytes_down or ctx.extra_bytes_up:
        row.update(off_round_bytes_down=ctx.extra_bytes_down, off_round_bytes_up=ctx.extra_bytes_up)
    ctx.round += 1
    return row


def upload(vector: torch.Tensor, key: str = "model", n: int = 10, **meta) -> Update:
    return Update({key: vector}, n, LocalResult(0.5, 1, 1), meta=meta)


def opposite_groups(per_group: tuple[int, int], dim: int = 40, scale: float = 2.0, noise: float = 0.2,
                    agree: bool = False, seed: int = 0) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(dim, generator=g)
    u = scale * u / u.norm()
    labels = np.repeat([0, 1], per_group)
    sign = torch.ones(len(labels)) if agree else torch.from_numpy(1.0 - 2.0 * labels).float()
    deltas = sign[:, None] * u + noise * torch.randn(len(labels), dim, generator=g) / dim ** 0.5
    return deltas, labels


def planted(groups: int, per: int, dim: int = 60, shared: float = 3.0, noise: float = 0.1, seed: int = 0):
    """Updates = a shared direction + one direction per group + noise (like first updates)."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(dim, generator=g)
    own = torch.randn(groups, dim, generator=g)
    labels = np.repeat(np.arange(groups), per)
    x = shared * common / common.norm() + own[labels] / own[labels].norm(dim=1, keepdim=True)
    return x + noise * torch.randn(len(labels), dim, generator=g) / dim ** 0.5, labels


def tiny_spec(results: Path, methods: dict, **training) -> dict:
    return {
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 6, "clients_per_round": 4, "local_steps": 3, "batch_size": 16,
                     "lr": 0.05, "momentum": 0.9, "eval_every": 2, "checkpoint_every": 3, "device": "cpu",
                     **training},
        "scenarios": {"swap": {"dataset": "digits", "clients": 8,
                               "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": methods,
        "results_dir": str(results),
    }


def real_run(tmp_path: Path, method: str, hyperparams: dict) -> Run:
    spec = parse_spec(tiny_spec(tmp_path, {method: hyperparams}))
    run = Run(resolve_run(spec, "swap", method, 0))
    run.setup()
    return run


# ---------------------------------------------------------------------------- registry


def test_methods_are_registered_with_documented_defaults():
    methods = all_methods()
    for name in CLUSTERED:
        assert name in methods, name
        info = methods[name]
        assert info.description
        for field_name, field in info.params.model_fields.items():
            assert field.description, f"{name}.{field_name} has no description"
            assert not field.is_required(), f"{name}.{field_name} has no default"
    from cflpipe.methods.cfl import RELATIVE_DEFAULTS, REFERENCE_DEFAULTS

    assert methods["cfl"].params().thresholds == "relative" and RELATIVE_DEFAULTS == (0.5, 0.6, 0.5)
    assert REFERENCE_DEFAULTS == (0.4, 1.6, 0.0)  # thresholds: absolute, the reference code
    assert methods["fesem"].params().init_restarts == 20
    assert methods["fedgroup"].params().pretrain_scale == 20
    with pytest.raises(ValueError):
        FLHCParams(linkage="ward", metric="cosine")
    with pytest.raises(ValueError, match="cosine distances have no scale"):
        FLHCParams(linkage="average", metric="cosine", threshold="relative")


# ---------------------------------------------------------------------------- CFL


def test_cfl_splits_clients_whose_updates_point_in_opposite_directions():
    deltas, truth = opposite_groups((4, 3))
    ctx = FakeContext(CFLParams(thresholds="absolute", warmup=2), 7, 40, deltas)
    cfl = CFL(ctx)
    everyone = np.arange(7)
    for _ in range(2):  # warm-up: stationary (mean ≈ 0) and large updates, but too early
        row = play_round(cfl, ctx, everyone)
        assert cfl.num_clusters == 1
        assert row["cfl_mean_norm"][0] < 0.4 < 1.6 < row["cfl_max_norm"][0]
    before = cfl.centers[0].clone()
    row = play_round(cfl, ctx, everyone)
    assert cfl.num_clusters == 2
    assert adjusted_rand_score(truth, cfl.assignment()) == 1.0
    # Each half took its own mean update at once (the split is decided before aggregation).
    for k in range(2):
        members = cfl.assignment() == k
        assert torch.allclose(cfl.centers[k], before + deltas[members].mean(0), atol=1e-6)
    # One model down and one update (a model-sized vector) up per client.
    p = deltas.shape[1] * 4
    assert row["bytes_down"] == row["bytes_up"] == 7 * p
    # Inside each half the updates agree: no further split.
    for _ in range(3):
        play_round(cfl, ctx, everyone)
    assert cfl.num_clusters == 2


def test_cfl_does_not_split_when_updates_agree():
    deltas, _ = opposite_groups((4, 3), agree=True)
    ctx = FakeContext(CFLParams(thresholds="absolute", warmup=0), 7, 40, deltas)
    cfl = CFL(ctx)
    for _ in range(4):
        row = play_round(cfl, ctx, np.arange(7))
        assert row["cfl_mean_norm"][0] > 0.4
    assert cfl.num_clusters == 1 and (cfl.assignment() == 0).all()
    # Opposite updates whose norms are all small (max ≤ eps2) are not split either.
    small, _ = opposite_groups((4, 3), scale=1.0)
    ctx = FakeContext(CFLParams(thresholds="absolute", warmup=0), 7, 40, small)
    cfl = CFL(ctx)
    for _ in range(3):
        play_round(cfl, ctx, np.arange(7))
    assert cfl.num_clusters == 1


def test_cfl_routes_clients_absent_at_the_split_through_the_split_model():
    deltas, truth = opposite_groups((4, 4))
    ctx = FakeContext(CFLParams(thresholds="absolute", warmup=0), 8, 40, deltas)
    cfl = CFL(ctx)
    play_round(cfl, ctx, [0, 1, 4, 5])
    assert cfl.num_clusters == 2
    split_model = cfl.split_models[0].clone()
    assert cfl.pending.tolist() == [-1, -1, 0, 0, -1, -1, 0, 0]
    centers = cfl.centers.clone()
    # A pending client gets the model the split was computed at and is sorted by its update.
    assert torch.equal(cfl.payload(2).tensors["model"], split_model)
    play_round(cfl, ctx, [2, 6])
    assert torch.equal(cfl.centers, centers), "routing updates are not aggregated"
    assert cfl.assignment()[2] == cfl.assignment()[0] and cfl.assignment()[6] == cfl.assignment()[4]
    assert cfl.pending.tolist() == [-1, -1, -1, 0, -1, -1, -1, 0]
    play_round(cfl, ctx, [3, 7])
    assert (cfl.pending < 0).all()
    assert adjusted_rand_score(truth, cfl.assignment()) == 1.0
    # State round-trips.
    clone = CFL(FakeContext(CFLParams(thresholds="absolute", warmup=0), 8, 40, deltas))
    clone.load_state_dict(cfl.state_dict())
    assert torch.equal(clone.centers, cfl.centers) and np.array_equal(clone.clusters, cfl.clusters)
    assert np.array_equal(clone.split_clusters, cfl.split_clusters)


def test_cfl_routes_a_client_through_every_later_split_of_its_cluster_and_no_other():
    """A client absent at two successive splits of its cluster is routed through both; clients of
    another cluster absent at a split are not made to wait at it."""
    dim = 40
    g = torch.Generator().manual_seed(3)
    u, v = torch.linalg.qr(torch.randn(dim, 2, generator=g))[0].T * 2.0  # orthogonal, norm 2
    ctx = FakeContext(CFLParams(thresholds="absolute", warmup=0, min_members=2), 8, dim, torch.stack([u] * 4 + [-u] * 4))
    cfl = CFL(ctx)
    play_round(cfl, ctx, [0, 1, 4, 5])  # split 0: {0, 1} (+u) | {4, 5} (-u); 2, 3, 6, 7 wait at it
    assert cfl.pending.tolist() == [-1, -1, 0, 0, -1, -1, 0, 0]
    a, b = int(cfl.clusters[0]), int(cfl.clusters[4])
    ctx.deltas = torch.stack([v, -v, u + v, u - v] + [-0.01 * u] * 4)
    play_round(cfl, ctx, [0, 1])  # split 1 of cluster a: {0} (+v) | {1} (-v)
    assert cfl.num_clusters == 3 and len(cfl.split_clusters) == 2 and cfl.split_clusters[1, 0] == a
    # 4 and 5 (cluster b, absent) do not wait at a split of cluster a
    assert cfl.pending.tolist() == [-1, -1, 0, 0, -1, -1, 0, 0]
    play_round(cfl, ctx, [2])  # routed at split 0 into a, then waits at a's later split 1
    assert cfl.clusters[2] == a and cfl.pending[2] == 1
    play_round(cfl, ctx, [2])  # routed at split 1 by its +v part: 0's side
    assert cfl.pending[2] == -1 and cfl.clusters[2] == cfl.clusters[0] != cfl.clusters[1]
    play_round(cfl, ctx, [6])  # cluster b never split again: routed once, done
    assert cfl.clusters[6] == b and cfl.pending[6] == -1


# ---------------------------------------------------------------------------- FeSEM


def test_fesem_em_converges_to_planted_centers():
    dim, per = 30, 6
    g = torch.Generator().manual_seed(0)
    centers = torch.stack([torch.full((dim,), 3.0), torch.full((dim,), -3.0), torch.zeros(dim)])
    centers[2, :10] = 6.0
    truth = np.repeat(np.arange(3), per)
    ctx = FakeContext(FeSEMParams(clusters=3), len(truth), dim)
    fesem = FeSEM(ctx)

    def sample_models():
        return centers[truth] + 0.5 * torch.randn(len(truth), dim, generator=g)

    # Round 1: every client uploads; best of 20 random k-means runs gives the initial centers.
    fesem.round_start(np.arange(len(truth)))
    fesem.aggregate({c: upload(v) for c, v in enumerate(sample_models())})
    assert fesem.initialized
    assert adjusted_rand_score(truth, fesem.assignment()) == 1.0
    # Then stochastic EM on fresh uploads: E-step nearest center, M-step plain mean.
    for r in range(1, 6):
        ctx.round = r
        models = sample_models()
        fesem.aggregate({c: upload(v) for c, v in enumerate(models)})
        for k in range(3):
            assert torch.allclose(fesem.centers[k], models[fesem.assignment() == k].mean(0), atol=1e-5)
    order = [int(fesem.assignment()[truth == k][0]) for k in range(3)]
    assert torch.allclose(fesem.centers[order], centers, atol=0.6)
    # A client whose model moved next to another center switches to it (E-step).
    ctx.round = 6
    moved = {0: upload(centers[1] + 0.01)}
    fesem.aggregate(moved)
    assert fesem.assignment()[0] == order[1]


def test_fesem_initialization_round_trains_everyone_and_counts_it():
    deltas, truth = planted(2, 4, dim=20, shared=0.0, noise=0.05)
    ctx = FakeContext(FeSEMParams(clusters=2, lam=0.5), 8, 20, 5 * deltas)
    fesem = FeSEM(ctx)
    row = play_round(fesem, ctx, [0, 5])
    assert sorted(c for r, c, _ in ctx.trained if r == 0) == list(range(8))
    model_bytes = 20 * 4
    assert row["bytes_down"] == row["bytes_up"] == 8 * model_bytes
    assert row["off_round_bytes_down"] == 6 * model_bytes
    assert adjusted_rand_score(truth, fesem.assignment()) == 1.0
    # Eq. 7's (λ/m)·‖ω − Ω‖² next to α_i·L_i: an anchor of strength 2λ/(m·α_i) at the client's
    # center, 2λ for these 8 equal clients (α_i = 1/8).
    anchor = ctx.anchors[-1][0]
    assert anchor.strength == pytest.approx(2 * 0.5) and torch.equal(anchor.vector, torch.zeros(20))
    row = play_round(fesem, ctx, [1, 2])
    assert "off_round_bytes_down" not in row and row["bytes_down"] == 2 * model_bytes
    assert [c for r, c, _ in ctx.trained if r == 1] == [1, 2]


# ---------------------------------------------------------------------------- FL+HC


def test_flhc_clusters_once_at_its_configured_round():
    deltas, truth = opposite_groups((3, 3), dim=24, scale=1.0, noise=0.05)
    ctx = FakeContext(FLHCParams(cluster_round=2, clusters=2), 6, 24, deltas)
    flhc = FLHC(ctx)
    model_bytes = 24 * 4
    for _ in range(2):  # FedAvg: one cluster
        row = play_round(flhc, ctx, [0, 3])
        assert flhc.num_clusters == 1 and not flhc.clustered
        assert row["bytes_down"] == 2 * model_bytes and "off_round_bytes_down" not in row
    global_model = flhc.centers[0].clone()
    row = play_round(flhc, ctx, [1, 4])  # round index 2: everyone updates, one clustering
    assert sorted(c for r, c, _ in ctx.trained if r == 2) == list(range(6))
    assert row["bytes_down"] == row["bytes_up"] == 6 * model_bytes
    assert row["off_round_bytes_up"] == 4 * model_bytes
    assert flhc.clustered and flhc.num_clusters == 2
    assert adjusted_rand_score(truth, flhc.assignment()) == 1.0
    for k in range(2):
        members = flhc.assignment() == k
        assert torch.allclose(flhc.centers[k], global_model + deltas[members].mean(0), atol=1e-6)
    # Later rounds never re-cluster, whatever the updates look like.
    assignment = flhc.assignment()
    ctx.deltas = deltas[torch.tensor([3, 4, 5, 0, 1, 2])]
    for _ in range(3):
        row = play_round(flhc, ctx, [0, 5])
        assert "off_round_bytes_down" not in row
    assert np.array_equal(flhc.assignment(), assignment) and flhc.num_clusters == 2


def test_flhc_distance_threshold_decides_the_number_of_clusters():
    deltas, _ = planted(3, 3, dim=30, shared=0.0, noise=0.05)
    for threshold, expected in ((0.5, 3), (100.0, 1)):
        ctx = FakeContext(FLHCParams(cluster_round=0, distance_threshold=threshold), 9, 30, deltas)
        flhc = FLHC(ctx)
        play_round(flhc, ctx, np.arange(9))
        assert flhc.num_clusters == expected


def test_flhc_relative_threshold_is_a_multiple_of_the_mean_update_norm():
    """Three groups of two identical updates r·e_g (orthonormal e_g): ward merges each pair at
    height 0, two pairs at 2r and the last pair with the other four at 2r as well, so a relative
    threshold of 1.9 keeps 3 clusters and 2.1 merges all, whatever r is; an absolute one does not."""
    for r in (0.01, 100.0):
        deltas = r * torch.eye(3, 12).repeat_interleave(2, dim=0)
        truth = np.repeat([0, 1, 2], 2)
        found = {}
        for threshold, distance in (("relative", 1.9), ("relative", 2.1), ("absolute", 1.9)):
            params = FLHCParams(cluster_round=0, threshold=threshold, distance_threshold=distance)
            ctx = FakeContext(params, 6, 12, deltas)
            flhc = FLHC(ctx)
            row = play_round(flhc, ctx, np.arange(6))
            assert row["flhc_mean_update_norm"] == pytest.approx(r)
            found[threshold, distance] = flhc.num_clusters
            if flhc.num_clusters == 3:
                assert adjusted_rand_score(truth, flhc.assignment()) == 1.0
        assert found[("relative", 1.9)] == 3 and found[("relative", 2.1)] == 1
        assert found[("absolute", 1.9)] == (3 if r == 100.0 else 1)
        assert "flhc_mean_update_norm" not in play_round(flhc, ctx, np.arange(6))  # only the clustering round


# ---------------------------------------------------------------------------- FedGroup


def test_fedgroup_decomposed_similarity_separates_planted_groups_and_cold_starts():
    deltas, truth = planted(2, 5, dim=60)
    ctx = FakeContext(FedGroupParams(clusters=2, pretrain_scale=3), 10, 60, deltas)
    group = FedGroup(ctx)
    row = play_round(group, ctx, [])  # round 1 with nobody sampled: pre-training only
    pretrained = sorted(c for r, c, steps in ctx.trained if r == 0 and steps == 20)
    assert len(pretrained) == 6, "min(α·K, m) clients pre-train, 20 steps each"
    members = group.assignment() >= 0
    assert set(np.nonzero(members)[0]) == set(pretrained)
    assert adjusted_rand_score(truth[members], group.assignment()[members]) == 1.0
    assert row["off_round_bytes_down"] == row["off_round_bytes_up"] == 6 * 60 * 4
    # Each group starts from the plain mean of its members' pre-trained models.
    for k in range(2):
        mine = group.assignment() == k
        assert torch.allclose(group.centers[k], deltas[mine].mean(0), atol=1e-6)
    # Newcomers are pre-trained when first sampled and join the group of their direction.
    newcomers = [c for c in range(10) if c not in pretrained]
    row = play_round(group, ctx, newcomers)
    assert (group.assignment() >= 0).all()
    assert adjusted_rand_score(truth, group.assignment()) == 1.0
    assert row["off_round_bytes_down"] == len(newcomers) * 60 * 4
    # Every assigned client is sent its own group's model (group 0 included), nothing else.
    for client in range(10):
        sent = group.payload(client).tensors["model"]
        assert torch.equal(sent, group.centers[group.assignment()[client]]), client
    # Unassigned clients are evaluated with the mean of the group models.
    fresh = FedGroup(FakeContext(FedGroupParams(clusters=2), 10, 60, deltas))
    assert torch.equal(fresh.payload(0).tensors["model"], fresh.centers.mean(0))
    evaluated = fresh.predictor()
    models, index = evaluated.models, evaluated.index
    assert len(models) == 3 and (index == 2).all()


# ---------------------------------------------------------------------------- IFCA (real model and data)


def test_ifca_client_picks_the_lowest_loss_model(tmp_path):
    run = real_run(tmp_path, "ifca", {"clusters": 3})
    ifca, ctx = run.method, run.ctx
    assert torch.equal(ifca.centers[0], ctx.init)
    assert not torch.equal(ifca.centers[1], ifca.centers[2]), "each model from its own seed"
    # Client 5's own fitted model has the lowest loss on its data, so it must pick index 1.
    fitted, _ = ctx.train(5, ctx.init, steps=60)
    ifca.centers = torch.stack([ifca.centers[0], fitted, ifca.centers[2]])
    assert asked_losses(ctx, ifca.centers)[5].argmin() == 1
    payload = ifca.payload(5)
    assert payload.nbytes == 3 * ctx.space.nbytes(), "all K models travel down"
    update = local_update(ifca, 5, payload)
    assert int(update.tensors["cluster"][0]) == 1
    assert update.nbytes == ctx.space.nbytes() + 8, "one model and the cluster id travel up"
    # Server: cluster-wise average of the uploads, and the uploaders' cluster ids.
    other = local_update(ifca, 6, ifca.payload(6))
    ifca.aggregate({5: update, 6: other})
    assert ifca.clusters[5] == 1
    # Evaluation refreshes everyone's cluster by lowest training loss, asked of the clients
    # (traffic not counted: an evaluation step). Checked against each model's float64 loss on
    # each client's rows, computed here by a plain forward pass, where the best two models of a
    # client are more than 1e-4 apart (a different code path: ties within float error excluded).
    ctx.extra_bytes_down = ctx.extra_bytes_up = 0
    evaluated = ifca.predictor()
    _, index = evaluated.models, evaluated.index
    assert ctx.extra_bytes_down == ctx.extra_bytes_up == 0
    assert np.array_equal(ifca.assignment(), index)
    network = build_model(ctx.training.model, ctx.data.input_shape, ctx.data.num_classes).double()
    train, clear = ctx.data.train, 0
    for client in range(ctx.num_clients):
        rows = train.owner == client
        x, y = train.x[rows].double(), train.y[rows]
        losses = []
        for vector in ifca.centers:
            torch.nn.utils.vector_to_parameters(vector.double(), network.parameters())
            with torch.no_grad():
                losses.append(float(torch.nn.functional.cross_entropy(network(x), y)))
        gap = np.diff(np.sort(losses)[:2])[0]
        if gap > 1e-4:
            clear += 1
            assert index[client] == int(np.argmin(losses)), client
    assert clear >= ctx.num_clients // 2


# ---------------------------------------------------------------------------- resume


RESUME_CASES = {
    "ifca": {"clusters": 2},
    "cfl": {"eps1": 100.0, "eps2": 0.01, "warmup": 1, "min_members": 2, "thresholds": "absolute"},  # splits early and often
    "flhc": {"cluster_round": 3, "clusters": 2},  # clusters right after the checkpoint
    "fesem": {"clusters": 2},
    "fedgroup": {"clusters": 2, "pretrain_scale": 2},  # leaves newcomers to cold-start later
}


@pytest.mark.parametrize("method", sorted(RESUME_CASES))
def test_resumed_run_is_identical(tmp_path, method, monkeypatch):
    hp = RESUME_CASES[method]
    whole = parse_spec(tiny_spec(tmp_path / "whole", {method: hp}))
    train_run(whole, "swap", method, 0, progress=False)
    cut = parse_spec(tiny_spec(tmp_path / "cut", {method: hp}))
    cls = all_methods()[method].cls
    original = cls.aggregate

    def crash(self, updates):
        if self.ctx.round == 4:
            raise KeyboardInterrupt
        return original(self, updates)

    monkeypatch.setattr(cls, "aggregate", crash)
    with pytest.raises(KeyboardInterrupt):
        train_run(cut, "swap", method, 0, progress=False)
    monkeypatch.setattr(cls, "aggregate", original)
    assert (cut.run_dir("swap", method, 0) / "state" / "state.pt").exists()
    train_run(cut, "swap", method, 0, progress=False)  # resumes after round 3
    for name in ("metrics.parquet", "clusters.parquet", "rounds.parquet", "summary.json"):
        a = (whole.run_dir("swap", method, 0) / name).read_bytes()
        b = (cut.run_dir("swap", method, 0) / name).read_bytes()
        assert a == b, f"{method}: {name} differs after resume"


def test_bytes_and_clusters_in_the_outputs(tmp_path):
    methods = {"fesem": {"clusters": 2}, "flhc": {"cluster_round": 2, "clusters": 2}, "ifca": {"clusters": 3},
               "cfl": {}, "fedavg": {}}
    spec = parse_spec(tiny_spec(tmp_path, methods))
    rounds = {m: pd.read_parquet(train_run(spec, "swap", m, 0, progress=False).run_dir / "rounds.parquet")
              for m in methods}
    model = int(rounds["fedavg"]["bytes_down"].iloc[0]) // 4  # 4 clients per round
    assert (rounds["ifca"]["bytes_down"] == 3 * 4 * model).all()
    assert (rounds["ifca"]["bytes_up"] == 4 * (model + 8)).all()
    assert (rounds["cfl"]["bytes_up"] == 4 * model).all()
    fesem = rounds["fesem"]["bytes_down"].tolist()
    assert fesem[0] == 8 * model and set(fesem[1:]) == {4 * model}
    flhc = rounds["flhc"]["bytes_up"].tolist()
    assert flhc[2] == 8 * model and set(flhc[:2] + flhc[3:]) == {4 * model}
    clusters = pd.read_parquet(spec.run_dir("swap", "flhc", 0) / "clusters.parquet")
    assert set(clusters["round"]) == {2, 4, 6} and len(clusters) == 3 * 8


# ---------------------------------------------------------------------------- scenarios (slow)

# The default config's digits scenarios and training block (config/config.yaml), unchanged.
# The trainer is named, not `auto`: auto chooses by timing the machine, and the two trainers'
# sums differ in the last bits, which here flips one of CFL's splits (digits-swap4 seed 1: ARI 1.00
# with 4 clusters sequentially, 0.90 with 5 batched), so the figures would depend on the load.
SCENARIO_TRAINING = {"model": "cnn", "rounds": 30, "clients_per_round": 10, "local_steps": 10, "batch_size": 32,
                     "lr": 0.05, "momentum": 0.9, "eval_every": 5, "checkpoint_every": 10, "device": "cpu",
                     "trainer": "sequential"}
SCENARIOS = {
    "digits-swap4": {"dataset": "digits", "clients": 20, "test_fraction": 0.2,
                     "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 4}]},
    "digits-rot4": {"dataset": "digits", "clients": 20,
                    "partition": [{"kind": "dirichlet", "alpha": 1.0}, {"kind": "rotation", "groups": 4}]},
}
SCENARIO_METHODS = {
    "fedavg": {},
    "ifca": {"clusters": 4},
    "flhc": {"clusters": 4},
    # CFL's ε are scale-dependent (the defaults 0.4/1.6 are the reference code's MNIST values and
    # never fire here); these are read off this training block's FedAvg-phase update norms, which
    # rounds.parquet records as cfl_mean_norm/cfl_max_norm (mean ≈ 0.5–0.9, max ≈ 1.5–3 by round
    # 10–20); the warm-up is shortened from the reference code's 20 rounds to 10 of the 30.
    "cfl": {"eps1": 1.0, "eps2": 2.0, "warmup": 10, "thresholds": "absolute"},
    "fesem": {"clusters": 4},
    "fedgroup": {"clusters": 4},
}
SEEDS = {"fedavg": (0, 1, 2), "ifca": (0, 1, 2), "flhc": (0, 1, 2), "cfl": (0, 1, 2), "fesem": (0,), "fedgroup": (0,)}


@pytest.fixture(scope="module")
def scenario_results(tmp_path_factory):
    """{(scenario, method, seed): final summary figures} for every planted-group run."""
    results = tmp_path_factory.mktemp("scenarios")
    spec = parse_spec({"seeds": [0, 1, 2], "training": SCENARIO_TRAINING, "scenarios": SCENARIOS,
                       "methods": SCENARIO_METHODS, "results_dir": str(results)})
    out = {}
    for scenario in SCENARIOS:
        for method, seeds in SEEDS.items():
            for seed in seeds:
                run = train_run(spec, scenario, method, seed, progress=False)
                final = dict(run.summary["final"])
                final["bytes_down_total"] = run.summary["bytes_down_total"]
                final["bytes_up_total"] = run.summary["bytes_up_total"]
                out[scenario, method, seed] = final
    print("\n" + json.dumps({f"{s}/{m}/seed{k}": {"ari": round(v["ari"], 3), "acc": round(v["acc_macro"], 3),
                                                    "n_clusters": v["n_clusters"]}
                             for (s, m, k), v in out.items()}, indent=1))
    return out


def _figures(results, scenario, method, key):
    return [results[scenario, method, seed][key] for seed in SEEDS[method]]


# Why each method falls short of ARI 0.9 on the rotations (on top of a Dirichlet(1.0) label skew),
# where every method is held to ARI > 0.5 in every seed:
# - flhc: after 10 FedAvg rounds the clients' updates also differ by their label mix, and ward on
#   4 clusters mixes some rotation groups (ARI 1.0 / 0.86 / 0.62 on seeds 0–2);
# - ifca: with random initialization one of the 4 models is never the lowest-loss choice (it stays
#   at its random init) and two rotation groups share a model, so IFCA ends with 3 clusters here
#   (ARI ≈ 0.6–0.7); the paper's remedy is random restarts;
# - cfl: updates' cosine similarities are noisy here (≈ 0–0.5 within a group) and only the sampled
#   half of a cluster votes on a split, so CFL both separates the groups and over-splits some (4–7
#   clusters); it reaches ARI ≥ 0.9 on one seed of three.
@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("method", ["flhc", "ifca", "cfl"])
def test_clustered_methods_recover_planted_groups_and_beat_fedavg(scenario_results, method, scenario):
    ari = _figures(scenario_results, scenario, method, "ari")
    acc, fedavg = (_figures(scenario_results, scenario, m, "acc_macro") for m in (method, "fedavg"))
    assert all(a > f for a, f in zip(acc, fedavg)), (acc, fedavg)
    if scenario == "digits-swap4":
        assert sum(a >= 0.9 for a in ari) >= 2, ari
    else:
        assert all(a > 0.5 for a in ari), ari


@pytest.mark.slow
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_fesem_and_fedgroup_run_and_report_their_clustering(scenario_results, scenario):
    # No recovery threshold: both cluster models trained once from the common random
    # initialization (FeSEM's initial k-means, FedGroup's pre-training), where the planted groups
    # are not yet visible, and keep that clustering; their ARI is reported, not asserted.
    for method in ("fesem", "fedgroup"):
        final = scenario_results[scenario, method, 0]
        assert 1 <= final["n_clusters"] <= 4
        assert -1.0 <= final["ari"] <= 1.0 and 0.0 <= final["acc_macro"] <= 1.0
        # The all-client first round is on top of FedAvg's traffic.
        assert final["bytes_down_total"] > scenario_results[scenario, "fedavg", 0]["bytes_down_total"]


def test_fesem_pull_follows_eq7_alpha_weights(tmp_path):
    """Eq. 7: α_i·L_i + (λ/m)·Dist, optimized as L_i + λ/(m·α_i)·Dist: coefficient 2λ/(m·α_i)."""
    from cflpipe.fl.engine import prepare_run
    from cflpipe.spec import parse_spec

    data = {"seeds": [0], "training": {"model": "mlp", "rounds": 1, "clients_per_round": 2, "device": "cpu"},
            "scenarios": {"s": {"dataset": "digits", "clients": 4,
                                "partition": [{"kind": "quantity", "min": 20, "max": 200}, {"kind": "iid"}]}},
            "methods": {"eq7": {"method": "fesem", "lam": 0.1}, "plain": {"method": "fesem", "lam": 0.1,
                                                                          "loss_weight": "none"}},
            "results_dir": str(tmp_path)}
    spec = parse_spec(data)
    eq7, plain = (prepare_run(spec, "s", name, 0).method for name in ("eq7", "plain"))
    sizes = eq7.ctx.train_sizes()
    assert len(set(sizes.tolist())) > 1
    for client in range(4):
        alpha = sizes[client] / sizes.sum()
        assert eq7.pull_strength(client) == pytest.approx(2 * 0.1 / (4 * alpha))
        assert plain.pull_strength(client) == pytest.approx(2 * 0.1 / 4)
        payload = eq7.payload(client)
        assert type(eq7).client_anchors(eq7.ctx.view(client), payload)[0].strength == eq7.pull_strength(client)


def test_cfl_relative_thresholds_scale_with_the_warmup_norms():
    """The same updates ×10: absolute thresholds stop splitting, relative ones split identically."""
    for scale, expected_absolute in ((2.0, 2), (20.0, 1)):
        deltas, truth = opposite_groups((4, 3), scale=scale)
        outcomes = {}
        for mode, eps1, eps2 in (("absolute", 0.4, 1.6), ("relative", 0.2, 0.5)):
            ctx = FakeContext(CFLParams(warmup=2, thresholds=mode, eps1=eps1, eps2=eps2), 7, 40, deltas)
            cfl = CFL(ctx)
            maxima = []
            for factor in (1.0, 2.0, 1.0):  # warm-up rounds of different sizes: the scale is their mean
                ctx.deltas = deltas * factor
                maxima.append(float(ctx.deltas.norm(dim=1).max()))
                play_round(cfl, ctx, np.arange(7))
            outcomes[mode] = cfl.num_clusters
            if mode == "relative":
                assert cfl.scale() == pytest.approx(np.mean(maxima[:2]))  # rounds 1-2, not the first only
                assert adjusted_rand_score(truth, cfl.assignment()) == 1.0
        assert outcomes == {"absolute": expected_absolute, "relative": 2}
    with pytest.raises(ValueError, match="warmup must be >= 1"):
        CFLParams(thresholds="relative", warmup=0)


def test_cfl_criterion_uses_the_plain_mean_of_updates():
    """Paper and reference code: ‖mean Δθ_i‖, not weighted by n_i (aggregation stays weighted)."""
    deltas = torch.zeros(3, 4)
    deltas[0, 0], deltas[1, 0], deltas[2, 0] = 3.0, -3.0, -3.0
    ctx = FakeContext(CFLParams(thresholds="absolute", warmup=0, eps1=100.0, eps2=100.0), 3, 4, deltas)
    ctx.train_sizes = lambda: np.array([1, 10, 10])  # weighted, the mean would be |3 − 30 − 30| / 21
    cfl = CFL(ctx)
    row = play_round(cfl, ctx, np.arange(3))
    assert row["cfl_mean_norm"][0] == pytest.approx(1.0)  # |3 − 3 − 3| / 3


def test_cfl_gamma_max_refuses_a_bipartition_whose_halves_are_not_separated_enough():
    """Sattler et al.'s check: split only if γ_max < sqrt((1 − α_cross_max)/2).

    Two groups whose updates are u and v with cos(u, v) = 0.6: α_cross_max = 0.6, so the
    separation is sqrt(0.2) ≈ 0.447 and γ_max = 0.44 splits while γ_max = 0.45 does not."""
    u = torch.tensor([1.0, 0.0, 0.0, 0.0])
    v = torch.tensor([0.6, 0.8, 0.0, 0.0])
    deltas = torch.stack([u, u, u, v, v, v]) * 2.0
    truth = np.repeat([0, 1], 3)
    outcomes = {}
    for gamma_max in (0.0, 0.44, 0.45):
        ctx = FakeContext(CFLParams(thresholds="absolute", warmup=0, eps1=100.0, eps2=0.1, gamma_max=gamma_max), 6, 4, deltas)
        cfl = CFL(ctx)
        row = play_round(cfl, ctx, np.arange(6))
        assert row["cfl_cross_similarity"][0] == pytest.approx(0.6, abs=1e-6)
        outcomes[gamma_max] = cfl.num_clusters
        if cfl.num_clusters == 2:
            assert adjusted_rand_score(truth, cfl.assignment()) == 1.0
            assert np.isnan(row["cfl_cross_similarity"][1])  # the new half attempted no split
    assert outcomes == {0.0: 2, 0.44: 2, 0.45: 1}
    # A refused cluster is checked again every round: once its halves point apart, it splits.
    ctx.deltas = torch.stack([u, u, u, -u, -u, -u]) * 2.0
    row = play_round(cfl, ctx, np.arange(6))
    assert row["cfl_cross_similarity"][0] == pytest.approx(-1.0, abs=1e-6)
    assert cfl.num_clusters == 2 and adjusted_rand_score(truth, cfl.assignment()) == 1.0
    with pytest.raises(ValueError):
        CFLParams(gamma_max=1.0)


# ---------------------------------------------------------------------------- K-means CFL


@pytest.mark.parametrize("start", ["fresh", "last"])
def test_kmeans_cfl_clusters_the_uploaded_models_from_cluster_start_on(start):
    """Rounds before cluster_start are FedAvg (one cluster); from it on, K-means on the server's
    copies of every uploaded model, one model per cluster (the plain mean of its members), whether
    each round's K-means starts afresh or from the last round's clusters."""
    deltas, truth = opposite_groups((3, 3), dim=24, scale=1.0, noise=0.05)
    ctx = FakeContext(KMeansCFLParams(clusters=2, cluster_start=2, n_init=3, kmeans_start=start), 6, 24, deltas)
    km = KMeansCFL(ctx)
    assert km.num_clusters == 1
    play_round(km, ctx, [0, 1, 3, 4])  # round 1 < cluster_start
    assert km.num_clusters == 1 and (km.assignment() == 0).all()
    torch.testing.assert_close(km.centers[0], deltas[[0, 1, 3, 4]].mean(0))
    previous = km.centers[0].clone()
    play_round(km, ctx, [0, 1, 3, 4])  # round 2 = cluster_start
    seen = [0, 1, 3, 4]
    assert km.num_clusters == 2
    assert adjusted_rand_score(truth[seen], km.assignment()[seen]) == 1.0
    for k in range(2):
        members = [c for c in seen if km.assignment()[c] == k]
        torch.testing.assert_close(km.centers[k], previous + deltas[members].mean(0))
    play_round(km, ctx, range(6))  # every client uploaded: all of them clustered
    if start == "fresh":
        assert adjusted_rand_score(truth, km.assignment()) == 1.0
    else:
        # Clients 2 and 5 upload for the first time, each trained from the model of the cluster
        # nearest the initial model, and Lloyd's steps from the last round's clusters keep client 5
        # with it: a local optimum that fresh restarts leave (docs/performance.md measures the cost).
        assert km.assignment().tolist() == [0, 0, 0, 1, 1, 0]
    assert np.array_equal(nearest_center(km.latest, km.centers), km.assignment())  # a Lloyd fixed point
    assert km.assignment()[0] == 0  # numbered in order of first appearance
    for k in range(2):
        torch.testing.assert_close(km.centers[k], km.latest[km.assignment() == k].mean(0))
    assert (km.carried is None) == (start == "fresh")


def test_kmeans_cfl_puts_clients_that_never_trained_with_the_nearest_cluster_model():
    deltas, _ = opposite_groups((3, 3), dim=24, scale=1.0, noise=0.05)
    deltas[1] = deltas[0] + 0.01  # clients 0 and 1 upload nearly the same model, far from client 3's
    ctx = FakeContext(KMeansCFLParams(clusters=2, cluster_start=1, n_init=3), 6, 24, deltas)
    km = KMeansCFL(ctx)
    km.latest[5] = 2 * deltas[3]  # the server's copy of a client that has not trained (e.g. a warm start)
    play_round(km, ctx, [0, 1, 3])
    assignment = km.assignment()
    assert assignment[0] == assignment[1] != assignment[3]
    assert assignment[5] == assignment[3]  # nearest cluster model: client 3's
    expected = pairwise_sq_distances(km.latest[[2, 4]], km.centers).argmin(1).numpy()
    assert np.array_equal(assignment[[2, 4]], expected)


# ---------------------------------------------------------------------------- FL+HC


def test_flhc_fedavg_rounds_average_and_the_cut_sees_updates_from_the_global_model(monkeypatch):
    import cflpipe.methods.flhc as flhc_module

    deltas, truth = opposite_groups((3, 3), dim=24, scale=1.0, noise=0.05)
    ctx = FakeContext(FLHCParams(cluster_round=1, clusters=2, linkage="average", metric="cosine"), 6, 24,
                      deltas + 0.3)  # a common part: the global model moves in the FedAvg round
    flhc = FLHC(ctx)
    play_round(flhc, ctx, [0, 3])
    torch.testing.assert_close(flhc.centers[0], (deltas[[0, 3]] + 0.3).mean(0))
    calls = []
    real = flhc_module.hierarchical_clusters

    def spy(updates, **kwargs):
        calls.append((updates.clone(), kwargs))
        return real(updates, **kwargs)

    monkeypatch.setattr(flhc_module, "hierarchical_clusters", spy)
    play_round(flhc, ctx, [1, 4])  # the clustering round: every client's update from the global model
    (updates, kwargs), = calls
    torch.testing.assert_close(updates, deltas + 0.3)
    assert kwargs["linkage"] == "average" and kwargs["metric"] == "cosine"
    assert flhc.round_metrics()["flhc_mean_update_norm"] == pytest.approx(float((deltas + 0.3).norm(dim=1).mean()))
    assert adjusted_rand_score(truth, flhc.assignment()) == 1.0


@pytest.mark.parametrize("large_first", [True, False])
def test_flhc_a_client_missing_from_the_clustering_round_joins_the_largest_cluster(large_first):
    """A client whose update diverged in the clustering round has no update to cut: it joins the
    largest cluster."""
    per_group = (4, 2) if large_first else (2, 4)
    deltas, truth = opposite_groups(per_group, dim=24, scale=1.0, noise=0.05)
    deltas = torch.cat([deltas, torch.zeros(1, 24)])
    ctx = FakeContext(FLHCParams(cluster_round=0, clusters=2), 7, 24, deltas)
    flhc = FLHC(ctx)
    flhc.cluster_aggregate({c: upload(deltas[c]) for c in range(6)})  # client 6 diverged
    assignment = flhc.assignment()
    assert adjusted_rand_score(truth, assignment[:6]) == 1.0
    largest = 0 if large_first else 5
    assert assignment[6] == assignment[largest] and (assignment >= 0).all()
    assert sorted(np.bincount(assignment).tolist()) == [2, 5]


def test_fedgroup_moves_each_group_model_by_its_members_mean_update():
    """After pre-training, a round of every client: each group's model moves by the mean update of
    its members (group 0 included) and that move is the group's direction; everyone is evaluated
    with their group's model."""
    deltas, truth = planted(2, 5, dim=60)
    ctx = FakeContext(FedGroupParams(clusters=2, pretrain_scale=5), 10, 60, deltas)
    group = FedGroup(ctx)
    play_round(group, ctx, [])  # pre-training: all 10 clients (α·K = 10)
    assert (group.assignment() >= 0).all() and adjusted_rand_score(truth, group.assignment()) == 1.0
    before = group.centers.clone()
    play_round(group, ctx, list(range(10)))
    for k in range(2):
        mine = group.assignment() == k
        torch.testing.assert_close(group.centers[k], before[k] + deltas[mine].mean(0))
        torch.testing.assert_close(group.directions[k], deltas[mine].mean(0))
    evaluated = group.predictor()
    models, index = evaluated.models, evaluated.index
    assert len(models) == 2 and np.array_equal(index, group.assignment())
    # Half-way through the cold start: members with their group's model, the others with the mean.
    partial_ctx = FakeContext(FedGroupParams(clusters=2, pretrain_scale=3), 10, 60, deltas)
    partial = FedGroup(partial_ctx)
    play_round(partial, partial_ctx, [])
    evaluated = partial.predictor()
    models, index = evaluated.models, evaluated.index
    assigned = partial.assignment() >= 0
    assert len(models) == 3 and 0 < assigned.sum() < 10 and (partial.assignment()[assigned] == 0).any()
    assert np.array_equal(index[assigned], partial.assignment()[assigned]) and (index[~assigned] == 2).all()


@pytest.mark.parametrize("nearer", [0, 1])
def test_fesem_a_client_missing_from_the_initialization_takes_the_center_nearest_the_initial_model(nearer):
    deltas, truth = opposite_groups((3, 3), dim=24, scale=1.0, noise=0.05)
    far = 3 if nearer == 0 else 0
    deltas[far:far + 3] *= 3.0  # the other group's models lie farther from the initial model (zeros)
    deltas = torch.cat([deltas, torch.zeros(1, 24)])
    ctx = FakeContext(FeSEMParams(clusters=2, init_restarts=2), 7, 24, deltas)
    fesem = FeSEM(ctx)
    fesem._initialize({c: upload(deltas[c]) for c in range(6)})  # client 6 diverged in that round
    assignment = fesem.assignment()
    assert fesem.initialized and adjusted_rand_score(truth, assignment[:6]) == 1.0
    assert assignment[6] == assignment[3 * nearer]


def test_fedgroup_pretraining_measures_updates_from_the_initial_model_and_pretrains_only_newcomers(monkeypatch):
    """With a non-zero initial model: the groups' first directions are their members' mean update
    (pre-trained model − initial model), their models the mean pre-trained model; k-means runs as
    configured (k-means++, kmeans_init restarts, kmeans_iter, the round's seed); a client already in
    a group (group 0 included) is never pre-trained again."""
    import cflpipe.methods.fedgroup as fedgroup_module

    deltas, truth = planted(2, 5, dim=60)
    ctx = FakeContext(FedGroupParams(clusters=2, pretrain_scale=5, kmeans_init=4, kmeans_iter=7), 10, 60, deltas)
    ctx.init = torch.full((60,), 0.5)
    calls = []
    real = fedgroup_module.kmeans

    def spy(features, k, **kwargs):
        calls.append(kwargs)
        return real(features, k, **kwargs)

    monkeypatch.setattr(fedgroup_module, "kmeans", spy)
    group = FedGroup(ctx)
    play_round(group, ctx, [])
    (kwargs,), = [calls]
    assert kwargs["init"] == "k-means++" and kwargs["n_init"] == 4 and kwargs["max_iter"] == 7
    assert isinstance(kwargs["seed"], np.random.Generator)
    assert adjusted_rand_score(truth, group.assignment()) == 1.0
    for k in range(2):
        mine = group.assignment() == k
        torch.testing.assert_close(group.directions[k], deltas[mine].mean(0))
        torch.testing.assert_close(group.centers[k], ctx.init + deltas[mine].mean(0))
    row = play_round(group, ctx, list(range(10)))
    assert "off_round_bytes_down" not in row and not [c for r, c, steps in ctx.trained if r == 1 and steps == 20]


def test_fedgroup_initializes_when_exactly_k_clients_pretrain():
    deltas, _ = planted(2, 5, dim=60)
    ctx = FakeContext(FedGroupParams(clusters=2, pretrain_scale=1), 10, 60, deltas)
    group = FedGroup(ctx)
    play_round(group, ctx, [])
    assert group.initialized and sorted(group.assignment()[group.assignment() >= 0].tolist()) == [0, 1]


def test_cfl_client_absent_at_a_split_is_sent_the_model_the_split_was_computed_at():
    deltas, _ = opposite_groups((4, 4))
    ctx = FakeContext(CFLParams(thresholds="absolute", warmup=0), 8, 40, deltas)
    ctx.init = torch.full((40,), 0.5)
    cfl = CFL(ctx)
    play_round(cfl, ctx, [0, 1, 4, 5])  # round 1 splits; the cluster's model was the initial one
    assert cfl.num_clusters == 2 and cfl.pending[2] == 0
    assert torch.equal(cfl.payload(2).tensors["model"], ctx.init)


def test_cfl_relative_eps2_refuses_a_split_whose_largest_update_is_below_eps2_times_the_scale():
    """Largest update norms ≈ 2 in every round, so the scale is ≈ 2: eps2 = 0.5 asks for a norm
    above ≈ 1 (splits), eps2 = 1.5 for one above ≈ 3 (no split)."""
    deltas, _ = opposite_groups((4, 3), scale=2.0)
    found = {}
    for eps2 in (0.5, 1.5):
        ctx = FakeContext(CFLParams(warmup=1, thresholds="relative", eps1=0.2, eps2=eps2), 7, 40, deltas)
        cfl = CFL(ctx)
        for _ in range(2):
            play_round(cfl, ctx, np.arange(7))
        found[eps2] = cfl.num_clusters
    assert found == {0.5: 2, 1.5: 1}


def test_cfl_warns_once_when_no_update_arrived_during_the_warmup(capsys):
    deltas, _ = opposite_groups((4, 3), scale=2.0)
    ctx = FakeContext(CFLParams(warmup=1, thresholds="relative", eps1=0.2, eps2=0.5), 7, 40, deltas)
    cfl = CFL(ctx)
    play_round(cfl, ctx, [])  # the warm-up round: nobody sampled, so no scale
    for _ in range(2):
        play_round(cfl, ctx, np.arange(7))
    assert np.isnan(cfl.scale()) and cfl.num_clusters == 1, "no scale: never split"
    assert capsys.readouterr().err.count("no update arrived during CFL's warm-up") == 1
    scaled = CFL(FakeContext(CFLParams(warmup=1, thresholds="relative"), 7, 40, deltas))
    for _ in range(2):
        play_round(scaled, scaled.ctx, np.arange(7))
    assert capsys.readouterr().err == ""


def test_flhc_absolute_threshold_is_the_distance_itself():
    assert FLHCParams(distance_threshold=1.9).cut(123.0) == {"distance_threshold": 1.9}
    assert FLHCParams(distance_threshold=1.9, threshold="relative").cut(2.0) == {"distance_threshold": 3.8}


def test_fesem_pull_of_a_client_with_one_training_sample():
    ctx = FakeContext(FeSEMParams(clusters=2, lam=0.1), 4, 8, torch.zeros(4, 8))
    ctx.train_sizes = lambda: np.array([1, 9, 10, 10])
    # α_0 = 1/30: coefficient 2λ/(m·α_0) = 2 · 0.1 / (4 / 30)
    assert FeSEM(ctx).pull_strength(0) == pytest.approx(2 * 0.1 * 30 / 4)


def test_ifca_never_picks_a_model_whose_loss_is_nan():
    assert lowest(np.array([[np.nan, 1.0, 0.5], [2.0, np.nan, 3.0]])).tolist() == [2, 0]


def test_fedgroup_pretrainings_that_all_diverge_leave_their_clients_unassigned_until_the_next_try():
    deltas, truth = planted(2, 5, dim=60)
    ctx = FakeContext(FedGroupParams(clusters=2, pretrain_scale=3), 10, 60, deltas)
    ctx.training.on_divergence = "skip"
    plain = ctx.run

    def diverging(plans):
        return {c: Trained(t.vector, LocalResult(float("nan"), 1, 1)) for c, t in plain(plans).items()}

    group = FedGroup(ctx)
    ctx.run = diverging
    play_round(group, ctx, [])  # every pre-training diverges: no group yet, tried again next round
    assert not group.initialized and (group.assignment() < 0).all()
    ctx.run = plain
    play_round(group, ctx, [])
    assert group.initialized
    newcomers = [int(c) for c in np.nonzero(group.assignment() < 0)[0]]
    ctx.run = diverging
    group.round_start(np.array(newcomers))  # the newcomers' pre-trainings diverge: still unassigned
    assert (group.assignment()[newcomers] < 0).all()
    ctx.run = plain
    group.round_start(np.array(newcomers))
    assert adjusted_rand_score(truth, group.assignment()) == 1.0


# ---------------------------------------------------------------------------- IFCA's restarts


def ifca_run(tmp_path, **hp):
    from cflpipe.fl.engine import prepare_run

    spec = parse_spec({
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 3, "clients_per_round": 4, "local_steps": 2, "batch_size": 16,
                     "lr": 0.05, "eval_every": 1, "device": "cpu"},
        "scenarios": {"s": {"dataset": "digits", "clients": 4,
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": {"ifca": {"clusters": 2, **hp}},
        "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data"),
    })
    return spec, prepare_run(spec, "s", "ifca", 0)


def test_ifca_restarts_train_side_by_side_then_keep_the_set_with_the_lowest_objective(tmp_path):
    """Three sets of K = 2 models: each client picks and trains one model per set; each set
    averages its own uploads; after restart_rounds the set whose clients' chosen models had the
    lowest mean loss is kept."""
    _, run = ifca_run(tmp_path, restarts=3, restart_rounds=2)
    ifca = run.method
    assert ifca.centers.shape[0] == 6 and ifca.tracks == 3
    initial = ifca.centers.clone()
    single = ifca_run(tmp_path / "one")[1].method
    assert torch.equal(initial[:2], single.centers)  # set 0 is Algorithm 1's own start
    dim = initial.shape[1]

    def update(client, losses, picks):
        tensors = {f"model{r}": torch.full((dim,), float(10 * r + client)) for r in range(3)}
        tensors["cluster"] = torch.tensor(picks)
        tensors["loss"] = torch.tensor(losses, dtype=torch.float64)
        return Update(tensors, 10, LocalResult(0.1, 2, 32))

    updates = {0: update(0, [2.0, 1.0, 3.0], [0, 1, 0]), 1: update(1, [2.0, 1.5, 0.1], [1, 1, 0])}
    ifca.ctx.round = 0  # the first of two restart rounds: every set goes on
    ifca.cluster_aggregate(updates)
    assert ifca.tracks == 3 and ifca.best_track == 1  # mean losses per set: 2.0, 1.25, 1.55
    # set r's cluster k averages the set-r uploads of the clients that picked k (equal weights)
    assert torch.equal(ifca.centers[0], torch.full((dim,), 0.0)) and torch.equal(ifca.centers[1], torch.full((dim,), 1.0))
    assert torch.equal(ifca.centers[3], torch.full((dim,), 10.5))  # set 1, cluster 1: clients 0 and 1
    assert torch.equal(ifca.centers[2], initial[2])  # set 1's cluster 0: nobody picked it
    assert torch.equal(ifca.centers[4], torch.full((dim,), 20.5)) and torch.equal(ifca.centers[5], initial[5])
    assert ifca.assignment()[:2].tolist() == [1, 1]  # the leading set's picks
    kept = ifca.centers[4:6].clone()
    updates = {0: update(0, [2.0, 1.0, 0.2], [0, 1, 0]), 1: update(1, [2.0, 1.5, 0.1], [1, 1, 1])}
    ifca.ctx.round = 1  # the last restart round: set 2 leads (0.15) and is kept
    ifca.cluster_aggregate(updates)
    assert ifca.tracks == 1 and ifca.best_track == 0 and ifca.centers.shape[0] == 2
    assert torch.equal(ifca.centers[0], torch.full((dim,), 20.0)) and torch.equal(ifca.centers[1], torch.full((dim,), 21.0))
    assert not torch.equal(ifca.centers, kept)
    assert ifca.payload(0).tensors["models"].shape[0] == 2  # from now on K models travel


@pytest.mark.slow
def test_ifca_restarts_count_every_set_in_the_traffic_and_refuse_the_variants(tmp_path):
    spec, run = ifca_run(tmp_path, restarts=2, restart_rounds=2)
    train_run(spec, "s", "ifca", 0, progress=False)
    rounds = pd.read_parquet(spec.run_dir("s", "ifca", 0) / "rounds.parquet")
    model_bytes = run.space.nbytes()
    assert rounds["bytes_down"].tolist() == [4 * 4 * model_bytes] * 2 + [4 * 2 * model_bytes]
    assert rounds["n_clusters"].max() <= 2
    from cflpipe.errors import SpecError
    from cflpipe.fl.engine import prepare_run

    variant = parse_spec({
        "seeds": [0], "training": {"model": "mlp", "rounds": 2, "clients_per_round": 4, "local_steps": 1},
        "scenarios": {"s": {"dataset": "digits", "clients": 4, "partition": [{"kind": "iid"}]}},
        "methods": {"ifca_awcfl": {"restarts": 2}},
        "results_dir": str(tmp_path / "r2"), "data_dir": str(tmp_path / "data")})
    with pytest.raises(SpecError, match=r"methods.ifca_awcfl.restarts: the AWCFL and MCFL variants take one"):
        prepare_run(variant, "s", "ifca_awcfl", 0)
