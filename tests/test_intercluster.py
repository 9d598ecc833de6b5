"""AWCFL and MCFL (seed paper 001): the mixing rule, MCFL's model selection, byte counts, and the
shape of the paper's Table 2 on digits with two rotation groups."""

import numpy as np
import pytest
import torch

from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.fl.local import LocalResult
from cflpipe.fl.method import Update, local_update
from cflpipe.fl.predictors import Selected
from cflpipe.registry import all_methods
from cflpipe.methods.intercluster import awcfl_mix, sample_mean
from cflpipe.spec import parse_spec

torch.set_num_threads(1)


def rot2_spec(tmp_path, methods, rounds=30, seeds=(0, 1)):
    return parse_spec({
        "seeds": list(seeds),
        "training": {"model": "cnn", "rounds": rounds, "clients_per_round": 10, "local_steps": 10,
                     "batch_size": 32, "lr": 0.05, "momentum": 0.9, "eval_every": 10, "device": "cpu"},
        "scenarios": {"rot2": {"dataset": "digits", "clients": 10,
                               "partition": [{"kind": "dirichlet", "alpha": 1.0},
                                             {"kind": "rotation", "groups": 2, "angles": [0, 180]}]}},
        "methods": methods,
        "results_dir": str(tmp_path),
    })


def test_beta_zero_keeps_and_beta_one_replaces_by_the_others_mean():
    centers = torch.tensor([[1.0, 0.0], [0.0, 3.0], [5.0, 6.0]])
    assert torch.equal(awcfl_mix(centers, 0.0), centers)
    others_mean = torch.stack([(centers.sum(0) - c) / 2 for c in centers])
    torch.testing.assert_close(awcfl_mix(centers, 1.0), others_mean)
    torch.testing.assert_close(awcfl_mix(centers, 0.5), 0.5 * centers + 0.5 * others_mean)
    assert torch.equal(awcfl_mix(centers[:1], 0.5), centers[:1])  # one cluster: nothing to mix


def test_two_clusters_each_move_beta_towards_the_other():
    centers = torch.tensor([[4.0, 0.0], [0.0, 8.0]])
    torch.testing.assert_close(awcfl_mix(centers, 0.25), torch.tensor([[3.0, 2.0], [1.0, 6.0]]))


def test_sample_mean_draws_distinct_inputs_and_flattens_an_empty_set():
    x = torch.arange(10.0)[:, None, None] * torch.tensor([[1.0, 100.0]])  # ten distinct (1 × 2) inputs
    mean = sample_mean(x, 9, np.random.default_rng(0))
    left_out = x.reshape(10, 2).sum(0) - 9 * mean  # without replacement: exactly one input is missing
    assert mean.shape == (2,) and any(torch.allclose(left_out, row) for row in x.reshape(10, 2))
    assert torch.equal(sample_mean(x, 10, np.random.default_rng(0)), x.reshape(10, 2).mean(0))
    empty = sample_mean(torch.zeros(0, 3, 2, 2), 5, np.random.default_rng(0))
    assert torch.equal(empty, torch.zeros(12))  # an (image) input's size, flattened


def _uploads(method, vectors: torch.Tensor, feature_means: torch.Tensor | None = None) -> dict[int, Update]:
    """An upload per client of its cluster's row of `vectors` (and of `feature_means`)."""
    updates = {}
    for client, k in enumerate(method.clusters):
        tensors = {"model": vectors[k].clone()}
        if feature_means is not None:
            tensors["feature_mean"] = feature_means[k].clone()
        updates[client] = Update(tensors, 10, LocalResult(0.5, 1, 1))
    return updates


def test_modifiers_exist_for_every_cluster_method():
    names = set(all_methods())
    for base in ("cfl", "ifca", "fesem", "flhc", "fedgroup", "oracle"):
        assert {f"{base}_awcfl", f"{base}_mcfl"} <= names
    assert {"awcfl", "mcfl", "kmeans_cfl"} <= names


def test_mcfl_selects_the_cluster_with_the_nearest_feature_mean(tmp_path):
    run = prepare_run(rot2_spec(tmp_path, {"oracle_mcfl": {"feature_samples": 5}}), "rot2", "oracle_mcfl", 0)
    mcfl = run.method
    dim = mcfl.feature_means.shape[1]
    planted = torch.stack([torch.full((dim,), -1.0), torch.full((dim,), 2.0)])
    mcfl.feature_means[:] = planted[torch.from_numpy(mcfl.clusters)]
    mcfl.has_mean[:] = True
    select = mcfl.predictor().select  # the engine's evaluation starts here; cluster means are computed once
    near_second = torch.full((40, 1, 8, 8), 1.6) + 0.1 * torch.randn(40, 1, 8, 8)
    near_first = torch.full((40, 1, 8, 8), -0.7) + 0.1 * torch.randn(40, 1, 8, 8)
    assert select(near_second) == 1
    assert select(near_first) == 0
    # Clusters with no uploaded mean are never chosen.
    mcfl.has_mean[mcfl.clusters == 1] = False
    select = mcfl.predictor().select
    assert select(near_second) == 0
    # A test set with no samples still gets a model (a client whose one sample went to train).
    assert select(near_first[:0]) in (0, 1)


def test_awcfl_mixes_the_cluster_models_after_each_aggregation(tmp_path):
    run = prepare_run(rot2_spec(tmp_path, {"oracle_awcfl": {"beta": 0.25}}), "rot2", "oracle_awcfl", 0)
    method = run.method
    p = method.centers.shape[1]
    a, b = torch.full((p,), 4.0), torch.full((p,), -4.0)
    method.aggregate(_uploads(method, torch.stack([a, b])))
    # Each group averages to its own vector, then takes β = 1/4 of the other group's.
    torch.testing.assert_close(method.centers, torch.stack([0.75 * a + 0.25 * b, 0.75 * b + 0.25 * a]))


def test_mcfl_uploads_train_feature_means_and_the_engine_selects_by_them(tmp_path):
    run = prepare_run(rot2_spec(tmp_path, {"oracle_mcfl": {"feature_samples": 100_000}}), "rot2", "oracle_mcfl", 0)
    mcfl = run.method
    assert isinstance(mcfl.predictor(), Selected)  # the engine evaluates each test set with its choice
    near_second = torch.full((40, 1, 8, 8), 1.6)
    assert mcfl.nearest_feature_mean(near_second) == 0, "no cluster has a feature mean yet: the first model"
    # A client's upload carries the mean of its training inputs (all of them, fewer than n).
    update = local_update(mcfl, 3, mcfl.payload(3))
    x, _ = run.data.client(3, "train")
    torch.testing.assert_close(update.tensors["feature_mean"], x.reshape(len(x), -1).mean(0))
    # Aggregation records every uploaded mean; a cluster with one member has that member's mean.
    dim = mcfl.feature_means.shape[1]
    planted = torch.stack([torch.full((dim,), -1.0), torch.full((dim,), 2.0)])
    updates = _uploads(mcfl, mcfl.centers, planted)
    lone = int(np.nonzero(mcfl.clusters == 1)[0][0])
    updates = {c: u for c, u in updates.items() if mcfl.clusters[c] == 0 or c == lone}
    mcfl.aggregate(updates)
    select = mcfl.predictor().select
    means, present = mcfl.cluster_feature_means()
    assert present.tolist() == [True, True]
    torch.testing.assert_close(means, planted)
    assert select(near_second) == 1


def test_mcfl_sends_every_other_cluster_model_with_the_own_one(tmp_path):
    run = prepare_run(rot2_spec(tmp_path, {"fesem_mcfl": {"clusters": 3}}), "rot2", "fesem_mcfl", 0)
    payload = run.method.payload(0)
    assert payload.tensors["other_cluster_models"].shape == (2, run.space.size)
    assert payload.nbytes == 3 * run.space.size * 4


def test_byte_counts_match_the_payloads(tmp_path):
    spec = rot2_spec(tmp_path, {"oracle_mcfl": {}, "oracle_awcfl": {}, "ifca_mcfl": {"clusters": 2}})
    for name in ("oracle_mcfl", "ifca_mcfl", "oracle_awcfl"):
        run = prepare_run(spec, "rot2", name, 0)
        method, model_bytes = run.method, run.space.size * 4
        payload = method.payload(3)
        update = local_update(method, 3, payload)
        if name.endswith("mcfl"):
            assert payload.nbytes == 2 * model_bytes  # all K = 2 cluster models go down
            extra = 8 if name.startswith("ifca") else 0  # IFCA also reports its chosen cluster id
            assert update.nbytes == model_bytes + 64 * 4 + extra  # the model and an 8×8 feature mean
        else:
            assert payload.nbytes == model_bytes and update.nbytes == model_bytes


@pytest.mark.slow
def test_table2_shape_on_digits_rotated_0_and_180(tmp_path):
    """Paper Table 2 (MNIST): CFL inter 0.45 / intra 0.95, AWCFL 0.84 / 0.83, MCFL 0.94 / 0.94.
    Measured here (digits, 10 clients, 2 rotation groups, mean of seeds 0 and 1): see the closing
    note of the AWCFL/MCFL issue; the assertions are the shape, not the paper's numbers."""
    methods = {"cfl": {}, "cfl_awcfl": {"beta": 0.5}, "cfl_mcfl": {}}
    spec = rot2_spec(tmp_path, methods)
    figures = {m: np.mean([[train_run(spec, "rot2", m, s, progress=False).summary["final"][k]
                            for k in ("intra_acc", "inter_acc")] for s in spec.seeds], axis=0)
               for m in methods}
    (cfl_intra, cfl_inter), (aw_intra, aw_inter), (mc_intra, mc_inter) = (figures[m] for m in methods)
    assert cfl_intra - cfl_inter > 0.1, figures  # CFL's cluster models fail on the other rotation
    assert aw_inter > cfl_inter + 0.1, figures  # AWCFL raises inter ...
    assert aw_intra <= cfl_intra + 0.01, figures  # ... at some (here small) cost to intra
    assert mc_intra >= cfl_intra - 0.01, figures  # MCFL keeps intra ...
    assert mc_inter > cfl_inter + 0.1, figures  # ... and raises inter


def test_awcfl_at_beta_k_minus_one_over_k_is_marked_as_one_model(tmp_path):
    """Eq. 2 at β = (K−1)/K (the paper's 0.5 with K = 2) gives every cluster the mean of all: the
    run says it collapsed to one model although its clients stay in two clusters; β = 0.25 keeps
    two models and is not marked."""
    import pandas as pd

    spec = rot2_spec(tmp_path, {"half": {"method": "awcfl", "clusters": 2, "cluster_start": 1, "beta": 0.5},
                                "quarter": {"method": "awcfl", "clusters": 2, "cluster_start": 1, "beta": 0.25}},
                     rounds=4, seeds=(0,))
    runs = {m: train_run(spec, "rot2", m, 0, progress=False) for m in ("half", "quarter")}
    half, quarter = (runs[m].summary for m in ("half", "quarter"))
    assert half["final"]["n_clusters"] == 2, half  # two clusters of clients ...
    assert half["final"]["inter_acc"] == pytest.approx(half["final"]["intra_acc"])  # ... one model for both
    assert half["degenerate_kind"] == "collapsed" and "one averaged model" in half["degenerate"], half
    assert quarter["final"]["n_clusters"] == 2 and not quarter["degenerate"], quarter
    # the rule reads the cluster models mixed (K = 4: β = 0.75), however many hold clients, as long
    # as the clients are in more than one
    method = prepare_run(parse_spec({**spec.model_dump(mode="json"), "methods": {
        "awcfl": {"clusters": 4, "beta": 0.75}}}), "rot2", "awcfl", 0).method
    method.centers = method.centers[:1].repeat(4, 1)  # as after its first clustering
    assert method.collapse_note(pd.DataFrame({"n_clusters": [4, 4]})) is not None
    assert method.collapse_note(pd.DataFrame({"n_clusters": [4, 3]})) is not None
    assert method.collapse_note(pd.DataFrame({"n_clusters": [4, 1]})) is None
    method.awcfl_beta = 2 / 3  # K = 3's rule, not K = 4's
    assert method.collapse_note(pd.DataFrame({"n_clusters": [4, 3]})) is None
