"""From a scenario to the clients' tensors: the transforms a partition records, the hold-out and
public draws, the partition's files, the checks that keep a stale partition from being trained on,
and the federated data built from them. Small inputs built here, no training."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from cflpipe.data.base import Dataset
from cflpipe.errors import PartitionError
from cflpipe.fl.data import (
    DIGESTS,
    FederatedData,
    SplitData,
    _channel_std,
    _fingerprint,
    _standardizer,
    build_federated_data,
    gather_pool_rows,
    partition_scenario,
)
from cflpipe.partition import (
    PUBLIC_FILE,
    _holdout,
    _pool_sources,
    _public_samples,
    apply_transform,
    build_partition,
    load_partition,
    write_partition,
)
from cflpipe.spec import Scenario, parse_spec

torch.set_num_threads(1)

TABLE_COLUMNS = {"clients.parquet": ["client", "split", "sample", "group", "transform", "label"],
                 "stats.parquet": ["client", "group", "transform", "n_train", "n_test", "label_0", "label_1"]}


def dataset(n_train: int = 40, n_test: int = 10, sources: bool = False) -> Dataset:
    rng = np.random.default_rng(0)
    x = rng.random((n_train + n_test, 1, 4, 4), dtype=np.float32)
    y = np.arange(n_train + n_test) % 2
    source = np.arange(n_train + n_test) % 4 if sources else None
    return Dataset("fake", x[:n_train], y[:n_train], x[n_train:], y[n_train:], 2,
                   source_train=None if source is None else source[:n_train],
                   source_test=None if source is None else source[n_train:])


def files_spec(tmp_path, params: dict | None = None, **scenario):
    """A spec over a user's .npz file (the one dataset whose file is digested into the partition's
    fingerprint); `params` in the order given."""
    path = tmp_path / "mine.npz"
    if not path.exists():
        rng = np.random.default_rng(1)
        np.savez(path, x_train=rng.random((40, 1, 4, 4), dtype=np.float32), y_train=np.arange(40) % 2,
                 x_test=rng.random((10, 1, 4, 4), dtype=np.float32), y_test=np.arange(10) % 2)
    return parse_spec({
        "seeds": [0], "results_dir": str(tmp_path / "results"),
        "training": {"model": "mlp", "rounds": 1, "clients_per_round": 2, "local_steps": 1, "device": "cpu"},
        "scenarios": {"s": {"dataset": {"name": "files", **(params or {"path": str(path)})}, "clients": 4,
                            "partition": [{"kind": "iid"}], **scenario}},
        "methods": {"fedavg": {}}})


# --------------------------------------------------------------------------- transforms


def test_free_angle_rotation_turns_a_ramp_by_exactly_that_angle():
    # Bilinear interpolation reproduces a linear image exactly, so the centre of a turned ramp is
    # known by hand: rotate:θ maps j - c to cos θ (j - c) - sin θ (i - c) (rotate:90 gives c - i,
    # as np.rot90). 45° must not be taken for a quarter turn, nor 91° for 90°.
    n, c = 9, 4
    i, j = np.mgrid[0:n, 0:n]
    ramp = (j - c).astype(np.float32)[None, None]
    centre = (slice(None), slice(None), slice(2, 7), slice(2, 7))  # its sources lie inside the image
    for angle in (45, 91, 135):
        theta = np.deg2rad(angle)
        expected = (np.cos(theta) * (j - c) - np.sin(theta) * (i - c))[None, None]
        turned, _ = apply_transform(ramp, np.zeros(1, dtype=np.int64), f"rotate:{angle}")
        np.testing.assert_allclose(turned[centre], expected[centre], atol=1e-5)


def test_free_angle_rotation_keeps_the_pixel_range_and_pads_with_black():
    # Bilinear weights are a convex combination: a [0, 1] image stays in [0, 1] (a spline of higher
    # order overshoots), and what comes from outside the image is 0, the images' background.
    x = np.random.default_rng(2).random((3, 1, 9, 9), dtype=np.float32)
    turned, _ = apply_transform(x, np.zeros(3, dtype=np.int64), "rotate:45")
    assert turned.min() >= 0 and turned.max() <= x.max()
    corners = turned[:, :, [0, 0, -1, -1], [0, -1, 0, -1]]
    assert (corners == 0).all()


# --------------------------------------------------------------------------- hold-out and public draw


def test_holdout_keeps_a_sample_on_each_side_of_every_client_with_two():
    # clients of 1, 2, 3 and 10 samples: one sample trains, never tests; from two on at least one
    # is held out and at least one trains, otherwise round(test_fraction * n)
    client = np.repeat(np.arange(4), [1, 2, 3, 10])
    for fraction, expected in ((0.2, [0, 1, 1, 2]), (0.9, [0, 1, 2, 9])):
        is_test = _holdout(client, 4, fraction, np.random.default_rng(0))
        assert np.bincount(client[is_test], minlength=4).tolist() == expected


def test_public_samples_are_distinct_and_default_to_the_whole_test_split():
    ds = dataset(n_test=10)

    def draw(**public):
        sc = Scenario(dataset={"name": "digits"}, clients=2, pool="train", public=public)
        return _public_samples(sc, ds, np.random.default_rng(0), "scenarios.s")

    assert draw().tolist() == list(range(10))
    assert draw(size=10).tolist() == list(range(10))  # all of it, asked for by size
    some = draw(size=4)
    assert len(set(some.tolist())) == 4 and (np.diff(some) > 0).all() and some.max() < 10


def test_pool_sources_are_those_of_the_datasets_pool():
    # natural partitions read the devices without concatenating the inputs: the same as
    # Dataset.pool, also for a dataset that records devices of one split only (no devices then)
    with_sources, without = dataset(sources=True), dataset()
    one_sided = Dataset("fake", without.x_train, without.y_train, without.x_test, without.y_test, 2,
                        source_train=np.zeros(40, dtype=np.int64))
    for ds in (with_sources, without, one_sided):
        for pool in ("train", "all"):
            expected = ds.pool(pool)[2]
            got = _pool_sources(ds, pool)
            assert (got is None) == (expected is None)
            if expected is not None:
                assert np.array_equal(got, expected)


# --------------------------------------------------------------------------- partition files


def test_partition_files_hold_their_documented_columns_and_a_stale_public_file_goes(tmp_path):
    ds = dataset()
    with_public = build_partition(Scenario(dataset={"name": "digits"}, clients=4, pool="train",
                                           public={"size": 3}), ds)
    write_partition(with_public, tmp_path)
    for name, columns in TABLE_COLUMNS.items():
        assert pq.read_schema(tmp_path / name).names == columns  # no pandas index column
    assert pq.read_schema(tmp_path / PUBLIC_FILE).names == ["sample"]
    assert np.array_equal(load_partition(tmp_path).public, with_public.public)
    # the scenario loses `public:`: the old public file would otherwise be read as this partition's
    write_partition(build_partition(Scenario(dataset={"name": "digits"}, clients=4, pool="train"), ds), tmp_path)
    assert not (tmp_path / PUBLIC_FILE).exists()
    # the picture is for people: a partition without it still loads
    (tmp_path / "label_hist.png").unlink()
    assert load_partition(tmp_path).public is None


# --------------------------------------------------------------------------- federated data


def test_client_gives_train_rows_by_default_and_test_rows_when_asked():
    def split(values: list[int], sizes: list[int]) -> SplitData:
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        return SplitData(torch.tensor(values, dtype=torch.float32)[:, None], torch.tensor(values),
                         offsets, torch.from_numpy(np.repeat(np.arange(len(sizes)), sizes)))

    data = FederatedData(split([0, 1, 2, 3, 4], [3, 2]), split([10, 11, 12], [1, 2]), np.array([-1, -1]), 2,
                         (1,), ["none", "none"])
    assert data.client(1)[1].tolist() == [3, 4]
    assert data.client(1, "train")[1].tolist() == [3, 4]
    assert data.client(1, "test")[1].tolist() == [11, 12]


def test_standardized_images_stay_float32():
    # float32 statistics: a float64 copy of the whole pool would double its memory
    ds = dataset()
    standardized = _standardizer(ds)(ds.x_train)
    assert standardized.dtype == np.float32
    np.testing.assert_allclose(standardized.mean(), 0, atol=1e-5)


def test_channel_std_in_chunks_is_numpys_std():
    x = (np.random.default_rng(3).random((1000, 3, 5, 5), dtype=np.float32) * 255)
    mean = x.mean(axis=(0, 2, 3), dtype=np.float64)[None, :, None, None]
    np.testing.assert_allclose(_channel_std(x, mean, rows_at_once=64), x.std(axis=(0, 2, 3), dtype=np.float64),
                               rtol=1e-12)


def test_pool_rows_gather_from_both_splits_in_order():
    ds = Dataset("d", np.arange(5, dtype=np.float32)[:, None], np.zeros(5, dtype=np.int64),
                 np.arange(10, 13, dtype=np.float32)[:, None], np.zeros(3, dtype=np.int64), 2)
    rows = np.array([6, 0, 7, 4, 5])
    assert ds.pool_rows("all", rows)[:, 0].tolist() == ds.pool("all")[0][rows][:, 0].tolist() == [11, 0, 12, 4, 10]
    assert ds.pool_rows("train", np.array([3, 1]))[:, 0].tolist() == [3, 1]


@pytest.mark.parametrize("pool", ["all", "train"])
def test_gathering_in_pool_order_gives_pool_rows_in_any_order_and_chunking(pool, monkeypatch):
    import cflpipe.fl.data as fl_data

    ds = dataset(n_train=37, n_test=11)
    size = 48 if pool == "all" else 37
    rows = np.random.default_rng(3).integers(0, size, 90)  # repeated rows too, unsorted
    for chunk_rows in (1, 5, 1000):
        monkeypatch.setattr(fl_data, "_POOL_CHUNK_BYTES", chunk_rows * ds.x_train[:1].nbytes)
        out = np.full((len(rows), *ds.input_shape), np.nan, dtype=np.float32)
        gather_pool_rows(ds, pool, rows, out)
        assert np.array_equal(out, ds.pool_rows(pool, rows))


def test_a_stored_npz_is_read_through_a_memory_map_with_the_same_values(tmp_path):
    from cflpipe.data.files import _read_npz

    rng = np.random.default_rng(2)
    arrays = {"x_train": rng.random((30, 3, 4, 4), dtype=np.float32), "y_train": np.arange(30) % 3,
              "x_test": np.asfortranarray(rng.random((9, 5))), "y_test": np.arange(9) % 3}
    np.savez(tmp_path / "stored.npz", **arrays)
    np.savez_compressed(tmp_path / "compressed.npz", **arrays)
    read, mapped = _read_npz(tmp_path / "stored.npz")
    assert len(mapped) == 1
    for name in ("x_train", "x_test"):
        assert not read[name].flags.writeable  # over the file: nothing may write into it
        assert read[name].dtype == arrays[name].dtype and np.array_equal(read[name], arrays[name])
    assert np.array_equal(read["y_train"], arrays["y_train"])
    read, mapped = _read_npz(tmp_path / "compressed.npz")
    assert mapped == () and all(np.array_equal(read[k], v) for k, v in arrays.items())


def test_a_mapped_dataset_builds_the_clients_an_in_memory_one_builds(tmp_path):
    """The same file stored and compressed: the same client tensors to the bit (the same
    values through the same arithmetic), the stored one read through its memory map."""
    built = {}
    for save in (np.savez, np.savez_compressed):
        folder = tmp_path / save.__name__
        folder.mkdir()
        rng = np.random.default_rng(1)
        save(folder / "mine.npz", x_train=rng.random((40, 3, 4, 4), dtype=np.float32), y_train=np.arange(40) % 2,
             x_test=rng.random((10, 3, 4, 4), dtype=np.float32), y_test=np.arange(10) % 2)
        spec = files_spec(folder, {"path": str(folder / "mine.npz")},
                          partition=[{"kind": "dirichlet", "alpha": 0.5}, {"kind": "rotation", "groups": 2}])
        mapped = []
        release = Dataset.release_pages
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(Dataset, "release_pages", lambda self: (mapped.append(len(self.mapped)), release(self)))
            data = build_federated_data(spec, "s", torch.device("cpu"))
        assert mapped and set(mapped) == {1 if save is np.savez else 0}  # read through the map, or not
        built[save.__name__] = [t.numpy().copy() for split in (data.train, data.test) for t in (split.x, split.y)]
    assert all(np.array_equal(a, b) for a, b in zip(built["savez"], built["savez_compressed"]))


def test_a_damaged_or_foreign_stored_member_is_left_to_numpy(tmp_path):
    """A member whose header promises more rows than it holds, or whose bytes fail its CRC, is
    not mapped: np.load reads it, so the file is refused with one line as before."""
    from cflpipe.data.cache import mapped_inputs
    from cflpipe.data.files import FilesParams, load_files
    from cflpipe.errors import DataError

    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.random((1000, 3), dtype=np.float32), "y_train": np.arange(1000) % 2,
              "x_test": rng.random((4, 3), dtype=np.float32), "y_test": np.arange(4) % 2}
    np.savez(tmp_path / "good.npz", **arrays)
    assert set(mapped_inputs(tmp_path / "good.npz")[0]) == {"x_train", "x_test"}
    data = bytearray((tmp_path / "good.npz").read_bytes())
    at = data.index(arrays["x_train"].tobytes())
    flipped = bytearray(data)
    flipped[at + 10_000] ^= 0xFF  # a byte of x_train past what reading its header reads: its CRC fails
    (tmp_path / "flipped.npz").write_bytes(flipped)
    assert "x_train" not in mapped_inputs(tmp_path / "flipped.npz")[0]
    with pytest.raises(DataError, match="flipped.npz"):
        load_files(FilesParams(path=str(tmp_path / "flipped.npz")), tmp_path)
    import io
    import zipfile

    with zipfile.ZipFile(tmp_path / "longer.npz", "w") as archive:  # stored, each CRC right
        for name, array in ((k, v) for k, v in arrays.items() if k != "x_train"):
            member = io.BytesIO()
            np.save(member, array)
            archive.writestr(f"{name}.npy", member.getvalue())
        header = io.BytesIO()  # one row more than the member holds
        np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (1001, 3)})
        archive.writestr("x_train.npy", header.getvalue() + arrays["x_train"].tobytes())
    assert "x_train" not in mapped_inputs(tmp_path / "longer.npz")[0]
    with pytest.raises(DataError, match="longer.npz"):
        load_files(FilesParams(path=str(tmp_path / "longer.npz")), tmp_path)


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads this process's resident size from /proc")
def test_released_pages_of_a_read_mapping_leave_the_process(tmp_path):
    import mmap

    from cflpipe.data.base import release_pages

    def resident_mib() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * mmap.PAGESIZE / 2**20

    path = tmp_path / "data.bin"
    path.write_bytes(np.random.default_rng(0).bytes(96 << 20))
    with open(path, "rb") as raw:
        mapping = mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ)
    values = np.frombuffer(mapping, dtype=np.uint8)
    before = resident_mib()
    assert int(values[::mmap.PAGESIZE].sum()) >= 0  # touch every page
    read = resident_mib()
    release_pages((mapping,))
    released = resident_mib()
    assert read - before > 64 and read - released > 64
    assert np.array_equal(values[:8], np.frombuffer(path.read_bytes()[:8], dtype=np.uint8))  # read again
    del values
    mapping.close()


def test_federated_data_follows_the_written_partition(tmp_path):
    spec = files_spec(tmp_path)
    out = partition_scenario(spec, "s")
    data = build_federated_data(spec, "s", torch.device("cpu"))
    partition = load_partition(out)
    assert data.public is None  # no `public:`: nothing for the server
    assert data.transforms == ["none"] * 4
    assert data.train.sizes().tolist() == partition.stats["n_train"].tolist()
    # a table the digests list has gone: one line naming it, not a crash
    (out / "stats.parquet").unlink()
    with pytest.raises(PartitionError, match=r"stats\.parquet: missing"):
        build_federated_data(spec, "s", torch.device("cpu"))


def test_an_up_to_date_partition_is_left_alone_unless_forced(tmp_path):
    spec = files_spec(tmp_path)
    out = partition_scenario(spec, "s")
    # the digests cover the tables the clients' data is read from, not the picture
    assert [line.split("  ")[1] for line in (out / DIGESTS).read_text().splitlines()] == \
        ["clients.parquet", "stats.parquet"]
    # files are renamed into place when written: a new inode is a rewrite
    inode = (out / "clients.parquet").stat().st_ino
    assert partition_scenario(spec, "s") == out
    assert (out / "clients.parquet").stat().st_ino == inode
    partition_scenario(spec, "s", force=True)
    assert (out / "clients.parquet").stat().st_ino != inode


def test_the_fingerprint_follows_the_users_file_not_the_order_of_its_params(tmp_path):
    spec = files_spec(tmp_path)
    path = spec.scenarios["s"].dataset.params["path"]
    fingerprint = _fingerprint(spec, "s")
    # the same definition spelled in another order is the same partition
    reordered = files_spec(tmp_path, {"classes": 2, "path": path})
    assert _fingerprint(reordered, "s") == _fingerprint(files_spec(tmp_path, {"path": path, "classes": 2}), "s")
    # an edited file is another partition: the one written from the old file is refused
    partition_scenario(spec, "s")
    with np.load(path) as npz:
        arrays = dict(npz)
    arrays["y_train"] = 1 - arrays["y_train"]
    np.savez(path, **arrays)
    assert _fingerprint(spec, "s") != fingerprint
    assert str(path) in json.loads(_fingerprint(spec, "s"))["inputs_sha256"]
    with pytest.raises(PartitionError, match="built from a different definition"):
        build_federated_data(spec, "s", torch.device("cpu"))


def test_mnist1d_is_generated_offline_cached_and_leaves_the_global_random_state_alone(tmp_path):
    """MNIST-1D from the mnist1d package's generator: 40-point signals of ten balanced classes, the
    package's 80/20 split, the same arrays from the cache, and NumPy's and Python's global random
    state as they were (the generator seeds both)."""
    import random

    from cflpipe.data.base import load_dataset

    random.seed(3)
    np.random.seed(3)
    expected = (random.random(), np.random.rand())
    random.seed(3)
    np.random.seed(3)
    made = load_dataset("mnist1d", {"samples": 1000, "seed": 1}, tmp_path)
    assert (random.random(), np.random.rand()) == expected
    assert made.x_train.shape == (800, 40) and made.x_test.shape == (200, 40) and made.num_classes == 10
    assert made.x_train.dtype == np.float32 and not made.is_image
    assert np.bincount(np.concatenate([made.y_train, made.y_test])).tolist() == [100] * 10
    assert abs(float(np.concatenate([made.x_train, made.x_test]).std()) - 1.0) < 1e-3  # the package standardises
    assert list((tmp_path / "mnist1d").glob(".cache-*.npz"))
    cached = load_dataset("mnist1d", {"samples": 1000, "seed": 1}, tmp_path)
    assert np.array_equal(cached.x_train, made.x_train) and np.array_equal(cached.y_test, made.y_test)
    other = load_dataset("mnist1d", {"samples": 1000, "seed": 2}, tmp_path)
    assert not np.array_equal(other.x_train, made.x_train)


def test_large_leaf_synthetic_is_generated_into_a_released_file_map_with_the_same_values(tmp_path, monkeypatch):
    """Past embedded.MAPPED_BYTES LEAF Synthetic's inputs are written into a map of an unlinked
    temporary file, its pages let go: the same arrays to the bit and the same client tensors as
    in memory, and the written pages leave the process."""
    import mmap

    from cflpipe.data import embedded

    def resident_mib() -> float:
        return int(Path("/proc/self/statm").read_text().split()[1]) * mmap.PAGESIZE / 2**20

    import hashlib

    # The arrays of the generator before it wrote rows in place (concatenated, then split), as
    # recorded from that code at 25abf8e: the same bytes in memory and through the map.
    recorded = "fead8cefaaf7e346b956c6798b0414b1b03d288d857578b5878199cdb6428b3d"
    for limit in (embedded.MAPPED_BYTES, 0):
        monkeypatch.setattr(embedded, "MAPPED_BYTES", limit)
        old = embedded.generate_synthetic(embedded.SyntheticParams(devices=40, max_samples=60, seed=7,
                                                                   test_fraction=0.5))
        digest = hashlib.sha256()
        for name in ("x_train", "y_train", "x_test", "y_test", "source_train", "source_test"):
            digest.update(np.ascontiguousarray(getattr(old, name)).tobytes())
        assert digest.hexdigest() == recorded
    monkeypatch.setattr(embedded, "MAPPED_BYTES", 256 * 2**20)
    params = embedded.SyntheticParams(devices=30, max_samples=80, seed=4)
    kept = embedded.generate_synthetic(params)
    monkeypatch.setattr(embedded, "MAPPED_BYTES", 0)
    mapped = embedded.generate_synthetic(params)
    assert not kept.mapped and len(mapped.mapped) == 2
    for name in ("x_train", "y_train", "x_test", "y_test", "source_train", "source_test"):
        assert np.array_equal(getattr(kept, name), getattr(mapped, name)), name
    built = []
    for limit in (embedded.MAPPED_BYTES, 2**40):
        monkeypatch.setattr(embedded, "MAPPED_BYTES", limit)
        spec = parse_spec({"seeds": [0], "training": {"model": "mlp", "rounds": 1},
                           "scenarios": {"s": {"dataset": {"name": "synthetic", "devices": 30, "max_samples": 80,
                                                           "seed": 4},
                                               "clients": 30, "partition": [{"kind": "natural"}]}},
                           "methods": {"fedavg": {}}, "results_dir": str(tmp_path / str(limit)),
                           "data_dir": str(tmp_path / "data")})
        data = build_federated_data(spec, "s", torch.device("cpu"))
        built.append([t.numpy().copy() for split in (data.train, data.test) for t in (split.x, split.y)])
    assert all(np.array_equal(a, b) for a, b in zip(*built))
    monkeypatch.setattr(embedded, "MAPPED_BYTES", 0)
    before = resident_mib()
    big = embedded.generate_synthetic(embedded.SyntheticParams(devices=2000, max_samples=400, min_samples=380,
                                                                dimension=60, seed=1))
    assert big.x_train.nbytes > 120 * 2**20
    assert resident_mib() - before < 100  # written through the map, not held
