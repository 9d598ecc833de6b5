"""FedAC: LrCos, cluster-number tuning, the local update, and its scenario behaviour."""

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.decomposition import PCA

from cflpipe.clustering import cosine_similarity_matrix, pairwise_sq_distances
from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.fl.method import client_update, client_work, local_update, receive
from cflpipe.metrics import clustering_scores
from cflpipe.methods import fedac as fedac_module
from cflpipe.methods.fedac import cluster_ratios, tune_cluster_number
from cflpipe.spec import parse_spec

torch.set_num_threads(1)


def nearest(vectors, centers):
    return pairwise_sq_distances(vectors, centers).argmin(1).numpy()


def spec_for(tmp_path, methods, rounds=4, **scenario):
    return parse_spec({
        "seeds": [0, 1, 2],
        "training": {"model": "cnn", "rounds": rounds, "clients_per_round": 10, "local_steps": 10,
                     "batch_size": 32, "lr": 0.05, "momentum": 0.9, "eval_every": 5, "device": "cpu"},
        "scenarios": {"swap4": {"dataset": "digits", "clients": 20,
                                "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 4}],
                                **scenario}},
        "methods": methods,
        "results_dir": str(tmp_path),
    })


def test_lrcos_equals_cosine_of_independent_pca_projections(tmp_path):
    run = prepare_run(spec_for(tmp_path, {"fedac": {"components": 5, "clusters": 3}}), "swap4", "fedac", 0)
    fedac = run.method
    generator = torch.Generator().manual_seed(0)
    models = fedac.models + 0.01 * torch.randn(fedac.models.shape, generator=generator)
    sampled = np.arange(10)
    fedac.models = models.clone()
    fedac.ctx.round = 0
    fedac._update_projections(sampled, models[sampled])
    centers = torch.stack([models[i::3].mean(0) for i in range(3)])
    ours = cosine_similarity_matrix(fedac.projections, fedac.pca.transform(centers))

    reference = PCA(n_components=5, svd_solver="full").fit(models[sampled].double().numpy())
    a = reference.transform(models.double().numpy())
    b = reference.transform(centers.double().numpy())
    expected = (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T
    np.testing.assert_allclose(ours.numpy(), expected, atol=2e-3)
    # E-step: highest LrCos. Our PCA and sklearn's agree to 2e-3, so only rows whose best center
    # wins by more than that are compared.
    top2 = np.sort(expected, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 4e-3
    assert clear.sum() >= len(expected) // 2
    assert (fedac.e_step(models, centers)[clear] == expected.argmax(1)[clear]).all()


@pytest.fixture(params=["gathered", "blocks"])
def cluster_rows(request, monkeypatch):
    """CNT's reads of a cluster's rows: gathered (the sizes tests use) or block by block of one row
    (every client's model at 10,000 clients): the same decisions and centers."""
    if request.param == "blocks":
        monkeypatch.setattr(fedac_module, "_GATHER_BYTES", 0)
        monkeypatch.setattr(fedac_module, "_BLOCK_BYTES", 1)


def test_cnt_splits_a_cluster_of_two_far_apart_groups(cluster_rows):
    rng = np.random.default_rng(0)
    a = rng.normal(0, 0.1, (6, 8)) + 5.0
    b = rng.normal(0, 0.1, (6, 8)) - 5.0
    c = rng.normal(0, 1.5, (6, 8)) + np.array([0, 0, 0, 0, 0, 0, 0, 4.0])
    models = torch.tensor(np.concatenate([a, b, c]))
    clusters = np.array([0] * 12 + [1] * 6)
    centers = torch.stack([models[:12].mean(0), models[12:].mean(0)])
    assert cluster_ratios(models, centers, clusters)[0] > 0.8
    new_centers, new_clusters, ratios = tune_cluster_number(models, centers, clusters, 0.2, 0.8, 10, nearest)
    assert new_centers.shape[0] == 3
    truth = np.array([0] * 6 + [1] * 6 + [2] * 6)
    assert clustering_scores(new_clusters, truth)["ari"] == 1.0
    assert_centers_are_member_means(models, new_centers, new_clusters)
    np.testing.assert_array_equal(ratios, cluster_ratios(models, centers, clusters))
    # no split beyond max_clusters: two clusters exist already
    capped, capped_clusters, _ = tune_cluster_number(models, centers, clusters, 0.2, 0.8, 2, nearest)
    assert capped.shape[0] == 2 and (capped_clusters == clusters).all() and torch.equal(capped, centers)


def assert_centers_are_member_means(models, centers, clusters) -> None:
    assert sorted(set(clusters.tolist())) == list(range(centers.shape[0]))
    for k in range(centers.shape[0]):
        torch.testing.assert_close(centers[k], models[clusters == k].mean(0))


def test_cnt_merges_two_identical_clusters(cluster_rows):
    rng = np.random.default_rng(1)
    twin = rng.normal(0, 0.2, (8, 4))
    far1 = rng.normal(0, 2.5, (8, 4)) + np.array([6.0, 0, 0, 0])
    far2 = rng.normal(0, 2.5, (8, 4)) + np.array([0, 6.0, 0, 0])
    models = torch.tensor(np.concatenate([twin, far1, far2]))
    # The twin cluster is split arbitrarily in two: both halves share one center.
    clusters = np.array([0, 1] * 4 + [2] * 8 + [3] * 8)
    centers = torch.stack([models[clusters == k].mean(0) for k in range(4)])
    centers[1] = centers[0]
    ratios = cluster_ratios(models, centers, clusters)
    assert ratios[0] < 0.2 and 0.2 <= ratios[2] <= 0.8 and 0.2 <= ratios[3] <= 0.8
    new_centers, new_clusters, _ = tune_cluster_number(models, centers, clusters, 0.2, 0.8, 10, nearest)
    assert new_centers.shape[0] == 3
    assert len(set(new_clusters[:8])) == 1  # the twins are one cluster
    truth = np.array([0] * 8 + [1] * 8 + [2] * 8)
    assert clustering_scores(new_clusters, truth)["ari"] == 1.0
    assert_centers_are_member_means(models, new_centers, new_clusters)


def test_local_update_without_pulls_is_plain_sgd_and_lambda_moves_only_the_body(tmp_path):
    one_step = {"local_steps": 1, "momentum": 0.0}
    spec = spec_for(tmp_path, {"plain": {"method": "fedac", "mu": 0.0, "lam": 0.0, "training": one_step},
                               "pulled": {"method": "fedac", "mu": 0.0, "lam": 2.0, "training": one_step}})
    plain = prepare_run(spec, "swap4", "plain", 0).method
    start = plain.models[3].clone()
    payload = plain.payload(3)
    ours = local_update(plain, 3, payload).tensors["model"]
    sgd, _ = plain.ctx.train(3, start)
    assert torch.equal(ours, sgd)

    pulled = prepare_run(spec, "swap4", "pulled", 0).method
    phi = start + 0.5  # a global embedding away from the client's model
    pulled.phi = phi.clone()
    moved = local_update(pulled, 3, pulled.payload(3)).tensors["model"]
    body, head = pulled.ctx.space.body, pulled.ctx.space.head
    # One SGD step from the same start: the λ term adds −η·λ·(φ − Φ) to the body and nothing else.
    assert torch.equal(moved[head], sgd[head])
    lr = pulled.ctx.lr()
    torch.testing.assert_close(moved[body] - sgd[body], -lr * 2.0 * (start[body] - phi[body]))
    assert (moved[body] - phi[body]).norm() < (sgd[body] - phi[body]).norm()


def test_bytes_count_center_embedding_and_pca_map(tmp_path):
    run = prepare_run(spec_for(tmp_path, {"fedac": {"components": 4}}), "swap4", "fedac", 0)
    fedac, space = run.method, run.space
    first = fedac.payload(0).nbytes
    assert first == (space.size + int(space.body.sum())) * 4
    fedac.aggregate({c: local_update(fedac, c, fedac.payload(c)) for c in range(10)})
    with_map = fedac.payload(15)
    assert with_map.nbytes == first + (4 * space.size + space.size) * 4  # components + mean, once
    assert fedac.payload(15).nbytes == first
    update = local_update(fedac, 1, fedac.payload(1))
    assert update.nbytes == (space.size + 4) * 4  # the model and its projection M·ω


@pytest.mark.slow
def test_fedac_recovers_four_label_swap_groups_from_two(tmp_path):
    """The paper's claim on our smallest setting: CNT from K=2 ends at the 4 true groups and
    FedAC beats FedAvg and FeSEM (given the true K=4). Measured (μ=0.01 default): 4 clusters,
    ARI 1.0 on seeds 0, 1, 2."""
    spec = spec_for(tmp_path, {"fedac": {"clusters": 2}, "fedavg": {}, "fesem": {"clusters": 4}}, rounds=30)
    recovered = 0
    for seed in (0, 1, 2):
        fedac = train_run(spec, "swap4", "fedac", seed, progress=False)
        fedavg = train_run(spec, "swap4", "fedavg", seed, progress=False)
        fesem = train_run(spec, "swap4", "fesem", seed, progress=False)
        final = fedac.summary["final"]
        recovered += final["n_clusters"] == 4 and final["ari"] >= 0.9
        assert final["acc_macro"] > fedavg.summary["final"]["acc_macro"] + 0.2
        assert final["acc_macro"] > fesem.summary["final"]["acc_macro"], (final, fesem.summary["final"])
        rounds = pd.read_parquet(fedac.run_dir / "rounds.parquet")
        assert "fedac_g" in rounds.columns and rounds["fedac_clusters"].notna().all()
    assert recovered >= 2


def test_the_pca_dimension_actually_used_is_recorded_and_said(tmp_path, capsys, monkeypatch):
    """A PCA of 10 sampled models has at most 10 components: D = 50 becomes 10, and says so, once
    per process (a job that trains every seed says it once)."""
    from cflpipe.methods import fedac as fedac_module

    monkeypatch.setattr(fedac_module, "_SAID_DIMS", set())  # what earlier tests in this process said
    run = prepare_run(spec_for(tmp_path, {"fedac": {"components": 50, "pca_every": 1}}), "swap4", "fedac", 0)
    fedac = run.method
    fedac.aggregate({c: local_update(fedac, c, fedac.payload(c)) for c in range(10)})
    assert fedac.round_metrics()["fedac_pca_dims"] == 10.0
    err = capsys.readouterr().err
    assert "LrCos keeps D = 10 of components = 50: a PCA of the 10 sampled clients' models" in err
    fedac.ctx.round = 1  # the map is refitted (pca_every 1), on 10 models again
    version = fedac.pca_version
    fedac.aggregate({c: local_update(fedac, c, fedac.payload(c)) for c in range(10, 20)})
    assert fedac.pca_version == version + 1 and fedac.round_metrics()["fedac_pca_dims"] == 10.0
    assert "LrCos keeps" not in capsys.readouterr().err  # said once
    other = prepare_run(spec_for(tmp_path / "seed1", {"fedac": {"components": 50, "pca_every": 1}}), "swap4",
                        "fedac", 1).method
    other.aggregate({c: local_update(other, c, other.payload(c)) for c in range(10)})
    assert other.round_metrics()["fedac_pca_dims"] == 10.0 and "LrCos keeps" not in capsys.readouterr().err


def test_round_metrics_report_the_servers_clusters_g_values_and_pca_dims(tmp_path):
    run = prepare_run(spec_for(tmp_path, {"fedac": {"components": 3, "clusters": 2, "cnt_start": 1}},
                               training={"model": "mlp"}), "swap4", "fedac", 0)
    fedac = run.method
    assert fedac.round_metrics()["fedac_pca_dims"] != fedac.round_metrics()["fedac_pca_dims"]  # nan: no PCA yet
    for r in range(2):
        run.ctx.round = r
        sampled = run.sample(r)
        fedac.round_start(sampled)
        payloads = {int(c): fedac.payload(int(c)) for c in sampled}
        started = {c: client_work(fedac, c, payloads[c]) for c in payloads}
        trained = run.ctx.run({c: plans for c, (plans, _) in started.items()})
        receive(fedac, {c: client_update(fedac, c, payloads[c], trained[c], started[c][1]) for c in payloads})
    metrics = fedac.round_metrics()
    assert metrics["fedac_clusters"] == fedac.centers.shape[0] == len(set(fedac.clusters.tolist()))
    assert metrics["fedac_g"] == [float(g) if np.isfinite(g) else None for g in fedac.g_values]
    assert len(metrics["fedac_g"]) == len(fedac.g_values) >= 1
    assert metrics["fedac_pca_dims"] == fedac.pca.components.shape[0] == 3


def mlp_fedac(tmp_path, **hyperparams):
    spec = parse_spec({
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 4, "clients_per_round": 8, "local_steps": 1, "batch_size": 16,
                     "eval_every": 4, "device": "cpu"},
        "scenarios": {"swap4": {"dataset": "digits", "clients": 8, "partition": [{"kind": "iid"}]}},
        "methods": {"fedac": hyperparams},
        "results_dir": str(tmp_path),
    })
    return prepare_run(spec, "swap4", "fedac", 0).method


def uploads(models: torch.Tensor) -> dict:
    from cflpipe.fl.local import LocalResult
    from cflpipe.fl.method import Update

    return {c: Update({"model": models[c].clone()}, 10, LocalResult(0.5, 1, 1)) for c in range(len(models))}


def test_the_l2_e_step_assigns_the_nearest_center_where_lrcos_sees_no_difference(tmp_path):
    """The ablation `similarity: l2`: models on one ray at different lengths have the same cosine to
    both centers, and their own nearest center in L2."""
    fedac = mlp_fedac(tmp_path, similarity="l2", clusters=2)
    direction = torch.zeros(fedac.models.shape[1])
    direction[0] = 1.0
    centers = torch.stack([direction, 10 * direction])
    models = torch.stack([0.9 * direction, 9 * direction, 1.2 * direction, 20 * direction])
    assert fedac.e_step(models, centers).tolist() == [0, 1, 0, 1]
    # a whole round with L2: the E-step reads the server's models (LrCos reads the projections)
    generator = torch.Generator().manual_seed(0)
    planted = fedac.models.clone()
    planted[4:] += 0.5 * torch.randn(fedac.models.shape[1], generator=generator)
    fedac.ctx.round = 0
    fedac.aggregate(uploads(planted + 0.001 * torch.randn(planted.shape, generator=generator)))
    assert clustering_scores(fedac.clusters, np.repeat([0, 1], 4))["ari"] == 1.0


@pytest.mark.parametrize("cnt", [True, False])
def test_cluster_number_tuning_runs_from_cnt_start_on_and_only_when_on(tmp_path, monkeypatch, cnt):
    import cflpipe.methods.fedac as fedac_module

    fedac = mlp_fedac(tmp_path, cnt=cnt, cnt_start=3, clusters=2)
    tuned = []
    real = fedac_module.tune_cluster_number

    def record(*args, **kwargs):
        tuned.append(fedac.ctx.round)
        return real(*args, **kwargs)

    monkeypatch.setattr(fedac_module, "tune_cluster_number", record)
    generator = torch.Generator().manual_seed(0)
    for round_index in range(4):
        fedac.ctx.round = round_index
        fedac.aggregate(uploads(fedac.models + 0.01 * torch.randn(fedac.models.shape, generator=generator)))
    assert tuned == ([2, 3] if cnt else [])  # rounds 3 and 4 (1-based) of cnt_start = 3


def test_cnt_splits_when_the_models_have_more_parameters_than_max_clusters():
    """Cluster ids, not parameters: a split is allowed while fewer than max_clusters are alive."""
    rng = np.random.default_rng(0)
    a = rng.normal(0, 0.1, (6, 40)) + 5.0
    b = rng.normal(0, 0.1, (6, 40)) - 5.0
    models = torch.tensor(np.concatenate([a, b]))
    clusters = np.zeros(12, dtype=np.int64)
    centers = models.mean(0, keepdim=True)
    split_centers, split_clusters, _ = tune_cluster_number(models, centers, clusters, 0.2, 0.8, 3, nearest)
    assert split_centers.shape[0] == 2
    assert clustering_scores(split_clusters, np.repeat([0, 1], 6))["ari"] == 1.0


def test_the_pca_map_is_refitted_every_pca_every_rounds_and_follows_its_seed(tmp_path, capsys):
    """pca_every 2: the map is fitted in rounds 1 and 3 (1-based) and kept in between, where only
    the sampled clients are projected again with the kept map. The randomized SVD is seeded: the
    same round on the same models fits the same map, bit for bit."""
    fedac = mlp_fedac(tmp_path, components=3, pca_every=2, cnt=False)
    twin = mlp_fedac(tmp_path, components=3, pca_every=2, cnt=False)
    generator = torch.Generator().manual_seed(0)
    start, versions = fedac.pca_version, []
    for round_index in range(4):
        fedac.ctx.round = round_index
        models = fedac.models + 0.01 * torch.randn(fedac.models.shape, generator=generator)
        kept = fedac.pca
        fedac.aggregate(uploads(models))
        versions.append(fedac.pca_version - start)
        if round_index == 0:
            twin.ctx.round = 0
            twin.aggregate(uploads(models))
            assert torch.equal(twin.pca.components, fedac.pca.components)
        if round_index % 2:  # kept map: the projections are the round's models under it
            assert fedac.pca is kept
            assert torch.allclose(fedac.projections, kept.transform(models), atol=1e-6)
    assert versions == [1, 1, 2, 2]
    assert "LrCos keeps" not in capsys.readouterr().err  # 8 models give the 3 components asked for


def test_a_resumed_run_has_the_pca_map_it_was_saved_with_or_none(tmp_path):
    for similarity in ("l2", "lrcos"):
        fedac = mlp_fedac(tmp_path, similarity=similarity, components=3)
        fresh = mlp_fedac(tmp_path, similarity=similarity, components=3)
        fresh.load_state_dict(fedac.state_dict())  # no round yet: no map
        assert fresh.pca is None
        fedac.ctx.round = 0
        fedac.aggregate(uploads(fedac.models + 0.01 * torch.randn(fedac.models.shape,
                                                                  generator=torch.Generator().manual_seed(1))))
        fresh.load_state_dict(fedac.state_dict())
        if similarity == "l2":  # the L2 ablation never fits a map
            assert fresh.pca is None
        else:
            assert torch.equal(fresh.pca.mean, fedac.pca.mean)
            assert torch.equal(fresh.pca.components, fedac.pca.components)


def test_the_g_value_of_a_lone_cluster_is_reported_as_missing(tmp_path):
    """One cluster has no other to compare with: G is inf, written as a missing value."""
    fedac = mlp_fedac(tmp_path, clusters=1, cnt=False)
    fedac.ctx.round = 0
    fedac.aggregate(uploads(fedac.models + 0.01 * torch.randn(fedac.models.shape,
                                                              generator=torch.Generator().manual_seed(2))))
    assert np.isinf(fedac.g_values).all() and fedac.round_metrics()["fedac_g"] == [None]
