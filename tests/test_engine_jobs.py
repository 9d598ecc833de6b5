"""Jobs of several runs in one process (`cflpipe train` of many methods and seeds): the same bytes
as one process per run, failures that stop no other run, the estimate of what is left, thread
limits, and one line for an unexpected failure."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cflpipe.spec import parse_spec

from engine_helpers import _bytes, _cli, tiny_spec

torch.set_num_threads(1)


def test_unexpected_failures_are_one_line_with_exit_code_1(tmp_path):
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(tiny_spec(tmp_path / "results")))
    state = tmp_path / "results" / "runs" / "swap" / "fedavg" / "seed0" / "state"
    state.parent.mkdir(parents=True)
    state.write_text("a file where the state folder should be: not a user error cflpipe names")
    proc = subprocess.run(_cli(config, "fedavg"), capture_output=True, text=True)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "CFLPIPE_DEBUG" in lines[0]


def test_cli_threads_default_to_one_are_bounded_and_recorded(tmp_path):
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(tiny_spec(tmp_path / "results", rounds=1)))
    base = [sys.executable, "-m", "cflpipe", "train", "--config", str(config), "--scenario", "swap",
            "--method", "fedavg", "--seed", "0", "--quiet"]
    too_many = subprocess.run([*base, "--threads", "100000"], capture_output=True, text=True)
    assert too_many.returncode == 2
    assert too_many.stderr.strip() == f"error: --threads: must lie in [1, {os.cpu_count()}] (the CPUs of this " \
                                      f"machine), got 100000"
    assert not (tmp_path / "results" / "runs").exists()
    subprocess.run(base, check=True, capture_output=True)
    recorded = yaml.safe_load((tmp_path / "results" / "runs" / "swap" / "fedavg" / "seed0" / "config.yaml").read_text())
    assert recorded["threads"] == 1


def _train(config: Path, methods: list[str], seeds: list[int]) -> list[str]:
    """`cflpipe train` of several methods and seeds of scenario swap in one process."""
    return [sys.executable, "-m", "cflpipe", "train", "--config", str(config), "--scenario", "swap",
            "--method", *methods, "--seed", *map(str, seeds), "--threads", "1", "--quiet"]


@pytest.mark.slow
def test_several_runs_in_one_process_equal_one_process_per_run(tmp_path):
    """`cflpipe train --method fedac fcca cfl --seed 0 1` (the workflow's scenario job) writes
    the same bytes as a fresh process per run: nothing of one run (RNG, caches, a method's module
    state) leaks into the next seed or the next method, including for methods that keep state
    outside the engine (sklearn, zuko)."""
    data = tiny_spec(tmp_path / "grouped")
    data["methods"] = {"fedac": {"clusters": 2}, "fcca": {"clusters": 2}, "cfl": {"warmup": 2}}
    grouped_cfg, alone_cfg = tmp_path / "grouped.yaml", tmp_path / "alone.yaml"
    grouped_cfg.write_text(yaml.safe_dump(data))
    alone_cfg.write_text(yaml.safe_dump({**data, "results_dir": str(tmp_path / "alone")}))
    methods = list(data["methods"])
    out = subprocess.run(_train(grouped_cfg, methods, [0, 1]), check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert [line.split(": ")[0].split("runs/swap/")[1] for line in out] == \
        [f"{m}/seed{k}" for m in methods for k in (0, 1)]
    assert all(line.split(": ")[1] == "finished" for line in out), out
    # each run after another one in the process: the next seed, or the next method's first seed
    for method, seed in (("fedac", 1), ("fcca", 0), ("fcca", 1), ("cfl", 0), ("cfl", 1)):
        subprocess.run(_train(alone_cfg, [method], [seed]), check=True, capture_output=True)
        run = Path("runs/swap") / method / f"seed{seed}"
        assert _bytes(tmp_path / "grouped" / run) == _bytes(tmp_path / "alone" / run), run
    # Finished runs are skipped, one line each; a repeated seed is refused before any run.
    again = subprocess.run(_train(grouped_cfg, ["cfl"], [1, 0]), check=True, capture_output=True, text=True).stdout
    assert again.count("already finished") == 2
    twice = subprocess.run(_train(grouped_cfg, ["cfl"], [0, 0]), capture_output=True, text=True)
    assert twice.returncode == 2 and twice.stderr == "error: --seed: 0 given twice; give each seed once\n"


def test_a_resumed_jobs_estimate_counts_only_the_runs_left_to_train(tmp_path):
    """The job's line after each run estimates the time left from the runs still to train: a
    resumed job's finished runs, skipped in a moment, add nothing to it."""
    data = tiny_spec(tmp_path / "results", rounds=1)
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(data))
    subprocess.run(_train(config, ["fedprox"], [0, 1]), check=True, capture_output=True)
    out = subprocess.run(_train(config, ["fedavg", "fedprox"], [0, 1]), check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert [line.split(": ")[1].split(" (")[0] for line in out] == ["finished", "finished", "already finished",
                                                                   "already finished"], out
    assert "run 1 of 4 of this job, about" in out[0] and " left)" in out[0], out  # fedavg seed 1 is left
    assert out[1].endswith("run 2 of 4 of this job)"), out  # the two fedprox runs left need no training
    data["methods"]["fedprox"]["mu"] = 0.2  # a changed entry: its finished runs train again
    config.write_text(yaml.safe_dump(data))
    out = subprocess.run(_train(config, ["fedprox"], [0, 1]), check=True, capture_output=True,
                         text=True).stdout.splitlines()
    assert out[0].split(": ")[1] == "finished" and "run 1 of 2 of this job, about" in out[0], out


def test_a_failed_seed_does_not_stop_the_jobs_other_seeds(tmp_path):
    """The workflow's job trains all seeds: seed 0 failing (here: another process holds its run)
    still trains seed 1, and the job exits with seed 0's error and code."""
    from cflpipe import store
    from cflpipe.fl.runs import LOCK_FILE

    data = tiny_spec(tmp_path / "results", rounds=2)
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(data))
    spec = parse_spec(data)
    with store.exclusive(spec.run_dir("swap", "fedavg", 0) / LOCK_FILE, "the test"):
        done = subprocess.run([*_cli(config, "fedavg")[:-4], "0", "1", "--quiet"], capture_output=True, text=True)
    assert done.returncode == 5, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: run swap/fedavg/seed0 ")
    assert (spec.run_dir("swap", "fedavg", 1) / "summary.json").is_file()
    assert not (spec.run_dir("swap", "fedavg", 0) / "summary.json").exists()


def test_a_scenario_job_trains_every_method_and_a_failed_run_stops_none(tmp_path):
    """The workflow's scenario job: `--method A B --seed 0 1` trains A's seeds, then B's; a run
    that fails (here: another process holds it) leaves the others training, and the job exits
    with the first failure's error and code, naming the other failed runs."""
    from cflpipe import store
    from cflpipe.fl.runs import LOCK_FILE

    data = tiny_spec(tmp_path / "results", rounds=1)
    data["methods"] = {"fedavg": {}, "local": {}}
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(data))
    spec = parse_spec(data)
    with store.exclusive(spec.run_dir("swap", "fedavg", 1) / LOCK_FILE, "the test"), \
            store.exclusive(spec.run_dir("swap", "local", 0) / LOCK_FILE, "the test"):
        done = subprocess.run(_train(config, ["fedavg", "local"], [0, 1]), capture_output=True, text=True)
    assert done.returncode == 5, done.stderr
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: run swap/fedavg/seed1 ")
    assert done.stderr.endswith(" (runs local/seed0 failed too)\n"), done.stderr
    assert [line.split(": ")[0].split("runs/")[1] for line in done.stdout.splitlines()] == \
        ["swap/fedavg/seed0", "swap/local/seed1"]
    twice = subprocess.run(_train(config, ["local", "fedavg", "local"], [0]), capture_output=True, text=True)
    assert twice.returncode == 2 and twice.stderr == "error: --method: local given twice; give each method once\n"
    unknown = subprocess.run(_train(config, ["fedavg", "nope"], [0]), capture_output=True, text=True)
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: --method: unknown method 'nope'")
    # a run outside the spec's matrix (one that aggregate would never read) is refused
    data["methods"]["local"] = {"scenarios": ["other"]}
    data["scenarios"]["other"] = yaml.safe_load(yaml.safe_dump(data["scenarios"]["swap"]))
    config.write_text(yaml.safe_dump(data))
    outside = subprocess.run(_train(config, ["fedavg", "local"], [0]), capture_output=True, text=True)
    assert outside.returncode == 2 and outside.stderr == (
        "error: --method: local does not run on scenario swap (methods.local.scenarios: other)\n")
