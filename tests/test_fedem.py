"""FedEM: the E-step, the weighted M-step loss, the client's mixture and its evaluation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.methods.fedem import WeightedCrossEntropy, responsibilities
from cflpipe.spec import parse_spec
from cflpipe.testing import spec_dict


def test_responsibilities_are_the_posterior_of_each_component():
    pi = np.array([0.25, 0.75])
    losses = np.array([[0.1, 2.0, 1.0], [1.0, 0.1, 1.0]])
    q = responsibilities(np.log(pi), losses)
    expected = pi[:, None] * np.exp(-losses)
    assert np.allclose(q, expected / expected.sum(axis=0))
    # stable where exp(−loss) underflows
    assert np.allclose(responsibilities(np.log(pi), losses + 1000.0), q)


def test_the_weighted_loss_of_component_k_reads_its_weight_column():
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 3)
    x, y = torch.randn(5, 2, 2), torch.randint(0, 3, (5,))
    w = torch.tensor([[0.0, 1.0, 0.5, 0.25, 1.0], [1.0, 0.0, 0.5, 0.75, 0.0]])
    inputs = torch.cat([x.reshape(5, -1), w.T], 1)  # the inputs once, then one column per component
    for k in (0, 1):
        loss = WeightedCrossEntropy.of((2, 2), 2, k)
        value = loss(lambda rows: net(rows.reshape(len(rows), -1)), inputs, y)
        expected = (w[k] * F.cross_entropy(net(x.reshape(5, -1)), y, reduction="none")).mean()
        assert torch.allclose(value, expected)
        assert WeightedCrossEntropy.of((2, 2), 2, k) is loss  # shared, so the batched trainer groups the plans


def _run(tmp_path: Path):
    raw = spec_dict(tmp_path, "fedem", clients_per_round=6)
    raw["methods"]["fedem"] = {"clusters": 2}
    return prepare_run(parse_spec(raw), "s", "fedem", 0)


def test_a_client_keeps_the_mean_responsibility_as_its_weights(tmp_path):
    run = _run(tmp_path)
    method, view = run.method, run.ctx.view(2)
    payload = method.payload(2)
    plans, new_pi = type(method).client_plan(view, payload)
    x, y = view.data()
    logits = [F.cross_entropy(run.ctx.apply(payload.tensors["models"][k:k + 1], x)[0], y, reduction="none")
              for k in range(2)]
    q = responsibilities(np.log([0.5, 0.5]), torch.stack(logits).double().numpy())
    assert np.allclose(new_pi.numpy(), q.mean(axis=1), atol=1e-6)
    assert set(plans) == {"model0", "model1"}
    assert plans["model0"].inputs is plans["model1"].inputs  # the client's inputs are held once
    assert torch.allclose(plans["model1"].inputs[:, -2:], torch.as_tensor(q.T, dtype=torch.float32), atol=1e-6)


def test_clients_are_evaluated_with_their_mixture(tmp_path):
    raw = spec_dict(tmp_path, "fedem", rounds=2, eval_every=2, keep_state=True)
    raw["methods"]["fedem"] = {"clusters": 2}
    spec = parse_spec(raw)
    train_run(spec, "s", "fedem", 0, progress=False)
    run = prepare_run(spec, "s", "fedem", 0)
    run.try_resume()
    method, data = run.method, run.data
    pi = method.mixture()
    assert np.allclose(pi.sum(axis=1), 1.0) and not np.allclose(pi, 0.5)
    metrics = pd.read_parquet(spec.run_dir("s", "fedem", 0) / "metrics.parquet")
    final = metrics[(metrics["round"] == 2) & (metrics["split"] == "test")].sort_values("client")
    for client in range(data.num_clients):
        x, y = data.test.of(client)
        probabilities = sum(pi[client, k] * run.ctx.apply(method.models[k:k + 1], x)[0].softmax(-1) for k in range(2))
        # another summation than the evaluation's einsum: the losses agree to rounding, and the
        # accuracy to one prediction at most (a near tie may fall either way)
        loss = float(-probabilities.gather(1, y[:, None]).log().mean())
        assert final["loss"].iloc[client] == pytest.approx(loss, rel=1e-5)
        accuracy = float((probabilities.argmax(1) == y).float().mean())
        assert abs(final["acc"].iloc[client] - accuracy) <= 1 / len(y) + 1e-12
    assert final["model"].tolist() == np.argmax(pi, axis=1).tolist()
    mixture = pd.read_parquet(spec.run_dir("s", "fedem", 0) / "mixture.parquet")
    assert np.allclose(mixture[mixture["round"] == 2]["weight"].to_numpy().reshape(-1, 2), pi)


def test_fedrc_counts_labels_softly_and_floors_the_prior():
    from cflpipe.methods.fedem import label_counts, label_prior

    q = np.array([[1.0, 0.25, 0.5], [0.0, 0.75, 0.5]])
    counts = label_counts(q, np.array([0, 2, 2]), classes=3)
    assert counts.tolist() == [[1.0, 0.0, 0.75], [0.0, 0.0, 1.25]]
    prior = label_prior(counts)
    assert np.allclose(prior.sum(axis=1), 1.0) and prior[1, 0] == pytest.approx(1e-8 / (1.25 + 2e-8))


def test_fedrc_divides_each_responsibility_by_the_clusters_label_probability(tmp_path):
    from cflpipe.methods.fedem import FedRC

    raw = spec_dict(tmp_path, "fedrc", clients_per_round=6)
    raw["methods"]["fedrc"] = {"clusters": 2}
    run = prepare_run(parse_spec(raw), "s", "fedrc", 0)
    method = run.method
    method.prior = np.tile(np.linspace(1, 2, 10) / np.linspace(1, 2, 10).sum(), (2, 1))
    method.prior[1] = method.prior[1][::-1]
    payload = method.payload(0)
    losses = np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]])
    labels = np.array([0, 5, 9])
    q = FedRC.responsibilities_of(payload, np.array([0.5, 0.5]), losses, labels)
    # equal losses: the cluster where a label is rarer takes the sample
    expected = (1 / method.prior[:, labels]) / (1 / method.prior[:, labels]).sum(axis=0)
    assert np.allclose(q, expected)
    # a client's update carries its soft label counts; the server's prior is their normalized sum
    play_round = type(method).client_plan(run.ctx.view(0), payload)
    assert isinstance(play_round[1], tuple) and play_round[1][1].shape == (2, 10)
