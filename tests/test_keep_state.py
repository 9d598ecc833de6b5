"""What a finished run keeps (issue #14, item 9): by default (`training.keep_state: false`) its
last checkpoint holds the tables its outputs are written from and no models, which is all a
resume after the last round needs; `cflpipe clean` cuts down finished runs made with
`keep_state: true` (or before it existed) and never touches an unfinished run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from cflpipe.cli import main
from cflpipe.fl import engine
from cflpipe.fl.checkpoint import read_state, state_bytes
from cflpipe.fl.engine import train_run
from cflpipe.fl.runs import OUTPUT_FILES, clean_runs, resolved_config
from cflpipe.spec import parse_spec, spec_sha256

torch.set_num_threads(1)

STABLE_FILES = ("metrics.parquet", "clusters.parquet", "rounds.parquet", "plots.csv", "summary.json",
                "config.yaml")


def spec_data(results: Path, **training) -> dict:
    return {
        "seeds": [0, 1],
        "training": {"model": "mlp", "rounds": 4, "clients_per_round": 4, "local_steps": 2, "batch_size": 16,
                     "lr": 0.05, "momentum": 0.9, "eval_every": 2, "checkpoint_every": 2, "device": "cpu",
                     **training},
        "scenarios": {"swap": {"dataset": "digits", "clients": 8,
                               "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        # local keeps a model per client: the checkpoint a finished run would otherwise keep is large
        "methods": {"local": {}, "fedprox": {"mu": 0.1}},
        "results_dir": str(results),
    }


def stable(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in STABLE_FILES}


def state(run_dir: Path) -> dict:
    loaded, problem = read_state(run_dir / "state" / "state.pt")
    assert problem is None, problem
    return loaded


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """Runs trained with keep_state: true (the whole checkpoint)."""
    spec = parse_spec(spec_data(tmp_path_factory.mktemp("kept"), keep_state=True))
    return spec, {m: train_run(spec, "swap", m, 0, progress=False).run_dir for m in ("local", "fedprox")}


def test_keep_state_changes_what_is_kept_not_the_run(tmp_path, kept):
    kept_spec, kept_dirs = kept
    spec = parse_spec(spec_data(tmp_path))
    assert spec.training.keep_state is False  # the default
    for method in ("local", "fedprox"):
        run_dir = train_run(spec, "swap", method, 0, progress=False).run_dir
        assert stable(run_dir) == stable(kept_dirs[method]), method
        cut, whole = state(run_dir), state(kept_dirs[method])
        assert cut["method"] is None and cut["clients"] is None and whole["method"] is not None
        assert cut["round"] == whole["round"] == 4
        assert {k: v for k, v in cut["tables"].items() if k != "timing"} == \
            {k: v for k, v in whole["tables"].items() if k != "timing"}  # wall-clock times differ
        size, kept_size = (state_bytes(d / "state/state.pt") for d in (run_dir, kept_dirs[method]))
        assert size < kept_size / 5, (size, kept_size)
    # Not part of what a run is: its config.yaml, the workflow's params and the spec's hash.
    assert "keep_state" not in yaml.safe_load((run_dir / "config.yaml").read_text())["training"]
    assert resolved_config(spec, "swap", "local", 0) == resolved_config(kept_spec, "swap", "local", 0)
    assert spec_sha256(spec) == spec_sha256(kept_spec)


def test_a_finished_run_without_its_outputs_is_rebuilt_from_the_cut_down_checkpoint(tmp_path, kept,
                                                                                       record_start_rounds):
    """Snakemake deletes a job's declared outputs before running it again (e.g. after a seed is
    added): the finished seeds come back from their last checkpoint without training a round."""
    _, kept_dirs = kept
    spec = parse_spec(spec_data(tmp_path))
    run_dir = train_run(spec, "swap", "local", 0, progress=False).run_dir
    for name in OUTPUT_FILES:
        (run_dir / name).unlink()
    started = record_start_rounds()
    result = train_run(spec, "swap", "local", 0, progress=False)
    assert not result.skipped and started == [4]
    assert stable(run_dir) == stable(kept_dirs["local"])


def test_a_run_stopped_after_its_last_checkpoint_resumes_to_the_same_bytes(tmp_path, kept, monkeypatch):
    """Killed between the last (cut-down) checkpoint and its outputs."""
    _, kept_dirs = kept
    spec = parse_spec(spec_data(tmp_path))

    class Stopped(Exception):
        pass

    def stop(self):
        raise Stopped

    with monkeypatch.context() as patch:
        patch.setattr(engine.Run, "write_outputs", stop)
        with pytest.raises(Stopped):
            train_run(spec, "swap", "fedprox", 0, progress=False)
    run_dir = spec.run_dir("swap", "fedprox", 0)
    assert not (run_dir / "summary.json").exists() and state(run_dir)["method"] is None
    train_run(spec, "swap", "fedprox", 0, progress=False)
    assert stable(run_dir) == stable(kept_dirs["fedprox"])


def test_clean_cuts_down_finished_runs_only(tmp_path, kept, monkeypatch, capsys):
    _, kept_dirs = kept
    data = spec_data(tmp_path / "results", keep_state=True)
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(data))
    spec = parse_spec(data)
    for method in ("local", "fedprox"):
        train_run(spec, "swap", method, 0, progress=False)
    # seed 1 of local is stopped after its round-2 checkpoint: unfinished, it must keep its models
    save = engine.Run.save_state

    class Stopped(Exception):
        pass

    def save_then_stop(self, round_number):
        save(self, round_number)
        raise Stopped

    with monkeypatch.context() as patch:
        patch.setattr(engine.Run, "save_state", save_then_stop)
        with pytest.raises(Stopped):
            train_run(spec, "swap", "local", 1, progress=False)
    unfinished = spec.run_dir("swap", "local", 1) / "state" / "state.pt"
    # .lock names the last process that held the run (clean takes it too)
    files = {p: p.read_bytes() for p in sorted((tmp_path / "results").rglob("*")) if p.is_file()
             and p.name != ".lock"}

    assert main(["clean", "--config", str(config), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert {p: p.read_bytes() for p in files} == files  # a dry run changes nothing
    assert len(out) == 3 and out[-1].startswith(f"{config}: would free ") \
        and out[-1].endswith(f" in 2 finished runs of 4 ({tmp_path / 'results'}/runs)")

    assert main(["clean", "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert sorted(line.split(": freed ")[0] for line in out[:-1]) == \
        [f"{spec.run_dir('swap', m, 0)}/state" for m in ("fedprox", "local")]
    assert all(line.endswith(("kB", "MB")) for line in out[:-1]), out
    assert out[-1].startswith(f"{config}: freed ")
    for method in ("local", "fedprox"):
        run_dir = spec.run_dir("swap", method, 0)
        assert state(run_dir)["method"] is None
        assert stable(run_dir) == stable(kept_dirs[method])  # outputs untouched
    assert unfinished.read_bytes() == files[unfinished] and read_state(unfinished)[0]["round"] == 2

    assert main(["clean", "--config", str(config)]) == 0  # nothing left to free
    assert capsys.readouterr().out.splitlines() == [f"{config}: nothing to clean: no finished run of the 4 runs "
                                                     f"holds models in its checkpoint ({tmp_path / 'results'}/runs)"]
    # The unfinished run still resumes; the cleaned ones still come back without their outputs.
    assert train_run(spec, "swap", "local", 1, progress=False).summary["rounds"] == 4
    run_dir = spec.run_dir("swap", "local", 0)
    (run_dir / "summary.json").unlink()
    train_run(spec, "swap", "local", 0, progress=False)
    assert stable(run_dir) == stable(kept_dirs["local"])


def test_clean_leaves_a_run_another_process_writes(tmp_path, kept, capsys):
    from cflpipe import store
    from cflpipe.fl.runs import LOCK_FILE

    spec, kept_dirs = kept
    run_dir = kept_dirs["fedprox"]
    before = (run_dir / "state/state.pt").read_bytes()
    with store.exclusive(run_dir / LOCK_FILE, "the test"):
        cleaned = clean_runs(spec, dry_run=True)
    assert [c.run_dir for c in cleaned if c.freed is None] == [run_dir]
    assert (run_dir / "state/state.pt").read_bytes() == before


def test_clean_reports_exactly_the_bytes_it_frees_and_a_dry_run_the_same(tmp_path):
    # `cflpipe clean` prints what it freed: the figure must be what left the disk, and a dry run
    # must promise the same figure.
    spec = parse_spec(spec_data(tmp_path / "results", keep_state=True))
    train_run(spec, "swap", "local", 0, progress=False)
    folder = spec.run_dir("swap", "local", 0) / "state"

    def on_disk() -> int:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    before = on_disk()
    [promised] = clean_runs(spec, dry_run=True)
    assert on_disk() == before
    [cleaned] = clean_runs(spec)
    assert cleaned.freed == before - on_disk() > 0
    # torch.save names the zip archive inside state.pt after the file it writes (a temp file),
    # and the dry run's in-memory copy "archive": a few dozen bytes apart, no more.
    assert abs(promised.freed - cleaned.freed) < 128
