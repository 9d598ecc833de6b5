"""Checkpoints with row blocks (issue #17, item 2): a large per-client table is stored as blocks of
rows named by their sha256, and a checkpoint writes only the blocks that changed since the last
one; what it reads back is the same tensors, and a missing or altered block is a refused
checkpoint, never a silently different state."""

from __future__ import annotations

import hashlib

import pytest
import torch

from cflpipe import store
from cflpipe.fl import checkpoint
from cflpipe.fl.checkpoint import BLOCK_BYTES, MIN_ROWS_BYTES, read_state, state_bytes, write_state

from conftest import Killed, die_after_saving


def table(rows: int, row_bytes: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, row_bytes // 4, generator=generator)


def state_of(models: torch.Tensor, **extra) -> dict:
    return {"round": 3, "method": {"latest": models, "centers": models[:2].clone(), "labels": torch.arange(4),
                                   "nested": [{"personal": models * 2}], **extra},
            "tables": {"metrics": {"acc": [0.5, 0.25]}}}


def blocks(path) -> dict[str, int]:
    return {block.name: block.stat().st_ino for block in checkpoint.rows_folder(path).glob("*.bin")}


def assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b


def test_a_large_table_round_trips_through_row_blocks_and_small_tensors_stay_inline(tmp_path):
    path = tmp_path / "state" / "state.pt"
    models = table(40, BLOCK_BYTES)  # 40 rows of one block each: 2.6 MB
    state = state_of(models, small=torch.ones(3, 3), bits=models[:, :8] > 0, half=models.to(torch.bfloat16))
    write_state(path, state)
    loaded, problem = read_state(path)
    assert problem is None
    assert_same(state, loaded)
    # latest, personal and the bfloat16 copy are in blocks: the file itself holds names, not rows
    assert path.stat().st_size < MIN_ROWS_BYTES / 4
    assert len(blocks(path)) == 40 + 40 + 20  # bfloat16 rows are half as long: two rows per block
    assert state_bytes(path) > 2.5 * models.numel() * 4  # float32 twice, bfloat16 once


def test_a_checkpoint_writes_only_the_rows_that_changed_and_drops_the_replaced_ones(tmp_path):
    path = tmp_path / "state" / "state.pt"
    models = table(40, BLOCK_BYTES)
    write_state(path, {"latest": models})
    before = blocks(path)
    changed = models.clone()
    changed[7] += 1.0  # one client trained
    write_state(path, {"latest": changed})
    after = blocks(path)
    assert len(after) == 40 and len(set(after) - set(before)) == 1 and len(set(before) - set(after)) == 1
    assert all(after[name] == before[name] for name in set(after) & set(before))  # not rewritten
    # a block cut short (an interrupted copy of the run folder) is written again, not trusted
    damaged = sorted(checkpoint.rows_folder(path).glob("*.bin"))[0]
    damaged.write_bytes(damaged.read_bytes()[:10])
    write_state(path, {"latest": changed})
    assert torch.equal(read_state(path)[0]["latest"], changed)
    assert torch.equal(read_state(path)[0]["latest"], changed)
    # a state without tables (a finished run's cut-down checkpoint) leaves no blocks behind
    write_state(path, {"latest": None})
    assert not checkpoint.rows_folder(path).exists() and read_state(path) == ({"latest": None}, None)


def test_equal_rows_are_stored_once(tmp_path):
    path = tmp_path / "state.pt"
    write_state(path, {"latest": table(1, BLOCK_BYTES).expand(30, -1)})  # every client got the same model
    assert len(blocks(path)) == 1
    assert torch.equal(read_state(path)[0]["latest"], table(1, BLOCK_BYTES).expand(30, -1))


def test_small_rows_share_a_block(tmp_path):
    path = tmp_path / "state.pt"
    models = table(1100, 1024)  # 1 kB rows: 64 to a block, the last one short
    write_state(path, {"latest": models})
    assert len(blocks(path)) == 18
    assert torch.equal(read_state(path)[0]["latest"], models)


@pytest.mark.parametrize("damage", ["truncate", "alter", "remove", "extend"])
def test_a_damaged_block_is_a_refused_checkpoint(tmp_path, damage):
    path = tmp_path / "state.pt"
    write_state(path, {"latest": table(20, BLOCK_BYTES)})
    block = sorted(checkpoint.rows_folder(path).glob("*.bin"))[5]
    data = block.read_bytes()
    if damage == "truncate":
        block.write_bytes(data[:-4])
    elif damage == "alter":
        block.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "extend":
        block.write_bytes(data + b"\0")
    else:
        block.unlink()
    state, problem = read_state(path)
    assert state is None
    assert problem == (f"its row block {block} is missing" if damage == "remove"
                       else f"its row block {block} does not match its name (a truncated or altered file)")


def test_a_block_name_outside_the_folder_is_refused_even_with_a_matching_digest(tmp_path):
    path = tmp_path / "state" / "state.pt"
    outside = tmp_path / "secret.bin"
    outside.write_bytes(bytes(8))
    for name in ("../../secret", "/etc/passwd", hashlib.sha256(bytes(8)).hexdigest() + "/x"):
        entry = {"dtype": "float32", "shape": [1, 2], "rows_per_block": 1, "blocks": [name]}
        path.parent.mkdir(exist_ok=True)
        torch.save({"latest": {"__rows__": entry}}, path)
        (path.parent / "state.sha256").write_text(f"{store.sha256_of(path)}\n")
        state, problem = read_state(path)
        assert state is None and problem.startswith("a row block name that is not a sha256"), problem
    for dtype, shape in (("Tensor", [1, 2]), ("os", [1, 2]), ("float32", [1 << 40, 1 << 40])):
        entry = {"dtype": dtype, "shape": shape, "rows_per_block": 1, "blocks": []}
        torch.save({"latest": {"__rows__": entry}}, path)
        (path.parent / "state.sha256").write_text(f"{store.sha256_of(path)}\n")
        state, problem = read_state(path)
        assert state is None and problem.startswith("a row table entry it cannot read"), (dtype, problem)


def test_a_crash_before_the_new_state_is_in_place_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    path = tmp_path / "state" / "state.pt"
    first = table(20, BLOCK_BYTES)
    write_state(path, {"latest": first})
    second = first.clone()
    second[3] = 0.0

    class Killed(Exception):
        pass

    def die(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(checkpoint.torch, "save", die)  # after the new blocks, before state.pt
    with pytest.raises(Killed):
        write_state(path, {"latest": second})
    monkeypatch.undo()
    assert len(blocks(path)) == 21  # the new row is there, and so is the one it replaces
    assert torch.equal(read_state(path)[0]["latest"], first)
    write_state(path, {"latest": second})
    assert len(blocks(path)) == 20 and torch.equal(read_state(path)[0]["latest"], second)


def test_a_run_with_a_model_per_client_writes_the_sampled_clients_rows_and_resumes_to_the_same_bytes(
        tmp_path, monkeypatch, record_start_rounds):
    """Ditto keeps a personal model per client (8 × 221 kB, one row per block); with 2 clients
    sampled a round, a checkpoint writes their 2 rows and nothing else of that table."""
    from cflpipe.fl import resume
    from cflpipe.fl.engine import train_run
    from cflpipe.spec import parse_spec

    def spec(results):
        return parse_spec({
            "seeds": [0],
            "training": {"model": "mlp", "rounds": 4, "clients_per_round": 2, "local_steps": 2, "batch_size": 16,
                         "eval_every": 2, "checkpoint_every": 1, "device": "cpu", "keep_state": True},
            "scenarios": {"s": {"dataset": "digits", "clients": 8, "partition": [{"kind": "iid"}]}},
            "methods": {"ditto": {}}, "results_dir": str(results)})

    new_blocks = []
    write_state = resume.write_state

    def record(path, state):
        before = set(blocks(path))
        write_state(path, state)
        new_blocks.append(len(set(blocks(path)) - before))

    with monkeypatch.context() as patch:
        patch.setattr(resume, "write_state", record)
        run_dir = train_run(spec(tmp_path / "a"), "s", "ditto", 0, progress=False).run_dir
    # round 1: the 2 trained personal models and the 6 untrained ones (equal: one block); then
    # the 2 sampled clients' rows a round (the global model, 1-D, is inside state.pt)
    assert new_blocks == [3, 2, 2, 2]

    with monkeypatch.context() as patch:  # without row blocks: the same outputs
        patch.setattr(checkpoint, "MIN_ROWS_BYTES", 1 << 62)
        inline = train_run(spec(tmp_path / "b"), "s", "ditto", 0, progress=False).run_dir
    assert not checkpoint.rows_folder(inline / "state/state.pt").exists()

    with monkeypatch.context() as patch:  # killed after round 2: resumed from its row blocks
        die_after_saving(patch, 2)
        with pytest.raises(Killed):
            train_run(spec(tmp_path / "c"), "s", "ditto", 0, progress=False)
    started = record_start_rounds()
    resumed = train_run(spec(tmp_path / "c"), "s", "ditto", 0, progress=False).run_dir
    assert started == [2]
    for name in ("metrics.parquet", "clusters.parquet", "rounds.parquet", "plots.csv", "summary.json"):
        assert (run_dir / name).read_bytes() == (inline / name).read_bytes() == (resumed / name).read_bytes(), name
