"""The client store on disk (`training.client_store: disk`, #70 item 1): tables memory-mapped in
the run's state folder, the same values as in memory, pages handed back after use, read back
into their files from a checkpoint. The conformance suite's resume check runs every method with
it against a reference in memory (byte-identical outputs)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from cflpipe.errors import SpecError
from cflpipe.fl import rowfile
from cflpipe.fl.checkpoint import read_state, write_state
from cflpipe.fl.context import ClientStore
from cflpipe.fl.engine import train_run
from cflpipe.spec import parse_spec
from cflpipe.testing import spec_dict


def rss_file_kib() -> int:
    """Resident file-backed pages of this process (a mapped file's pages count here)."""
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("RssFile:")).split()[1])


def test_rows_start_at_the_default_and_writes_reach_the_file(tmp_path):
    default = torch.arange(5, dtype=torch.float32)
    table = rowfile.RowFile(tmp_path / "t.rows", default, rows=7)
    assert table.tensor.shape == (7, 5) and torch.equal(table.tensor, default.repeat(7, 1))
    table.tensor[3] = -1.0
    table.release()
    on_disk = np.fromfile(tmp_path / "t.rows", dtype=np.float32).reshape(7, 5)
    assert (on_disk[3] == -1).all() and (on_disk[[0, 1, 2, 4, 5, 6]] == np.arange(5)).all()
    assert torch.equal(table.tensor[3], torch.full((5,), -1.0)), "released pages read back from the file"
    table.remove()
    assert not (tmp_path / "t.rows").exists()
    assert float(table.tensor[3].sum()) == -5.0, "a view read after remove() still reads its pages"


def test_release_hands_the_pages_back(tmp_path):
    rows, width = 256, 1 << 16  # 64 MiB of float32
    table = rowfile.RowFile(tmp_path / "big.rows", torch.zeros(width), rows)
    table.tensor.add_(1.0)  # every page touched and dirty
    touched = rss_file_kib()
    table.release()
    released = rss_file_kib()
    assert touched - released > 48 * 1024, (touched, released)
    assert float(table.tensor.sum()) == rows * width, "the data stayed in the file"
    table.remove()


def test_a_store_on_disk_holds_what_one_in_memory_holds(tmp_path):
    memory, disk = ClientStore(6, torch.device("cpu")), ClientStore(6, torch.device("cpu"))
    disk.on_disk(tmp_path / "store")
    for store in (memory, disk):
        store.add("model", torch.linspace(0, 1, 11))
        store.add("pi", torch.full((3,), 1 / 3, dtype=torch.float64))
        store.set("model", np.array([1, 4]), torch.ones(2, 11))
        store.set("pi", 2, torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == ["client-model.rows", "client-pi.rows"]
    for name in ("model", "pi"):
        assert torch.equal(memory[name], disk[name]) and disk[name].dtype == memory[name].dtype
    # A whole table assigned (FedAC's models) is copied into the file, which stays the table.
    before = disk["model"].data_ptr()
    disk["model"] = torch.full((6, 11), 7.0)
    model_before_removal = disk["model"]
    assert disk["model"].data_ptr() == before and float(disk["model"].min()) == 7.0
    with pytest.raises(KeyError):
        disk["model"] = torch.zeros(5, 11)
    disk.remove_files()
    assert not (tmp_path / "store").exists()
    assert float(model_before_removal.sum()) == 7.0 * 66, "views outlive the file"


def test_disk_needs_a_cpu_device(tmp_path):
    with pytest.raises(SpecError, match="client_store: disk"):
        ClientStore(2, torch.device("meta")).on_disk(tmp_path)


def test_a_table_past_the_free_space_is_one_line(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 10, 1000))
    with pytest.raises(SpecError, match="needs 0.0 GiB for t.rows in .* where 0.0 GiB are free"):
        rowfile.RowFile(tmp_path / "t.rows", torch.zeros(100), rows=10)


def test_a_checkpoint_reads_back_into_the_files(tmp_path, monkeypatch):
    monkeypatch.setattr("cflpipe.fl.checkpoint.MIN_ROWS_BYTES", 1)
    store = ClientStore(9, torch.device("cpu"))
    store.on_disk(tmp_path / "store")
    table = store.add("personal", torch.zeros(300))
    table[:] = torch.randn(9, 300, generator=torch.Generator().manual_seed(0))
    saved = table.clone()
    write_state(tmp_path / "state" / "state.pt", {"round": 3, "clients": store.state_dict()})
    table[4:] = 0.0  # rounds after the checkpoint, lost with a kill
    targets = {("clients", name): t for name, t in store.targets().items()}
    state, problem = read_state(tmp_path / "state" / "state.pt", targets)
    assert problem is None and state["clients"]["personal"].data_ptr() == table.data_ptr()
    store.load_state_dict(state["clients"])
    assert torch.equal(store["personal"], saved) and store["personal"].data_ptr() == table.data_ptr()


def test_a_run_on_disk_leaves_no_store_and_is_the_same_run(tmp_path):
    outputs = {}
    for where in ("memory", "disk"):
        raw = spec_dict(tmp_path / where, "ditto", rounds=3, eval_every=3)
        raw["training"]["client_store"] = where
        spec = parse_spec(raw)
        train_run(spec, "s", "ditto", 0, progress=False)
        run_dir = spec.run_dir("s", "ditto", 0)
        assert not list(Path(run_dir).rglob("*.rows")), "the store's files outlive the run"
        outputs[where] = {p.relative_to(run_dir): p.read_bytes() for p in sorted(Path(run_dir).glob("*.parquet"))}
        assert "client_store" not in (run_dir / "config.yaml").read_text()
    assert outputs["memory"].keys() == outputs["disk"].keys() and outputs["memory"]
    for name, data in outputs["memory"].items():
        if name.name != "timing.parquet":  # seconds
            assert outputs["disk"][name] == data, name


def test_a_methods_table_stays_on_disk_through_its_state(tmp_path):
    from cflpipe.fl.engine import Run
    from cflpipe.fl.runs import resolve_run

    raw = spec_dict(tmp_path, "cgpfl")
    raw["training"]["client_store"] = "disk"
    run = Run(resolve_run(parse_spec(raw), "s", "cgpfl", 0))
    run.setup()
    method = run.method
    table = method.local
    assert rowfile.owner(table) is not None and table.shape[0] == run.ctx.num_clients
    assert (run.state_path.with_name("store") / "server-local.rows").is_file()
    table[2] = 5.0
    state = {name: (value.clone() if isinstance(value, torch.Tensor) else value)
             for name, value in method.state_dict().items()}
    table[2] = -5.0
    method.load_state_dict(state)
    assert method.local is table and float(method.local[2].min()) == 5.0, "read back into its file"
    run.ctx.clients.remove_files()
    assert not run.state_path.with_name("store").exists()


def test_a_damaged_or_foreign_checkpoint_leaves_the_files_as_they_were(tmp_path, monkeypatch):
    monkeypatch.setattr("cflpipe.fl.checkpoint.MIN_ROWS_BYTES", 1)
    store = ClientStore(5, torch.device("cpu"))
    store.on_disk(tmp_path / "store")
    table = store.add("personal", torch.zeros(1 << 14))
    table[:] = torch.arange(1.0, 6.0)[:, None]  # rows of 64 KiB, 1 … 5: a block each
    path = tmp_path / "state" / "state.pt"
    write_state(path, {"config": "a", "clients": store.state_dict()})
    table[:] = 2.0
    targets = {("clients", "personal"): table}
    # another configuration's checkpoint: read, but not into the files
    state, problem = read_state(path, targets, wanted=lambda s: s.get("config") == "b")
    assert problem is None and float(state["clients"]["personal"][4].min()) == 5.0
    assert float(table.min()) == 2.0 and state["clients"]["personal"].data_ptr() != table.data_ptr()
    # a damaged block, the last row's: not even the rows before it are written into the file
    last = hashlib.sha256(torch.full((1 << 14,), 5.0).numpy().tobytes()).hexdigest()
    block = tmp_path / "state" / "rows" / f"{last}.bin"
    block.write_bytes(block.read_bytes()[:-4])
    state, problem = read_state(path, targets, wanted=lambda s: True)
    assert state is None and "does not match" in problem
    assert float(table.min()) == float(table.max()) == 2.0


def test_a_damaged_second_table_leaves_the_first_as_it_was(tmp_path, monkeypatch):
    monkeypatch.setattr("cflpipe.fl.checkpoint.MIN_ROWS_BYTES", 1)
    store = ClientStore(3, torch.device("cpu"))
    store.on_disk(tmp_path / "store")
    first = store.server_table("held", torch.zeros(1 << 14), 3)
    second = store.server_table("update", torch.zeros(1 << 14), 3)
    first[:] = 1.0
    second[:] = torch.arange(1.0, 4.0)[:, None]
    path = tmp_path / "state" / "state.pt"
    write_state(path, {"config": "a", "method": {"held": first, "update": second}})
    first[:], second[:] = 2.0, 2.0
    last = hashlib.sha256(torch.full((1 << 14,), 3.0).numpy().tobytes()).hexdigest()
    block = tmp_path / "state" / "rows" / f"{last}.bin"
    block.write_bytes(block.read_bytes()[:-4])
    state, problem = read_state(path, {("method", "held"): first, ("method", "update"): second})
    assert state is None and "does not match" in problem
    assert float(first.min()) == float(first.max()) == 2.0, "the table read before the damaged one was written"


def test_the_clients_inputs_live_in_the_stores_folder_and_their_pages_are_let_go(tmp_path):
    """With the store on disk the clients' inputs are a map of an unlinked file in the run's store
    folder (#70 item 3): the same values as in memory, their pages let go once written and after
    each round (Engine: FederatedData.release_pages)."""
    from cflpipe.fl.data import build_federated_data
    from cflpipe.fl.runs import resolve_run

    raw = spec_dict(tmp_path / "r", "fedavg", client_store="disk")
    raw["scenarios"]["s"] = {"dataset": {"name": "synthetic", "devices": 2000, "max_samples": 100},
                             "clients": 2000, "partition": [{"kind": "natural"}]}
    spec = parse_spec(raw)
    resolved = resolve_run(spec, "s", "fedavg", 0)
    cpu = torch.device("cpu")
    in_memory = build_federated_data(spec, "s", cpu)
    before = rss_file_kib()
    data = resolved.load_data(cpu)
    store = resolved.run_dir / "state" / "store"
    assert rss_file_kib() - before < 8 * 1024, "the inputs were let go as they were written"
    assert data.train.mapped and data.test.mapped and not in_memory.train.mapped
    mapped_files = Path("/proc/self/maps").read_text().splitlines()
    assert any(f"{store}/" in line and line.endswith("(deleted)") for line in mapped_files)
    assert torch.equal(data.train.x, in_memory.train.x) and torch.equal(data.test.x, in_memory.test.x)
    assert torch.equal(data.train.y, in_memory.train.y) and np.array_equal(data.train.offsets, in_memory.train.offsets)
    assert data.train.x.nbytes > 16 << 20
    float(data.train.x.sum())  # every page read back
    touched = rss_file_kib()
    data.release_pages()
    assert touched - rss_file_kib() > 12 * 1024, (touched, rss_file_kib())
    assert not list(store.iterdir()), "nothing named in the folder: the file goes with its map"


def test_rows_taken_out_of_a_mapped_split_a_block_at_a_time_are_the_rows(tmp_path, monkeypatch):
    """SplitData.take (a sampled evaluation's copy of its clients' rows) from a map: the rows in
    memory, whatever the block."""
    from cflpipe.fl import data as fl_data

    raw = spec_dict(tmp_path / "r", "fedavg")
    spec = parse_spec(raw)
    cpu = torch.device("cpu")
    mapped, in_memory = (fl_data.build_federated_data(spec, "s", cpu, store) for store in (tmp_path / "store", None))
    clients = np.array([1, 3, 4])
    for block in (fl_data._ROWS_PER_RELEASE, 7, 1):
        monkeypatch.setattr(fl_data, "_ROWS_PER_RELEASE", block)
        for sample, expected in ((mapped.subset(clients), in_memory.subset(clients)),
                                 (mapped.subset(clients, train=False), in_memory.subset(clients, train=False))):
            assert torch.equal(sample.train.x, expected.train.x) and torch.equal(sample.test.x, expected.test.x)
            assert torch.equal(sample.test.y, expected.test.y) and sample.test.x.shape[0] > 7
        assert torch.equal(mapped.train.only(clients).x, in_memory.train.only(clients).x)


def test_a_disk_too_small_for_the_inputs_is_one_line(tmp_path, monkeypatch):
    from collections import namedtuple

    from cflpipe.data import base
    from cflpipe.errors import DataError

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(base.shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    with pytest.raises(DataError) as caught:
        base.file_map(8 << 20, tmp_path)
    assert str(tmp_path) in str(caught.value) and "8 MiB" in str(caught.value) and "1 MiB are free" in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def test_a_run_on_disk_that_fails_after_its_data_leaves_no_folder(tmp_path, monkeypatch):
    """The store's folder is made with the data (the inputs' files), before the method: a run
    that fails in between removes it with the run's other new folders."""
    from cflpipe.errors import SpecError as Refused
    from cflpipe.fl import engine

    def refuse(*args, **kwargs):
        raise Refused("training.model: refused here")

    monkeypatch.setattr(engine, "build_model", refuse)
    spec = parse_spec(spec_dict(tmp_path / "r", "fedavg", client_store="disk"))
    with pytest.raises(Refused):
        train_run(spec, "s", "fedavg", 0, progress=False)
    assert not spec.run_dir("s", "fedavg", 0).exists()
