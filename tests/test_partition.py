"""Partition properties (hypothesis) and examples on the real digits dataset."""

from __future__ import annotations

import functools
import itertools
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cflpipe.partition import files as partition_files
from cflpipe.data.base import Dataset
from cflpipe.errors import PartitionError
from cflpipe.partition import (
    Partition,
    apply_transform,
    build_partition,
    client_arrays,
    client_indices,
    client_transforms,
    load_partition,
    write_partition,
)
from cflpipe.spec import Scenario

FAST = settings(max_examples=25, deadline=None)
WHERE = "scenarios.test"


@functools.lru_cache(maxsize=None)
def digits() -> Dataset:
    try:
        from cflpipe.data import load_dataset
    except ImportError:
        # cflpipe.data also imports the downloadable datasets, written separately; digits itself
        # is embedded and needs none of them.
        from cflpipe.data.base import NoParams
        from cflpipe.data.embedded import load_digits

        return load_digits(NoParams(), Path("resources/datasets"))
    return load_dataset("digits", {}, "resources/datasets")


def fake_dataset(labels: np.ndarray, num_classes: int, image: bool = True,
                 sources: np.ndarray | None = None) -> Dataset:
    n = len(labels)
    rng = np.random.default_rng(n)
    shape = (n, 1, 4, 4) if image else (n, 3)
    x = rng.standard_normal(shape).astype(np.float32)
    y = np.asarray(labels, dtype=np.int64)
    return Dataset("fake", x, y, x[:0], y[:0], num_classes,
                   source_train=sources, source_test=None if sources is None else sources[:0])


def random_labels(n: int, num_classes: int, seed: int = 0) -> np.ndarray:
    labels = np.random.default_rng(seed).integers(0, num_classes, n)
    labels[:num_classes] = np.arange(num_classes)  # every class present
    return labels


def scenario(clients: int, *steps: dict, seed: int = 0, **kwargs) -> Scenario:
    return Scenario(dataset={"name": "digits"}, clients=clients, seed=seed,
                    partition=list(steps) or [{"kind": "iid"}], **kwargs)


def sizes_of(p: Partition) -> np.ndarray:
    return (p.stats["n_train"] + p.stats["n_test"]).to_numpy()


def check_invariants(p: Partition, dataset: Dataset, sc: Scenario) -> None:
    """What every partition must satisfy, whatever the steps."""
    table = p.clients
    pool_labels = dataset.pool_labels(sc.pool)
    assert list(table.columns) == ["client", "split", "sample", "group", "transform", "label"]
    assert table["client"].dtype == np.int32 and table["group"].dtype == np.int32
    assert table["sample"].dtype == np.int64 and table["label"].dtype == np.int64
    # The string columns have the dtype pandas infers (built from codes, not inferred), so the
    # Parquet schema is what it was when they were object arrays.
    assert table["split"].dtype == table["transform"].dtype == pd.Series(["x"]).dtype
    # Disjoint: each pool sample used at most once over all clients and splits.
    assert table["sample"].is_unique
    assert table["sample"].between(0, len(pool_labels) - 1).all()
    assert set(table["split"].unique()) <= {"train", "test"}
    key = pd.DataFrame({"c": table["client"], "t": table["split"] == "test", "s": table["sample"]})
    assert key.equals(key.sort_values(["c", "t", "s"]).reset_index(drop=True))
    assert len(p.stats) == sc.clients
    assert (p.stats["client"].to_numpy() == np.arange(sc.clients)).all()
    # stats.parquet holds integers (a float column would read 12.0 samples and change the file).
    assert p.stats["client"].dtype == np.int32 and p.stats["group"].dtype == np.int32
    counted = ["n_train", "n_test", *(f"label_{k}" for k in range(p.num_classes))]
    assert (p.stats[counted].dtypes == np.int64).all()
    # Stats agree with the rows.
    n = table.groupby("client").size().reindex(range(sc.clients), fill_value=0).to_numpy()
    n_test = (table["split"] == "test").groupby(table["client"]).sum().reindex(range(sc.clients)).to_numpy()
    assert (n >= 1).all()
    assert (p.stats["n_test"].to_numpy() == n_test).all()
    assert (sizes_of(p) == n).all()
    counts = pd.crosstab(table["client"], table["label"]).reindex(
        index=range(sc.clients), columns=range(p.num_classes), fill_value=0)
    stat_counts = p.stats[[f"label_{k}" for k in range(p.num_classes)]].to_numpy()
    assert (counts.to_numpy() == stat_counts).all()
    # Hold-out: round(test_fraction·n), at least 1 and at most n-1 once n >= 2.
    expected = np.where(n >= 2, np.clip(np.rint(sc.test_fraction * n), 1, n - 1), 0)
    assert (n_test == expected).all()
    # Per-client group and transform are constant and agree with stats.
    per_client = table.groupby("client")[["group", "transform"]].nunique()
    assert (per_client.to_numpy() == 1).all()
    merged = table.merge(p.stats[["client", "group", "transform"]], on="client", suffixes=("", "_s"))
    assert (merged["group"] == merged["group_s"]).all()
    assert (merged["transform"] == merged["transform_s"]).all()
    if sc.group_step() is None or sc.group_step().kind != "label_swap":
        assert (table["label"].to_numpy() == pool_labels[table["sample"].to_numpy()]).all()


def entropy(p: Partition) -> float:
    counts = p.stats[[f"label_{k}" for k in range(p.num_classes)]].to_numpy(float)
    share = counts / counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.nansum(-share * np.log(share), axis=1).mean())


# --------------------------------------------------------------------------- label splits

split_steps = st.one_of(
    st.just({"kind": "iid"}),
    st.builds(lambda a, m: {"kind": "dirichlet", "alpha": a, "min_size": m},
              st.sampled_from([0.01, 0.1, 0.5, 1.0, 100.0]), st.integers(0, 8)),
    st.builds(lambda k: {"kind": "pathological", "labels_per_client": k}, st.integers(1, 4)),
)


@FAST
@given(n=st.integers(100, 600), clients=st.integers(1, 12), classes=st.integers(4, 8),
       step=split_steps, seed=st.integers(0, 2**32 - 1))
def test_label_split_uses_whole_pool(n, clients, classes, step, seed):
    ds = fake_dataset(random_labels(n, classes, seed % 1000), classes)
    if step["kind"] == "pathological":
        step = {**step, "labels_per_client": min(step["labels_per_client"], classes)}
    sc = scenario(clients, step, seed=seed)
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    holders = np.zeros(classes)
    if step["kind"] == "pathological":
        seen = p.stats[[f"label_{k}" for k in range(classes)]].to_numpy() > 0
        holders = seen.sum(axis=0)
        assert (seen.sum(axis=1) == step["labels_per_client"]).all()
    # Without quantity every sample is used (pathological: every held label).
    unheld = int(np.isin(ds.y_train, np.flatnonzero(holders == 0)).sum()) if step["kind"] == "pathological" else 0
    assert len(p.clients) == n - unheld
    if step["kind"] == "iid":
        assert np.ptp(sizes_of(p)) <= 1
    if step["kind"] == "dirichlet":
        assert sizes_of(p).min() >= max(step["min_size"], 1)


@FAST
@given(n=st.integers(200, 800), clients=st.integers(1, 10), low=st.integers(5, 20), extra=st.integers(0, 30),
       step=split_steps, quantity_first=st.booleans(), seed=st.integers(0, 10_000))
def test_quantity_sets_sizes_in_either_position(n, clients, low, extra, step, quantity_first, seed):
    classes = 5
    ds = fake_dataset(random_labels(n, classes, seed), classes)
    quantity = {"kind": "quantity", "min": low, "max": low + extra}
    if step["kind"] == "dirichlet":
        step = {k: v for k, v in step.items() if k != "min_size"}
    if step["kind"] == "pathological":
        step = {**step, "labels_per_client": min(step["labels_per_client"], low)}
    steps = (quantity, step) if quantity_first else (step, quantity)
    sc = scenario(clients, *steps, seed=seed)
    try:
        p = build_partition(sc, ds, WHERE)
    except PartitionError as error:
        # Only a draw too large for the pool (or, for pathological, for the clients' own labels)
        # may fail, and then with one line naming the quantity step.
        assert "\n" not in str(error)
        assert str(error).startswith(f"{WHERE}.partition[{steps.index(quantity)}].")
        return
    check_invariants(p, ds, sc)
    sizes = sizes_of(p)
    assert sizes.min() >= low and sizes.max() <= low + extra
    assert sizes.sum() <= n
    other = scenario(clients, *reversed(steps), seed=seed)
    assert build_partition(other, ds, WHERE).clients.equals(p.clients)
    if step["kind"] == "pathological":
        seen = p.stats[[f"label_{k}" for k in range(classes)]].to_numpy() > 0
        assert (seen.sum(axis=1) == step["labels_per_client"]).all()


@FAST
@given(clients=st.integers(2, 60), alpha=st.floats(0.01, 5.0), min_size=st.integers(1, 20),
       seed=st.integers(0, 10_000))
def test_dirichlet_respects_min_size(clients, alpha, min_size, seed):
    n = 1500
    ds = fake_dataset(random_labels(n, 10, seed), 10)
    sc = scenario(clients, {"kind": "dirichlet", "alpha": alpha, "min_size": min_size}, seed=seed)
    if clients * min_size > n:
        with pytest.raises(PartitionError):
            build_partition(sc, ds, WHERE)
        return
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    assert sizes_of(p).min() >= min_size
    assert sizes_of(p).sum() == n


@pytest.mark.parametrize("clients, alpha", [(500, 0.3), (1000, 0.1), (1000, 0.01)])
def test_dirichlet_terminates_for_many_clients(clients, alpha):
    labels = np.random.default_rng(1).integers(0, 10, 60_000)
    ds = fake_dataset(labels, 10)
    sc = scenario(clients, {"kind": "dirichlet", "alpha": alpha}, pool="train")
    start = time.perf_counter()
    p = build_partition(sc, ds, WHERE)
    # Generous bound: catches a resampling loop or a per-sample Python loop, not CPU noise.
    assert time.perf_counter() - start < 10
    assert sizes_of(p).min() >= 10
    assert len(p.clients) == 60_000 and p.clients["sample"].is_unique


def test_dirichlet_skew_grows_as_alpha_shrinks():
    ds = fake_dataset(random_labels(5000, 10), 10)
    for quantity in ([], [{"kind": "quantity", "min": 50, "max": 150}]):
        skewed = build_partition(scenario(30, {"kind": "dirichlet", "alpha": 0.05}, *quantity), ds, WHERE)
        flat = build_partition(scenario(30, {"kind": "dirichlet", "alpha": 100.0}, *quantity), ds, WHERE)
        assert entropy(skewed) < entropy(flat) - 0.5


def test_clientwise_dirichlet_renormalises_when_a_label_runs_out():
    # Sizes use almost the whole pool, so late clients must find their favourite labels empty.
    ds = fake_dataset(random_labels(400, 4), 4)
    sc = scenario(10, {"kind": "quantity", "min": 38, "max": 40}, {"kind": "dirichlet", "alpha": 0.05})
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    assert sizes_of(p).min() >= 38


@FAST
@given(clients=st.integers(1, 40), per_client=st.integers(1, 10), seed=st.integers(0, 10_000))
def test_pathological_on_digits(clients, per_client, seed):
    ds = digits()
    sc = scenario(clients, {"kind": "pathological", "labels_per_client": per_client}, seed=seed)
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    held = p.stats[[f"label_{k}" for k in range(10)]].to_numpy() > 0
    assert (held.sum(axis=1) == per_client).all()
    holders = held.sum(axis=0)
    assert holders.max() - holders.min() <= 1  # each label held by a balanced number of clients
    # Each label is split into equal shards among its holders.
    counts = p.stats[[f"label_{k}" for k in range(10)]].to_numpy()
    for c in range(10):
        shard = counts[held[:, c], c]
        assert len(shard) == 0 or shard.max() - shard.min() <= 1


def test_natural_split_follows_devices():
    from cflpipe.data.embedded import SyntheticParams, generate_synthetic

    ds = generate_synthetic(SyntheticParams(devices=20, max_samples=200))
    sc = scenario(20, {"kind": "natural"})
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    _, _, source = ds.pool("all")
    assert len(p.clients) == len(source)
    devices_per_client = pd.Series(source[p.clients["sample"]]).groupby(p.clients["client"].to_numpy()).nunique()
    assert (devices_per_client == 1).all()
    assert pd.Series(source[p.clients["sample"]]).nunique() == 20


# --------------------------------------------------------------------------- groups


group_steps = st.one_of(
    st.builds(lambda g: {"kind": "rotation", "groups": g}, st.integers(1, 6)),
    st.builds(lambda g: {"kind": "flip", "groups": g}, st.integers(1, 4)),
    st.builds(lambda g: {"kind": "label_swap", "groups": g}, st.integers(1, 6)),
)


@FAST
@given(clients=st.integers(6, 40), group=group_steps, split=split_steps, seed=st.integers(0, 10_000))
def test_groups_are_balanced_and_transforms_match(clients, group, split, seed):
    ds = digits()
    sc = scenario(clients, split, group, seed=seed)
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    groups = group["groups"]
    assert p.groups == groups
    sizes = np.bincount(p.stats["group"], minlength=groups)
    assert len(sizes) == groups and sizes.max() - sizes.min() <= 1
    step = sc.group_step()
    if group["kind"] == "rotation":
        expected = [f"rotate:{a:g}" for a in step.group_angles()]
    elif group["kind"] == "flip":
        expected = [f"flip:{axis}" for axis in step.group_axes()]
    else:
        expected = p.stats.groupby("group")["transform"].first().tolist()
        assert expected[0] == "labels:" + "-".join(map(str, range(10)))  # group 0 keeps identity
        assert len(set(expected)) == groups
    assert (p.stats["transform"] == [expected[g] for g in p.stats["group"]]).all()


@FAST
@given(classes=st.integers(2, 10), groups=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_label_swap_permutations(classes, groups, seed):
    import math

    ds = fake_dataset(random_labels(300, classes, seed), classes, image=False)
    sc = scenario(max(groups, 8), {"kind": "label_swap", "groups": groups}, seed=seed)
    if groups > math.factorial(classes):
        with pytest.raises(PartitionError, match=r"partition\[0\]\.groups"):
            build_partition(sc, ds, WHERE)
        return
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    perms = {}
    for g, text in p.stats.groupby("group")["transform"].first().items():
        assert text.startswith("labels:")
        perm = np.array([int(v) for v in text.removeprefix("labels:").split("-")])
        assert sorted(perm) == list(range(classes))
        perms[g] = perm
    assert len({tuple(v) for v in perms.values()}) == groups
    table = p.clients
    original = ds.y_train[table["sample"]]
    expected = np.array([perms[g][y] for g, y in zip(table["group"], original)])
    assert (table["label"].to_numpy() == expected).all()
    # apply_transform agrees with the label column.
    for k, text in client_transforms(p).items():
        rows = table[table["client"] == k]
        _, seen = apply_transform(ds.x_train[rows["sample"]], ds.y_train[rows["sample"]], text)
        assert (seen == rows["label"].to_numpy()).all()


def test_group_transform_leaves_the_split_alone():
    ds = digits()
    plain = build_partition(scenario(12, {"kind": "dirichlet", "alpha": 0.5}), ds, WHERE)
    rotated = build_partition(scenario(12, {"kind": "dirichlet", "alpha": 0.5},
                                       {"kind": "rotation", "groups": 4}), ds, WHERE)
    columns = ["client", "split", "sample", "label"]
    assert plain.clients[columns].equals(rotated.clients[columns])
    assert (plain.stats["group"] == -1).all() and (plain.stats["transform"] == "none").all()
    assert plain.groups == 0


# --------------------------------------------------------------------------- seeding and files


@FAST
@given(seed=st.integers(0, 2**31), step=split_steps, quantity=st.booleans())
def test_same_seed_same_partition_other_seed_differs(seed, step, quantity):
    ds = digits()
    extra = [{"kind": "quantity", "min": 20, "max": 60}] if quantity else []
    if quantity and step["kind"] == "dirichlet":
        step = {k: v for k, v in step.items() if k != "min_size"}
    first = build_partition(scenario(15, step, *extra, {"kind": "label_swap", "groups": 3}, seed=seed), ds, WHERE)
    again = build_partition(scenario(15, step, *extra, {"kind": "label_swap", "groups": 3}, seed=seed), ds, WHERE)
    other = build_partition(scenario(15, step, *extra, {"kind": "label_swap", "groups": 3}, seed=seed + 1), ds, WHERE)
    assert first.clients.equals(again.clients) and first.stats.equals(again.stats)
    assert not first.clients.equals(other.clients)


def test_files_are_byte_identical_and_round_trip(tmp_path):
    ds = digits()
    sc = scenario(20, {"kind": "dirichlet", "alpha": 0.3}, {"kind": "rotation", "groups": 4}, seed=7)
    p = build_partition(sc, ds, WHERE)
    write_partition(p, tmp_path / "a")
    write_partition(build_partition(sc, ds, WHERE), tmp_path / "b", title="dir03 rotation")
    for name in ("clients.parquet", "stats.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    png = (tmp_path / "a" / "label_hist.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    assert sorted(f.name for f in (tmp_path / "a").iterdir()) == ["clients.parquet", "label_hist.png",
                                                                  "stats.parquet"]
    loaded = load_partition(tmp_path / "a")
    assert loaded.clients.equals(p.clients) and loaded.stats.equals(p.stats)
    assert (loaded.num_classes, loaded.groups) == (10, 4)
    other = build_partition(scenario(20, {"kind": "dirichlet", "alpha": 0.3}, {"kind": "rotation", "groups": 4},
                                     seed=8), ds, WHERE)
    write_partition(other, tmp_path / "c")
    assert (tmp_path / "a" / "clients.parquet").read_bytes() != (tmp_path / "c" / "clients.parquet").read_bytes()


def test_failed_write_leaves_no_files(tmp_path, monkeypatch):
    p = build_partition(scenario(5), digits(), WHERE)

    def broken(*args, **kwargs):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(partition_files, "label_heatmap_png", broken)
    with pytest.raises(RuntimeError):
        write_partition(p, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_load_missing_partition_is_a_one_line_error(tmp_path):
    with pytest.raises(PartitionError, match="clients.parquet"):
        load_partition(tmp_path)


def test_client_indices_and_arrays():
    ds = digits()
    sc = scenario(8, {"kind": "iid"}, {"kind": "flip", "groups": 2, "axes": ["none", "horizontal"]})
    p = build_partition(sc, ds, WHERE)
    indices = client_indices(p)
    assert sorted(indices) == list(range(8))
    x, y, _ = ds.pool("all")
    arrays = client_arrays(p, x, y)
    transforms = client_transforms(p)
    for k, parts in indices.items():
        rows = p.clients[p.clients["client"] == k]
        for split in ("train", "test"):
            expected = rows.loc[rows["split"] == split, "sample"].to_numpy()
            assert (parts[split] == expected).all()
            xs, ys = arrays[k][split]
            assert (ys == rows.loc[rows["split"] == split, "label"].to_numpy()).all()
            flipped = x[expected][..., ::-1] if transforms[k] == "flip:horizontal" else x[expected]
            assert np.array_equal(xs, flipped) and xs.flags.c_contiguous
        assert p.transform_of(k) == transforms[k]


# --------------------------------------------------------------------------- errors


def one_line_error(sc: Scenario, ds: Dataset, field: str) -> str:
    with pytest.raises(PartitionError) as info:
        build_partition(sc, ds, WHERE)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{WHERE}.{field}: "), message
    return message


def test_impossible_requests_raise_one_line():
    ds = digits()
    n = len(ds.pool_labels("all"))
    assert str(n) in one_line_error(scenario(n + 1), ds, "clients")
    message = one_line_error(scenario(1000, {"kind": "iid"}, {"kind": "quantity", "min": 50, "max": 60}),
                             ds, "partition[1].min")
    assert message == f"{WHERE}.partition[1].min: 1000 clients × 50 samples needs 50000, pool has {n}"
    one_line_error(scenario(20, {"kind": "quantity", "min": 10, "max": 1000}), ds, "partition[0].max")
    one_line_error(scenario(500, {"kind": "dirichlet", "alpha": 0.3, "min_size": 50}), ds,
                   "partition[0].min_size")
    one_line_error(scenario(5, {"kind": "dirichlet", "alpha": 0.3, "min_size": 30},
                            {"kind": "quantity", "min": 10, "max": 40}), ds, "partition[0].min_size")
    one_line_error(scenario(10, {"kind": "pathological", "labels_per_client": 11}), ds,
                   "partition[0].labels_per_client")
    one_line_error(scenario(10, {"kind": "pathological", "labels_per_client": 3},
                            {"kind": "quantity", "min": 2, "max": 9}), ds, "partition[1].min")
    one_line_error(scenario(10, {"kind": "natural"}), ds, "partition[0].kind")
    tabular = fake_dataset(random_labels(100, 3), 3, image=False)
    one_line_error(scenario(4, {"kind": "rotation", "groups": 2}), tabular, "partition[0].kind")
    one_line_error(scenario(4, {"kind": "iid"}, {"kind": "flip", "groups": 2}), tabular, "partition[1].kind")
    one_line_error(scenario(8, {"kind": "label_swap", "groups": 7}), tabular, "partition[0].groups")
    tiny = fake_dataset(np.array([0, 0, 1, 1, 1, 1, 1, 1]), 2)
    one_line_error(scenario(6, {"kind": "pathological", "labels_per_client": 1}), tiny,
                   "partition[0].labels_per_client")
    lopsided = fake_dataset(np.repeat([0, 1], [10, 100]), 2)
    one_line_error(scenario(4, {"kind": "pathological", "labels_per_client": 1},
                            {"kind": "quantity", "min": 20, "max": 20}), lopsided, "partition[1].max")


def test_natural_needs_one_client_per_device():
    sources = np.repeat(np.arange(5), 20)
    ds = fake_dataset(random_labels(100, 3), 3, image=False, sources=sources)
    message = one_line_error(scenario(4, {"kind": "natural"}), ds, "clients")
    assert "5" in message
    check_invariants(build_partition(scenario(5, {"kind": "natural"}), ds, WHERE), ds,
                     scenario(5, {"kind": "natural"}))


# --------------------------------------------------------------------------- apply_transform


images = st.integers(1, 3).flatmap(lambda n: st.integers(2, 6).map(
    lambda s: np.random.default_rng(n * 10 + s).standard_normal((n, 2, s, s)).astype(np.float32)))


@FAST
@given(x=images)
def test_rotations(x):
    y = np.arange(len(x))
    turned, same_y = apply_transform(x, y, "rotate:90")
    assert np.array_equal(turned, np.rot90(x, 1, axes=(2, 3))) and same_y is y
    assert np.array_equal(apply_transform(x, y, "rotate:360")[0], x)
    assert np.array_equal(apply_transform(x, y, "rotate:0")[0], x)
    assert np.array_equal(apply_transform(x, y, "rotate:-90")[0], apply_transform(x, y, "rotate:270")[0])
    four = x
    for _ in range(4):
        four = apply_transform(four, y, "rotate:90")[0]
    assert np.array_equal(four, x)
    assert turned.dtype == x.dtype and turned.flags.c_contiguous


def test_free_angle_rotation_turns_like_rot90():
    x = np.random.default_rng(0).standard_normal((2, 1, 9, 9)).astype(np.float32)
    y = np.zeros(2, dtype=np.int64)
    almost, _ = apply_transform(x, y, "rotate:89.99999")
    assert almost.shape == x.shape and almost.dtype == x.dtype
    np.testing.assert_allclose(almost, np.rot90(x, 1, axes=(2, 3)), atol=1e-3)
    half, _ = apply_transform(x, y, "rotate:45")
    assert half.shape == x.shape


@FAST
@given(x=images, axis=st.sampled_from(["none", "horizontal", "vertical", "both"]))
def test_flips(x, axis):
    y = np.arange(len(x))
    once, _ = apply_transform(x, y, f"flip:{axis}")
    expected = {"none": x, "horizontal": x[..., ::-1], "vertical": x[..., ::-1, :], "both": x[..., ::-1, ::-1]}
    assert np.array_equal(once, expected[axis])
    assert np.array_equal(apply_transform(once, y, f"flip:{axis}")[0], x)


def test_label_mapping_and_identity():
    x = np.zeros((4, 3))
    y = np.array([0, 1, 2, 2])
    mapped_x, mapped = apply_transform(x, y, "labels:2-0-1")
    assert mapped_x is x and mapped.tolist() == [2, 0, 1, 1]
    assert apply_transform(x, y, "none")[1] is y
    with pytest.raises(ValueError):
        apply_transform(x, y, "shear:3")


@pytest.mark.parametrize("pairs", [1, 2, 5])
def test_label_swap_pairs_swap_disjoint_pairs(pairs):
    """`pairs: n` (Sattler et al.'s CFL setting): group 0 keeps the labels, every other group
    swaps exactly n disjoint label pairs, each group its own, the same for the same seed."""
    from cflpipe.partition.groups import _pair_swaps

    draw = _pair_swaps(10, 6, pairs, np.random.default_rng(3), "f", "digits")
    assert draw.shape == (6, 10) and (draw[0] == np.arange(10)).all()
    for permutation in draw[1:]:
        moved = np.nonzero(permutation != np.arange(10))[0]
        assert len(moved) == 2 * pairs
        assert (permutation[permutation] == np.arange(10)).all()  # swaps: an involution
    assert len({tuple(p) for p in draw}) == 6
    assert (draw == _pair_swaps(10, 6, pairs, np.random.default_rng(3), "f", "digits")).all()


def test_label_swap_pairs_count_the_distinct_swaps():
    from cflpipe.errors import PartitionError
    from cflpipe.partition.groups import _pair_swaps

    assert len(_pair_swaps(4, 4, 1, np.random.default_rng(0), "f", "d")) == 4  # 6 single swaps of 4 labels
    with pytest.raises(PartitionError, match=r"f.groups: with 2 swapped pair\(s\) of 4 classes there are 3 "
                                             r"distinct swaps, so at most 4 groups, got 5"):
        _pair_swaps(4, 5, 2, np.random.default_rng(0), "f", "d")


def test_pathological_label_sets_cyclic_or_random():
    labels = random_labels(6000, 10)
    ds = fake_dataset(labels, 10)
    sets = {}
    for kind in ("cyclic", "random"):
        sc = scenario(100, {"kind": "pathological", "labels_per_client": 3, "label_sets": kind})
        p = build_partition(sc, ds)
        check_invariants(p, ds, sc)
        held = p.stats[[f"label_{k}" for k in range(10)]].to_numpy() > 0
        assert (held.sum(axis=1) == 3).all()
        sets[kind] = {tuple(np.flatnonzero(row)) for row in held}
        assert build_partition(sc, ds).clients.equals(p.clients)  # seeded
    assert len(sets["cyclic"]) <= 10 < len(sets["random"])  # random draws repeat only by chance
    # the default keeps the partitions (and their fingerprints) written before the option existed
    default = scenario(10, {"kind": "pathological", "labels_per_client": 2})
    assert "label_sets" not in default.definition()["partition"][0]
    assert build_partition(default, ds).clients.equals(
        build_partition(scenario(10, {"kind": "pathological", "labels_per_client": 2, "label_sets": "cyclic"}),
                        ds).clients)


def test_pathological_sizes_top_up_from_the_clients_other_labels():
    """A client whose share of one label exceeds what is left of it takes the rest from its other
    labels; one sample per (client, label) slot stays reserved for clients that fill later."""
    from types import SimpleNamespace

    from cflpipe.partition.splits import _fill_pathological

    quantity = (1, SimpleNamespace(min=2))
    # One client, labels 0 (2 samples) and 1 (20): 5 + 5 wanted, label 0 runs out at 2.
    counts = np.zeros((1, 2), dtype=np.int64)
    _fill_pathological(counts, np.array([[0, 1]]), np.array([10]), np.array([1, 19]), quantity,
                       np.random.default_rng(0), "s.partition[0]", "scenarios.s")
    assert counts.tolist() == [[2, 8]]
    # An uneven size splits as evenly as it can: 10 over 3 labels is 4 + 3 + 3.
    counts = np.zeros((1, 3), dtype=np.int64)
    _fill_pathological(counts, np.array([[0, 1, 2]]), np.array([10]), np.array([9, 9, 9]), (1, SimpleNamespace(min=3)),
                       np.random.default_rng(0), "s.partition[0]", "scenarios.s")
    assert counts.tolist() == [[4, 3, 3]]
    # Two clients share labels 0 (3 samples) and 1 (30); whoever fills first leaves the other its
    # reserved sample of label 0, and both get their full size.
    for seed in range(4):
        counts = np.zeros((2, 2), dtype=np.int64)
        _fill_pathological(counts, np.array([[0, 1], [0, 1]]), np.array([12, 12]), np.array([1, 28]), quantity,
                           np.random.default_rng(seed), "s.partition[0]", "scenarios.s")
        assert counts.sum(axis=1).tolist() == [12, 12] and (counts >= 1).all()
        assert counts[:, 0].sum() == 3 and counts[:, 1].sum() == 21


# --------------------------------------------------------------------------- edges of the splits


def image_dataset(labels: np.ndarray, num_classes: int, height: int, width: int) -> Dataset:
    x = np.zeros((len(labels), 1, height, width), dtype=np.float32)
    y = np.asarray(labels, dtype=np.int64)
    return Dataset("fake", x, y, x[:0], y[:0], num_classes)


@pytest.mark.parametrize("steps", [
    [{"kind": "iid"}],
    [{"kind": "quantity", "min": 1, "max": 1}],  # no label split: iid
    [{"kind": "dirichlet", "alpha": 0.5, "min_size": 0}],  # min_size 0 is treated as 1, not more
    [{"kind": "dirichlet", "alpha": 0.5, "min_size": 1}, {"kind": "quantity", "min": 1, "max": 1}],
    [{"kind": "pathological", "labels_per_client": 1}],  # each label has exactly as many samples as holders
], ids=["iid", "quantity", "dirichlet", "dirichlet-quantity", "pathological"])
def test_a_pool_of_exactly_one_sample_per_client_gives_each_client_one(steps):
    # Every bound is inclusive: clients == pool size, clients × min_size == pool size, a quantity
    # that uses the whole pool and a min_size equal to the quantity min are all possible.
    ds = fake_dataset(np.array([0, 1, 2, 0, 1, 2]), 3)
    sc = scenario(6, *steps)
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    assert sorted(p.clients["sample"]) == list(range(6))
    assert p.stats["n_train"].tolist() == [1] * 6 and p.stats["n_test"].tolist() == [0] * 6


def test_quantity_leaves_the_rest_of_the_pool_unused():
    ds = fake_dataset(random_labels(40, 4), 4)
    sc = scenario(4, {"kind": "iid"}, {"kind": "quantity", "min": 3, "max": 5})
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    sizes = sizes_of(p)
    assert ((sizes >= 3) & (sizes <= 5)).all() and len(p.clients) == sizes.sum() < 40


def test_random_label_sets_take_their_sizes_from_quantity():
    ds = fake_dataset(random_labels(600, 5), 5)
    sc = scenario(10, {"kind": "pathological", "labels_per_client": 2, "label_sets": "random"},
                  {"kind": "quantity", "min": 20, "max": 30})
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    sizes = sizes_of(p)
    assert ((sizes >= 20) & (sizes <= 30)).all()
    held = p.stats[[f"label_{k}" for k in range(5)]].to_numpy() > 0
    assert (held.sum(axis=1) == 2).all()


def test_labels_outside_the_classes_are_refused():
    # A dataset (a user's own files, a plugin) whose labels do not fit its num_classes.
    for labels in ([0, 1, 3, 1], [-1, 0, 1, 2]):
        ds = fake_dataset(np.array(labels), 3)
        assert "dataset fake must lie in [0, 3)" in one_line_error(scenario(2), ds, "dataset")


def test_only_odd_multiples_of_90_are_refused_on_non_square_images():
    wide = image_dataset(random_labels(40, 2), 2, 4, 6)
    for angles in ([0, 90], [270, 0]):
        message = one_line_error(scenario(4, {"kind": "rotation", "groups": 2, "angles": angles}), wide,
                                 "partition[0].angles")
        assert f"rotating 4x6 images by {max(angles)} " in message
    # Half turns keep the shape; free angles rotate inside the frame (reshape=False).
    sc = scenario(4, {"kind": "rotation", "groups": 4, "angles": [0, 180, 22.5, 135]})
    p = build_partition(sc, wide, WHERE)
    check_invariants(p, wide, sc)
    # The recorded string is what apply_transform turns by: 22.5 must not become 22.
    assert sorted(p.stats["transform"]) == ["rotate:0", "rotate:135", "rotate:180", "rotate:22.5"]


def test_label_swap_pairs_through_a_scenario():
    ds = digits()
    sc = scenario(9, {"kind": "iid"}, {"kind": "label_swap", "groups": 3, "pairs": 2})
    p = build_partition(sc, ds, WHERE)
    check_invariants(p, ds, sc)
    assert p.groups == 3
    perms = {g: np.array([int(v) for v in t.removeprefix("labels:").split("-")])
             for g, t in p.stats.groupby("group")["transform"].first().items()}
    assert (perms[0] == np.arange(10)).all()
    for g in (1, 2):
        assert (perms[g] != np.arange(10)).sum() == 4 and (perms[g][perms[g]] == np.arange(10)).all()
    assert not (perms[1] == perms[2]).all()
    table = p.clients
    pool = ds.pool_labels("all")[table["sample"]]
    assert (table["label"].to_numpy() == [perms[g][y] for g, y in zip(table["group"], pool)]).all()


def test_pair_swaps_reach_every_distinct_swap_and_count_them():
    from cflpipe.partition.groups import _pair_swaps

    # 4 labels have exactly 3 double swaps: all of them fit, one group more does not.
    draw = _pair_swaps(4, 4, 2, np.random.default_rng(0), "f", "d")
    assert {tuple(row) for row in draw} == {(0, 1, 2, 3), (1, 0, 3, 2), (2, 3, 0, 1), (3, 2, 1, 0)}
    with pytest.raises(PartitionError, match=r"at most 4 groups, got 5"):
        _pair_swaps(4, 5, 2, np.random.default_rng(0), "f", "d")
    # Triple swaps of 6 labels: 6! / (2³ · 3!) = 15 (2 · 3 in place of 2³ would say 20).
    assert len({tuple(row) for row in _pair_swaps(6, 16, 3, np.random.default_rng(0), "f", "d")}) == 16
    with pytest.raises(PartitionError, match=r"there are 15 distinct swaps, so at most 16 groups, got 22"):
        _pair_swaps(6, 22, 3, np.random.default_rng(0), "f", "d")


def test_error_messages_name_the_dataset_and_the_related_step():
    ds = digits()
    message = one_line_error(scenario(5, {"kind": "dirichlet", "alpha": 0.3, "min_size": 30},
                                      {"kind": "quantity", "min": 10, "max": 40}), ds, "partition[0].min_size")
    assert f"from {WHERE}.partition[1] (quantity min 10)" in message
    assert "dataset digits" in one_line_error(scenario(10, {"kind": "pathological", "labels_per_client": 11}),
                                              ds, "partition[0].labels_per_client")
    assert "dataset digits has no natural split" in one_line_error(scenario(10, {"kind": "natural"}), ds,
                                                                   "partition[0].kind")
    message = one_line_error(scenario(10, {"kind": "pathological", "labels_per_client": 3},
                                      {"kind": "quantity", "min": 2, "max": 9}), ds, "partition[1].min")
    assert f"({WHERE}.partition[0].labels_per_client)" in message
    tabular = fake_dataset(random_labels(100, 3), 3, image=False)
    assert "dataset fake has 3 classes" in one_line_error(scenario(8, {"kind": "label_swap", "groups": 7}),
                                                          tabular, "partition[0].groups")
    assert "dataset fake has 3 classes, so at most 1 disjoint label pairs, got 2" in one_line_error(
        scenario(8, {"kind": "label_swap", "groups": 2, "pairs": 2}), tabular, "partition[0].pairs")
    tiny = fake_dataset(np.array([0, 0, 1, 1, 1, 1, 1, 1]), 2)
    assert "label 0 has 2 samples but 3 clients hold it" in one_line_error(
        scenario(6, {"kind": "pathological", "labels_per_client": 1}), tiny, "partition[0].labels_per_client")
    random_sets = {"kind": "pathological", "labels_per_client": 2, "label_sets": "random"}
    one_line_error(scenario(6, random_sets), tiny, "partition[0].labels_per_client")
    one_line_error(scenario(2, random_sets, {"kind": "quantity", "min": 1, "max": 3}), tiny, "partition[1].min")
    # A label of 10 samples cannot give its one holder 11.
    lopsided = fake_dataset(np.repeat([0, 1], [10, 100]), 2)
    one_line_error(scenario(2, {"kind": "pathological", "labels_per_client": 1},
                            {"kind": "quantity", "min": 11, "max": 11}), lopsided, "partition[1].max")


def test_natural_split_with_the_datasets_own_test_split():
    sources_train, sources_test = np.array([0, 0, 1, 1, 1, 2, 2]), np.array([0, 1, 2])
    x = np.zeros((10, 3), dtype=np.float32)
    y = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    ds = Dataset("fake", x[:7], y[:7], x[7:], y[7:], 2, source_train=sources_train, source_test=sources_test)
    sc = scenario(3, {"kind": "natural", "holdout": "dataset"})
    p = build_partition(sc, ds, WHERE)
    # Each device's test rows are exactly its samples of the test split (pool index 7 on).
    table = p.clients
    assert ((table["split"] == "test") == (table["sample"] >= 7)).all()
    assert p.stats["n_train"].tolist() == [2, 3, 2] and p.stats["n_test"].tolist() == [1, 1, 1]
    # pool: train deals only the train split's samples to the devices.
    p = build_partition(scenario(3, {"kind": "natural"}, pool="train"), ds, WHERE)
    assert sorted(p.clients["sample"]) == list(range(7)) and sizes_of(p).tolist() == [2, 3, 2]


def test_assemble_refuses_a_client_without_samples():
    from cflpipe.partition import NO_TRANSFORM, _assemble

    # A regression in a split that left the last client empty must not become a silent 0-sample client.
    with pytest.raises(AssertionError, match="client 2 without samples"):
        _assemble(np.array([0, 1, 1]), np.array([0, 1, 2]), np.zeros(3, bool), np.full(3, -1),
                  np.array([NO_TRANSFORM], dtype=object), np.array([0, 1, 0]), 2, 0)


@pytest.mark.parametrize("sizes, expected", [
    ([6, 2, 1], [5, 2, 2]),  # one sample from the largest to the one below min_size
    ([3, 5, 0], [3, 3, 2]),  # donors cut to a common level 3; a client at that level gives nothing
])
def test_repair_min_size_moves_the_deficit_from_the_largest_clients(sizes, expected):
    from cflpipe.partition.splits import _repair_min_size

    before = np.concatenate([np.repeat(np.arange(3), sizes), [-1, -1]])  # two samples unused
    owner = before.copy()
    _repair_min_size(owner, 3, 2, np.random.default_rng(0))
    assert np.bincount(owner[owner >= 0], minlength=3).tolist() == expected
    moved = owner != before
    assert (owner[-2:] == -1).all()  # unused samples stay unused
    gained = np.asarray(expected) > np.asarray(sizes)
    assert gained[owner[moved]].all() and not gained[before[moved]].any()


def test_label_pools_keep_the_shuffle_order_within_each_class():
    from cflpipe.partition.splits import _label_pools

    # A stable sort of the shuffled indices: the pools depend on the seed alone, not on which
    # sorting algorithm numpy picks on this CPU.
    labels = np.random.default_rng(0).integers(0, 4, 300)
    pools = _label_pools(labels, 4, np.random.default_rng(5))
    order = np.random.default_rng(5).permutation(300)
    for c in range(4):
        assert pools[c].tolist() == order[labels[order] == c].tolist()


def test_labelwise_dirichlet_gives_the_last_client_its_share():
    # alpha 100 is close to uniform: each of 5 clients gets about a fifth of every class.
    ds = fake_dataset(random_labels(1000, 4), 4)
    p = build_partition(scenario(5, {"kind": "dirichlet", "alpha": 100.0}), ds, WHERE)
    assert sizes_of(p).min() > 150


def test_clientwise_dirichlet_spreads_a_runout_labels_share_by_the_clients_proportions():
    from cflpipe.partition.splits import _split_dirichlet_clientwise

    # alpha 1000: one client wants about a third of each label; label 0 runs out at 10, and
    # what it misses is spread evenly over labels 1 and 2 (not piled on the last one).
    labels = np.repeat([0, 1, 2], [10, 500, 500])
    owner = np.full(len(labels), -1)
    _split_dirichlet_clientwise(owner, labels, 3, np.array([600]), 1000.0, np.random.default_rng(0))
    counts = np.bincount(labels[owner == 0], minlength=3)
    assert counts[0] == 10 and counts.sum() == 600 and abs(int(counts[1]) - int(counts[2])) < 30
    # A label's last sample is drawn by the proportions like any other (not left to a fallback):
    # labels 0 and 1 hold one sample each and a client of size 2 wants a third of each.
    labels = np.repeat([0, 1, 2], [1, 1, 50])
    taken = set()
    for seed in range(10):
        owner = np.full(len(labels), -1)
        _split_dirichlet_clientwise(owner, labels, 3, np.array([2]), 1000.0, np.random.default_rng(seed))
        taken |= set(labels[owner == 0].tolist())
    assert {0, 1} <= taken


def test_pathological_fill_tops_up_exactly_and_splits_the_rest_evenly():
    from types import SimpleNamespace

    from cflpipe.partition.splits import _fill_pathological

    def fill(size, spare):
        counts = np.zeros((1, len(spare)), dtype=np.int64)
        _fill_pathological(counts, np.arange(len(spare))[None], np.array([size]), np.array(spare),
                           (1, SimpleNamespace(min=len(spare))), np.random.default_rng(0), "s.partition[0]",
                           "scenarios.s")
        return counts[0].tolist()

    # 3 + 3 wanted, label 0 has 2: the one missing sample is the last one label 1 has.
    assert fill(6, [1, 3]) == [2, 4]
    # 4 + 3 + 3 wanted, label 0 has 1: the 3 missing go 2 + 1 to labels 1 and 2, first label first.
    assert fill(10, [0, 9, 9]) == [1, 5, 4]


def test_few_class_label_permutations_are_distinct_non_identity_draws_of_every_permutation():
    # Datasets of few classes (CelebA's 2, a user's 3-class files) take the enumerating branch:
    # group 0 keeps the labels, the others are distinct permutations, drawn by the seed.
    from cflpipe.partition.groups import _label_permutations

    three = _label_permutations(3, 6, np.random.default_rng(0), "f", "d")
    assert three.shape == (6, 3) and tuple(three[0]) == (0, 1, 2)
    assert {tuple(row) for row in three} == set(itertools.permutations(range(3)))  # all 3! of them
    draws = {tuple(map(tuple, _label_permutations(4, 3, np.random.default_rng(s), "f", "d"))) for s in range(8)}
    assert len(draws) > 1  # the seed picks which permutations
    for draw in draws:
        assert draw[0] == (0, 1, 2, 3) and len(set(draw)) == 3
        assert all(sorted(row) == [0, 1, 2, 3] for row in draw)
    assert tuple(_label_permutations(2, 2, np.random.default_rng(0), "f", "d")[1]) == (1, 0)
    with pytest.raises(PartitionError, match="at most 2 distinct label permutations, got 3"):
        _label_permutations(2, 3, np.random.default_rng(0), "f", "d")
