"""PACFL: the client's subspace basis, the proximity matrix and the one-shot clustering."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.metrics import adjusted_rand_score

from cflpipe.fl.engine import prepare_run
from cflpipe.methods.pacfl import client_subspace, proximity_matrix
from cflpipe.spec import parse_spec
from cflpipe.testing import spec_dict


def _view(x: torch.Tensor, y: torch.Tensor):
    return SimpleNamespace(data=lambda split="train": (x, y))


def _samples(leading: int, second: int, dim: int = 6) -> torch.Tensor:
    """8 inputs spread 10× more along axis `leading` than along axis `second`, the two spreads
    orthogonal over the samples (Walsh sequences), so the singular vectors are those axes exactly."""
    x = torch.zeros(8, dim, dtype=torch.float64)
    x[:, leading] = 10 * torch.tensor([1, -1, 1, -1, 1, -1, 1, -1], dtype=torch.float64)
    x[:, second] = torch.tensor([1, 1, -1, -1, 1, 1, -1, -1], dtype=torch.float64)
    return x


def test_basis_holds_p_leading_singular_vectors_per_label():
    x = torch.cat([_samples(0, 1), _samples(2, 3)])
    y = torch.cat([torch.zeros(8, dtype=torch.long), torch.ones(8, dtype=torch.long)])
    basis = client_subspace(_view(x, y), 2)
    assert basis.shape == (6, 4)
    # label 0's two vectors span axes 0 and 1, the leading one along axis 0; label 1's axes 2 and 3
    assert float(basis[2:, :2].abs().max()) < 1e-12 and float(basis[:2, 2:].abs().max()) < 1e-12
    assert float(basis[0, 0].abs()) > 0.99 and float(basis[2, 2].abs()) > 0.99
    assert torch.allclose(basis[:, :2].T @ basis[:, :2], torch.eye(2, dtype=torch.float64), atol=1e-9)


def test_more_basis_vectors_can_bring_two_clients_closer():
    """The smallest angle over all pairs: clients whose leading directions are orthogonal but
    whose second directions agree are 90° apart with p = 1 and 0° apart with p = 2."""
    y = torch.zeros(8, dtype=torch.long)
    a, b = _view(_samples(0, 1), y), _view(_samples(2, 1), y)
    one = proximity_matrix([client_subspace(a, 1), client_subspace(b, 1)])
    two = proximity_matrix([client_subspace(a, 2), client_subspace(b, 2)])
    assert float(one[0, 1]) == pytest.approx(90.0, abs=1e-6)
    assert float(two[0, 1]) == pytest.approx(0.0, abs=1e-4)
    assert torch.equal(two, two.T) and torch.all(two.diagonal() < 1e-4)


def test_proximity_ignores_the_signs_of_singular_vectors():
    rng = np.random.default_rng(0)
    bases = [torch.linalg.qr(torch.from_numpy(rng.standard_normal((8, 3))))[0] for _ in range(4)]
    flipped = [b * torch.tensor([-1.0, 1.0, -1.0], dtype=torch.float64) for b in bases]
    assert torch.allclose(proximity_matrix(bases), proximity_matrix(flipped), atol=1e-9)
    # against the definition, pair by pair
    a = proximity_matrix(bases)
    for i in range(4):
        for j in range(4):
            expected = np.degrees(np.arccos(min(1.0, float((bases[i].T @ bases[j]).abs().max()))))
            assert float(a[i, j]) == pytest.approx(expected, abs=1e-6)


def _clustered(tmp_path: Path, partition: list[dict], **hp) -> tuple[np.ndarray, np.ndarray, object]:
    raw = spec_dict(tmp_path, "pacfl")
    raw["scenarios"]["s"] |= {"clients": 12, "partition": partition}
    raw["methods"]["pacfl"] = hp
    run = prepare_run(parse_spec(raw), "s", "pacfl", 0)
    run.method.round_start(np.arange(3))
    return run.method.clusters, run.ctx.data.groups, run


def test_rotated_groups_are_recovered_before_any_training(tmp_path):
    clusters, groups, run = _clustered(tmp_path, [{"kind": "iid"}, {"kind": "rotation", "groups": 3}], clusters=3)
    assert adjusted_rand_score(groups, clusters) == 1.0
    assert run.method.centers.shape[0] == 3 and torch.equal(run.method.centers[1], run.ctx.init)
    # every client's basis went up: 64 features × 3 vectors × 10 labels as float32
    assert run.ctx.extra_bytes_up == 12 * 64 * 3 * 10 * 4


def test_the_threshold_decides_the_number_of_clusters(tmp_path):
    partition = [{"kind": "iid"}, {"kind": "rotation", "groups": 3}]
    many, _, run = _clustered(tmp_path / "a", partition, threshold=1e-3)
    assert len(set(many)) == 12  # no two clients' subspaces within 0.001°
    one, _, _ = _clustered(tmp_path / "b", partition, threshold=180.0)
    assert len(set(one)) == 1
    angles = run.method.round_metrics()
    assert 0 < angles["pacfl_angle_min"] <= angles["pacfl_angle_median"] <= angles["pacfl_angle_max"] <= 90


def test_a_new_clients_proximity_row_is_the_matrix_row():
    from cflpipe.methods.pacfl import proximity_matrix, proximity_to

    g = torch.Generator().manual_seed(0)
    bases = [torch.linalg.qr(torch.randn(20, k, generator=g, dtype=torch.float64))[0] for k in (3, 0, 5, 2)]
    row = proximity_to(bases[0], torch.cat(bases[1:], dim=1), np.array([0, 5, 2]))
    np.testing.assert_allclose(row, proximity_matrix(bases).numpy()[0, 1:], rtol=1e-12)
    assert row[0] == 90.0  # a client without a basis: at 90° from everything
