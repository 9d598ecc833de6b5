"""training.compile: the batched trainer's vmapped step through torch.compile (#32 item 5)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import yaml

from cflpipe.errors import SpecError
from cflpipe.fl.plan import ClientPlan
from cflpipe.fl.trainer_choice import AutoTrainer, build_trainer
from cflpipe.fl.trainers import BatchedTrainer
from cflpipe.spec import parse_spec
from tests.test_trainers import tiny_run

# Each process compiles from scratch: Inductor's on-disk caches would let a second process load
# the first one's kernels, and a rerun check would then not check a fresh compilation.
FRESH = {**os.environ, "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"}


@pytest.mark.parametrize("trainer", ["sequential", "processes", "tests.test_plugins:AnyTrainer"])
def test_compile_with_a_trainer_that_has_no_batched_step_is_one_line(tmp_path, trainer):
    with pytest.raises(SpecError) as info:
        tiny_run(tmp_path, trainer, compile=True)
    assert str(info.value) == ("training: compile: true compiles the batched trainer's step; trainer is "
                               f"'{trainer}', allowed with compile: batched or auto")


def test_compile_makes_auto_batched_rather_than_measured():
    cpu = torch.device("cpu")
    assert type(build_trainer("auto", cpu, "resnet18")) is AutoTrainer
    compiled = build_trainer("auto", cpu, "resnet18", compiled=True)
    assert type(compiled) is BatchedTrainer and compiled.compiled
    assert not build_trainer("batched", cpu, "mlp").compiled


def _trained(tmp_path, clients: int, compiled: bool = True) -> list[torch.Tensor]:
    run = tiny_run(tmp_path / f"{clients}-{compiled}", "batched", clients=clients, clients_per_round=clients,
                   compile=compiled)
    assert run.trainer.compiled is compiled
    return [t.vector for t in run.ctx.run({c: ClientPlan(run.ctx.init, lr=0.1) for c in range(clients)}).values()]


@pytest.mark.slow
def test_a_compiled_step_trains_as_the_uncompiled_one_to_float_rounding(tmp_path):
    from torch._dynamo.utils import counters

    counters.clear()
    eager = _trained(tmp_path, 4, compiled=False)
    assert not counters["frames"]["ok"]
    compiled = _trained(tmp_path, 4)
    assert counters["frames"]["ok"]  # TorchDynamo traced the step
    for a, b in zip(eager, compiled):
        assert float((a - b).abs().max()) <= 1e-4 * float(a.abs().max())


@pytest.mark.slow
def test_a_compiled_group_trains_alike_whatever_the_process_compiled_before(tmp_path):
    """More group shapes than TorchDynamo's default limit of 8 graphs: past it, it would train
    uncompiled, so a run's bits would depend on the runs before it in one process."""
    import torch._dynamo

    torch._dynamo.reset()
    for clients in (2, 3, 5, 6, 7, 8, 9, 10, 11):
        _trained(tmp_path / "before", clients)
    after_others = _trained(tmp_path / "after", 4)
    torch._dynamo.reset()
    alone = _trained(tmp_path / "alone", 4)
    assert all(torch.equal(a, b) for a, b in zip(after_others, alone))


def _spec(tmp_path) -> dict:
    return {"seeds": [0], "results_dir": str(tmp_path / "results"),
            "training": {"model": "mlp", "rounds": 4, "clients_per_round": 4, "local_steps": 2, "batch_size": 8,
                         "eval_every": 2, "checkpoint_every": 1, "device": "cpu", "compile": True,
                         "trainer": "batched"},
            "scenarios": {"s": {"dataset": "digits", "clients": 6, "partition": [{"kind": "iid"}]}},
            "methods": {"fedavg": {}}}


def _train(config, env=FRESH, kill_after: int | None = None) -> subprocess.CompletedProcess:
    # A kill: the process dies right after saving the checkpoint of round `kill_after`.
    kill = ("" if kill_after is None else
            "import os; from cflpipe.fl import engine; save = engine.Run.save_state\n"
            "def die(self, r):\n save(self, r)\n if r == %d: os._exit(9)\n"
            "engine.Run.save_state = die\n" % kill_after)
    code = (kill + "from cflpipe.cli import main; raise SystemExit(main(['train', '--config', %r, '--scenario', 's', "
            "'--method', 'fedavg', '--seed', '0', '--quiet']))" % str(config))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


def _outputs(spec: dict) -> dict[str, bytes]:
    run_dir = parse_spec(spec).run_dir("s", "fedavg", 0)
    return {name: (run_dir / name).read_bytes() for name in ("metrics.parquet", "rounds.parquet", "clusters.parquet")}


@pytest.mark.slow
def test_a_compiled_run_reruns_and_resumes_byte_identical_in_fresh_processes(tmp_path):
    spec = _spec(tmp_path)
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(spec))
    assert _train(config).returncode == 0
    reference = _outputs(spec)
    assert yaml.safe_load((parse_spec(spec).run_dir("s", "fedavg", 0) / "config.yaml").read_text()
                          )["training"]["compile"] is True
    spec["results_dir"] = str(tmp_path / "again")
    config.write_text(yaml.safe_dump(spec))
    killed = _train(config, kill_after=2)
    assert killed.returncode == 9, killed.stderr
    assert _train(config).returncode == 0  # resumes from round 2's checkpoint, compiling anew
    assert _outputs(spec) == reference


@pytest.mark.slow
def test_a_compiler_that_fails_is_one_line_not_an_uncompiled_run(tmp_path):
    spec = _spec(tmp_path)
    config = tmp_path / "spec.yaml"
    config.write_text(yaml.safe_dump(spec))
    failed = _train(config, env={**FRESH, "CXX": str(tmp_path / "no-such-g++")})
    assert failed.returncode != 0
    lines = failed.stderr.strip().splitlines()
    assert lines[-1].startswith("error: training.compile: torch.compile failed on the batched step ("), lines[-3:]
    assert lines[-1].endswith("allowed: compile: false, or a machine with a C++ compiler (CPU) or Triton (CUDA)")
    assert not (parse_spec(spec).run_dir("s", "fedavg", 0) / "metrics.parquet").exists()
