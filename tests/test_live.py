"""`workflow.live`: a run's curves while it trains (TensorBoard event files under RESULTS/live), the
same figures as rounds.parquet, each round once after a resume, and no file of the run changed."""

from __future__ import annotations

import pandas as pd
import pytest

from cflpipe.fl.engine import train_run
from cflpipe.fl.live import LiveCurves
from cflpipe.spec import parse_spec

RUN_FILES = ("metrics.parquet", "clusters.parquet", "rounds.parquet", "plots.csv", "summary.json", "config.yaml")


def spec(results, live: bool):
    return parse_spec(raw(results, live))


def raw(results, live: bool) -> dict:
    return {
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 4, "clients_per_round": 4, "local_steps": 2, "batch_size": 16,
                     "lr": 0.05, "eval_every": 1, "checkpoint_every": 2, "device": "cpu"},
        "scenarios": {"s": {"dataset": "digits", "clients": 4,
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": {"ifca": {"clusters": 2}},
        "results_dir": str(results), "workflow": {"live": live},
    }


def drawn(folder, figure: str) -> list[tuple[int, float]]:
    """The points TensorBoard draws for `figure` (its reader applies the purges of resumed runs)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(figure)]


def test_live_curves_follow_the_rounds_resume_without_repeats_and_change_no_output(tmp_path, monkeypatch):
    log = LiveCurves.log

    class Killed(Exception):
        pass

    def log_then_die(self, round_number, row):
        log(self, round_number, row)
        if round_number == 3:  # evaluated and drawn, not yet checkpointed (every 2 rounds)
            raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(LiveCurves, "log", log_then_die)
        with pytest.raises(Killed):
            train_run(spec(tmp_path / "live", True), "s", "ifca", 0, progress=False)
    run_dir = train_run(spec(tmp_path / "live", True), "s", "ifca", 0, progress=False).run_dir
    quiet_dir = train_run(spec(tmp_path / "quiet", False), "s", "ifca", 0, progress=False).run_dir

    assert not (tmp_path / "quiet" / "live").exists()
    for name in RUN_FILES:
        assert (run_dir / name).read_bytes() == (quiet_dir / name).read_bytes(), name
    assert sorted(p.name for p in run_dir.iterdir()) == sorted(p.name for p in quiet_dir.iterdir())
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    for figure in ("acc_macro", "ari", "n_clusters", "train_loss"):
        points = drawn(tmp_path / "live" / "live" / "s" / "ifca" / "seed0", figure)
        assert [step for step, _ in points] == [1, 2, 3, 4], figure  # round 3 once, though trained twice
        assert [value for _, value in points] == pytest.approx(rounds[figure].astype(float).tolist(), rel=1e-6)


def test_a_train_job_says_where_the_live_curves_go(tmp_path, capsys):
    import yaml

    from cflpipe import cli

    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(raw(tmp_path / "results", True)))
    assert cli.main(["train", "--config", str(config), "--scenario", "s", "--method", "ifca", "--seed", "0",
                     "--quiet"]) == 0
    folder = tmp_path / "results" / "live"
    assert f"live curves: {folder} (watch with `tensorboard --logdir {folder}`)" in capsys.readouterr().out
