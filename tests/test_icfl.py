"""ICFL as reconstructed from FedRC's implementation: its split bar, cohesion and bisection, the
pool's first split, the incremental assignment (defects A–D fixed) and its aggregation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from cflpipe.fl.engine import prepare_run, train_run
from cflpipe.fl.local import LocalResult
from cflpipe.fl.method import Update
from cflpipe.methods.icfl import POOL, bisect, cohesion, split_bar
from cflpipe.spec import parse_spec
from cflpipe.testing import spec_dict


def test_the_split_bar_rises_from_zero_to_alpha0_at_eps2_squared():
    eps2 = math.log(1 - 0.85) / (1 - math.log(4.0))
    assert eps2 == pytest.approx(4.911, abs=1e-3)
    assert split_bar(0, 4.0, 0.85) == 0.0  # no cluster splits in the first round
    assert split_bar(1, 4.0, 0.85) == pytest.approx(1 - (math.e / 4) ** (1 / eps2))
    assert split_bar(1, 4.0, 0.85) == pytest.approx(0.0757, abs=1e-3)
    assert split_bar(eps2 ** 2, 4.0, 0.85) == pytest.approx(0.85)
    bars = [split_bar(t, 4.0, 0.85) for t in range(60)]
    assert all(a < b for a, b in zip(bars, bars[1:])) and bars[-1] < 1
    assert split_bar(5, 8.0, 0.85) > split_bar(5, 4.0, 0.85)  # a larger ε₁ raises the bar sooner


def test_cohesion_is_one_for_aligned_updates_and_one_over_n_for_orthogonal_ones():
    assert cohesion(np.ones((4, 4))) == pytest.approx(1.0)
    assert cohesion(np.eye(4)) == pytest.approx(0.25)
    assert cohesion(np.ones((1, 1))) == 1.0


def test_the_bisection_embeds_clients_by_the_columns_of_v():
    """Two blocks of aligned clients: the top two singular vectors (columns of V, a row per client)
    separate them; FedRC's rows of V would embed 2 points for 6 clients (defect A)."""
    directions = np.array([[1, 0, 0]] * 2 + [[0, 1, 0]] * 4, dtype=float)
    directions += 0.05 * np.random.default_rng(0).standard_normal(directions.shape)
    unit = directions / np.linalg.norm(directions, axis=1, keepdims=True)
    halves = bisect(unit @ unit.T, seed=3)
    assert len(halves) == 6 and len(set(halves[:2])) == 1 and len(set(halves[2:])) == 1 and halves[0] != halves[2]
    assert np.array_equal(bisect(unit @ unit.T, seed=3), halves)  # seeded


def _update(vector: torch.Tensor, n: int = 10) -> Update:
    return Update({"model": vector.clone()}, n, LocalResult(0.0, 1, 1))


def make(tmp_path, **hp):
    raw = spec_dict(tmp_path, "icfl")
    raw["methods"]["icfl"] = hp
    return prepare_run(parse_spec(raw), "s", "icfl", 0).method


def test_the_pool_splits_once_then_newcomers_join_the_nearest_clusters_mean_update(tmp_path):
    icfl = make(tmp_path, eps1=100.0)  # the bar is nearly 1 from round 1
    p = icfl.centers.shape[1]
    start = icfl.centers[POOL].clone()
    a, b = torch.zeros(p), torch.zeros(p)
    a[0], b[1] = 1.0, 1.0
    icfl.ctx.round = 1
    icfl.aggregate({0: _update(start + a), 1: _update(start + 1.1 * a), 2: _update(start + b), 3: _update(start + b)})
    assert icfl.clusters[:4].tolist() in ([1, 1, 2, 2], [2, 2, 1, 1])
    assert (icfl.clusters[4:] == POOL).all()  # the clients not sampled stay in the pool
    along_b = int(icfl.clusters[2])
    # θ_k: the sample-weighted mean of its members' latest models
    torch.testing.assert_close(icfl.centers[along_b], start + b)
    # θ_0: the round's pool clients (none left) and every cluster model, weighted by members' samples
    torch.testing.assert_close(icfl.centers[POOL], (icfl.centers[1] + icfl.centers[2]) / 2)
    # The round's clients now hold their cluster's model (FedRC's broadcast); the others the initial one.
    torch.testing.assert_close(icfl.held[2], icfl.centers[along_b])
    torch.testing.assert_close(icfl.held[5], start)
    # A later pool client joins the cluster whose members' mean update is most like its own.
    icfl.ctx.round = 2
    icfl.aggregate({4: _update(start + 3 * b)})
    assert icfl.clusters[4] == along_b
    assert icfl.num_clusters == 3  # the pool is never split again


def test_a_pool_client_joins_by_mean_update_not_by_model_nor_the_last_cluster(tmp_path):
    """Three clusters; the newcomer's update runs along cluster 1's mean update, while cluster 3
    (the last, FedRC's defect B) has the model most like that update (its defect C)."""
    icfl = make(tmp_path, eps1=100.0)
    p = icfl.centers.shape[1]
    e = torch.eye(3, p)  # three unit directions (torch.eye(p) would be p × p: 10 GB for this model)
    icfl.clusters[:] = [1, 2, 3, POOL, POOL, POOL]
    icfl.centers = torch.stack([icfl.centers[POOL], e[2], e[2], 5 * e[0] + e[2]])
    icfl.latest_update[:3] = e  # cluster 1 moved along e0, 2 along e1, 3 along e2
    icfl.has_update[:3] = True
    icfl.samples[:3] = 10
    icfl.ctx.round = 5
    icfl.aggregate({3: _update(icfl.held[3] + 2 * e[0])})
    assert icfl.clusters[3] == 1


def test_a_cluster_below_the_bar_is_bisected_and_one_above_it_is_kept(tmp_path):
    icfl = make(tmp_path, eps1=100.0)
    p = icfl.centers.shape[1]
    icfl.clusters[:] = [1, 1, 1, 1, POOL, POOL]
    icfl.centers = icfl.centers[:1].repeat(2, 1)
    a, b = torch.zeros(p), torch.zeros(p)
    a[0], b[1] = 1.0, 1.0
    icfl.ctx.round = 3
    sent = icfl.centers[1].clone()
    icfl.aggregate({0: _update(sent + a), 1: _update(sent + a), 2: _update(sent + b), 3: _update(sent + b)})
    assert icfl.num_clusters == 3 and icfl.clusters[0] == icfl.clusters[1] != icfl.clusters[2] == icfl.clusters[3]
    assert icfl.round_metrics()["icfl_alpha_g"][1] == pytest.approx(0.5)  # two orthogonal pairs
    # One direction only: cohesion 1, never below the bar.
    aligned = make(tmp_path / "aligned", eps1=100.0)
    aligned.clusters[:] = [1, 1, 1, 1, POOL, POOL]
    aligned.centers = aligned.centers[:1].repeat(2, 1)
    aligned.ctx.round = 3
    sent = aligned.centers[1].clone()
    aligned.aggregate({c: _update(sent + (c + 1) * a) for c in range(4)})
    assert aligned.num_clusters == 2 and aligned.round_metrics()["icfl_alpha_g"][1] == pytest.approx(1.0)


def test_a_run_records_its_split_schedule(tmp_path):
    raw = spec_dict(tmp_path, "icfl")
    raw["training"]["rounds"] = 4
    result = train_run(parse_spec(raw), "s", "icfl", 0, progress=False)
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet")
    bars = rounds["icfl_alpha_t"].tolist()
    assert bars[0] == 0.0 and all(x < y for x, y in zip(bars, bars[1:]))
    clusters = pd.read_parquet(result.run_dir / "clusters.parquet").groupby("round")["cluster"].nunique()
    evaluated = rounds.set_index("round").loc[clusters.index, "icfl_clusters"]
    assert evaluated.tolist() == clusters.tolist()  # the pool counted while it has members
    assert all(isinstance(v, (list, np.ndarray)) for v in rounds["icfl_alpha_g"])


def test_a_subclass_with_the_cluster_base_variants_is_refused_in_one_line(tmp_path, registry_copy):
    """A plugin's subclass of ICFL gets AWCFL and MCFL variants from the cluster-model base; ICFL's
    clients hold the model broadcast to them, which neither option can reach."""
    from cflpipe.errors import SpecError
    from cflpipe.methods import register
    from cflpipe.methods.icfl_params import ICFLParams
    from cflpipe.methods.icfl import ICFL

    Sub = type("Sub", (ICFL,), {"__module__": __name__, "__qualname__": "Sub", "__doc__": "Sub: an ICFL."})
    register("icfl_sub", ICFLParams)(Sub)
    raw = spec_dict(tmp_path, "icfl_sub_mcfl")
    with pytest.raises(SpecError, match="methods.icfl_sub_mcfl: ICFL takes neither AWCFL's mixing nor MCFL's"):
        prepare_run(parse_spec(raw), "s", "icfl_sub_mcfl", 0)
