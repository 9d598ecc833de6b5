"""FLUX (reconstructed from the authors' code, #46 item 3): its descriptor, scaling, DBSCAN radius
and clustering, its trigger, and that it recovers groups when the descriptors are estimated from
enough samples."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from cflpipe.fl.engine import train_run
from cflpipe.methods.flux import (PLACEHOLDER, dbscan_clusters, descriptor, knee_radius, scale_groups,
                                  shared_projection)
from cflpipe.spec import parse_spec


def test_the_descriptor_is_the_mean_and_spread_overall_and_per_label():
    z = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [10.0, 10.0]])
    y = np.array([0, 0, 1, 2])  # label 1 and 2 have one sample each; label 3 none
    d = descriptor(z, y, classes=4)
    assert d.shape == (2 * 2 + 2 * 4 * 2,)
    np.testing.assert_allclose(d[:2], z.mean(0))
    np.testing.assert_allclose(d[2:4], z.std(0))
    per_mean, per_std = d[4:12].reshape(4, 2), d[12:].reshape(4, 2)
    np.testing.assert_allclose(per_mean[0], [1.0, 2.0])
    np.testing.assert_allclose(per_std[0], [1.0, 1.0])
    assert (per_mean[1:] == PLACEHOLDER).all() and (per_std[1:] == PLACEHOLDER).all()


def test_each_group_of_columns_is_scaled_by_one_pooled_minimum_and_maximum():
    d = np.array([[0.0, 2.0, 5.0, 5.0], [4.0, 1.0, 5.0, 5.0]])
    scaled = scale_groups(d, group=2)
    np.testing.assert_allclose(scaled[:, :2], [[0.0, 0.5], [1.0, 0.25]])  # min 0, max 4 over both columns
    assert (scaled[:, 2:] == 0).all()  # a constant group carries nothing


def test_the_radius_is_the_knee_of_the_nearest_neighbour_distances():
    # nine points on a line 0.1 apart and one far away: the knee lies before the outlier's distance
    points = np.r_[np.arange(9) * 0.1, [5.0]][:, None]
    radius = knee_radius(points, 1.0)
    assert radius == pytest.approx(0.1)
    assert knee_radius(points, 2.0) == pytest.approx(0.2)
    assert knee_radius(np.zeros((3, 1)), 1.0) > 0  # equal points: never 0, which DBSCAN refuses


def test_noise_points_become_clusters_of_their_own_numbered_by_first_client():
    points = np.array([[5.0], [0.0], [0.1], [9.0], [9.05], [20.0]])
    assert dbscan_clusters(points, eps=0.2).tolist() == [0, 1, 1, 2, 2, 3]


def test_the_projection_does_not_depend_on_numpys_global_state():
    """Wide features (over 500: resnet18's 512) took sklearn's randomized, unseeded solver."""
    x = np.random.default_rng(0).normal(size=(7, 600))
    fit = shared_projection.__wrapped__  # each call fits again (the clients' calls are cached)
    np.random.seed(1)
    a = fit(600, 10, 2.0, 200).transform(x)
    np.random.seed(2)
    np.testing.assert_array_equal(a, fit(600, 10, 2.0, 200).transform(x))


def test_every_client_gets_the_same_projection():
    a, b = shared_projection.__wrapped__(30, 5, 2.0, 200), shared_projection.__wrapped__(30, 5, 2.0, 200)
    x = np.random.default_rng(0).normal(size=(7, 30))
    np.testing.assert_array_equal(a.transform(x), b.transform(x))
    assert a.n_components_ == 5 and shared_projection(3, 5, 2.0, 200).n_components_ == 3


def spec(tmp_path, clients: int, **hp) -> dict:
    return {"seeds": [0], "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data"),
            "training": {"model": "mlp", "rounds": 12, "clients_per_round": clients, "local_steps": 10,
                         "batch_size": 32, "lr": 0.05, "eval_every": 4, "device": "cpu"},
            "scenarios": {"s": {"dataset": "digits", "clients": clients, "pool": "train",
                                "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
            "methods": {"flux": hp}}


def test_it_clusters_once_when_accuracy_stalls_and_recovers_groups_with_enough_samples(tmp_path):
    """Four clients of two label-swap groups (about 36 samples per label each): FLUX clusters in
    the round its trigger fires and finds the two groups."""
    run = train_run(parse_spec(spec(tmp_path, 4)), "s", "flux", 0, progress=False)
    rounds = pd.read_parquet(run.run_dir / "rounds.parquet")
    clustered = rounds.dropna(subset=["flux_eps"])
    assert len(clustered) == 1  # once
    r = int(clustered["round"].iloc[0]) - 1  # 0-based
    trend = rounds["flux_accuracy"].dropna().to_numpy()  # measured at the start of rounds 1…r
    assert len(trend) == r and r >= 3
    assert (np.diff(trend) < 0.06).any() or r >= 0.8 * 12  # it fired
    if r > 3:  # and not a round later than it should have
        assert (np.diff(trend[:-1]) >= 0.06).all()
    assert json.loads((run.run_dir / "summary.json").read_text())["final"]["ari"] == pytest.approx(1.0)


def test_a_fixed_round_replaces_the_trigger(tmp_path):
    run = train_run(parse_spec(spec(tmp_path, 4, cluster_round=6)), "s", "flux", 0, progress=False)
    rounds = pd.read_parquet(run.run_dir / "rounds.parquet")
    assert rounds.dropna(subset=["flux_eps"])["round"].tolist() == [7]
    assert "flux_accuracy" not in rounds or rounds["flux_accuracy"].isna().all()
