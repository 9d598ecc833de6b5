"""StoCFL: the anchor movements, the union of clusters and the bi-level models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from cflpipe.fl.engine import prepare_run
from cflpipe.spec import parse_spec
from cflpipe.testing import play, spec_dict


def _run(tmp_path: Path, **hp):
    raw = spec_dict(tmp_path, "stocfl", clients_per_round=6)
    raw["methods"]["stocfl"] = hp
    return prepare_run(parse_spec(raw), "s", "stocfl", 0)


def _directions(method, rows: dict[int, list[float]]):
    p = method.psi.shape[1]
    for client, head in rows.items():
        vector = torch.zeros(p, dtype=method.psi.dtype)
        vector[:len(head)] = torch.tensor(head, dtype=method.psi.dtype)
        method.psi[client] = vector
        method.observed[client] = True


def test_clusters_unite_most_similar_first_while_at_least_tau(tmp_path):
    method = _run(tmp_path, tau=0.9).method
    # 0 and 1 point alike, 2 and 3 alike, 4 between the two pairs, 5 opposite to everything
    _directions(method, {0: [1, 0], 1: [1, 0.1], 2: [0, 1], 3: [0.1, 1], 4: [1, 1], 5: [-1, -1]})
    method.ctx.round = 0
    method.round_start(np.arange(6))
    assert method.cluster_of.tolist() == [0, 0, 2, 2, 4, 5]  # cos(0, 4) ≈ 0.71 < 0.9
    # next round the pairs are represented by their members' mean: still below τ with 4
    method.round_start(np.arange(6))
    assert method.assignment().tolist() == [0, 0, 1, 1, 2, 3]
    loose = _run(tmp_path / "loose", tau=0.7).method
    _directions(loose, {0: [1, 0], 1: [1, 0.1], 2: [0, 1], 3: [0.1, 1], 4: [1, 1], 5: [-1, -1]})
    loose.round_start(np.arange(6))
    # 4 joins one pair (0.71 ≥ 0.7); that cluster is then the same for the other pair's test
    assert len(set(loose.cluster_of.tolist())) == 2 and loose.cluster_of[5] == 5


def test_first_sampled_clients_send_their_anchor_movement_once(tmp_path):
    run = _run(tmp_path)
    method, ctx = run.method, run.ctx
    method.round_start(np.array([1, 3]))
    assert method.observed.tolist() == [False, True, False, True, False, False]
    assert float(method.psi[1].norm()) > 0 and float(method.psi[0].norm()) == 0
    first = method.psi[1].clone()
    sent = ctx.extra_bytes_up
    assert sent == 2 * ctx.init.numel() * 4
    method.round_start(np.array([1, 2]))
    assert torch.equal(method.psi[1], first)  # cached, not measured again
    assert ctx.extra_bytes_up == sent + ctx.init.numel() * 4  # only client 2 sent


def test_a_united_cluster_keeps_the_larger_ones_model(tmp_path):
    method = _run(tmp_path, tau=0.5).method
    method.cluster_of[:] = [0, 0, 0, 3, 4, 5]
    method.models[0], method.models[3] = 1.0, 2.0
    method.has_model[[0, 3]] = True
    method._unite(3, 1)  # cluster 3 (1 member) into cluster 0 (3 members): 0's model stays
    assert method.cluster_of.tolist() == [0, 0, 0, 0, 4, 5]
    assert float(method.models[0][0]) == 1.0 and not method.has_model[3]
    method.models[4] = 5.0
    method.has_model[4] = True
    method.cluster_of[:] = [0, 4, 4, 4, 4, 5]
    method._unite(0, 4)  # the lower id names it, the larger cluster's model goes with it
    assert method.cluster_of.tolist() == [0, 0, 0, 0, 0, 5] and float(method.models[0][0]) == 5.0
    method.has_model[:] = False
    method.models[5], method.has_model[5] = 7.0, True
    method._unite(0, 5)  # the larger cluster has no model yet: the only model goes on
    assert method.has_model[0] and float(method.models[0][0]) == 7.0


def test_a_new_cluster_starts_from_the_global_model_and_clients_are_evaluated_with_theirs(tmp_path):
    run = _run(tmp_path, tau=1.0)  # nobody unites
    method = run.method
    play(run, 2)
    assert method.has_model.all()  # every client sampled: every singleton cluster has a model
    evaluated = method.predictor()
    models, index = evaluated.models, evaluated.index
    assert len(models) == 6 and index.tolist() == list(range(6))
    assert not torch.equal(method.models[0], method.global_model)
    method.has_model[2] = False
    evaluated = method.predictor()
    models, index = evaluated.models, evaluated.index
    assert torch.equal(models[index[2]], method.global_model)
    assert torch.equal(method.payload(2).tensors["cluster"], method.global_model)
