"""CFL-GP: the profiles' cumulative average, the spectral clustering and the label matching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import adjusted_rand_score

from cflpipe.fl.engine import prepare_run
from cflpipe.fl.local import LocalResult
from cflpipe.fl.method import Update
from cflpipe.methods.cflgp import match_labels, profile_weight
from cflpipe.spec import parse_spec
from cflpipe.testing import spec_dict


def test_profile_weight_averages_over_blocks_of_k_periods():
    # K = 4, period 2: rounds 0-6 replace, 7-14 halve, 15-22 a third (the authors' floor((t+1)/8))
    assert [profile_weight(t, 4, 2) for t in (0, 6, 7, 14, 15)] == [1.0, 1.0, 0.5, 0.5, 1 / 3]


def test_new_labels_take_the_old_names_they_agree_with_most():
    old = np.array([0, 0, 0, 1, 1, 2, 2, 2])
    new = np.array([2, 2, 1, 0, 0, 1, 1, 1])  # 2 ↔ 0, 0 ↔ 1, 1 ↔ 2
    assert match_labels(new, old, 3).tolist() == [0, 0, 2, 1, 1, 2, 2, 2]
    assert match_labels(old, old, 3).tolist() == old.tolist()


def _run(tmp_path: Path, **hp):
    raw = spec_dict(tmp_path, "cflgp", clients_per_round=6)
    raw["scenarios"]["s"]["clients"] = 8
    raw["methods"]["cflgp"] = {"clusters": 2, **hp}
    return prepare_run(parse_spec(raw), "s", "cflgp", 0)


def _updates(method, directions: dict[int, torch.Tensor]) -> dict[int, Update]:
    return {c: Update({"model": method.centers[method.clusters[c]] + d}, 10, LocalResult(1.0, 1, 10))
            for c, d in directions.items()}


def _two_directions(p: int) -> tuple[np.ndarray, dict[int, torch.Tensor]]:
    """8 clients' updates along one of two random directions (their truth), with a little noise."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(p, generator=g), torch.randn(p, generator=g)
    truth = np.array([0, 1, 0, 1, 1, 0, 1, 0])
    noise = 0.05 * torch.randn(8, p, generator=g)
    return truth, {c: (a if truth[c] == 0 else b) + noise[c] for c in range(8)}


def test_clients_whose_updates_point_alike_are_clustered_together(tmp_path):
    method = _run(tmp_path).method
    p = method.centers.shape[1]
    truth, directions = _two_directions(p)
    method.ctx.round = 0
    method.cluster_aggregate(_updates(method, directions))
    assert method.profiled.all()
    assert adjusted_rand_score(truth, method.clusters) == 1.0
    assert len(method.round_metrics()["cflgp_singular_values"]) == 2
    # each cluster's model is the mean of its members' trained models
    members = np.nonzero(method.clusters == method.clusters[0])[0]
    start = method.ctx.init
    expected = torch.stack([start + directions[c] for c in members]).mean(0)
    assert torch.allclose(method.centers[method.clusters[0]], expected, atol=1e-5)


def test_profiles_average_across_profile_rounds_and_clustering_stops(tmp_path):
    method = _run(tmp_path, period=1, stop_after=2).method
    p = method.centers.shape[1]
    ones = torch.ones(p)
    method.ctx.round = 0
    method.cluster_aggregate(_updates(method, {c: ones * (c + 1) for c in range(8)}))
    first = method.profile.clone()
    assert torch.allclose(first[3], ones * 4)
    # round 1: β = 1/(floor(2/2) + 1) = 1/2 with K = 2, period 1
    method.ctx.round = 1
    method.cluster_aggregate(_updates(method, {3: torch.zeros(p)}))
    assert torch.allclose(method.profile[3], ones * 2) and torch.equal(method.profile[2], first[2])
    clusters = method.clusters.copy()
    method.ctx.round = 2  # stop_after: no more profiles or clustering
    method.cluster_aggregate(_updates(method, {c: -ones * (c + 1) for c in range(8)}))
    assert torch.allclose(method.profile[3], ones * 2) and np.array_equal(method.clusters, clusters)


def test_a_client_first_heard_from_late_gets_its_whole_update_as_profile(tmp_path):
    method = _run(tmp_path, period=1, stop_after=10).method
    p = method.centers.shape[1]
    method.ctx.round = 3  # β = 1/2 with K = 2, period 1
    method.cluster_aggregate(_updates(method, {5: torch.ones(p)}))
    assert torch.allclose(method.profile[5], torch.ones(p))


def test_a_profile_share_keeps_the_same_seeded_coordinates_and_still_separates_the_directions(tmp_path):
    method = _run(tmp_path / "a", profile_share=0.05).method
    p = method.centers.shape[1]
    kept = method.coordinates
    assert method.profile.shape == (8, max(1, int(p * 0.05))) and len(kept) == method.profile.shape[1]
    assert torch.equal(kept, kept.sort().values) and len(torch.unique(kept)) == len(kept)
    assert torch.equal(_run(tmp_path / "b", profile_share=0.05).method.coordinates, kept)  # the run's seed alone
    truth, directions = _two_directions(p)
    method.ctx.round = 0
    method.cluster_aggregate(_updates(method, directions))
    assert adjusted_rand_score(truth, method.clusters) == 1.0
    torch.testing.assert_close(method.profile[3], directions[3][kept])
    assert _run(tmp_path / "c").method.coordinates is None  # the default keeps every coordinate
