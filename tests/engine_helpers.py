"""What the engine's test modules share: the tiny spec, the module's finished runs, the files a
rerun must give byte for byte, and the `cflpipe train` command of one run."""

import sys
from pathlib import Path

import pytest

from cflpipe.fl.engine import train_run
from cflpipe.spec import parse_spec


STABLE_FILES = ("metrics.parquet", "clusters.parquet", "rounds.parquet", "plots.csv", "summary.json",
                "config.yaml")


def tiny_spec(results: Path, **training) -> dict:
    return {
        "seeds": [0, 1],
        "training": {"model": "mlp", "rounds": 6, "clients_per_round": 4, "local_steps": 3,
                     "batch_size": 16, "lr": 0.05, "momentum": 0.9, "eval_every": 2,
                     "checkpoint_every": 2, "device": "cpu", "eval_train": True, **training},
        "scenarios": {"swap": {"dataset": "digits", "clients": 8,
                               "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": {"fedavg": {}, "fedprox": {"mu": 0.1}, "local": {}, "oracle": {}},
        "results_dir": str(results),
    }


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory):
    results = tmp_path_factory.mktemp("runs")
    spec = parse_spec(tiny_spec(results))
    out = {}
    for method in ("fedavg", "oracle", "local"):
        out[method] = train_run(spec, "swap", method, 0, progress=False)
    return spec, out


def _bytes(run_dir: Path) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in STABLE_FILES}


def _cli(config: Path, method: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "cflpipe", "train", "--config", str(config), "--scenario", "swap",
            "--method", method, "--seed", "0", "--threads", "1", "--quiet", *extra]
