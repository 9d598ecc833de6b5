"""training.compile: the batched trainer's vmapped step through torch.compile (#32 item 5)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import yaml

from cflpipe.errors import SpecError
from cflpipe.fl.plan import ClientPlan
from cflpipe.fl.trainers import BatchedTrainer, SequentialTrainer, build_trainer
from cflpipe.spec import parse_spec
from tests.test_trainers import tiny_run


@pytest.mark.parametrize("trainer", ["sequential", "processes"])
def test_compile_with_a_trainer_that_has_no_batched_step_is_one_line(tmp_path, trainer):
    with pytest.raises(SpecError) as info:
        tiny_run(tmp_path, trainer, compile=True)
    assert str(info.value).startswith("training: compile: true compiles the batched trainer's step; trainer is "
                                      f"'{trainer}', allowed with compile: batched, auto")


def test_compile_makes_auto_batched_even_where_auto_would_pick_sequential():
    cpu = torch.device("cpu")
    assert type(build_trainer("auto", cpu, "resnet18")) is SequentialTrainer
    compiled = build_trainer("auto", cpu, "resnet18", compiled=True)
    assert type(compiled) is BatchedTrainer and compiled.compiled
    assert not build_trainer("batched", cpu, "mlp").compiled


@pytest.mark.slow
def test_a_compiled_step_trains_as_the_uncompiled_one_to_float_rounding(tmp_path):
    from torch._dynamo.utils import counters

    outcomes = {}
    for compiled in (False, True):
        run = tiny_run(tmp_path / str(compiled), "batched", compile=compiled)
        assert run.trainer.compiled is compiled
        counters.clear()
        outcomes[compiled] = run.ctx.run({c: ClientPlan(run.ctx.init, lr=0.1) for c in range(4)})
        assert bool(counters["frames"]["ok"]) is compiled  # TorchDynamo traced the step, and only then
    for c in range(4):
        eager, compiled = outcomes[False][c].vector, outcomes[True][c].vector
        assert not torch.equal(eager, run.ctx.init)
        assert float((eager - compiled).abs().max()) <= 1e-4 * float(eager.abs().max())


@pytest.mark.slow
def test_a_compiled_run_reruns_byte_identical_in_a_fresh_process(tmp_path):
    """Each process compiles anew (Inductor's disk cache aside): the kernels, and so the bytes,
    must come out the same."""
    config = tmp_path / "spec.yaml"
    spec = {"seeds": [0], "results_dir": str(tmp_path / "results"),
            "training": {"model": "cnn", "rounds": 3, "clients_per_round": 4, "local_steps": 2, "batch_size": 8,
                         "eval_every": 3, "device": "cpu", "compile": True, "trainer": "batched"},
            "scenarios": {"s": {"dataset": "digits", "clients": 6, "partition": [{"kind": "iid"}]}},
            "methods": {"fedavg": {}}}
    config.write_text(yaml.safe_dump(spec))
    outputs = []
    for _ in range(2):
        subprocess.run([sys.executable, "-m", "cflpipe", "train", "--config", str(config), "--scenario", "s",
                        "--method", "fedavg", "--seed", "0", "--force", "--quiet"], check=True)
        run_dir = parse_spec(spec).run_dir("s", "fedavg", 0)
        outputs.append({name: (run_dir / name).read_bytes()
                        for name in ("metrics.parquet", "rounds.parquet", "clusters.parquet")})
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["compile"] is True
    assert outputs[0] == outputs[1]
