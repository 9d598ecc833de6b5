"""Downloading, verifying, unpacking and parsing the remote datasets, end to end and offline.

Each test writes small files in the real formats (IDX gz, Python-2 CIFAR pickles in a tar.gz, an
SVHN MATLAB file, the EMNIST zip), serves them from 127.0.0.1, downloads them with the official
resource lists (only the MD5s swapped for the fakes') and loads them through the registry.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import io
import os
import pickle
import shutil
import socket
import struct
import tarfile
import threading
import time
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from cflpipe.data import DATASETS, load_dataset
from cflpipe.data import download as dl
from cflpipe.data import formats
from cflpipe.data.download import Resource, describe_resources, download_dataset, extract_archive, fetch
from cflpipe.data.remote import RESOURCES, num_classes, parse, resources_for
from cflpipe.errors import DataError, SpecError

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------- writers of the real formats


def idx_bytes(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr, dtype=np.uint8)
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.tobytes()


def write_idx_gz(path: Path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(idx_bytes(arr), mtime=0))


def py2_pickle(obj) -> bytes:
    """A protocol-2 pickle as Python 2 wrote the official CIFAR batches: str values are 8-bit
    strings (`U`/`T` opcodes) and arrays name `numpy.core.multiarray._reconstruct`."""
    out = bytearray(b"\x80\x02")

    def string(s: bytes) -> None:
        out.extend(b"U" + bytes([len(s)]) + s if len(s) < 256 else b"T" + struct.pack("<I", len(s)) + s)

    def emit(o) -> None:
        if isinstance(o, dict):
            out.extend(b"}(")
            for k, v in o.items():
                emit(k)
                emit(v)
            out.extend(b"u")
        elif isinstance(o, list):
            out.extend(b"](")
            for v in o:
                emit(v)
            out.extend(b"e")
        elif isinstance(o, str):
            string(o.encode("latin-1"))
        elif isinstance(o, int):
            out.extend(b"J" + struct.pack("<i", o))
        elif isinstance(o, np.ndarray):
            assert o.dtype == np.uint8
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R")
            out.extend(b"(K\x01(")
            for d in o.shape:
                out.extend(b"J" + struct.pack("<i", d))
            out.extend(b"tcnumpy\ndtype\nU\x02u1K\x00K\x01\x87R"
                       b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89")
            string(o.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(o))

    emit(obj)
    out.extend(b".")
    return bytes(out)


def add_to_tar(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def images(n: int, c: int, h: int, w: int) -> np.ndarray:
    return RNG.integers(0, 256, (n, c, h, w), dtype=np.uint8)


def with_fake_md5s(name: str, mirror: Path) -> list[Resource]:
    # The official file names must be what the fakes are written under, so only MD5s change.
    return [dataclasses.replace(r, md5=md5(mirror / r.filename)) for r in resources_for(name)]


# ---------------------------------------------------------------- local HTTP mirror


class _Handler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        pass


@pytest.fixture
def mirror(tmp_path):
    """A folder served on 127.0.0.1; `requests` lists every path asked for."""
    root = tmp_path / "mirror"
    root.mkdir()
    requests: list[str] = []

    class Counting(_Handler):
        def do_GET(self):
            requests.append(self.path)
            if self.path.endswith("/truncated.bin"):
                # A connection that drops mid-transfer: fewer bytes than Content-Length promised.
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                self.wfile.write(b"x" * 10)
                self.close_connection = True
                return
            super().do_GET()

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Counting, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield dataclasses.make_dataclass("Mirror", ["root", "url", "requests"])(
            root, f"http://127.0.0.1:{server.server_address[1]}/", requests)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def data_dir(tmp_path):
    path = tmp_path / "data"
    path.mkdir()
    return path


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/files"


def assert_nothing_left(folder: Path) -> None:
    assert not folder.exists() or list(folder.iterdir()) == []


# ---------------------------------------------------------------- end to end, per dataset


def write_mnist_like(root: Path) -> dict[str, np.ndarray]:
    arrays = {
        "x_train": images(30, 1, 28, 28), "y_train": RNG.integers(0, 10, 30),
        "x_test": images(12, 1, 28, 28), "y_test": RNG.integers(0, 10, 12),
    }
    write_idx_gz(root / "train-images-idx3-ubyte.gz", arrays["x_train"][:, 0])
    write_idx_gz(root / "train-labels-idx1-ubyte.gz", arrays["y_train"])
    write_idx_gz(root / "t10k-images-idx3-ubyte.gz", arrays["x_test"][:, 0])
    write_idx_gz(root / "t10k-labels-idx1-ubyte.gz", arrays["y_test"])
    return arrays


def assert_loaded(ds, expected: dict[str, np.ndarray], classes: int) -> None:
    for split in ("train", "test"):
        x, y = getattr(ds, f"x_{split}"), getattr(ds, f"y_{split}")
        assert x.dtype == np.float32 and y.dtype == np.int64
        assert 0.0 <= x.min() and x.max() <= 1.0
        np.testing.assert_array_equal(x, expected[f"x_{split}"].astype(np.float32) / 255)
        np.testing.assert_array_equal(y, expected[f"y_{split}"])
    assert ds.num_classes == classes


@pytest.mark.parametrize("name", ["mnist", "fmnist"])
def test_mnist_family_round_trip(name, mirror, data_dir):
    expected = write_mnist_like(mirror.root)
    folder = download_dataset(name, data_dir, progress=False, base_url=mirror.url,
                              resources=with_fake_md5s(name, mirror.root))
    assert folder == data_dir / name and (folder / ".complete").is_file()
    assert sorted(mirror.requests) == sorted("/" + f for f in os.listdir(mirror.root))
    ds = load_dataset(name, {}, data_dir)
    assert ds.x_train.shape == (30, 1, 28, 28) and ds.x_test.shape == (12, 1, 28, 28)
    assert_loaded(ds, expected, 10)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664)])
def test_downloaded_files_honour_the_umask(mirror, data_dir, umask, mode):
    """Colleagues read a shared data folder: downloads get the mode any new file gets."""
    write_mnist_like(mirror.root)
    old = os.umask(umask)
    try:
        folder = download_dataset("mnist", data_dir, progress=False, base_url=mirror.url,
                                  resources=with_fake_md5s("mnist", mirror.root))
    finally:
        os.umask(old)
    files = [path for path in folder.iterdir() if path.is_file()]
    assert files and {path.name: path.stat().st_mode & 0o777 for path in files} == {path.name: mode for path in files}


def test_second_download_uses_files_present(mirror, data_dir):
    write_mnist_like(mirror.root)
    resources = with_fake_md5s("mnist", mirror.root)
    download_dataset("mnist", data_dir, progress=False, base_url=mirror.url, resources=resources)
    assert len(mirror.requests) == 4
    mirror.requests.clear()
    download_dataset("mnist", data_dir, progress=False, base_url=mirror.url, resources=resources)
    assert mirror.requests == []
    assert (data_dir / "mnist" / ".complete").is_file()


def test_emnist_zip_both_splits_transposed(mirror, data_dir):
    expected = {}
    with zipfile.ZipFile(mirror.root / "gzip.zip", "w") as zf:
        for split, classes in (("balanced", 47), ("byclass", 62)):
            arrays = {
                "x_train": images(25, 1, 28, 28), "y_train": np.arange(25) % classes,
                "x_test": images(10, 1, 28, 28), "y_test": np.r_[classes - 1, np.zeros(9, int)],
            }
            expected[split] = arrays
            for part, key in (("train-images-idx3", "x_train"), ("train-labels-idx1", "y_train"),
                              ("test-images-idx3", "x_test"), ("test-labels-idx1", "y_test")):
                arr = arrays[key]
                # NIST stores each image transposed (column-major); the loader must undo it.
                raw = arr[:, 0].transpose(0, 2, 1) if key.startswith("x") else arr
                zf.writestr(f"gzip/emnist-{split}-{part}-ubyte.gz", gzip.compress(idx_bytes(raw), mtime=0))
    download_dataset("emnist", data_dir, progress=False, base_url=mirror.url,
                     resources=with_fake_md5s("emnist", mirror.root))
    for split, classes in (("balanced", 47), ("byclass", 62)):
        ds = load_dataset("emnist", {"split": split}, data_dir)
        assert ds.x_train.shape == (25, 1, 28, 28)
        assert_loaded(ds, expected[split], classes)
        assert num_classes("emnist", {"split": split}) == classes
    assert (data_dir / "emnist" / ".cache-balanced.npz").is_file()
    assert (data_dir / "emnist" / ".cache-byclass.npz").is_file()


def cifar_tar(path: Path, folder: str, members: dict[str, dict]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, batch in members.items():
            add_to_tar(tar, f"{folder}/{name}", py2_pickle(batch))


def test_cifar10_tar_of_python2_pickles(mirror, data_dir):
    batches = {f"data_batch_{i}": images(4, 3, 32, 32) for i in range(1, 6)}
    batches["test_batch"] = images(6, 3, 32, 32)
    labels = {name: [int(v) for v in RNG.integers(0, 10, len(x))] for name, x in batches.items()}
    cifar_tar(mirror.root / "cifar-10-python.tar.gz", "cifar-10-batches-py", {
        name: {"batch_label": f"batch {name}", "labels": labels[name], "data": x.reshape(len(x), -1),
               "filenames": [f"img_{i}.png" for i in range(len(x))]}
        for name, x in batches.items()})
    download_dataset("cifar10", data_dir, progress=False, base_url=mirror.url,
                     resources=with_fake_md5s("cifar10", mirror.root))
    ds = load_dataset("cifar10", None, data_dir)
    train = [f"data_batch_{i}" for i in range(1, 6)]
    assert ds.x_train.shape == (20, 3, 32, 32) and ds.x_test.shape == (6, 3, 32, 32)
    assert_loaded(ds, {
        "x_train": np.concatenate([batches[n] for n in train]),
        "y_train": np.concatenate([labels[n] for n in train]),
        "x_test": batches["test_batch"], "y_test": np.array(labels["test_batch"]),
    }, 10)


def test_cifar100_uses_fine_labels(mirror, data_dir):
    x_train, x_test = images(8, 3, 32, 32), images(5, 3, 32, 32)
    fine_train, fine_test = [99, 0, 5, 17, 42, 63, 1, 2], [3, 99, 50, 0, 7]
    cifar_tar(mirror.root / "cifar-100-python.tar.gz", "cifar-100-python", {
        "train": {"filenames": ["a"] * 8, "batch_label": "training batch 1 of 1", "fine_labels": fine_train,
                  "coarse_labels": [f // 5 for f in fine_train], "data": x_train.reshape(8, -1)},
        "test": {"filenames": ["a"] * 5, "batch_label": "testing batch 1 of 1", "fine_labels": fine_test,
                 "coarse_labels": [f // 5 for f in fine_test], "data": x_test.reshape(5, -1)},
        "meta": {"fine_label_names": ["x"] * 100, "coarse_label_names": ["y"] * 20},
    })
    download_dataset("cifar100", data_dir, progress=False, base_url=mirror.url,
                     resources=with_fake_md5s("cifar100", mirror.root))
    ds = load_dataset("cifar100", {}, data_dir)
    assert_loaded(ds, {"x_train": x_train, "y_train": np.array(fine_train),
                       "x_test": x_test, "y_test": np.array(fine_test)}, 100)


def test_svhn_mat_label_ten_is_zero(mirror, data_dir):
    from scipy.io import savemat

    expected = {}
    for split, n in (("train", 15), ("test", 7)):
        x = images(n, 3, 32, 32)
        y = (np.arange(n) % 10) + 1  # 1..10, with 10 standing for the digit 0
        savemat(mirror.root / f"{split}_32x32.mat", {"X": x.transpose(2, 3, 1, 0), "y": y[:, None].astype(np.uint8)})
        expected[f"x_{split}"], expected[f"y_{split}"] = x, y % 10
    download_dataset("svhn", data_dir, progress=False, base_url=mirror.url,
                     resources=with_fake_md5s("svhn", mirror.root))
    ds = load_dataset("svhn", {}, data_dir)
    assert ds.x_train.shape == (15, 3, 32, 32)
    assert set(ds.y_train.tolist()) == set(range(10))
    assert_loaded(ds, expected, 10)


# ---------------------------------------------------------------- failures


def test_wrong_checksum_leaves_nothing(mirror, data_dir):
    (mirror.root / "train_32x32.mat").write_bytes(b"not the real file")
    resources = [dataclasses.replace(r, md5="0" * 32) for r in resources_for("svhn")]
    with pytest.raises(DataError) as err:
        download_dataset("svhn", data_dir, progress=False, base_url=mirror.url, resources=resources)
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"checksum mismatch for train_32x32.mat from {mirror.url}train_32x32.mat: "
                       f"expected {'0' * 32}, got {md5(mirror.root / 'train_32x32.mat')}")
    assert_nothing_left(data_dir / "svhn")


def test_unreachable_mirror_names_url_and_manual_step(data_dir):
    url = closed_port_url()
    with pytest.raises(DataError) as err:
        download_dataset("mnist", data_dir, resources_for("mnist"), progress=False, base_url=url)
    message = str(err.value)
    assert "\n" not in message
    assert f"{url}/train-images-idx3-ubyte.gz" in message
    assert f"place it at {data_dir / 'mnist' / 'train-images-idx3-ubyte.gz'}, then re-run" in message
    assert_nothing_left(data_dir / "mnist")


def test_http_404_then_next_mirror(mirror, tmp_path):
    (mirror.root / "b").mkdir()
    (mirror.root / "b" / "f.bin").write_bytes(b"payload")
    resource = Resource("f.bin", [mirror.url + "a/f.bin", mirror.url + "b/f.bin"], md5(mirror.root / "b" / "f.bin"))
    path = fetch(resource, tmp_path / "dest", progress=False)
    assert path.read_bytes() == b"payload"
    assert mirror.requests == ["/a/f.bin", "/b/f.bin"]
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == ["f.bin"]


def test_all_mirrors_404_lists_each(mirror, tmp_path):
    resource = Resource("f.bin", [mirror.url + "a/f.bin", mirror.url + "b/f.bin"], "0" * 32)
    with pytest.raises(DataError, match=r"a/f\.bin \(HTTP 404 .*\); .*b/f\.bin \(HTTP 404 .*\); download "):
        fetch(resource, tmp_path / "dest", progress=False)
    assert_nothing_left(tmp_path / "dest")


def test_truncated_transfer_is_a_network_failure(mirror, tmp_path):
    resource = Resource("truncated.bin", [mirror.url + "truncated.bin"], "0" * 32)
    with pytest.raises(DataError, match=r"could not download truncated.bin: .*truncated.bin \(.*\); download"):
        fetch(resource, tmp_path / "dest", progress=False)
    assert_nothing_left(tmp_path / "dest")


def test_progress_bar_goes_to_stderr(mirror, tmp_path, capfd):
    (mirror.root / "f.bin").write_bytes(b"z" * 5000)
    fetch(Resource("f.bin", [mirror.url + "f.bin"], md5(mirror.root / "f.bin")), tmp_path, progress=True)
    out, err = capfd.readouterr()
    assert out == "" and "f.bin" in err


def test_mirror_from_environment(mirror, data_dir, monkeypatch):
    write_mnist_like(mirror.root)
    monkeypatch.setenv("CFLPIPE_DATASET_MIRROR", mirror.url.rstrip("/"))
    download_dataset("mnist", data_dir, progress=False, resources=with_fake_md5s("mnist", mirror.root))
    assert len(mirror.requests) == 4
    assert dl.resource_urls(resources_for("mnist")[0], "http://proxy/x/") == [
        "http://proxy/x/train-images-idx3-ubyte.gz"]


def evil_tar(path: Path, name: str, kind: str = "file") -> None:
    with tarfile.open(path, "w:gz") as tar:
        add_to_tar(tar, "ok/inner.txt", b"fine")
        if kind == "file":
            add_to_tar(tar, name, b"evil")
        else:
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE if kind == "symlink" else tarfile.CHRTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)


@pytest.mark.parametrize("member, kind, reason", [
    ("../evil", "file", "points outside"),
    ("ok/../../evil", "file", "points outside"),
    ("/tmp/evil-abs", "file", "absolute path"),
    ("ok/link", "symlink", "link or device"),
    ("ok/dev", "device", "link or device"),
])
def test_tar_with_unsafe_member_is_refused(tmp_path, member, kind, reason):
    dest = tmp_path / "dest"
    dest.mkdir()
    evil_tar(tmp_path / "evil.tar.gz", member, kind)
    with pytest.raises(DataError, match=reason):
        extract_archive(tmp_path / "evil.tar.gz", "tar", dest)
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "evil").exists()


@pytest.mark.parametrize("member", ["../evil", "/abs/evil", "ok\\..\\..\\evil"])
def test_zip_with_unsafe_member_is_refused(tmp_path, member):
    dest = tmp_path / "dest"
    dest.mkdir()
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("ok/inner.txt", b"fine")
        zf.writestr(zipfile.ZipInfo(member), b"evil")
    with pytest.raises(DataError, match="refusing to extract"):
        extract_archive(tmp_path / "evil.zip", "zip", dest)
    assert list(dest.iterdir()) == []


def test_zip_symlink_member_is_refused(tmp_path):
    info = zipfile.ZipInfo("ok/link")
    info.create_system = 3
    info.external_attr = (0o120777 << 16)
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr(info, "/etc/passwd")
    with pytest.raises(DataError, match="link or device"):
        extract_archive(tmp_path / "evil.zip", "zip", tmp_path)


def test_evil_archive_through_download_writes_no_marker(mirror, data_dir):
    evil_tar(mirror.root / "cifar-10-python.tar.gz", "../evil")
    with pytest.raises(DataError, match="points outside"):
        download_dataset("cifar10", data_dir, progress=False, base_url=mirror.url,
                         resources=with_fake_md5s("cifar10", mirror.root))
    folder = data_dir / "cifar10"
    # The verified archive stays (no need to fetch it again), but nothing was unpacked.
    assert sorted(p.name for p in folder.iterdir()) == ["cifar-10-python.tar.gz"]
    assert not (data_dir / "evil").exists()


def test_corrupt_archive_is_a_data_error(tmp_path):
    (tmp_path / "bad.tar.gz").write_bytes(gzip.compress(b"x" * 1000)[:50])
    with pytest.raises(DataError, match="bad.tar.gz is not a readable tar archive"):
        extract_archive(tmp_path / "bad.tar.gz", "tar", tmp_path)


def test_stale_temp_files_are_swept(mirror, data_dir):
    write_mnist_like(mirror.root)
    folder = data_dir / "mnist"
    folder.mkdir()
    stale, fresh = folder / ".train-images-idx3-ubyte.gz.abc.part", folder / ".other.def.part"
    stale.write_bytes(b"old")
    fresh.write_bytes(b"in progress elsewhere")
    old = time.time() - 2 * dl.STALE_S
    os.utime(stale, (old, old))
    download_dataset("mnist", data_dir, progress=False, base_url=mirror.url,
                     resources=with_fake_md5s("mnist", mirror.root))
    assert not stale.exists() and fresh.exists()


def test_reextracts_when_unpacked_folder_was_removed(mirror, data_dir):
    cifar_tar(mirror.root / "cifar-100-python.tar.gz", "cifar-100-python", {
        "train": {"fine_labels": [1], "data": images(1, 3, 32, 32).reshape(1, -1)},
        "test": {"fine_labels": [2], "data": images(1, 3, 32, 32).reshape(1, -1)},
    })
    resources = with_fake_md5s("cifar100", mirror.root)
    download_dataset("cifar100", data_dir, progress=False, base_url=mirror.url, resources=resources)
    shutil.rmtree(data_dir / "cifar100" / "cifar-100-python")
    mirror.requests.clear()
    download_dataset("cifar100", data_dir, progress=False, base_url=mirror.url, resources=resources)
    assert mirror.requests == []
    assert load_dataset("cifar100", {}, data_dir).y_test.tolist() == [2]


# ---------------------------------------------------------------- loaders and parsers


def test_missing_dataset_says_how_to_get_it(data_dir):
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", {}, data_dir)
    assert str(err.value) == (
        f"dataset cifar10 is not in {data_dir / 'cifar10'}; run `cflpipe download cifar10` "
        f"(or place the files listed by `cflpipe download cifar10 --list` there)")


def test_hand_gunzipped_idx_files_load(data_dir):
    expected = write_mnist_like(data_dir / "mnist")
    for gz in (data_dir / "mnist").glob("*.gz"):
        gz.with_suffix("").write_bytes(gzip.decompress(gz.read_bytes()))
        gz.unlink()
    assert_loaded(load_dataset("mnist", {}, data_dir), expected, 10)


def test_cache_is_refreshed_when_raw_files_change(data_dir):
    write_mnist_like(data_dir / "mnist")
    load_dataset("mnist", {}, data_dir)
    assert (data_dir / "mnist" / ".cache-all.npz").is_file()
    expected = write_mnist_like(data_dir / "mnist")
    labels = data_dir / "mnist" / "train-labels-idx1-ubyte.gz"
    os.utime(labels, ns=(labels.stat().st_mtime_ns + 10**9,) * 2)
    assert_loaded(load_dataset("mnist", {}, data_dir), expected, 10)


def _damaged(path: Path, how: str) -> None:
    raw = path.read_bytes()
    if how == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    elif how == "empty":
        path.write_bytes(b"")
    else:  # a flipped bit inside the array data
        data = bytearray(raw)
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "empty", "flipped"])
def test_a_damaged_cache_is_rebuilt(data_dir, how):
    expected = write_mnist_like(data_dir / "mnist")
    load_dataset("mnist", {}, data_dir)
    cache = data_dir / "mnist" / ".cache-all.npz"
    _damaged(cache, how)
    # The float cache is what runs read; without it the uint8 cache is read, found damaged and
    # rebuilt from the raw files.
    (data_dir / "mnist" / ".cache-all-float32.npz").unlink()
    assert_loaded(load_dataset("mnist", {}, data_dir), expected, 10)
    assert (data_dir / "mnist" / ".cache-all.npz.sha256").read_text().strip() == \
        hashlib.sha256(cache.read_bytes()).hexdigest()


def test_the_float_cache_is_left_to_one_writer_and_to_file_systems_that_map(data_dir, monkeypatch):
    import fcntl

    from cflpipe.data import remote

    expected = write_mnist_like(data_dir / "mnist")
    floats = data_dir / "mnist" / ".cache-all-float32.npz"
    orphan = data_dir / "mnist" / "..cache-all-float32.npz.x1y2.tmp"  # atomic_path's, its writer killed mid-way
    (data_dir / "mnist").mkdir(exist_ok=True)
    orphan.write_bytes(b"half")
    with open(str(floats) + ".lock", "a+") as held:  # another process writing it
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = load_dataset("mnist", {}, data_dir)
    assert busy.mapped == () and not floats.exists() and orphan.exists()
    assert_loaded(busy, expected, 10)
    with monkeypatch.context() as patch:
        patch.setattr(remote, "can_map", lambda path: False)
        unmappable = load_dataset("mnist", {}, data_dir)
    assert unmappable.mapped == () and not floats.exists()
    assert_loaded(unmappable, expected, 10)
    mapped = load_dataset("mnist", {}, data_dir)
    assert len(mapped.mapped) == 1 and floats.exists() and not orphan.exists()
    assert_loaded(mapped, expected, 10)


@pytest.mark.parametrize("how", ["truncated", "empty", "flipped", "stale"])
def test_runs_map_the_float_cache_and_a_damaged_or_stale_one_is_rebuilt(data_dir, how):
    expected = write_mnist_like(data_dir / "mnist")
    first = load_dataset("mnist", {}, data_dir)  # parses, writes both caches, maps the float one
    floats = data_dir / "mnist" / ".cache-all-float32.npz"
    assert len(first.mapped) == 1 and not first.x_train.flags.writeable
    assert_loaded(first, expected, 10)
    again = load_dataset("mnist", {}, data_dir)
    assert len(again.mapped) == 1 and all(np.array_equal(a, b) for a, b in
                                          ((first.x_train, again.x_train), (first.y_test, again.y_test)))
    if how == "stale":  # new raw files: the float cache's stamp no longer matches
        expected = write_mnist_like(data_dir / "mnist")
        labels = data_dir / "mnist" / "train-labels-idx1-ubyte.gz"
        os.utime(labels, ns=(labels.stat().st_mtime_ns + 10**9,) * 2)
    else:
        _damaged(floats, how)
    rebuilt = load_dataset("mnist", {}, data_dir)
    assert len(rebuilt.mapped) == 1
    assert_loaded(rebuilt, expected, 10)


@pytest.mark.parametrize("how", ["truncated", "flipped"])
def test_a_damaged_digits_cache_is_rebuilt(tmp_path, how):
    import numpy as np

    first = load_dataset("digits", {}, tmp_path)
    (cache,) = (tmp_path / "digits").glob(".cache-*.npz")
    _damaged(cache, how)
    again = load_dataset("digits", {}, tmp_path)
    assert np.array_equal(again.x_train, first.x_train) and np.array_equal(again.y_test, first.y_test)


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[:-5], "is corrupt: header"),
    (lambda raw: b"\x00\x00\x0f\x03" + raw[4:], "bad magic"),
    (lambda raw: raw[:6], "truncated IDX header"),
])
def test_corrupt_idx_names_the_file(tmp_path, damage, message):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(damage(idx_bytes(images(3, 1, 28, 28)[:, 0]))))
    with pytest.raises(DataError, match=message) as err:
        formats.read_idx_images(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_idx_labels_file_is_not_images(tmp_path):
    path = tmp_path / "labels.gz"
    write_idx_gz(path, np.arange(5))
    with pytest.raises(DataError, match="not an IDX ubyte image file"):
        formats.read_idx_images(path)


def test_truncated_gzip_is_a_data_error(tmp_path):
    path = tmp_path / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.arange(100)))[:-12])
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz cannot be read"):
        formats.read_idx_labels(path)


def test_labels_out_of_range_are_refused(data_dir):
    folder = data_dir / "mnist"
    write_mnist_like(folder)
    write_idx_gz(folder / "t10k-labels-idx1-ubyte.gz", np.r_[np.zeros(11, int), 10])
    with pytest.raises(DataError, match=r"test split\): labels span 0\.\.10, expected 0\.\.9"):
        load_dataset("mnist", {}, data_dir)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.parametrize("payload", [
    pickle.dumps({"data": _Exploit()}),
    pickle.dumps({"data": np.zeros((1, 3072), np.uint8), "labels": [1]}, protocol=2),  # _codecs.encode
    pickle.dumps({"data": np.zeros((1, 3072), np.uint8), "labels": [1]}, protocol=5),  # _frombuffer
])
def test_pickle_globals_outside_numpy_are_refused(tmp_path, payload):
    path = tmp_path / "data_batch_1"
    path.write_bytes(payload)
    with pytest.raises(DataError, match="is not allowed"):
        formats.read_cifar_batch(path)


def test_python3_repickled_batches_are_read_too(tmp_path):
    # Protocol 4 is the newest that stores arrays through `_reconstruct` (5 uses `_frombuffer`).
    x = images(2, 3, 32, 32)
    path = tmp_path / "test_batch"
    path.write_bytes(pickle.dumps({b"data": x.reshape(2, -1), b"labels": [3, 4]}, protocol=4))
    got_x, got_y = formats.read_cifar_batch(path)
    np.testing.assert_array_equal(got_x, x)
    assert got_y.dtype == np.int64 and got_y.tolist() == [3, 4]


def test_cifar_batch_with_wrong_shape(tmp_path):
    path = tmp_path / "test_batch"
    path.write_bytes(py2_pickle({"data": np.zeros((2, 100), np.uint8), "labels": [0, 1]}))
    with pytest.raises(DataError, match=r"expected uint8 \(N, 3072\)"):
        formats.read_cifar_batch(path)


def test_svhn_bad_labels(tmp_path):
    from scipy.io import savemat

    savemat(tmp_path / "t.mat", {"X": np.zeros((32, 32, 3, 2), np.uint8), "y": np.array([[0], [3]], np.uint8)})
    with pytest.raises(DataError, match=r"labels span 0\.\.3, expected 1\.\.10"):
        formats.read_svhn_mat(tmp_path / "t.mat")


# ---------------------------------------------------------------- registry and official tables


OFFICIAL = {
    "mnist": {"train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
              "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
              "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
              "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"},
    "fmnist": {"train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
               "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
               "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
               "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310"},
    "emnist": {"gzip.zip": "58c8d27c78d21e728a6bc7b3cc06412e"},
    "cifar10": {"cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a"},
    "cifar100": {"cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85"},
    "svhn": {"train_32x32.mat": "e26dedcc434d2e4c54c9b2d4a06d8373",
             "test_32x32.mat": "eb5a983be6a315427106f1b164d9cef3"},
}


def test_official_resources():
    assert set(RESOURCES) == set(OFFICIAL)
    for name, files in OFFICIAL.items():
        assert {r.filename: r.md5 for r in resources_for(name)} == files
        assert DATASETS[name].downloadable
        for r in resources_for(name):
            assert all(u.endswith("/" + r.filename) for u in r.urls)
    assert resources_for("mnist")[0].urls == (
        "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz",
        "http://yann.lecun.com/exdb/mnist/train-images-idx3-ubyte.gz")


def test_num_classes_and_params():
    assert {n: num_classes(n) for n in OFFICIAL} == {
        "mnist": 10, "fmnist": 10, "emnist": 47, "cifar10": 10, "cifar100": 100, "svhn": 10}
    with pytest.raises(ValidationError, match="extra"):
        num_classes("emnist", {"split": "balanced", "oops": 1})
    with pytest.raises(ValidationError, match="balanced"):
        num_classes("emnist", {"split": "letters"})
    with pytest.raises(SpecError, match="not downloadable"):
        resources_for("digits")


def test_describe_resources(data_dir):
    lines = describe_resources("cifar10", data_dir, resources_for("cifar10"))
    assert lines == [
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz -> "
        f"{data_dir / 'cifar10' / 'cifar-10-python.tar.gz'}  md5 c58f30108f718f92721af3b95e74349a "
        "(a tar archive, unpacked there)"]
    assert describe_resources("mnist", data_dir, resources_for("mnist"))[0].startswith(
        "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz or http://yann.lecun.com/")


def test_parse_reads_a_folder_directly(tmp_path):
    expected = write_mnist_like(tmp_path / "anywhere")
    assert_loaded(parse("fmnist", tmp_path / "anywhere", use_cache=False), expected, 10)
    assert not (tmp_path / "anywhere" / ".cache-all.npz").exists()
