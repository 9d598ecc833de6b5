"""FedTSDP (seed paper 003): the Hopkins statistic, the two-stage clustering, the sampling-weight
update, the shared-layer schedule, the server's public data, and a run against FedAvg."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.spatial.distance import jensenshannon

from cflpipe.clustering import canonical_labels, dbscan_precomputed, hopkins, js_divergence_matrix
from cflpipe.errors import PartitionError, SpecError
from cflpipe.fl.data import build_federated_data
from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.methods.fedtsdp import dampened, raised_sampling_weights, shared_layer_count, two_stage_clusters
from cflpipe.partition import build_partition, load_partition
from cflpipe.data import load_dataset
from cflpipe.spec import parse_spec

torch.set_num_threads(1)


# ---------------------------------------------------------------------- Hopkins


def test_hopkins_is_about_half_for_uniform_points_and_near_one_for_clusters():
    rng = np.random.default_rng(0)
    uniform = [hopkins(rng.random((200, 5)), 20, seed=s) for s in range(30)]
    centers = rng.normal(size=(3, 5)) * 10
    clustered = [hopkins(np.concatenate([c + rng.normal(0, 0.05, (60, 5)) for c in centers]), 20, seed=s)
                 for s in range(30)]
    assert 0.4 < np.mean(uniform) < 0.6
    assert np.mean(clustered) > 0.9
    grid = np.stack(np.meshgrid(np.arange(15.0), np.arange(15.0)), -1).reshape(-1, 2)
    assert np.mean([hopkins(grid, 20, seed=s) for s in range(30)]) < 0.4  # regular spacing: below 0.5


def test_hopkins_follows_its_seed_and_rejects_bad_sizes():
    x = np.random.default_rng(1).random((20, 3))
    assert hopkins(x, 5, seed=3) == hopkins(x, 5, seed=3)
    assert hopkins(x, 5, seed=3) != hopkins(x, 5, seed=4)
    with pytest.raises(ValueError, match="samples"):
        hopkins(x, 21)
    with pytest.raises(ValueError, match="at least 2"):
        hopkins(x[:1], 1)
    assert hopkins(np.ones((4, 3)), 2) == 0.5  # identical points: no tendency either way


# ---------------------------------------------------------------------- divergence and DBSCAN


def test_js_divergence_is_the_flattened_divergence_with_natural_log():
    p = torch.softmax(torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(0)), -1).double()
    matrix = js_divergence_matrix(p)
    assert np.allclose(matrix, matrix.T) and np.all(np.diag(matrix) == 0)
    flat = p.reshape(4, -1).numpy() / 6  # the batch's outputs flattened into one distribution
    for i in range(4):
        for j in range(4):
            assert matrix[i, j] == pytest.approx(jensenshannon(flat[i], flat[j]) ** 2, rel=1e-7, abs=1e-12)
    disjoint = torch.tensor([[[1.0, 0.0]], [[0.0, 1.0]]])
    assert js_divergence_matrix(disjoint)[0, 1] == pytest.approx(np.log(2))


def test_dbscan_labels_noise_and_numbers_clusters_by_first_appearance():
    points = np.array([[0.0], [0.1], [5.0], [5.1], [20.0]])
    distances = np.abs(points - points.T)
    assert dbscan_precomputed(distances, 0.5, 2).tolist() == [0, 0, 1, 1, -1]


def test_two_stage_clustering_splits_by_outputs_then_by_weights():
    a, b = torch.tensor([0.9, 0.05, 0.05]), torch.tensor([0.05, 0.05, 0.9])
    outputs = torch.stack([a, a, a, b, b, torch.tensor([0.05, 0.9, 0.05])])[:, None, :].repeat(1, 4, 1)
    # clients 0, 1, 2 answer alike, but 2's weights are far from 0's and 1's; 3 and 4 alike in both;
    # 5 answers unlike anyone (stage-1 noise)
    weights = torch.tensor([[0.0, 0.0], [0.1, 0.0], [9.0, 9.0], [0.0, 0.1], [0.1, 0.1], [0.0, 0.0]])
    labels = two_stage_clusters(outputs, weights, eps_js=0.05, eps_weights=1.0, min_pts=2)
    assert labels.tolist() == [0, 0, 1, 2, 2, 3]
    # stage 2 alone never joins clients that stage 1 separated, however close their weights
    assert two_stage_clusters(outputs, torch.zeros(6, 2), 0.05, 1.0, 2).tolist() == [0, 0, 0, 1, 1, 2]
    # Labels of different stage-1 groups never collide: group a (clients 0-4, 10) splits into 2
    # clusters and 2 noise points, group b (5-9, 11-13) into 3 clusters and 2 noise points.
    owner = [a] * 5 + [b] * 5 + [a, b, b, b]
    outputs = torch.stack(owner)[:, None, :].repeat(1, 4, 1)
    weights = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 0.0], [5.1, 0.0], [20.0, 20.0],
                            [0.0, 0.0], [0.1, 0.0], [5.0, 0.0], [5.1, 0.0], [0.0, 5.0],
                            [-20.0, -20.0], [0.1, 5.0], [30.0, 0.0], [0.0, 30.0]])
    labels = two_stage_clusters(outputs, weights, eps_js=0.05, eps_weights=1.0, min_pts=2)
    assert labels.tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 4, 5, 6, 5, 7, 8]


def test_noise_points_become_singletons_one_cluster_or_are_left_to_keep_their_cluster():
    """The three readings of DBSCAN's noise: in the 14-client case above, stage 1 has no noise
    and stage 2 leaves clients 4 and 10 (group a) and 12 and 13 (group b) as noise."""
    a, b = torch.tensor([0.9, 0.05, 0.05]), torch.tensor([0.05, 0.05, 0.9])
    outputs = torch.stack([a] * 5 + [b] * 5 + [a, b, b, b])[:, None, :].repeat(1, 4, 1)
    weights = torch.tensor([[0.0, 0.0], [0.1, 0.0], [5.0, 0.0], [5.1, 0.0], [20.0, 20.0],
                            [0.0, 0.0], [0.1, 0.0], [5.0, 0.0], [5.1, 0.0], [0.0, 5.0],
                            [-20.0, -20.0], [0.1, 5.0], [30.0, 0.0], [0.0, 30.0]])
    cluster = two_stage_clusters(outputs, weights, 0.05, 1.0, 2, noise="cluster")
    assert cluster.tolist() == [0, 0, 1, 1, 2, 3, 3, 4, 4, 5, 2, 5, 6, 6]  # each group's noise together
    previous = two_stage_clusters(outputs, weights, 0.05, 1.0, 2, noise="previous")
    assert previous.tolist() == [0, 0, 1, 1, -1, 2, 2, 3, 3, 4, -1, 4, -1, -1]
    # stage-1 noise: clients 4-7 answer unlike anyone (and each other); as one group they are
    # split by stage 2 like any group (4 and 5 near, 6 and 7 near), under `previous` they never
    # reach stage 2
    c, d = torch.tensor([0.05, 0.9, 0.05]), torch.tensor([0.45, 0.1, 0.45])
    e, f = torch.tensor([0.45, 0.45, 0.1]), torch.tensor([0.1, 0.45, 0.45])
    outputs = torch.stack([a, a, b, b, c, d, e, f])[:, None, :].repeat(1, 4, 1)
    weights = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [0.0, 0.0], [0.1, 0.0], [9.0, 9.0],
                            [9.1, 9.0]])
    assert two_stage_clusters(outputs, weights, 0.05, 1.0, 2).tolist() == [0, 0, 1, 1, 2, 3, 4, 5]
    assert two_stage_clusters(outputs, weights, 0.05, 1.0, 2, noise="cluster").tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert two_stage_clusters(outputs, weights, 0.05, 1.0, 2, noise="previous").tolist() == [0, 0, 1, 1, -1, -1, -1,
                                                                                              -1]


# ---------------------------------------------------------------------- weights and layers


def test_sampling_weights_raise_the_drawn_batch_and_stay_normalized():
    weights = np.full(10, 0.1)
    raised = raised_sampling_weights(weights, np.array([2, 5]))
    assert raised.sum() == pytest.approx(1.0)
    expected = weights.copy()
    expected[[2, 5]] += 10 / 2  # |D_pub| / |D_B|
    assert np.allclose(raised, expected / expected.sum())
    assert raised[2] > 0.4 and raised[0] < 0.01


def test_shared_layer_schedule():
    exact, counts = 4.0, []
    for r in range(1, 9):
        exact = dampened(exact, 0.98, "constant", r)
        counts.append(shared_layer_count(exact, "round", 4))
    assert counts == [4] * 6 + [3, 3]  # 4·0.98^7 = 3.48: the seventh clustering gives up a layer
    assert dampened(4.0, 0.98, "power", 50) == pytest.approx(4 * 0.98 ** 50)
    assert shared_layer_count(3.9, "floor", 4) == 3 and shared_layer_count(3.1, "ceil", 4) == 4
    assert shared_layer_count(-1.0, "round", 4) == 0 and shared_layer_count(7.0, "round", 4) == 4


# ---------------------------------------------------------------------- the server's public data


def scenario(**extra) -> dict:
    return {"dataset": "digits", "clients": 6, "pool": "train", "public": {"size": 50},
            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}], **extra}


def spec_of(tmp_path, methods: dict, sc: dict | None = None, **training) -> object:
    return parse_spec({
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 3, "clients_per_round": 6, "local_steps": 3, "batch_size": 16,
                     "lr": 0.05, "eval_every": 1, "device": "cpu", **training},
        "scenarios": {"s": sc or scenario()},
        "methods": methods,
        "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data"),
    })


def test_public_data_is_drawn_from_the_test_split_recorded_and_never_dealt(tmp_path):
    spec = spec_of(tmp_path, {"fedavg": {}})
    sc = spec.scenarios["s"]
    dataset = load_dataset("digits", {}, tmp_path / "data")
    partition = build_partition(sc, dataset)
    assert len(partition.public) == 50 and len(set(partition.public)) == 50
    assert partition.public.max() < len(dataset.y_test)
    assert np.array_equal(build_partition(sc, dataset).public, partition.public)  # seeded
    from cflpipe.fl.data import partition_scenario
    out = partition_scenario(spec, "s")
    assert np.array_equal(load_partition(out).public, partition.public)
    data = build_federated_data(spec, "s", torch.device("cpu"))
    assert data.public.shape == (50, *data.input_shape)
    # the clients' samples all come from the train split (pool: train), the server's from test
    assert int(partition.clients["sample"].max()) < len(dataset.y_train)
    standardized = (dataset.x_test[partition.public] - dataset.x_train.mean(axis=(0, 2, 3))[None, :, None, None]) \
        / dataset.x_train.std(axis=(0, 2, 3))[None, :, None, None]
    assert np.allclose(data.public.numpy(), standardized, atol=1e-5)


def test_public_data_errors_are_one_named_line(tmp_path):
    with pytest.raises(SpecError) as info:
        spec_of(tmp_path, {"fedavg": {}}, scenario(pool="all"))
    assert "public.source" in str(info.value) and "pool: train" in str(info.value)
    assert "\n" not in str(info.value)
    spec = spec_of(tmp_path, {"fedavg": {}}, scenario(public={"size": 100000}))
    with pytest.raises(PartitionError) as error:
        build_partition(spec.scenarios["s"], load_dataset("digits", {}, tmp_path / "data"), where="scenarios.s")
    assert str(error.value).startswith("scenarios.s.public.size: must be <= 360")
    without = scenario()
    without.pop("public")
    with pytest.raises(SpecError) as info:
        spec_of(tmp_path, {"fedtsdp": {}}, without)
    assert "methods.fedtsdp: fedtsdp needs server-held public data" in str(info.value)


# ---------------------------------------------------------------------- runs


def test_without_clustering_fedtsdp_is_fedavg(tmp_path):
    """h_th that H never passes: every layer stays shared and one cluster trains, i.e. FedAvg."""
    spec = spec_of(tmp_path, {"fedavg": {}, "fedtsdp": {"hopkins_threshold": 0.999}})
    for _, method, seed in spec.matrix():
        train_run(spec, "s", method, seed, progress=False)
    ours = pd.read_parquet(spec.run_dir("s", "fedtsdp", 0) / "rounds.parquet")
    theirs = pd.read_parquet(spec.run_dir("s", "fedavg", 0) / "rounds.parquet")
    assert (ours["clustering_ran"] == 0).all() and (ours["shared_layers"] == 3).all()
    assert ours["hopkins"].between(0, 0.999).all()
    # Two code paths (cluster_average vs FedAvg's column blocks; six equal models vs one) that
    # agree to float rounding: losses to 1e-5, accuracies to less than one test sample.
    np.testing.assert_allclose(ours["train_loss"], theirs["train_loss"], rtol=1e-5)
    for column in ("acc_macro", "global_acc_mean"):
        np.testing.assert_allclose(ours[column], theirs[column], atol=1e-3, err_msg=column)
    assert ours["bytes_down"].tolist() == theirs["bytes_down"].tolist()
    # the whole model goes up (the server computes outputs and weight distances from it)
    run = prepare_run(spec, "s", "fedtsdp", 0)
    assert ours["bytes_up"].tolist() == [6 * run.space.nbytes()] * 3


def test_clustering_shrinks_the_shared_layers_and_keeps_personal_ones(tmp_path):
    spec = spec_of(tmp_path, {"fedtsdp": {"hopkins_threshold": 0.01, "dampening": 0.5, "eps_js": 1e-4,
                                          "eps_weights": 1e-4, "noise": "singletons"}}, rounds=3)
    train_run(spec, "s", "fedtsdp", 0, progress=False)
    rounds = pd.read_parquet(spec.run_dir("s", "fedtsdp", 0) / "rounds.parquet")
    assert rounds["clustering_ran"].tolist() == [1.0, 1.0, 1.0]
    assert rounds["shared_layers"].tolist() == [3.0, 2.0, 1.0]  # 3 → 1.5 (2) → 0.75 (1)
    # radii far below any distance: every client is noise, so each is a cluster of its own
    assert rounds["n_clusters"].tolist() == [6, 6, 6]
    run = prepare_run(spec, "s", "fedtsdp", 0)
    layer1 = run.space.first_layers(1)
    # round 3 sent one shared layer down to each of the 6 clients
    assert rounds["bytes_down"].iloc[2] == 6 * run.space.nbytes(layer1)


def test_report_plots_hopkins_clustering_and_shared_layers(tmp_path):
    from cflpipe.report.aggregate import aggregate
    from cflpipe.report.build import build_report

    spec = spec_of(tmp_path, {"fedavg": {}, "fedtsdp": {"hopkins_threshold": 0.01, "dampening": 0.5}}, rounds=2)
    for _, method, seed in spec.matrix():
        train_run(spec, "s", method, seed, progress=False)
    aggregate(spec)
    html = build_report(spec).read_text()
    for slug in ("s-hopkins", "s-clustering-ran", "s-shared-layers"):
        assert slug in html, slug
    assert "50 unlabeled samples of the test split" in html
    assert "s-flow-nll" not in html  # only figures some method recorded


def test_reclustering_with_partial_participation_keeps_the_absent_clients_models(tmp_path):
    spec = spec_of(tmp_path, {"fedtsdp": {}})
    method = prepare_run(spec, "s", "fedtsdp", 0).method
    p = method.centers.shape[1]
    method.centers = torch.stack([torch.full((p,), 10.0), torch.full((p,), 20.0), torch.full((p,), 30.0)])
    method.clusters = np.array([0, 0, 0, 1, 1, 2])
    # clients 0, 3, 5 trained this round and form two new clusters; 1, 2 (old cluster 0) and 4
    # (old cluster 1) were absent; old cluster 2 keeps no member
    method._recluster(np.array([0, 3, 5]), np.array([0, 1, 1]))
    clusters, centers = method.clusters, method.centers
    assert clusters[3] == clusters[5] != clusters[0]
    assert clusters[1] == clusters[2] and len({clusters[0], clusters[1], clusters[3], clusters[4]}) == 4
    assert torch.all(centers[clusters[1]] == 10.0) and torch.all(centers[clusters[4]] == 20.0)
    assert len(centers) == 4 and not any(torch.all(c == 30.0) for c in centers)
    assert clusters.tolist() == canonical_labels(clusters).tolist()  # numbered by first appearance
    # the round's aggregation then averages the new clusters from their members only
    assert torch.equal(centers[clusters[0]], method.ctx.init)


def test_under_noise_previous_a_noise_client_keeps_its_cluster_and_its_model(tmp_path, monkeypatch):
    """noise: previous treats a DBSCAN noise point as a client the clustering did not reach: it
    stays in the cluster it was in, with that cluster's model, shared with whoever else of that
    cluster stays; the clustered clients take the new clusters."""
    import cflpipe.methods.fedtsdp as fedtsdp_module

    spec = spec_of(tmp_path, {"fedtsdp": {"hopkins_threshold": 0.01, "noise": "previous"}})
    method = prepare_run(spec, "s", "fedtsdp", 0).method
    p = method.centers.shape[1]
    method.centers = torch.stack([torch.full((p,), 10.0), torch.full((p,), 20.0)])
    method.clusters = np.array([0, 0, 0, 1, 1, 1])
    # clients 0 and 3 are noise; 1, 2 and 4, 5 form the two new clusters
    monkeypatch.setattr(fedtsdp_module, "two_stage_clusters", lambda *a, **k: np.array([-1, 0, 0, -1, 1, 1]))
    uploads = round_of_uploads(method)
    method.ctx.round = 2
    method.aggregate(uploads)
    clusters = method.clusters
    assert len(set(clusters.tolist())) == 4 and clusters[1] == clusters[2] and clusters[4] == clusters[5]
    assert len({clusters[0], clusters[1], clusters[3], clusters[4]}) == 4
    # the kept clusters' centers are their old model averaged with the noise client's upload alone
    for client in (0, 3):
        torch.testing.assert_close(method.centers[clusters[client]], uploads[client].tensors["model"])
    torch.testing.assert_close(method.centers[clusters[1]],
                               (uploads[1].tensors["model"] + uploads[2].tensors["model"]) / 2)


def round_of_uploads(method, seed: int = 0) -> dict:
    from cflpipe.fl.local import LocalResult
    from cflpipe.fl.method import Update

    generator = torch.Generator().manual_seed(seed)
    p = method.centers.shape[1]
    return {c: Update({"model": method.ctx.init + 0.1 * torch.randn(p, generator=generator)}, 10,
                      LocalResult(0.5, 1, 1)) for c in range(6)}


@pytest.mark.parametrize("schedule", ["constant", "power"])
def test_a_clustering_round_dampens_the_shared_layers_by_its_schedule_and_raises_the_batch_weights(
        tmp_path, monkeypatch, schedule):
    import cflpipe.methods.fedtsdp as fedtsdp_module

    spec = spec_of(tmp_path, {"fedtsdp": {"hopkins_threshold": 0.01, "dampening": 0.5, "dampening_schedule": schedule,
                                          "hopkins_fraction": 0.5, "hopkins_min_samples": 1, "public_batch": 8}})
    method = prepare_run(spec, "s", "fedtsdp", 0).method
    samples = []
    real = fedtsdp_module.hopkins

    def spy(points, m, seed):
        samples.append(m)
        return real(points, m, seed=seed)

    monkeypatch.setattr(fedtsdp_module, "hopkins", spy)
    initial, uniform = method.shared_exact, method.sampling_weights.copy()
    method.ctx.round = 2  # the third round
    batch = method._draw_public_batch()
    method.aggregate(round_of_uploads(method))
    assert samples == [3]  # m̃ = round(0.5 · 6 clients)
    assert method.shared_exact == pytest.approx(initial * (0.5 ** 3 if schedule == "power" else 0.5))
    np.testing.assert_allclose(method.sampling_weights, raised_sampling_weights(uniform, batch))


def test_the_public_batch_is_drawn_by_the_sampling_weights_without_replacement(tmp_path):
    spec = spec_of(tmp_path, {"fedtsdp": {"public_batch": 8}})
    method = prepare_run(spec, "s", "fedtsdp", 0).method
    favoured = np.array([3, 7, 11, 19, 23, 31, 41, 47])
    weights = np.zeros(len(method.public))
    weights[favoured] = 1.0 / len(favoured)
    method.sampling_weights = weights
    for round_index in range(3):
        method.ctx.round = round_index
        assert method._draw_public_batch().tolist() == favoured.tolist()


def test_hopkins_takes_a_tenth_of_the_clients_but_at_least_the_floor_and_at_most_all():
    from cflpipe.methods.fedtsdp import hopkins_samples

    assert hopkins_samples(20, 0.1, 1) == 2 and hopkins_samples(20, 0.1, 5) == 5
    assert hopkins_samples(100, 0.1, 5) == 10 and hopkins_samples(3, 0.1, 5) == 3 and hopkins_samples(4, 0.01, 1) == 1


def test_a_relative_weight_radius_follows_the_median_neighbour_distance_and_an_absolute_one_does_not():
    """Two groups of clients whose outputs and weights are tight inside, far apart: the relative
    ε2 finds them at any scale of the weights; the paper's absolute ε2 = 3.5 merges the groups
    when the weights' distances are small and shatters them when large. ε1 is the paper's 0.15
    (JS divergences are bounded whatever the model)."""
    from cflpipe.methods.fedtsdp import neighbour_scale

    generator = torch.Generator().manual_seed(0)
    centers = torch.softmax(3 * torch.randn(2, 8, 5, generator=generator), dim=-1)
    outputs = torch.stack([centers[c // 4] for c in range(8)]).double()
    outputs = outputs + 0.002 * torch.rand(outputs.shape, generator=generator, dtype=torch.float64)
    outputs = outputs / outputs.sum(-1, keepdim=True)
    same_outputs = outputs[:1].repeat(8, 1, 1)  # stage 1 sees one group: stage 2 must split
    base = torch.randn(2, 30, generator=generator)
    weights = torch.stack([base[c // 4] + 0.05 * torch.randn(30, generator=generator) for c in range(8)])
    truth = [0, 0, 0, 0, 1, 1, 1, 1]
    for scale in (0.01, 1.0, 100.0):
        labels = two_stage_clusters(same_outputs, scale * weights, 0.15, 2.0, min_pts=2, relative=True)
        assert labels.tolist() == truth, scale
    assert two_stage_clusters(outputs, weights, 0.15, 2.0, min_pts=2, relative=True).tolist() == truth  # stage 1
    assert len(set(two_stage_clusters(same_outputs, 0.01 * weights, 0.15, 3.5, 2).tolist())) == 1
    assert len(set(two_stage_clusters(same_outputs, 100 * weights, 0.15, 3.5, 2).tolist())) == 8
    square = np.array([[0.0, 1, 4], [1, 0, 3], [4, 3, 0]])
    assert neighbour_scale(square, 2) == 1.0 and neighbour_scale(square, 3) == 4.0  # medians of (1,1,3), (4,3,4)


def test_shared_layers_body_starts_with_every_layer_but_the_last_shared(tmp_path):
    method = prepare_run(spec_of(tmp_path, {"fedtsdp": {"shared_layers": "body"}}), "s", "fedtsdp", 0).method
    assert method.shared_count() == method.ctx.space.num_layers - 1
    with pytest.raises(SpecError, match="shared_layers"):
        spec_of(tmp_path, {"fedtsdp": {"shared_layers": -1}})


def test_shared_layers_past_the_models_layers_are_refused_at_validate(tmp_path):
    """Refused when the spec is read, not when the run builds the model: the built-in networks'
    layers are known without torch."""
    spec_of(tmp_path, {"fedtsdp": {"shared_layers": 3}})
    with pytest.raises(SpecError, match=r"methods.fedtsdp.shared_layers: must be <= 3 \(the layers of model mlp\), "
                                        r"got 4 \(scenario s\)"):
        spec_of(tmp_path, {"fedtsdp": {"shared_layers": 4}})
    spec_of(tmp_path, {"fedtsdp": {"shared_layers": 5}}, model="mlp5")
    with pytest.raises(SpecError, match="must be <= 5 .the layers of model mlp5"):
        spec_of(tmp_path, {"fedtsdp": {"shared_layers": 6}}, model="mlp5")


def test_shared_layers_sets_the_initial_number_of_shared_layers(tmp_path):
    run = prepare_run(spec_of(tmp_path, {"fedtsdp": {"shared_layers": 1}}), "s", "fedtsdp", 0)
    method = run.method
    method.round_start(np.arange(6))
    assert method.shared_count() == 1 and method.round_metrics()["shared_layers"] == 1.0
    assert method.payload(0).tensors["shared"].numel() == int(run.space.first_layers(1).sum())


def test_clients_are_evaluated_with_their_clusters_shared_layers_and_their_own_other_layers(tmp_path):
    method = prepare_run(spec_of(tmp_path, {"fedtsdp": {"shared_layers": 1}}), "s", "fedtsdp", 0).method
    p = method.centers.shape[1]
    method.centers = torch.stack([torch.full((p,), 10.0), torch.full((p,), 20.0)])
    method.clusters = np.array([0, 0, 0, 1, 1, 1])
    own = torch.arange(6.0)[:, None].repeat(1, p)
    method.ctx.clients["model"] = own.clone()
    shared = method.ctx.space.first_layers(1)
    evaluated = method.predictor()
    models, index = evaluated.models, evaluated.index
    for client in range(6):
        vector = models[index[client]]
        assert torch.all(vector[shared] == 10.0 * (1 + method.clusters[client]))
        assert torch.equal(vector[~shared], own[client][~shared])
