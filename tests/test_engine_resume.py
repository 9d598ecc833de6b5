"""The engine's runs on disk: resume after a kill (byte-identical), damaged or foreign checkpoints,
one writer per run, file modes, a full disk, and what a failed run leaves behind."""

import os
import signal
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml

from cflpipe.errors import SpecError
from cflpipe.fl.checkpoint import read_state
from cflpipe.fl.engine import train_run
from cflpipe.spec import parse_spec

from engine_helpers import _bytes, _cli, finished_runs, tiny_spec  # noqa: F401 (a fixture)

torch.set_num_threads(1)


def test_finished_run_is_skipped_unless_forced(finished_runs):
    spec, runs = finished_runs
    before = (runs["fedavg"].run_dir / "metrics.parquet").stat().st_mtime_ns
    again = train_run(spec, "swap", "fedavg", 0, progress=False)
    assert again.skipped and (runs["fedavg"].run_dir / "metrics.parquet").stat().st_mtime_ns == before
    forced = train_run(spec, "swap", "fedavg", 0, force=True, progress=False)
    assert not forced.skipped


@pytest.mark.slow
def test_kill_and_resume_gives_identical_outputs(tmp_path):
    data = tiny_spec(tmp_path / "killed", rounds=40, checkpoint_every=3, eval_every=4, local_steps=5)
    data["training"]["model"] = "cnn"
    killed_cfg = tmp_path / "killed.yaml"
    killed_cfg.write_text(yaml.safe_dump(data))
    reference_cfg = tmp_path / "reference.yaml"
    reference_cfg.write_text(yaml.safe_dump({**data, "results_dir": str(tmp_path / "reference")}))
    subprocess.run(_cli(reference_cfg, "fedprox"), check=True, capture_output=True)

    run_dir = tmp_path / "killed" / "runs" / "swap" / "fedprox" / "seed0"
    proc = subprocess.Popen(_cli(killed_cfg, "fedprox"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = run_dir / "state" / "state.pt"
    deadline = time.monotonic() + 120
    while not state.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(0.3)  # let it get past the first checkpoint, somewhere mid-run
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "summary.json").exists()
    assert not (run_dir / "metrics.parquet").exists()
    checkpoint, problem = read_state(state)
    assert problem is None and 0 < checkpoint["round"] < 40

    subprocess.run(_cli(killed_cfg, "fedprox"), check=True, capture_output=True)
    reference_dir = tmp_path / "reference" / "runs" / "swap" / "fedprox" / "seed0"
    assert _bytes(run_dir) == _bytes(reference_dir)


def test_one_writer_per_run_and_stale_temp_files_are_swept(tmp_path):
    from cflpipe import store
    from cflpipe.errors import BusyError
    from cflpipe.fl.runs import LOCK_FILE

    spec = parse_spec(tiny_spec(tmp_path, rounds=2))
    run_dir = spec.run_dir("swap", "fedavg", 0)
    with store.exclusive(run_dir / LOCK_FILE, "holder"):
        with pytest.raises(BusyError) as info:
            train_run(spec, "swap", "fedavg", 0, progress=False)
        assert (run_dir / LOCK_FILE).exists()  # the refused one never cleans up after the holder
    message = str(info.value)
    assert message.startswith(f"run swap/fedavg/seed0 ({run_dir}): pid {os.getpid()} on ") and "\n" not in message
    assert not (run_dir / "summary.json").exists()
    stale = [run_dir / ".metrics.parquet.x1.tmp", run_dir / "state" / ".state.pt.x2.tmp"]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a checkpoint")
    train_run(spec, "swap", "fedavg", 0, progress=False)
    assert not any(path.exists() for path in stale) and (run_dir / "summary.json").exists()


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_outputs_honour_the_umask(tmp_path, umask, mode):
    from cflpipe import store

    old = os.umask(umask)
    try:
        store.write_text(tmp_path / "out.txt", "x")
    finally:
        os.umask(old)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == mode


class _Stopped(Exception):
    pass


def _interrupted_after_round(spec, monkeypatch, last_round: int = 4):
    from cflpipe.fl import engine

    save = engine.Run.save_state

    def save_then_stop(self, round_number):
        save(self, round_number)
        if round_number == last_round:
            raise _Stopped

    with monkeypatch.context() as patch:
        patch.setattr(engine.Run, "save_state", save_then_stop)
        with pytest.raises(_Stopped):
            train_run(spec, "swap", "fedavg", 0, progress=False)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage, problem", [
    (lambda p: p.write_bytes(p.read_bytes()[:100]), "does not match state.sha256"),
    (lambda p: p.write_bytes(b""), "does not match state.sha256"),
    (_flip_a_byte, "does not match state.sha256"),
    (lambda p: p.with_name("state.sha256").unlink(), "no state.sha256 beside it"),
    (lambda p: (p.write_bytes(b"garbage"), p.with_name("state.sha256").write_text(
        __import__("hashlib").sha256(b"garbage").hexdigest())), "unreadable"),
])
def test_a_damaged_checkpoint_is_detected_and_the_run_starts_afresh(tmp_path, finished_runs, monkeypatch,
                                                                    capsys, damage, problem):
    _, runs = finished_runs
    spec = parse_spec(tiny_spec(tmp_path))
    _interrupted_after_round(spec, monkeypatch)
    state = spec.run_dir("swap", "fedavg", 0) / "state" / "state.pt"
    damage(state)
    capsys.readouterr()
    result = train_run(spec, "swap", "fedavg", 0, progress=False)
    err = capsys.readouterr().err
    assert err.startswith(f"warning: {state}: ") and problem in err and err.rstrip().endswith("starting the run afresh")
    assert _bytes(result.run_dir) == _bytes(runs["fedavg"].run_dir)


def test_an_intact_checkpoint_resumes_silently(tmp_path, finished_runs, monkeypatch, capsys,
                                                 record_start_rounds):
    _, runs = finished_runs
    spec = parse_spec(tiny_spec(tmp_path))
    _interrupted_after_round(spec, monkeypatch)
    capsys.readouterr()
    started = record_start_rounds()
    result = train_run(spec, "swap", "fedavg", 0, progress=False)
    assert started == [4] and "warning" not in capsys.readouterr().err
    assert _bytes(result.run_dir) == _bytes(runs["fedavg"].run_dir)


@pytest.mark.parametrize("method", ["fedavg", "local"])
def test_a_save_killed_before_its_rename_falls_back_to_the_previous_checkpoint(
        tmp_path, finished_runs, monkeypatch, capsys, record_start_rounds, method):
    """A kill between writing state.sha256 and renaming the new state.pt into place (simulated:
    the rename of round 6's state fails) costs one checkpoint interval, not the run. `local`'s
    client models are row blocks here (the threshold lowered), which change between the two."""
    from cflpipe import store
    from cflpipe.fl import checkpoint, engine

    _, runs = finished_runs
    monkeypatch.setattr(checkpoint, "MIN_ROWS_BYTES", 1024)
    spec = parse_spec(tiny_spec(tmp_path))
    real_replace, save = os.replace, engine.Run.save_state

    def replace(src, dst):
        if Path(dst).name == "state.pt" and round_saved[-1] == 6:
            raise _Stopped
        real_replace(src, dst)

    round_saved: list[int] = []

    def recording_save(self, round_number):
        round_saved.append(round_number)
        save(self, round_number)

    with monkeypatch.context() as patch:
        patch.setattr(store.os, "replace", replace)
        patch.setattr(engine.Run, "save_state", recording_save)
        with pytest.raises(_Stopped):
            train_run(spec, "swap", method, 0, progress=False)
    state = spec.run_dir("swap", method, 0) / "state" / "state.pt"
    if method == "local":
        assert any(state.with_name("rows").glob("*.bin"))
    assert len(state.with_name("state.sha256").read_text().split()) == 2  # round 6's digest, then round 4's
    round4 = store.sha256_of(state)
    capsys.readouterr()
    started = record_start_rounds()
    result = train_run(spec, "swap", method, 0, progress=False)
    assert started == [4]
    assert capsys.readouterr().err == (f"warning: {state}: the last checkpoint's save was interrupted; "
                                       f"resuming from the one before it (round 4)\n")
    assert _bytes(result.run_dir) == _bytes(runs[method].run_dir)
    # the resumed-from state (round 4's) is the next checkpoint's fallback, not the save that never landed
    assert state.with_name("state.sha256").read_text().split() == [store.sha256_of(state), round4]


def test_a_checkpoint_of_another_configuration_is_discarded_with_a_word(tmp_path, monkeypatch, capsys,
                                                                        record_start_rounds):
    spec = parse_spec(tiny_spec(tmp_path))
    _interrupted_after_round(spec, monkeypatch)
    capsys.readouterr()
    started = record_start_rounds()
    train_run(parse_spec(tiny_spec(tmp_path, lr=0.07)), "swap", "fedavg", 0, progress=False)
    state = spec.run_dir("swap", "fedavg", 0) / "state" / "state.pt"
    assert started == [0]
    assert capsys.readouterr().err == (f"warning: {state}: a checkpoint of another configuration (differs in "
                                       f"training.lr); starting the run afresh\n")


def test_a_folder_in_place_of_the_checkpoint_is_said_and_cleared(tmp_path, finished_runs, capsys):
    _, runs = finished_runs
    spec = parse_spec(tiny_spec(tmp_path))
    state = spec.run_dir("swap", "fedavg", 0) / "state" / "state.pt"
    (state / "inside").mkdir(parents=True)
    result = train_run(spec, "swap", "fedavg", 0, progress=False)
    assert capsys.readouterr().err == f"warning: {state}: a folder, not a checkpoint; starting the run afresh\n"
    assert _bytes(result.run_dir) == _bytes(runs["fedavg"].run_dir)
    (result.run_dir / "summary.json").unlink()
    shutil.rmtree(state.parent)
    (state / "inside").mkdir(parents=True)
    forced = train_run(spec, "swap", "fedavg", 0, force=True, progress=False)  # --force: no resume, cleared too
    assert _bytes(forced.run_dir) == _bytes(runs["fedavg"].run_dir)


def test_a_results_dir_that_cannot_hold_runs_fails_before_training(tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("a file, not a folder")
    spec = parse_spec({**tiny_spec(blocker), "results_dir": str(blocker)})
    with pytest.raises(SpecError) as info:
        train_run(spec, "swap", "fedavg", 0, progress=False)
    assert str(info.value) == (f"results_dir: cannot write the run folder {spec.run_dir('swap', 'fedavg', 0)} "
                               f"(Not a directory)")


def test_file_systems_without_flock_run_unlocked_with_a_warning(tmp_path, monkeypatch, capsys):
    import errno
    import fcntl

    from cflpipe import store

    def no_locks(handle, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with store.exclusive(tmp_path / ".lock", "run x"):
        pass
    assert "does not support locks (No locks available); make sure only one process writes run x" in \
        capsys.readouterr().err
    spec = parse_spec(tiny_spec(tmp_path, rounds=1))
    assert train_run(spec, "swap", "fedavg", 0, progress=False).summary["rounds"] == 1
    assert "make sure only one process writes run swap/fedavg/seed0" in capsys.readouterr().err


def test_a_finished_run_recorded_without_threads_is_not_redone(tmp_path):
    spec = parse_spec(tiny_spec(tmp_path, rounds=1))
    first = train_run(spec, "swap", "fedavg", 0, progress=False)
    config = first.run_dir / "config.yaml"
    recorded = yaml.safe_load(config.read_text())
    assert recorded.pop("threads") == 1
    config.write_text(yaml.safe_dump(recorded, sort_keys=False))  # as runs written before threads were
    assert train_run(spec, "swap", "fedavg", 0, progress=False).skipped


class _Exploit:
    def __reduce__(self):
        return (os.system, ("true",))


def test_a_checkpoint_holding_a_pickled_object_is_refused_even_with_its_digest(tmp_path):
    from cflpipe.fl.checkpoint import write_state

    path = tmp_path / "state.pt"
    write_state(path, {"round": 2, "tables": {}})
    assert read_state(path) == ({"round": 2, "tables": {}}, None)
    torch.save({"round": 2, "tables": _Exploit()}, path)
    from cflpipe import store

    (tmp_path / "state.sha256").write_text(f"{store.sha256_of(path)}\n")  # a matching digest
    state, problem = read_state(path)
    assert state is None and problem == "unreadable (UnpicklingError)"


def test_same_run_compares_the_recorded_config_without_threads(tmp_path):
    from cflpipe.fl.runs import same_run
    from cflpipe.spec import dump_yaml

    recorded = tmp_path / "config.yaml"
    config = {"method": "fedavg", "training": {"lr": 0.1}, "seed": 0, "threads": 1}
    recorded.write_text(dump_yaml(config))  # as the engine records it
    assert same_run(recorded, {**config, "threads": 4})
    assert same_run(recorded, {k: v for k, v in config.items() if k != "threads"})  # runs before threads
    assert not same_run(recorded, {**config, "training": {"lr": 0.2}})
    recorded.write_text("training: [unclosed")
    assert not same_run(recorded, config)
    recorded.write_text("just text")
    assert not same_run(recorded, config)


def test_a_run_that_left_nothing_leaves_no_empty_folders(tmp_path):
    from cflpipe.fl.runs import LOCK_FILE, remove_empty

    existed = tmp_path / "results"
    run_dir = existed / "runs" / "s" / "fedavg" / "seed0"
    (run_dir / "state").mkdir(parents=True)
    (run_dir / LOCK_FILE).write_text("1\n")
    remove_empty(run_dir, existed)
    assert existed.is_dir() and not (existed / "runs").exists()
    # a checkpoint to resume from keeps its run folder, whatever else is empty
    (run_dir / "state").mkdir(parents=True)
    (run_dir / "state" / "state.pt").write_bytes(b"x")
    remove_empty(run_dir, existed)
    assert (run_dir / "state" / "state.pt").exists()
    remove_empty(run_dir, existed)  # no lock file left: nothing to unlink, no error


def test_a_checkpoint_without_models_before_the_last_round_restarts_the_run(tmp_path, capsys):
    from cflpipe.fl.checkpoint import write_state

    spec = parse_spec(tiny_spec(tmp_path))
    train_run(spec, "swap", "fedavg", 0, progress=False)
    run_dir = spec.run_dir("swap", "fedavg", 0)
    fresh = (run_dir / "rounds.parquet").read_bytes()
    state, _ = read_state(run_dir / "state" / "state.pt")
    assert state["method"] is None and state["round"] == 6  # the finished run's cut-down checkpoint
    write_state(run_dir / "state" / "state.pt", {**state, "round": 4})  # cannot be written: refused
    (run_dir / "summary.json").unlink()
    train_run(spec, "swap", "fedavg", 0, progress=False)
    assert "a checkpoint without models before the last round; starting the run afresh" in capsys.readouterr().err
    assert (run_dir / "rounds.parquet").read_bytes() == fresh


def test_a_finished_run_is_skipped_only_unforced_and_for_the_same_config(tmp_path):
    spec = parse_spec(tiny_spec(tmp_path, rounds=1, eval_every=1))
    run_dir = spec.run_dir("swap", "fedavg", 0)
    first = train_run(spec, "swap", "fedavg", 0, progress=False)
    assert not first.skipped and yaml.safe_load((run_dir / "config.yaml").read_text())["seed"] == 0
    again = train_run(spec, "swap", "fedavg", 0, progress=False)
    # the skipped run's message names its folder and reports its figures
    assert (again.skipped, again.run_dir, again.summary) == (True, run_dir, first.summary)
    forced = train_run(spec, "swap", "fedavg", 0, force=True, progress=False)
    assert not forced.skipped
    recorded = yaml.safe_load((run_dir / "config.yaml").read_text())
    recorded["training"]["lr"] = 0.5  # a run of an earlier definition of the spec, every output there
    (run_dir / "config.yaml").write_text(yaml.safe_dump(recorded, sort_keys=False))
    assert not train_run(spec, "swap", "fedavg", 0, progress=False).skipped
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["lr"] == 0.05


def test_a_run_that_fails_before_writing_anything_leaves_the_results_folder_as_it_was(tmp_path):
    results = tmp_path / "results"
    results.mkdir()  # existed before the run: kept, though empty again
    spec = parse_spec({**tiny_spec(results), "methods": {"fedavg": {}}, "scenarios": {"s": {
        "dataset": {"name": "files", "path": str(tmp_path / "missing.npz")}, "clients": 4,
        "partition": [{"kind": "iid"}]}}})
    from cflpipe.errors import DataError

    with pytest.raises(DataError, match="no such file"):
        train_run(spec, "s", "fedavg", 0, progress=False)
    assert results.is_dir() and list(results.iterdir()) == []


def test_a_resume_before_the_first_evaluation_equals_an_uninterrupted_run(tmp_path, monkeypatch, capsys,
                                                                         record_start_rounds):
    # A checkpoint before the first evaluation holds empty metrics tables; a resumed run must
    # extend them like a fresh one and come out byte-identical.
    settings = dict(rounds=3, eval_every=3, checkpoint_every=1, clients_per_round=2, local_steps=1)
    reference = train_run(parse_spec(tiny_spec(tmp_path / "reference", **settings)), "swap", "fedavg", 0,
                          progress=False)
    spec = parse_spec(tiny_spec(tmp_path / "resumed", **settings))
    _interrupted_after_round(spec, monkeypatch, last_round=1)
    checkpoint, _ = read_state(spec.run_dir("swap", "fedavg", 0) / "state" / "state.pt")
    assert checkpoint["method"] is not None and checkpoint["tables"]["metrics"] == {}
    capsys.readouterr()
    started = record_start_rounds()
    result = train_run(spec, "swap", "fedavg", 0, progress=False)
    assert started == [1] and "warning" not in capsys.readouterr().err
    assert _bytes(result.run_dir) == _bytes(reference.run_dir)
    # the last checkpoint is cut down to the tables (keep_state: false)
    final, _ = read_state(result.run_dir / "state" / "state.pt")
    assert final["round"] == 3 and final["method"] is None and final["clients"] is None


@pytest.mark.parametrize("how", ["torch", "os"])
def test_a_full_disk_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys, how):
    """#33 item 4: a full disk ended in torch's `unexpected pos …` or `OSError: [Errno 28]`."""
    import errno
    from collections import namedtuple

    from cflpipe import store
    from cflpipe.cli import main
    from cflpipe.fl import checkpoint

    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(tiny_spec(tmp_path / "results", rounds=2)))
    state = tmp_path / "results" / "runs" / "swap" / "fedavg" / "seed0" / "state" / "state.pt"
    if how == "torch":
        def full(*args, **kwargs):
            raise RuntimeError("[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing "
                               "file data/0: file write failed; unexpected pos 2496 vs 2390")
        monkeypatch.setattr(checkpoint.torch, "save", full)
        usage = namedtuple("usage", "total used free")
        monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 0))
    else:
        def full(path, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        monkeypatch.setattr(store, "write_text", full)
    code = main(["train", "--config", str(config), "--scenario", "swap", "--method", "fedavg", "--seed", "0",
                 "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1, err
    assert err[0].startswith("error: no space left on the device writing ") and err[0].endswith(
        "; free some and run the same command again (finished runs and checkpoints are kept)")
    if how == "torch":
        assert str(state) in err[0]
