"""LEAF FEMNIST and CelebA from files in LEAF's real formats (written here), and datasets a user
brings as .npz or .parquet: natural clients, LEAF's own split, user selection, one-line errors,
and end-to-end training."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cflpipe.data import load_dataset
from cflpipe.errors import DataError, SpecError
from cflpipe.fl.engine import train_run
from cflpipe.partition import build_partition
from cflpipe.spec import parse_spec

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- LEAF fixtures


def leaf_json(users: dict[str, tuple[list, list]]) -> str:
    return json.dumps({"users": list(users), "num_samples": [len(y) for _, y in users.values()],
                       "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()}})


def write_femnist(folder: Path, sizes: list[int], files: int = 2, seed: int = 0, split: bool = False) -> dict:
    """LEAF FEMNIST JSON files: writer i has sizes[i] samples of 784 floats in [0, 1]."""
    rng = np.random.default_rng(seed)
    writers = {f"f{i:04d}_{i % 7:02d}": (rng.integers(0, 256, (n, 784)) / 255.0, rng.integers(0, 62, n))
               for i, n in enumerate(sizes)}
    names = list(writers)
    chunks = np.array_split(np.arange(len(names)), files)
    for k, chunk in enumerate(chunks):
        if split:  # LEAF's sample-level split: the first sample of each writer goes to test
            for part, rows in (("train", slice(1, None)), ("test", slice(0, 1))):
                (folder / part).mkdir(parents=True, exist_ok=True)
                (folder / part / f"all_data_{k}_niid_{part}.json").write_text(leaf_json(
                    {names[i]: (writers[names[i]][0][rows].tolist(), writers[names[i]][1][rows].tolist())
                     for i in chunk}))
        else:
            (folder / "all_data").mkdir(parents=True, exist_ok=True)
            (folder / "all_data" / f"all_data_{k}.json").write_text(leaf_json(
                {names[i]: (writers[names[i]][0].tolist(), writers[names[i]][1].tolist()) for i in chunk}))
    return writers


def write_celeba(folder: Path, sizes: list[int], seed: int = 0) -> dict:
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = folder / "raw" / "img_align_celeba"
    images.mkdir(parents=True)
    users, count = {}, 0
    for i, n in enumerate(sizes):
        names = []
        for _ in range(n):
            count += 1
            name = f"{count:06d}.jpg"
            Image.fromarray(rng.integers(0, 256, (218, 178, 3), dtype=np.uint8)).save(images / name)
            names.append(name)
        users[str(1000 + i)] = (names, rng.integers(0, 2, n).tolist())
    (folder / "all_data").mkdir(parents=True)
    (folder / "all_data" / "all_data.json").write_text(leaf_json(users))
    return users


def spec_with(tmp_path: Path, dataset: dict, clients: int, partition: list[dict], **scenario) -> object:
    return parse_spec({
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 2, "clients_per_round": 2, "local_steps": 2, "batch_size": 4,
                     "lr": 0.05, "eval_every": 2, "device": "cpu"},
        "scenarios": {"s": {"dataset": dataset, "clients": clients, "partition": partition, **scenario}},
        "methods": {"fedavg": {}},
        "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data"),
    })


# ---------------------------------------------------------------------- FEMNIST


def test_femnist_gives_one_client_per_writer(tmp_path):
    writers = write_femnist(tmp_path / "data" / "femnist", [5, 3, 8, 4], files=2)
    data = load_dataset("femnist", {}, tmp_path / "data")
    assert data.x_train.shape == (20, 1, 28, 28) and data.num_classes == 62 and len(data.y_test) == 0
    assert data.source_train.tolist() == [0] * 5 + [1] * 3 + [2] * 8 + [3] * 4
    first = writers[next(iter(writers))]
    assert np.allclose(data.x_train[0, 0].reshape(-1), first[0][0], atol=1e-6)
    assert data.y_train[:5].tolist() == first[1].tolist()
    spec = spec_with(tmp_path, "femnist", 4, [{"kind": "natural"}])
    partition = build_partition(spec.scenarios["s"], data)
    assert (partition.stats["n_train"] + partition.stats["n_test"]).tolist() == [5, 3, 8, 4]
    assert train_run(spec, "s", "fedavg", 0, progress=False).summary["clients"] == 4


@pytest.mark.parametrize("select, expected", [("first", [5, 3]), ("largest", [5, 8]), ("random", None)])
def test_femnist_keeps_the_chosen_users(tmp_path, select, expected):
    write_femnist(tmp_path / "femnist", [5, 3, 8, 4])
    data = load_dataset("femnist", {"users": 2, "select": select, "seed": 3}, tmp_path)
    sizes = np.bincount(data.source_train).tolist()
    if expected is not None:
        assert sizes == expected
    else:  # seeded: the same seed keeps the same writers, other seeds others
        kept = {seed: tuple(np.bincount(load_dataset("femnist", {"users": 2, "select": "random", "seed": seed},
                                                     tmp_path).source_train)) for seed in range(8)}
        assert len(set(kept.values())) > 1 and tuple(sizes) == kept[3]


def test_leafs_own_sample_split_is_kept_with_holdout_dataset(tmp_path):
    write_femnist(tmp_path / "data" / "femnist", [5, 3, 8, 4], split=True)
    spec = spec_with(tmp_path, "femnist", 4, [{"kind": "natural", "holdout": "dataset"}])
    data = load_dataset("femnist", {}, tmp_path / "data")
    partition = build_partition(spec.scenarios["s"], data)
    assert partition.stats["n_test"].tolist() == [1, 1, 1, 1]
    assert partition.stats["n_train"].tolist() == [4, 2, 7, 3]
    with pytest.raises(SpecError, match="holdout: dataset .* needs pool: all"):
        spec_with(tmp_path, "femnist", 4, [{"kind": "natural", "holdout": "dataset"}], pool="train")


def test_cflpipe_partition_and_download_on_the_command_line(tmp_path):
    write_femnist(tmp_path / "data" / "femnist", [5, 3, 8, 4])
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"seeds: [0]\nresults_dir: {tmp_path / 'results'}\ndata_dir: {tmp_path / 'data'}\n"
                    "training: {model: cnn, clients_per_round: 2}\n"
                    "scenarios:\n  writers: {dataset: femnist, clients: 4, partition: [{kind: natural}]}\n"
                    "methods: {fedavg: {}}\n")
    done = subprocess.run([sys.executable, "-m", "cflpipe", "partition", "--config", str(spec), "--scenario",
                           "writers"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    stats = pd.read_parquet(tmp_path / "results" / "partitions" / "writers" / "stats.parquet")
    assert len(stats) == 4
    refused = subprocess.run([sys.executable, "-m", "cflpipe", "download", "femnist", "--data-dir",
                              str(tmp_path / "data")], capture_output=True, text=True)
    assert refused.returncode == 3
    line, = refused.stderr.strip().splitlines()
    assert "no official archive with a stable checksum" in line and "github.com/TalwalkarLab/leaf" in line
    assert str(tmp_path / "data" / "femnist") in line


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.write_text("{\"users\": [\"a\""), "not a readable LEAF JSON file (JSONDecodeError"),
    (lambda p: p.write_text(json.dumps({"users": ["a"]})), "needs `users` (a list) and `user_data`"),
    (lambda p: p.write_text(leaf_json({"a": ([[0.5] * 10], [1])})), "user 'a': every x must be a list of 784"),
    (lambda p: p.write_text(leaf_json({"a": ([[0.5] * 784], [62])})), "user 'a': labels must be integers in 0..61"),
    (lambda p: p.write_text(leaf_json({"a": ([[float("nan")] * 784], [1])})), "user 'a': x holds NaN"),
    (lambda p: p.write_text(leaf_json({"a": ([[255.0] * 784], [1])})), "user 'a': pixels must lie in [0, 1]"),
])
def test_a_bad_leaf_file_is_one_line_naming_it(tmp_path, damage, message):
    write_femnist(tmp_path / "femnist", [2, 2], files=1)
    path = tmp_path / "femnist" / "all_data" / "all_data_0.json"
    damage(path)
    with pytest.raises(DataError) as info:
        load_dataset("femnist", {}, tmp_path)
    assert str(info.value).startswith(f"{path}") and message in str(info.value) and "\n" not in str(info.value)


def test_missing_leaf_files_say_where_to_get_them(tmp_path):
    with pytest.raises(DataError) as info:
        load_dataset("femnist", {}, tmp_path)
    assert f"dataset femnist is not in {tmp_path / 'femnist'}" in str(info.value)
    assert "LEAF's preprocessing" in str(info.value)


# ---------------------------------------------------------------------- CelebA


def test_celeba_decodes_and_resizes_the_images_and_names_a_missing_one(tmp_path):
    users = write_celeba(tmp_path / "data" / "celeba", [3, 2, 4])
    data = load_dataset("celeba", {"size": 32}, tmp_path / "data")
    assert data.x_train.shape == (9, 3, 32, 32) and data.num_classes == 2
    assert data.source_train.tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert 0.0 <= data.x_train.min() and data.x_train.max() <= 1.0
    spec = spec_with(tmp_path, {"name": "celeba", "size": 32}, 3, [{"kind": "natural"}])
    assert len(build_partition(spec.scenarios["s"], data).stats) == 3
    missing = tmp_path / "data" / "celeba" / "raw" / "img_align_celeba" / users["1001"][0][1]
    missing.unlink()
    with pytest.raises(DataError) as info:
        load_dataset("celeba", {"size": 16}, tmp_path / "data")
    assert str(info.value) == f"{missing}: image of {tmp_path / 'data' / 'celeba' / 'all_data' / 'all_data.json'}: " \
                              f"user '1001' is missing"


# ---------------------------------------------------------------------- a user's own files


def test_the_example_spec_trains_an_npz_and_a_parquet_dataset(tmp_path, monkeypatch):
    from cflpipe.spec import load_spec

    monkeypatch.chdir(ROOT)  # paths in the example are relative to the repository root
    spec = load_spec(ROOT / "config" / "experiments" / "files_example.yaml")
    spec = spec.model_copy(update={"results_dir": str(tmp_path / "results")})
    for scenario, method, seed in spec.matrix():
        result = train_run(spec, scenario, method, seed, progress=False)
        assert result.summary["final"]["acc_macro"] > 0.5, (scenario, method)
    sc = spec.scenarios["parquet-devices"]  # one client per `source` of the Parquet file
    stats = build_partition(sc, load_dataset("files", sc.dataset.params, spec.data_dir)).stats
    assert len(stats) == 12 and (stats["n_train"] > 0).all()


def test_parquet_image_column_trains_a_cnn(tmp_path):
    rng = np.random.default_rng(0)
    images = rng.random((60, 1 * 8 * 8)).astype(np.float32)
    frame = pd.DataFrame({"pixels": list(images), "label": rng.integers(0, 3, 60),
                          "split": ["train"] * 48 + ["test"] * 12})
    path = tmp_path / "images.parquet"
    frame.to_parquet(path, index=False)
    data = load_dataset("files", {"path": str(path), "image": "pixels", "shape": [1, 8, 8]}, tmp_path)
    assert data.x_train.shape == (48, 1, 8, 8) and data.is_image
    assert np.allclose(data.x_test[0].reshape(-1), images[48])
    spec = spec_with(tmp_path, {"name": "files", "path": str(path), "image": "pixels", "shape": [1, 8, 8]}, 4,
                     [{"kind": "iid"}])
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"model": "cnn"})})
    assert train_run(spec, "s", "fedavg", 0, progress=False).summary["clients"] == 4


def _npz(path: Path, **arrays) -> str:
    base = {"x_train": np.zeros((4, 3), np.float32), "y_train": np.array([0, 1, 0, 1]),
            "x_test": np.zeros((2, 3), np.float32), "y_test": np.array([1, 0])}
    base.update(arrays)
    np.savez(path, **{k: v for k, v in base.items() if v is not None})
    return str(path)


@pytest.mark.parametrize("arrays, message", [
    ({"x_test": None}, "missing arrays x_test"),
    ({"extra": np.zeros(2)}, "unknown arrays extra"),
    ({"x_train": np.array([[1.0, np.nan, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])}, "x_train holds 1 NaN or infinite"),
    ({"x_test": np.zeros((2, 4), np.float32)}, "x_train samples have shape (3,), x_test samples (4,)"),
    ({"y_train": np.array([0, 1, 0])}, "y_train must be one label per row of x_train (4)"),
    ({"y_train": np.array([0, 1, -1, 1])}, "labels span -1..1"),
    ({"y_train": np.array([0.0, 1.5, 0.0, 1.0])}, "y_train must hold integer labels"),
    ({"x_train": np.array([["a"] * 3] * 4)}, "x_train must be numbers"),
    ({"x_train": np.array([None] * 4, dtype=object)}, "cannot be read without pickle"),
    ({"source_train": np.zeros(4, np.int64)}, "give both source_train and source_test"),
])
def test_a_bad_npz_is_one_line_naming_it(tmp_path, arrays, message):
    path = _npz(tmp_path / "mine.npz", **arrays)
    with pytest.raises(DataError) as info:
        load_dataset("files", {"path": path}, tmp_path)
    assert str(info.value).startswith(path) and message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("frame, params, message", [
    (pd.DataFrame({"a": [1.0, 2.0], "y": [0, 1]}), {}, "no label column 'label'"),
    (pd.DataFrame({"a": ["x", "y"], "label": [0, 1]}), {}, "column a must hold numbers"),
    (pd.DataFrame({"a": [1.0, None], "label": [0, 1]}), {}, "column a has 1 missing values"),
    (pd.DataFrame({"a": [1.0, 2.0], "label": [0, 1], "split": ["train", "val"]}), {}, "got val"),
    (pd.DataFrame({"a": [1.0, 2.0], "label": [0, 5]}), {"classes": 3}, "labels span 0..5, expected 0..2"),
    (pd.DataFrame({"px": [[1.0] * 4, [1.0] * 4], "label": [0, 1]}), {"image": "px"}, "needs shape"),
    (pd.DataFrame({"px": [[1.0] * 4, [1.0] * 3], "label": [0, 1]}), {"image": "px", "shape": [1, 2, 2]},
     "must hold 4 numbers per row"),
    (pd.DataFrame({"px": [[1.0] * 5, [1.0] * 3], "label": [0, 1]}), {"image": "px", "shape": [1, 2, 2]},
     "row 0 has 5"),  # the right total in uneven rows would shift every later image
    (pd.DataFrame({"a": [1e39, 2.0], "label": [0, 1]}), {}, "x_train holds 1 NaN or infinite values (in float32)"),
])
def test_a_bad_parquet_is_one_line_naming_it(tmp_path, frame, params, message):
    path = tmp_path / "mine.parquet"
    frame.to_parquet(path, index=False)
    with pytest.raises(DataError) as info:
        load_dataset("files", {"path": str(path), **params}, tmp_path)
    assert str(info.value).startswith(str(path)) and message in str(info.value) and "\n" not in str(info.value)


def test_files_spec_errors(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_dataset("files", {"path": str(tmp_path / "absent.npz")}, tmp_path)
    (tmp_path / "mine.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="must be .npz or .parquet, got '.csv'"):
        load_dataset("files", {"path": str(tmp_path / "mine.csv")}, tmp_path)


def test_a_partition_of_an_edited_file_is_refused(tmp_path):
    from cflpipe.errors import PartitionError
    from cflpipe.fl.data import partition_scenario

    path = _npz(tmp_path / "mine.npz", x_train=np.random.default_rng(0).random((8, 3)).astype(np.float32),
                y_train=np.array([0, 1] * 4))
    spec = spec_with(tmp_path, {"name": "files", "path": path}, 2, [{"kind": "iid"}])
    partition_scenario(spec, "s")
    _npz(tmp_path / "mine.npz", x_train=np.ones((8, 3), np.float32), y_train=np.array([0, 1] * 4))
    with pytest.raises(PartitionError, match="built from a different definition of scenario s"):
        train_run(spec, "s", "fedavg", 0, progress=False)


def test_leaf_edge_cases(tmp_path):
    from cflpipe.errors import PartitionError

    folder = tmp_path / "data" / "femnist" / "all_data"
    folder.mkdir(parents=True)
    pixels = [[0.5] * 784] * 2
    (folder / "all_data_0.json").write_text(leaf_json({"a": (pixels, [1, 2]), "empty": ([], []), "b": (pixels, [3, 4])}))
    data = load_dataset("femnist", {}, tmp_path / "data")
    assert np.bincount(data.source_train).tolist() == [2, 2]  # a user without samples is no client
    # the cache follows the JSON files: an edit is read again
    (folder / "all_data_0.json").write_text(leaf_json({"a": (pixels, [5, 6]), "b": (pixels, [7, 8])}))
    assert load_dataset("femnist", {}, tmp_path / "data").y_train.tolist() == [5, 6, 7, 8]
    assert not list((tmp_path / "data" / "femnist").glob(".cache*"))  # caches live outside the tracked folder
    spec = spec_with(tmp_path, "femnist", 2, [{"kind": "natural", "holdout": "dataset"}])
    with pytest.raises(PartitionError, match="has no test split here .* use holdout: fraction"):
        build_partition(spec.scenarios["s"], load_dataset("femnist", {}, tmp_path / "data"), where="scenarios.s")


def write_user_level_split(folder: Path, train_users: dict[str, int], test_users: dict[str, int]) -> None:
    """LEAF's user-level split (`--t user`): every user's samples in one of the two folders."""
    rng = np.random.default_rng(5)
    for part, users in (("train", train_users), ("test", test_users)):
        (folder / part).mkdir(parents=True)
        records = {u: (rng.random((n, 784)).round(3).tolist(), rng.integers(0, 62, n).tolist())
                   for u, n in users.items()}
        (folder / part / f"{part}.json").write_text(leaf_json(records))


def test_leafs_user_level_split_trains_the_train_users_and_evaluates_the_held_out_ones(tmp_path):
    import pandas as pd
    from cflpipe.fl.engine import prepare_run

    write_user_level_split(tmp_path / "data" / "femnist", {"a": 6, "b": 5, "c": 7}, {"d": 4, "e": 3})
    spec = spec_with(tmp_path, "femnist", 5, [{"kind": "natural", "holdout": "dataset"}])
    run = prepare_run(spec, "s", "fedavg", 0)
    run.setup()
    sizes = run.data.train.sizes()
    training = np.flatnonzero(sizes > 0)
    assert sorted(sizes.tolist()) == [0, 0, 5, 6, 7] and run.data.test.sizes()[training].sum() == 0
    drawn = np.concatenate([run.sample(r) for r in range(30)])
    assert set(drawn.tolist()) == set(training.tolist())  # every training user is drawn, no held-out one

    train_run(spec, "s", "fedavg", 0, progress=False)
    metrics = pd.read_parquet(spec.run_dir("s", "fedavg", 0) / "metrics.parquet")
    test = metrics[(metrics["split"] == "test") & (metrics["round"] == 2)].set_index("client")
    held_out = np.setdiff1d(np.arange(5), training)
    assert test.loc[held_out, "n"].tolist() == [4, 3] and test.loc[held_out, "acc"].notna().all()
    assert (test.loc[training, "n"] == 0).all()  # the train users' data all trained


@pytest.mark.parametrize("method, params", [("ifca", {"clusters": 2}), ("local", {})])
def test_a_user_level_split_needs_a_method_with_one_global_model(tmp_path, method, params):
    write_user_level_split(tmp_path / "data" / "femnist", {"a": 6, "b": 5, "c": 7}, {"d": 4, "e": 3})
    spec = spec_with(tmp_path, "femnist", 5, [{"kind": "natural", "holdout": "dataset"}])
    spec = parse_spec({**spec.model_dump(mode="json", exclude_none=True), "methods": {method: params}})
    with pytest.raises(SpecError, match=rf"^methods.{method}: scenario s holds 2 clients that never train .* "
                                        r"no model for them\. Use a method with one global model"):
        train_run(spec, "s", method, 0, progress=False)
    assert not spec.run_dir("s", method, 0).exists()  # refused before anything is written


def test_a_user_level_split_samples_at_most_its_training_users(tmp_path):
    write_user_level_split(tmp_path / "data" / "femnist", {"a": 6, "b": 5}, {"d": 4, "e": 3})
    spec = spec_with(tmp_path, "femnist", 4, [{"kind": "natural", "holdout": "dataset"}])
    data = spec.model_dump(mode="json", exclude_none=True)
    spec = parse_spec({**data, "training": {**data["training"], "clients_per_round": 3}})
    with pytest.raises(SpecError, match=r"^training.clients_per_round: 3, but scenario s has 2 clients with "
                                        r"training samples \(2 only test\); at most 2$"):
        train_run(spec, "s", "fedavg", 0, progress=False)
    spec = parse_spec({**data, "methods": {"fedavg": {"training": {"clients_per_round": 4}}}})
    with pytest.raises(SpecError, match=r"^methods.fedavg.training.clients_per_round: 4, but"):
        train_run(spec, "s", "fedavg", 0, progress=False)


def test_test_files_alone_are_refused_with_holdout_dataset(tmp_path):
    from cflpipe.errors import PartitionError

    write_user_level_split(tmp_path / "femnist", {}, {"a": 2, "b": 3})
    spec = spec_with(tmp_path, "femnist", 2, [{"kind": "natural", "holdout": "dataset"}])
    with pytest.raises(PartitionError, match=r"holdout: with holdout: dataset, no client has a training sample in "
                                             r"femnist's files; use holdout: fraction"):
        build_partition(spec.scenarios["s"], load_dataset("femnist", {}, tmp_path), where="scenarios.s")


def test_standardize_scales_features_with_the_train_split_statistics(tmp_path):
    """#35 item 3: features on unlike scales; the test split is scaled with the train split's
    mean and std, never fitted on; a constant feature is centred only."""
    x_train = np.array([[1.0, 1000.0, 5.0], [3.0, 3000.0, 5.0], [5.0, 2000.0, 5.0], [7.0, 4000.0, 5.0]], np.float32)
    x_test = np.array([[4.0, 2500.0, 6.0], [10.0, 0.0, 5.0]], np.float32)
    path = _npz(tmp_path / "d.npz", x_train=x_train, x_test=x_test)
    raw = load_dataset("files", {"path": path}, tmp_path)
    scaled = load_dataset("files", {"path": path, "standardize": True}, tmp_path)
    np.testing.assert_array_equal(raw.x_train, x_train)  # used as given by default
    mean, std = x_train.astype(np.float64).mean(0), x_train.astype(np.float64).std(0)
    np.testing.assert_allclose(scaled.x_train.mean(0), [0, 0, 0], atol=1e-6)
    np.testing.assert_allclose(scaled.x_train[:, :2].std(0), [1, 1], rtol=1e-6)
    np.testing.assert_allclose(scaled.x_test[:, :2], (x_test[:, :2] - mean[:2]) / std[:2], rtol=1e-6)
    np.testing.assert_allclose(scaled.x_test[:, 2], [1.0, 0.0])
    assert scaled.x_train.dtype == np.float32 and scaled.x_test.dtype == np.float32
