"""Scenarios the methods' own premises need: clients whose data mix several groups (FedEM,
FedSoft, FedRC), and several group transforms in one scenario (FedRC's label, feature and concept
shift at once)."""

from __future__ import annotations

import numpy as np
import pytest

from cflpipe.data import load_dataset
from cflpipe.errors import SpecError
from cflpipe.metrics import mixture_error
from cflpipe.partition import MIXED, apply_sample_transforms, apply_transform, build_partition, client_arrays
from cflpipe.spec import parse_spec


def scenario(partition, clients=12, **extra):
    spec = parse_spec({"seeds": [0], "training": {"model": "mlp"}, "methods": {"fedavg": {}},
                       "scenarios": {"s": {"dataset": "digits", "clients": clients, "partition": partition, **extra}}})
    return spec.scenarios["s"]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", {}, "resources/datasets")


MIXED_SWAPS = [{"kind": "iid"}, {"kind": "rotation", "groups": 2}, {"kind": "label_swap", "groups": 3},
               {"kind": "mixture", "alpha": 0.5}]


def test_a_mixture_clients_samples_come_from_the_groups_in_the_recorded_weights(digits):
    partition = build_partition(scenario(MIXED_SWAPS), digits)
    weights = partition.weights
    assert weights.shape == (12, 6) and partition.groups == 6
    np.testing.assert_allclose(weights.sum(axis=1), 1.0)
    stats, table = partition.stats, partition.clients
    np.testing.assert_array_equal(stats[[f"weight_{g}" for g in range(6)]].to_numpy(), weights)
    for client, rows in table.groupby("client"):
        drawn = np.bincount(rows["component"], minlength=6) / len(rows)
        # exact counts: within one sample of the weight times the client's size
        assert np.abs(drawn - weights[client]).max() <= 1.0 / len(rows) + 1e-12, client
        assert stats["group"].iat[client] == int(np.argmax(weights[client]))
        assert stats["transform"].iat[client] == MIXED
    # the clients really mix: several groups in most clients, and both splits hold them
    assert (table.groupby("client")["component"].nunique() > 1).sum() >= 10
    assert table.groupby(["client", "split"])["component"].nunique().min() >= 1
    # each sample's transform and label follow its own group (cell = rotation group · 3 + swap group)
    x, y, _ = digits.pool("all")
    for _, row in table.sample(60, random_state=0).iterrows():
        rotation, swap = divmod(int(row["component"]), 3)
        assert row["transform"].startswith(f"rotate:{180 * rotation}+labels:")
        _, seen = apply_transform(x[[row["sample"]]], y[[row["sample"]]], row["transform"])
        assert seen[0] == row["label"]


def test_a_mixture_is_reproducible_and_its_clients_arrays_take_each_samples_transform(digits):
    first = build_partition(scenario(MIXED_SWAPS), digits)
    again = build_partition(scenario(MIXED_SWAPS), digits)
    assert first.clients.equals(again.clients) and first.stats.equals(again.stats)
    other = build_partition(scenario(MIXED_SWAPS, seed=1), digits)
    assert not np.array_equal(first.weights, other.weights)
    x, y, _ = digits.pool("all")
    arrays = client_arrays(first, x, y)
    rows = first.clients[(first.clients["client"] == 3) & (first.clients["split"] == "train")].sort_values("sample")
    xs, ys = arrays[3]["train"]
    np.testing.assert_array_equal(ys, rows["label"].to_numpy())
    for i, (sample, transform) in enumerate(zip(rows["sample"], rows["transform"])):
        np.testing.assert_array_equal(xs[i], apply_transform(x[[sample]], y[[sample]], transform)[0][0])


def test_the_weights_concentrate_with_a_small_alpha_and_spread_with_a_large_one(digits):
    steps = [{"kind": "iid"}, {"kind": "label_swap", "groups": 3}]
    peaked = build_partition(scenario(steps + [{"kind": "mixture", "alpha": 0.05}], clients=30), digits).weights
    even = build_partition(scenario(steps + [{"kind": "mixture", "alpha": 100.0}], clients=30), digits).weights
    assert peaked.max(axis=1).mean() > 0.9 and even.max(axis=1).mean() < 0.5


def test_several_group_transforms_combine_into_every_pair_and_ground_truth_can_leave_one_out(digits):
    both = build_partition(scenario([{"kind": "dirichlet", "alpha": 1.0}, {"kind": "rotation", "groups": 2},
                                     {"kind": "label_swap", "groups": 3}]), digits)
    assert both.groups == 6 and both.weights is None and "component" not in both.clients
    assert sorted(np.bincount(both.stats["group"])) == [2] * 6            # 12 clients, 2 in each of 6 cells
    for _, row in both.stats.iterrows():
        rotation, swap = divmod(int(row["group"]), 3)
        assert row["transform"].startswith(f"rotate:{180 * rotation}+labels:")
    # the same swap group has the same permutation whatever the rotation
    swaps = {int(g) % 3: t.split("+")[1] for g, t in zip(both.stats["group"], both.stats["transform"])}
    assert len(set(swaps.values())) == 3
    concept = build_partition(scenario([{"kind": "dirichlet", "alpha": 1.0},
                                        {"kind": "rotation", "groups": 2, "ground_truth": False},
                                        {"kind": "label_swap", "groups": 3}]), digits)
    assert concept.groups == 3
    # the same cells as with both steps scored; only the ground truth forgets the rotation
    assert list(concept.stats["transform"]) == list(both.stats["transform"])
    np.testing.assert_array_equal(concept.stats["group"], both.stats["group"] % 3)
    # one group transform alone is written as before (its strings, groups and draws)
    alone = build_partition(scenario([{"kind": "iid"}, {"kind": "rotation", "groups": 2}]), digits)
    assert set(alone.stats["transform"]) == {"rotate:0", "rotate:180"}


def test_a_composite_transform_applies_its_parts_in_order():
    x = np.arange(8, dtype=np.float32).reshape(2, 1, 2, 2)
    y = np.array([0, 1])
    turned, labels = apply_transform(x, y, "rotate:90+labels:1-0")
    np.testing.assert_array_equal(turned, apply_transform(x, y, "rotate:90")[0])
    np.testing.assert_array_equal(labels, [1, 0])


@pytest.mark.parametrize("partition, clients, message", [
    ([{"kind": "iid"}, {"kind": "mixture", "alpha": 1.0}], 12, "mixture mixes the groups of a group transform"),
    ([{"kind": "iid"}, {"kind": "rotation", "groups": 2}, {"kind": "rotation", "groups": 3}], 12,
     "more than one rotation step"),
    ([{"kind": "iid"}, {"kind": "label_swap", "groups": 2}, {"kind": "mixture", "alpha": 1.0},
      {"kind": "mixture", "alpha": 2.0}], 12, "more than one mixture step"),
    ([{"kind": "iid"}, {"kind": "rotation", "groups": 4}, {"kind": "label_swap", "groups": 4}], 12,
     "combine into 16 groups (4 × 4), more than the 12 clients"),
    ([{"kind": "iid"}, {"kind": "label_swap", "groups": 2}, {"kind": "mixture", "alpha": 0}], 12, "alpha"),
])
def test_impossible_combinations_are_one_line_naming_the_partition(partition, clients, message):
    with pytest.raises(SpecError) as error:
        scenario(partition, clients=clients)
    assert message in str(error.value) and str(error.value).startswith("scenarios.s")


def test_mixture_error_is_zero_for_the_true_weights_whatever_the_cluster_numbers_and_one_for_disjoint_ones():
    weights = np.array([[0.7, 0.3], [0.1, 0.9], [1.0, 0.0]])
    assert mixture_error(weights, weights) == pytest.approx(0.0)
    assert mixture_error(weights, weights[:, ::-1]) == pytest.approx(0.0)       # clusters numbered the other way
    assert mixture_error(weights, np.c_[weights, np.zeros(3)]) == pytest.approx(0.0)  # an empty extra cluster
    one_hot = np.eye(2)[[0, 1]]
    # one cluster for both groups: right for the clients of the group it is matched to
    assert mixture_error(one_hot, np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])) == pytest.approx(0.5)
    assert mixture_error(np.array([[0.5, 0.5]]), np.array([[1.0, 0.0]])) == pytest.approx(0.5)
    # one cluster for two groups: the unmatched group's weight is missed
    assert mixture_error(np.array([[0.5, 0.5]]), np.array([[1.0]])) == pytest.approx(0.5)


def test_a_run_on_a_mixture_scores_a_soft_methods_shares_and_only_those(tmp_path):
    from cflpipe.fl.engine import train_run

    spec = parse_spec({
        "seeds": [0], "results_dir": str(tmp_path / "results"), "data_dir": "resources/datasets",
        "training": {"model": "mlp", "rounds": 2, "clients_per_round": 6, "local_steps": 2, "batch_size": 16,
                     "eval_every": 1, "device": "cpu"},
        "scenarios": {"s": {"dataset": "digits", "clients": 6, "partition": [
            {"kind": "iid"}, {"kind": "label_swap", "groups": 2}, {"kind": "mixture", "alpha": 0.5}]}},
        "methods": {"fedem": {"clusters": 2}, "ifca": {"clusters": 2}}})
    soft = train_run(spec, "s", "fedem", 0, progress=False).summary["final"]
    hard = train_run(spec, "s", "ifca", 0, progress=False).summary["final"]
    assert 0.0 <= soft["mixture_error"] <= 1.0 and hard["mixture_error"] is None


def test_the_engines_client_tensors_take_each_samples_transform_and_score_against_the_train_shares(tmp_path):
    import torch

    from cflpipe.fl.data import build_federated_data
    from cflpipe.partition import load_partition, realized_weights

    spec = parse_spec({"seeds": [0], "results_dir": str(tmp_path / "results"), "data_dir": "resources/datasets",
                       "training": {"model": "mlp", "clients_per_round": 6}, "methods": {"fedavg": {}},
                       "scenarios": {"s": {"dataset": "digits", "clients": 6, "partition": MIXED_SWAPS}}})
    from cflpipe.fl.data import partition_scenario

    partition_scenario(spec, "s")
    partition = load_partition(spec.partition_dir("s"))
    data = build_federated_data(spec, "s", torch.device("cpu"))
    table = partition.clients
    for client in range(6):
        for split, tensors in (("train", data.train), ("test", data.test)):
            rows = table[(table["client"] == client) & (table["split"] == split)].sort_values("sample")
            _, y = tensors.of(client)
            assert y.tolist() == rows["label"].tolist()
        train = table[(table["client"] == client) & (table["split"] == "train")]
        shares = np.bincount(train["component"], minlength=6) / len(train)
        np.testing.assert_allclose(data.mixture_weights[client], shares)
    np.testing.assert_allclose(realized_weights(partition, "train"), data.mixture_weights)
    np.testing.assert_allclose(partition.weights, build_partition(spec.scenarios["s"], load_dataset(
        "digits", {}, "resources/datasets")).weights)
    # every input is its pool row standardized and then turned by its own sample's transform
    from cflpipe.fl.data import _standardizer

    dataset = load_dataset("digits", {}, "resources/datasets")
    standardize = _standardizer(dataset)
    pool_x, pool_y, _ = dataset.pool("all")
    x, _ = data.train.of(2)
    rows = table[(table["client"] == 2) & (table["split"] == "train")].sort_values("sample")
    expected, _ = apply_sample_transforms(standardize(pool_x[rows["sample"]]), pool_y[rows["sample"]],
                                          rows["transform"].to_numpy(object))
    np.testing.assert_array_equal(x.numpy(), expected)
    assert rows["transform"].str.startswith("rotate:180").any() and rows["transform"].str.startswith("rotate:0").any()


def test_a_mixture_of_groups_none_of_which_is_ground_truth_is_refused():
    with pytest.raises(SpecError) as error:
        scenario([{"kind": "iid"}, {"kind": "rotation", "groups": 2, "ground_truth": False},
                  {"kind": "mixture", "alpha": 1.0}])
    assert "no group transform here has ground_truth: true" in str(error.value)
