"""FedGMM: the Gaussians' densities and statistics, the joint E-step over (component, classifier)
pairs, the server's pooled moments, the embedding, and the input-dependent prediction weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.fl.method import Update
from cflpipe.fl.local import LocalResult
from cflpipe.methods.fedgmm import (_gaussian_statistics, gaussian_log_density, input_weights,
                                    joint_responsibilities, uncentered_pca)
from cflpipe.spec import parse_spec
from cflpipe.testing import spec_dict


def random_spd(rng, m, d):
    a = rng.standard_normal((m, d, d))
    return a @ a.transpose(0, 2, 1) + 0.5 * np.eye(d)


def test_the_log_density_is_the_multivariate_normals():
    rng = np.random.default_rng(0)
    z, mean, cov = rng.standard_normal((7, 3)), rng.standard_normal((2, 3)), random_spd(rng, 2, 3)
    got = gaussian_log_density(torch.tensor(z), torch.tensor(mean), torch.tensor(cov))
    for m in range(2):
        expected = torch.distributions.MultivariateNormal(torch.tensor(mean[m]), torch.tensor(cov[m])).log_prob(
            torch.tensor(z))
        assert torch.allclose(got[m], expected)


def test_joint_responsibilities_are_the_posterior_of_each_pair():
    rng = np.random.default_rng(1)
    pi = rng.random((2, 3))
    pi /= pi.sum()
    log_density, losses = rng.standard_normal((2, 5)), rng.random((3, 5))
    r = joint_responsibilities(np.log(pi), log_density, losses)
    expected = pi[:, :, None] * np.exp(log_density)[:, None, :] * np.exp(-losses)[None, :, :]
    assert np.allclose(r, expected / expected.sum(axis=(0, 1)))
    assert np.allclose(joint_responsibilities(np.log(pi), log_density - 800.0, losses + 900.0), r)  # stable


def test_prediction_weights_are_the_classifiers_posterior_given_the_input():
    rng = np.random.default_rng(2)
    pi = rng.random((4, 2, 3))
    pi /= pi.sum(axis=(1, 2), keepdims=True)
    log_density = rng.standard_normal((2, 4))
    w = input_weights(torch.tensor(np.log(pi)), torch.tensor(log_density)).numpy()
    joint = pi * np.exp(log_density.T)[:, :, None]
    assert np.allclose(w, (joint / joint.sum(axis=(1, 2), keepdims=True)).sum(axis=1))
    assert np.allclose(w.sum(axis=1), 1.0)


def test_a_clients_statistics_are_its_weighted_moments():
    rng = np.random.default_rng(3)
    z, resp = rng.standard_normal((6, 2)), rng.random((2, 6))
    mass, mean, cov = (t.numpy() for t in _gaussian_statistics(torch.tensor(z), torch.tensor(resp)))
    for m in range(2):
        assert np.isclose(mass[m], resp[m].sum())
        assert np.allclose(mean[m], np.average(z, axis=0, weights=resp[m]))
        assert np.allclose(cov[m], np.cov(z, rowvar=False, aweights=resp[m], bias=True))


def test_the_uncentred_embedding_is_the_top_right_singular_vectors():
    x = torch.tensor(np.random.default_rng(4).standard_normal((50, 6)) + 3.0)
    v = uncentered_pca(x, 2)
    _, _, vt = torch.linalg.svd(x, full_matrices=False)
    assert torch.allclose(v.T @ v, torch.eye(2, dtype=v.dtype), atol=1e-10)
    assert torch.allclose((v.T @ vt[:2].T).abs(), torch.eye(2, dtype=v.dtype), atol=1e-8)  # up to sign
    assert uncentered_pca(x, 10).shape == (6, 6)  # at most the input size


def _run(tmp_path: Path, **hp):
    raw = spec_dict(tmp_path, "fedgmm", clients_per_round=6)
    raw["methods"]["fedgmm"] = {"clusters": 2, "gmm_components": 2, "embedding": 4, **hp}
    return prepare_run(parse_spec(raw), "s", "fedgmm", 0)


def test_the_server_pools_the_clients_moments_exactly(tmp_path):
    """Two clients' statistics pool to the mass-weighted moments of their data together, plus
    the covariance floor once."""
    run = _run(tmp_path, covariance_floor=0.25)
    method = run.method
    rng = np.random.default_rng(5)
    parts = [torch.tensor(rng.standard_normal((n, 4)) + shift) for n, shift in ((5, 0.0), (9, 2.0))]
    resp = [torch.tensor(rng.random((2, len(z)))) for z in parts]
    updates = {}
    for c, (z, r) in enumerate(zip(parts, resp)):
        mass, mean, cov = _gaussian_statistics(z, r)
        tensors = {f"model{k}": method.models[k].clone() for k in range(2)}
        tensors.update(gmm_mass=mass, gmm_mean=mean, gmm_cov=cov, learner_mass=torch.ones(2, dtype=torch.float64))
        updates[c] = Update(tensors, len(z), LocalResult(0.0, 1, 1))
    method.aggregate(updates)
    z, r = torch.cat(parts), torch.cat(resp, dim=1)
    _, mean, cov = _gaussian_statistics(z, r)
    assert torch.allclose(method.means, mean)
    assert torch.allclose(method.covs, cov + 0.25 * torch.eye(4, dtype=cov.dtype))


def test_a_clients_mixture_depends_on_the_input_and_its_cluster_is_its_classifier(tmp_path):
    run = _run(tmp_path)
    method = run.method
    pi = torch.tensor([[0.7, 0.0], [0.0, 0.3]], dtype=torch.float64)  # component 0 ↔ classifier 0
    method.ctx.clients.set("pi", 0, pi)
    x = run.data.train.of(0)[0]
    z = x.reshape(len(x), -1).double() @ method.embedding
    near = int(torch.argmin(((z - method.means[1]) ** 2).sum(1)))  # the row nearest component 1
    w = method.row_weights(x, np.zeros(len(x), dtype=np.int64))
    assert torch.allclose(w.sum(dim=1), torch.ones(len(x), dtype=w.dtype))
    assert float(w[:, 1].max() - w[:, 1].min()) > 0.1  # the weights follow the input
    assert float(w[near, 1]) > 0.3  # …towards the classifier its component is paired with
    assert method.assignment()[0] == 0 and np.allclose(method.shares()[0], [0.7, 0.3])


def test_a_run_writes_the_classifiers_and_the_pairs_weights(tmp_path):
    raw = spec_dict(tmp_path, "fedgmm", clients_per_round=6)
    raw["methods"]["fedgmm"] = {"clusters": 2, "gmm_components": 2, "embedding": 4}
    result = train_run(parse_spec(raw), "s", "fedgmm", 0, progress=False)
    mixture = pd.read_parquet(result.run_dir / "mixture.parquet")
    pairs = pd.read_parquet(result.run_dir / "gmm_pairs.parquet")
    last = pairs[pairs["round"] == pairs["round"].max()]
    marginal = last.groupby(["client", "classifier"])["weight"].sum().to_numpy()
    shares = mixture[mixture["round"] == mixture["round"].max()].sort_values(["client", "cluster"])["weight"]
    assert np.allclose(marginal, shares.to_numpy())
    assert np.allclose(last.groupby("client")["weight"].sum(), 1.0)
