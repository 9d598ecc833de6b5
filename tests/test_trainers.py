"""The plan seam's trainers beyond the built-in methods: an auxiliary per-client network trained
with a loss of its own, plans with different settings in one round, and a loss that vmap cannot
run, which the batched trainer hands to the sequential path and says so once per run. Then the
pieces both trainers share, checked by hand: the step rules' arithmetic on a quadratic, the local
loop's guards and loss record, and the flat parameter space."""

from __future__ import annotations

import json
import math
import os
import re
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cflpipe.fl.engine import prepare_run
from cflpipe.fl.local import (SGD, Anchor, FOMAMLStep, LocalResult, LoopState, MoreauStep, SGDStep, StepConfig,
                              batch_indices, run_loop, sgd, step_config)
from cflpipe.fl.params import ParamSpace, cluster_average
from cflpipe.fl.plan import ClientPlan
from cflpipe.fl.trainer_choice import (AutoTrainer, build_trainer, choices_file, machine_key, plan_shape, read_choices,
                                       record_choice)
from cflpipe.fl.trainers import BatchedTrainer, SequentialTrainer
from cflpipe.models import MLP
from cflpipe.spec import parse_spec
from conftest import Killed, die_after_saving

torch.set_num_threads(1)



@pytest.fixture(autouse=True)
def _the_results_own_record(monkeypatch):
    """These tests check the results folder's own record of trainer choices (conftest shares one
    record across the session's other tests)."""
    monkeypatch.delenv("CFLPIPE_TRAINER_CHOICES", raising=False)

def tiny_run(tmp_path, trainer: str, clients: int = 4, **training):
    settings = {"model": "mlp", "rounds": 2, "clients_per_round": 4, "local_steps": 3, "batch_size": 8,
                "lr": 0.1, "device": "cpu", "trainer": trainer, **training}
    if "local_epochs" in training:
        del settings["local_steps"]
    spec = parse_spec({
        "seeds": [0],
        "training": settings,
        "scenarios": {"s": {"dataset": "digits", "clients": clients, "partition": [{"kind": "iid"}]}},
        "methods": {"fedavg": {}},
        "results_dir": str(tmp_path / trainer),
    })
    return prepare_run(spec, "s", "fedavg", 0)


def one_hot_regression(forward, x, y):
    """A loss of a network other than the classifier: squared error against one-hot targets."""
    # torch.eye(...)[y] rather than F.one_hot, whose range check calls .item() (not vmappable).
    return F.mse_loss(forward(x), torch.eye(10, dtype=x.dtype, device=x.device)[y])


def not_vmappable(forward, x, y):
    loss = F.cross_entropy(forward(x), y)
    if loss.item() > 1e9:  # data-dependent Python control flow: vmap refuses .item()
        return loss * 0
    return loss


def aux_plans(run):
    torch.manual_seed(3)
    space = run.ctx.add_space("aux", nn.Linear(64, 10))
    start = space.read()
    features = {c: run.data.client(c, "train")[0].flatten(1) * 0.5 for c in range(4)}
    return {c: ClientPlan(start, space="aux", loss=one_hot_regression, inputs=features[c]) for c in range(4)}


def test_auxiliary_network_with_its_own_loss_trains_and_batches(tmp_path):
    results = {}
    for trainer in ("sequential", "batched"):
        run = tiny_run(tmp_path, trainer)
        plans = aux_plans(run)
        trained = run.ctx.run(plans)
        results[trainer] = torch.stack([trained[c].vector for c in range(4)])
        assert run.trainer.counts[trainer] == 4
        start = plans[0].start
        assert all(not torch.equal(trained[c].vector, start) for c in range(4))
        assert run.space.size != start.numel()  # the auxiliary network, not the classifier
    a, b = results["sequential"], results["batched"]
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())


def test_plans_with_different_settings_train_in_separate_groups(tmp_path):
    outcomes = {}
    for trainer in ("sequential", "batched"):
        run = tiny_run(tmp_path, trainer)
        start = run.ctx.init
        plans = {0: ClientPlan(start, lr=0.1), 1: ClientPlan(start, lr=0.1), 2: ClientPlan(start, lr=0.01),
                 3: ClientPlan(start, lr=0.01, steps=7)}
        trained = run.ctx.run(plans)
        outcomes[trainer] = trained
        if trainer == "batched":  # {0, 1} form a group; 2 and 3 (more than 2× its steps) are alone
            assert run.trainer.counts == {"batched": 2, "sequential": 2}
    for c in range(4):
        a, b = outcomes["sequential"][c], outcomes["batched"][c]
        assert a.result.steps == b.result.steps == (7 if c == 3 else 3)
        assert float((a.vector - b.vector).abs().max()) <= 1e-5 * float(a.vector.abs().max())


def test_a_loss_vmap_cannot_run_falls_back_to_sequential_said_once(tmp_path, capsys):
    reference = tiny_run(tmp_path, "sequential")
    run = tiny_run(tmp_path, "batched")
    for round_index in range(2):
        expected = {}
        for which in (reference, run):
            which.ctx.round = round_index
            plans = {c: ClientPlan(which.ctx.init, loss=not_vmappable) for c in range(4)}
            expected[which is run] = which.ctx.run(plans)
        for c in range(4):  # the fallback is the sequential path itself: equal to the bit
            assert torch.equal(expected[True][c].vector, expected[False][c].vector)
    err = capsys.readouterr().err
    assert err.count("the batched trainer cannot run some client plans") == 1
    assert re.search(r"\(\w+Error: ", err)  # the exception vmap raised (its type varies by torch release)
    assert len(err.strip().splitlines()) == 1
    assert run.trainer.counts == {"batched": 0, "sequential": 8}


def test_a_plan_with_into_writes_its_trained_vector_there_unless_it_diverged(tmp_path):
    for trainer in ("sequential", "batched"):
        run = tiny_run(tmp_path, trainer)
        start = run.ctx.init
        table = start.repeat(4, 1)
        before = table.clone()
        plans = {c: ClientPlan(start, lr=0.1, into=table[c]) for c in range(2)}
        # two that diverge, with the same settings: the batched trainer trains them as a group
        plans.update({c: ClientPlan(start, lr=1e12, momentum=0.0, into=table[c]) for c in (2, 3)})
        trained = run.ctx.run(plans)
        if trainer == "batched":
            assert run.trainer.counts == {"batched": 4, "sequential": 0}
        free = run.ctx.run({c: ClientPlan(start, lr=0.1) for c in range(2)})  # the same, without into
        for c in range(2):
            assert trained[c].vector.data_ptr() == table[c].data_ptr()  # the row itself, no copy
            assert not torch.equal(table[c], before[c])
            assert torch.equal(table[c], free[c].vector)
        for c in (2, 3):
            assert trained[c].result.diverged
            assert torch.equal(table[c], before[c])  # a diverged client's row keeps its last value
            assert trained[c].vector.data_ptr() != table[c].data_ptr()
            # its own copy, not the live parameters that the next plan's training overwrites
            assert trained[c].vector.data_ptr() != run.space.flat.data_ptr()
    with pytest.raises(ValueError, match="`into` cannot be combined with a follow-up"):
        ClientPlan(start, into=table[0], then=lambda trained: ClientPlan(trained.vector))


def test_the_batched_trainer_applies_every_setting_of_a_plan_as_the_sequential_one(tmp_path):
    """Momentum, weight decay, proximal anchors and a trainable mask act alike on both trainers,
    and the loss record (mean loss, steps, samples) is the same."""
    outcomes = {}
    for trainer in ("sequential", "batched"):
        run = tiny_run(tmp_path, trainer)
        space, start = run.space, run.ctx.init
        torch.manual_seed(1)
        anchor = Anchor(start + 0.05 * torch.randn_like(start), 0.5, space.body)
        plans = {c: ClientPlan(start, (anchor,), trainable=space.body, momentum=0.5, weight_decay=0.05, lr=0.1)
                 for c in range(4)}
        outcomes[trainer] = run.ctx.run(plans)
        if trainer == "batched":
            assert run.trainer.counts == {"batched": 4, "sequential": 0}
    for c in range(4):
        a, b = outcomes["sequential"][c], outcomes["batched"][c]
        assert torch.equal(a.vector[~space.body], start[~space.body])  # the head did not train
        assert torch.equal(b.vector[~space.body], start[~space.body])
        assert float((a.vector - b.vector).abs().max()) <= 1e-5 * float(a.vector.abs().max())
        assert (a.result.steps, a.result.samples) == (b.result.steps, b.result.samples) == (3, 24)
        assert type(b.result.samples) is int  # a count of samples, as the sequential trainer's
        assert abs(a.result.loss - b.result.loss) <= 1e-5 * abs(a.result.loss)


@pytest.mark.parametrize("setting", [{"momentum": 0.0}, {"weight_decay": 0.0}, {"anchors": ()}, {"trainable": None}])
def test_each_plan_setting_changes_batched_training(tmp_path, setting):
    run = tiny_run(tmp_path, "batched")
    space, start = run.space, run.ctx.init
    anchor = Anchor(start + 0.05, 0.5)
    base = {"anchors": (anchor,), "trainable": space.body, "momentum": 0.5, "weight_decay": 0.05, "lr": 0.1}
    trained = [run.ctx.run({c: ClientPlan(start, **options) for c in range(4)})
               for options in (base, {**base, **setting})]
    assert run.trainer.counts["batched"] == 8
    assert not torch.equal(trained[0][0].vector, trained[1][0].vector)


def test_a_network_with_dropout_trains_batched(tmp_path):
    spec = parse_spec({
        "seeds": [0],
        "training": {"model": "cnn_tsdp", "rounds": 1, "clients_per_round": 2, "local_steps": 2, "batch_size": 4,
                     "lr": 0.05, "device": "cpu", "trainer": "batched"},
        "scenarios": {"s": {"dataset": "digits", "clients": 2, "partition": [{"kind": "iid"}]}},
        "methods": {"fedavg": {}},
        "results_dir": str(tmp_path),
    })
    run = prepare_run(spec, "s", "fedavg", 0)
    run.ctx.run({c: ClientPlan(run.ctx.init) for c in range(2)})
    assert run.trainer.counts == {"batched": 2, "sequential": 0}  # vmap draws the dropout masks


def test_plans_that_differ_in_mask_anchor_mask_loss_or_inputs_are_not_batched_together(tmp_path):
    """The batched trainer trains a group with its first plan's settings, so plans must share a
    group only when everything but their data and start is the same."""
    outcomes, counts = {}, {}
    for trainer in ("sequential", "batched"):
        run = tiny_run(tmp_path / trainer, trainer, clients=16)
        space, start = run.space, run.ctx.init
        pull = start + 0.1
        variants = [dict(trainable=space.body), dict(trainable=space.head), dict(trainable=None),
                    dict(anchors=(Anchor(pull, 0.5, space.head),)), dict(anchors=(Anchor(pull, 0.5, space.body),)),
                    dict(anchors=(Anchor(pull, 0.5, None),)), dict(loss=one_hot_regression),
                    dict(inputs="own, halved")]
        # each variant twice (clients 2k and 2k + 1), so every variant could form a group of its own
        plans = {}
        for k, options in enumerate(variants):
            for client in (2 * k, 2 * k + 1):
                if "inputs" in options:
                    options = {"inputs": run.data.client(client, "train")[0] * 0.5}
                plans[client] = ClientPlan(start, lr=0.1, **options)
        outcomes[trainer] = run.ctx.run(plans)
        counts[trainer] = dict(run.trainer.counts)
    assert counts["batched"] == {"batched": 16, "sequential": 0}  # eight groups of two
    for client in range(16):
        a, b = outcomes["sequential"][client].vector, outcomes["batched"][client].vector
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max()), client


def test_local_epochs_become_steps_by_hand():
    from cflpipe.fl.local import steps_for

    assert steps_for(50, 16, 7, None) == 7  # local_steps wins
    assert steps_for(50, 16, None, 2) == 7  # ceil(2 · 50 / 16)
    assert steps_for(10, 16, None, 2) == 2  # a batch is at most the client's data: ceil(2 · 10 / 10)
    assert steps_for(50, 16, None, 0.25) == 1  # ceil(0.78): at least one step
    assert steps_for(64, 16, None, 1) == 4


def test_dropout_masks_follow_seed_round_client_and_stream(tmp_path):
    """For networks with dropout the trainer reseeds torch's RNG per (seed, round, client,
    stream), so masks differ between clients and rounds and a rerun draws the same ones."""

    spec = parse_spec({
        "seeds": [0],
        "training": {"model": "cnn_tsdp", "rounds": 1, "clients_per_round": 2, "local_steps": 1, "batch_size": 4,
                     "lr": 0.05, "device": "cpu"},
        "scenarios": {"s": {"dataset": "digits", "clients": 2, "partition": [{"kind": "iid"}]}},
        "methods": {"fedavg": {}},
        "results_dir": str(tmp_path),
    })
    run = prepare_run(spec, "s", "fedavg", 0)
    ctx = run.ctx

    def draw(seed=0, round_index=0, client=0, stream=()):
        ctx.seed, ctx.round = seed, round_index
        ctx.work_item(client, ClientPlan(ctx.init, stream=stream)).generator()
        return torch.rand(4)

    reference = draw()
    assert torch.equal(draw(), reference)
    for other in (draw(seed=1), draw(round_index=1), draw(client=1), draw(stream=(7,))):
        assert not torch.equal(other, reference)
    # the batch stream (a torch.Generator) follows the same key, drawn apart from the masks
    def batches(round_index):
        ctx.seed, ctx.round = 0, round_index
        return ctx.work_item(0, ClientPlan(ctx.init)).generator().initial_seed()

    assert batches(0) == batches(0) and batches(1) != batches(0)
    # and from a seed of its own: dropout masks and batch orders are not one stream read twice
    batch_seed = batches(0)
    assert torch.initial_seed() != batch_seed


def test_the_auto_trainer_batches_on_a_gpu_and_for_a_compiled_step_and_measures_on_a_cpu():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")  # a device name: no GPU needed
    assert type(build_trainer("auto", cpu, "resnet18")) is AutoTrainer  # whatever the model's name
    assert build_trainer("auto", gpu, "mlp").name == "batched"
    assert build_trainer("auto", cpu, "mlp", compiled=True).name == "batched"
    assert build_trainer("sequential", gpu, "cnn").name == "sequential"  # a named trainer is kept


def slowed(monkeypatch, trainer_class, seconds: float = 0.05) -> None:
    """Make `trainer_class.train` burn `seconds` of CPU time more per call (auto times the process's CPU)."""
    train = trainer_class.train

    def slow_train(self, spaces, items):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
        return train(self, spaces, items)

    monkeypatch.setattr(trainer_class, "train", slow_train)


def run_files(run_dir) -> dict[str, bytes]:
    return {name: (run_dir / name).read_bytes() for name in ("metrics.parquet", "rounds.parquet", "clusters.parquet")}


def auto_spec(tmp_path, name: str, trainer: str = "auto", rounds: int = 4):
    return parse_spec({
        "seeds": [0],
        "training": {"model": "mlp", "rounds": rounds, "clients_per_round": 4, "local_steps": 3, "batch_size": 8,
                     "lr": 0.1, "device": "cpu", "trainer": trainer, "eval_every": 1, "checkpoint_every": 1},
        "scenarios": {"s": {"dataset": "digits", "clients": 6, "partition": [{"kind": "iid"}]}},
        "methods": {"fedavg": {}, "local": {}},
        "results_dir": str(tmp_path / name),
    })


@pytest.mark.parametrize("slower", ["sequential", "batched"])
def test_auto_takes_the_trainer_it_measured_faster_and_keeps_its_bytes(tmp_path, monkeypatch, slower):
    """The first run of a shape measures both trainers and keeps the faster one's results: its
    outputs are those of a run that named the faster trainer. The choice is cached, so the next run
    reads it without measuring and gives the same bytes; the run says what it chose and why."""
    from cflpipe.fl.engine import train_run

    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(tmp_path / "cache"))
    slowed(monkeypatch, SequentialTrainer if slower == "sequential" else BatchedTrainer)
    faster = "batched" if slower == "sequential" else "sequential"
    for method in ("fedavg", "local"):  # FedAvg streams its uploads (train_each); Local's plans meet the cache
        named = train_run(auto_spec(tmp_path, faster, faster), "s", method, 0, force=True, progress=False)
        measured = train_run(auto_spec(tmp_path, "auto"), "s", method, 0, force=True, progress=False)
        assert run_files(measured.run_dir) == run_files(named.run_dir)
        timing = json.loads((measured.run_dir / "timing.json").read_text())
        (shape, choice), = timing["auto_choices"].items()
        assert choice["trainer"] == faster and "MLP[" in shape and "clients 4 steps 2-4" in shape
        # Local's plans are the same shape, which the results folder has recorded since FedAvg's run
        assert choice["by"] == ("measured" if method == "fedavg" else "recorded")
        assert timing["plans_trained"][faster] == 4 * 4 and timing["plans_trained"][slower] == 0
        again = train_run(auto_spec(tmp_path, "auto"), "s", method, 0, force=True, progress=False)
        assert run_files(again.run_dir) == run_files(named.run_dir)
    # kept with the results alone: a run with a results folder neither reads nor writes the per-user cache
    assert read_choices() == {}
    kept = read_choices(tmp_path / "auto" / "trainer-choices.json", results=True)
    assert len(kept) == 1 and next(iter(kept.values()))["trainer"] == faster
    assert sorted(p.name for p in (tmp_path / "auto").iterdir()) == ["runs", "trainer-choices.json"]  # no lock file
    from cflpipe.report.aggregate import aggregate  # an output of the workflow: aggregate copies the runs' shapes

    copied = json.loads((aggregate(auto_spec(tmp_path, "auto")) / "trainer-choices.json").read_text())
    assert copied == read_choices(tmp_path / "auto" / "trainer-choices.json", results=True)


def test_a_run_with_a_results_folder_needs_no_home_cache(tmp_path, monkeypatch, capsys):
    """$HOME and the cache folder unusable (under a file: nothing can be read or made there), and
    a choice for the shape cached where the cache would be read: the run measures, keeps its
    choice in the results folder and says nothing of a cache."""
    from cflpipe.fl.engine import train_run

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.delenv("CFLPIPE_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(blocker / "home"))
    slowed(monkeypatch, SequentialTrainer)
    run = train_run(auto_spec(tmp_path, "auto"), "s", "fedavg", 0, force=True, progress=False)
    timing = json.loads((run.run_dir / "timing.json").read_text())
    assert [c["by"] for c in timing["auto_choices"].values()] == ["measured"]
    assert "cannot keep" not in capsys.readouterr().err
    (kept,) = read_choices(tmp_path / "auto" / "trainer-choices.json", results=True).values()
    assert kept["trainer"] == "batched"
    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(tmp_path / "cache"))  # a cache that says otherwise is not read
    record_choice(machine_key() + " | " + next(iter(timing["auto_choices"])), {"trainer": "sequential"})
    (tmp_path / "auto" / "trainer-choices.json").unlink()
    again = train_run(auto_spec(tmp_path, "auto"), "s", "fedavg", 0, force=True, progress=False)
    assert [c["by"] for c in json.loads((again.run_dir / "timing.json").read_text())["auto_choices"].values()] == \
        ["measured"]


@pytest.mark.parametrize("slower", ["sequential", "batched"])
def test_a_rerun_on_a_fresh_home_reads_the_results_folders_choices_and_gives_the_same_bytes(tmp_path, monkeypatch,
                                                                                          slower):
    """The trainer choices are an input of the results: a rerun with an empty per-user cache (a
    fresh $HOME, another node of a cluster) and the results folder present trains every shape as
    recorded there, without measuring, to the same bytes, even where this machine would now
    measure the other trainer faster."""
    from cflpipe.fl.engine import train_run

    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(tmp_path / "home-1"))
    faster = "batched" if slower == "sequential" else "sequential"
    with monkeypatch.context() as patch:
        slowed(patch, SequentialTrainer if slower == "sequential" else BatchedTrainer)
        first = train_run(auto_spec(tmp_path, "auto"), "s", "fedavg", 0, force=True, progress=False)
    before = run_files(first.run_dir)
    (shape, recorded), = read_choices(tmp_path / "auto" / "trainer-choices.json").items()
    assert recorded["trainer"] == faster and recorded["machine"] and "MLP[" in shape
    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(tmp_path / "home-2"))  # nothing cached there
    slowed(monkeypatch, BatchedTrainer if slower == "sequential" else SequentialTrainer)  # now the other is faster
    again = train_run(auto_spec(tmp_path, "auto"), "s", "fedavg", 0, force=True, progress=False)
    assert run_files(again.run_dir) == before
    timing = json.loads((again.run_dir / "timing.json").read_text())
    assert [c["by"] for c in timing["auto_choices"].values()] == ["recorded"]
    assert timing["plans_trained"][slower] == 0
    assert not (tmp_path / "home-2" / "trainer-choices.json").exists()


def test_a_resumed_auto_run_keeps_the_choices_of_its_checkpoint(tmp_path, monkeypatch):
    """Killed after round 2 and resumed after the cache was changed (or lost) in between, a run
    trains on with the trainer its checkpoint names, to the bytes of an uninterrupted run."""
    from cflpipe.fl.engine import train_run

    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(tmp_path / "cache"))
    with monkeypatch.context() as patch:
        slowed(patch, SequentialTrainer)
        whole = train_run(auto_spec(tmp_path, "whole"), "s", "fedavg", 0, force=True, progress=False)
        assert next(iter(read_choices(tmp_path / "whole" / "trainer-choices.json").values()))["trainer"] == "batched"
        with monkeypatch.context() as dying:
            die_after_saving(dying, 2)
            with pytest.raises(Killed):
                train_run(auto_spec(tmp_path, "killed"), "s", "fedavg", 0, force=True, progress=False)
    record = tmp_path / "killed" / "trainer-choices.json"
    kept = read_choices(record)
    for key in kept:  # the results' record now says the other trainer
        kept[key]["trainer"] = "sequential"
    record.write_text(json.dumps(kept))
    resumed = train_run(auto_spec(tmp_path, "killed"), "s", "fedavg", 0, progress=False)
    assert run_files(resumed.run_dir) == run_files(whole.run_dir)
    timing = json.loads((resumed.run_dir / "timing.json").read_text())
    assert [c["by"] for c in timing["auto_choices"].values()] == ["checkpoint"]
    assert timing["plans_trained"] == {"batched": 2 * 4, "sequential": 0}


@pytest.mark.parametrize("slower", ["sequential", "batched"])
def test_measuring_leaves_what_the_faster_trainer_alone_leaves(tmp_path, monkeypatch, slower):
    """Items of a dropout network whose `into` is their own start row: after auto measured both
    trainers, the results, the rows written into, the parameter space and torch's RNG are those
    the faster trainer alone leaves, bit for bit."""
    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(tmp_path / "cache"))
    slowed(monkeypatch, SequentialTrainer if slower == "sequential" else BatchedTrainer)
    faster = "batched" if slower == "sequential" else "sequential"
    outcomes = {}
    for trainer in ("auto", faster):
        run = tiny_run(tmp_path / trainer, trainer, model="cnn_tsdp")
        assert run.ctx.has_dropout("model")
        table = torch.stack([run.ctx.init + 0.01 * c for c in range(4)])
        items = [run.ctx.work_item(c, ClientPlan(table[c], into=table[c])) for c in range(4)]
        torch.manual_seed(5)
        run.space.load(run.ctx.init)
        trained = list(run.trainer.train_each(run.ctx.spaces, items))
        outcomes[trainer] = (torch.stack([t.vector for t in trained]), table.clone(), run.space.flat.clone(),
                             run.space.grad.clone(), torch.get_rng_state(), [t.result.loss for t in trained])
        if trainer == "auto":
            assert [c["by"] for c in run.trainer.choices.values()] == ["measured"]
            assert run.trainer.counts[faster] == 4 and run.trainer.counts[slower] == 0
    for mine, theirs in zip(outcomes["auto"], outcomes[faster]):
        assert torch.equal(mine, theirs) if isinstance(mine, torch.Tensor) else mine == theirs


def test_a_choice_recorded_meanwhile_by_another_process_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(tmp_path / "cache"))
    assert record_choice("machine | shape", {"trainer": "batched"})["trainer"] == "batched"
    assert record_choice("machine | shape", {"trainer": "sequential"})["trainer"] == "batched"
    assert read_choices()["machine | shape"]["trainer"] == "batched"
    assert record_choice("machine | other", {"trainer": "sequential"})["trainer"] == "sequential"


def test_processes_measuring_one_shape_at_once_agree_on_its_trainer(tmp_path):
    """Eight processes record a choice for one shape at the same moment, half of them each
    trainer: all of them train with the one the file keeps, and the file stays whole."""
    import subprocess
    import sys

    code = ("import sys, time; from cflpipe.fl.trainer_choice import record_choice; "
            "time.sleep(max(0.0, float(sys.argv[2]) - time.time())); "
            "print(record_choice('machine | shape', {'trainer': sys.argv[1]})['trainer'])")
    start = str(time.time() + 3.0)
    env = {**os.environ, "CFLPIPE_CACHE_DIR": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", code, trainer, start], env=env, stdout=subprocess.PIPE, text=True)
             for trainer in ("sequential", "batched") * 4]
    said = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(said) == 1 and said <= {"sequential", "batched"}
    assert json.loads((tmp_path / "cache" / "trainer-choices.json").read_text())["machine | shape"]["trainer"] in said


def test_an_unwritable_cache_is_said_once_and_the_choice_kept_for_the_process(tmp_path, monkeypatch, capsys):
    import cflpipe.fl.trainer_choice as choice

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(blocker / "cache"))  # under a file: cannot be made
    monkeypatch.setattr(choice, "_said_unwritable", False)
    assert record_choice("k", {"trainer": "batched"}) == {"trainer": "batched"}
    record_choice("k2", {"trainer": "batched"})
    assert capsys.readouterr().err.count("cannot keep the measured trainer choice") == 1


def test_plan_shapes_tell_apart_what_changes_the_cost_and_nothing_else(tmp_path):
    run = tiny_run(tmp_path, "auto", clients=6)
    items = lambda plans: [run.ctx.work_item(c, plan) for c, plan in plans.items()]  # noqa: E731
    start = run.ctx.init
    shape = plan_shape(run.ctx.spaces, items({c: ClientPlan(start) for c in range(4)}))
    assert shape == plan_shape(run.ctx.spaces, items({c: ClientPlan(start.clone()) for c in range(2, 6)}))
    assert shape != plan_shape(run.ctx.spaces, items({c: ClientPlan(start) for c in range(5)}))
    assert shape != plan_shape(run.ctx.spaces, items({c: ClientPlan(start, steps=4) for c in range(4)}))
    assert plan_shape(run.ctx.spaces, items({0: ClientPlan(start)})) is None  # nothing to vmap
    unequal = plan_shape(run.ctx.spaces, items({0: ClientPlan(start, steps=3), 1: ClientPlan(start, steps=5)}))
    assert unequal.endswith("clients 2 steps 2-8")
    assert shape.endswith("SGDStep clients 4 steps 2-4")


def test_the_fallback_message_names_the_exception_and_its_first_line_once(capsys):
    trainer = BatchedTrainer()
    trainer.say_fallback(ValueError("shapes differ\nthe rest of a long message"))
    trainer.say_fallback(KeyError("a later failure"))
    assert capsys.readouterr().err == ("cflpipe: the batched trainer cannot run some client plans "
                                       "(ValueError: shapes differ); training them sequentially\n")
    BatchedTrainer().say_fallback(NotImplementedError())  # no message: its name stands in
    assert "(NotImplementedError: NotImplementedError)" in capsys.readouterr().err


def test_plans_without_momentum_or_weight_decay_take_the_runs(tmp_path):
    run = tiny_run(tmp_path, "sequential", momentum=0.5, weight_decay=0.05)
    start = run.ctx.init

    def trained(**options):  # client 0 each time: the same batches
        return run.ctx.run({0: ClientPlan(start, **options)})[0].vector

    default = trained()
    assert torch.equal(default, trained(momentum=0.5, weight_decay=0.05))
    assert not torch.equal(default, trained(momentum=0.0))
    assert not torch.equal(default, trained(weight_decay=0.0))


@pytest.mark.parametrize("rule", ["sgd", "moreau"])
def test_plans_of_up_to_twice_the_steps_train_in_one_group_as_sequentially(tmp_path, rule):
    """local_epochs over clients of unequal size: steps 2, 3, 4 and 8 train as one group of three
    (the shorter clients' extra steps undone) and 8 alone, equal to the sequential trainer with
    momentum, and a rule's companion vector ends where the client's own steps leave it."""
    outcomes = {}
    for trainer in ("sequential", "batched"):
        run = tiny_run(tmp_path, trainer)
        start = run.ctx.init
        kind = {"rule": MoreauStep(lam=15.0, inner_steps=2, personal_lr=0.05),
                "companions": {"local": start.clone()}} if rule == "moreau" else {}
        plans = {c: ClientPlan(start, lr=0.1, momentum=0.5, steps=steps, **kind)
                 for c, steps in enumerate([2, 3, 4, 8])}
        outcomes[trainer] = run.ctx.run(plans)
        if trainer == "batched":
            assert run.trainer.counts == {"batched": 3, "sequential": 1}
    for c, steps in enumerate([2, 3, 4, 8]):
        a, b = outcomes["sequential"][c], outcomes["batched"][c]
        assert (a.result.steps, a.result.samples) == (b.result.steps, b.result.samples) == (steps, steps * 8)
        assert float((a.vector - b.vector).abs().max()) <= 1e-5 * float(a.vector.abs().max())
        assert abs(a.result.loss - b.result.loss) <= 1e-5 * abs(a.result.loss)
        for name, vector in a.companions.items():
            assert float((vector - b.companions[name]).abs().max()) <= 1e-5 * float(vector.abs().max())


def test_a_group_over_the_memory_budget_trains_in_chunks_as_sequentially(tmp_path, monkeypatch):
    from cflpipe.fl import trainers

    outcomes = {}
    for trainer in ("sequential", "batched"):
        run = tiny_run(tmp_path, trainer, clients=6)
        per_client = run.space.flat.numel() * trainers.BYTES_PER_PARAMETER
        monkeypatch.setitem(trainers.GROUP_MEMORY_BUDGET, "cpu", 2 * per_client)  # two clients at a time
        outcomes[trainer] = run.ctx.run({c: ClientPlan(run.ctx.init, lr=0.1) for c in range(5)})
        if trainer == "batched":
            assert run.trainer.counts == {"batched": 4, "sequential": 1}  # chunks of 2, 2 and 1
    for c in range(5):
        a, b = outcomes["sequential"][c].vector, outcomes["batched"][c].vector
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())


def test_bf16_trains_both_trainers_alike_and_apart_from_float32(tmp_path):
    outcomes = {}
    for trainer in ("sequential", "batched"):
        for precision in ("float32", "bf16", "tf32"):
            run = tiny_run(tmp_path / precision, trainer, precision=precision)
            outcomes[trainer, precision] = run.ctx.run({c: ClientPlan(run.ctx.init, lr=0.1) for c in range(4)})
    for c in range(4):
        exact, bf16 = outcomes["sequential", "float32"][c].vector, outcomes["sequential", "bf16"][c].vector
        batched = outcomes["batched", "bf16"][c].vector
        assert not torch.equal(exact, bf16)  # bfloat16 products move the result…
        assert float((exact - bf16).abs().max()) <= 0.05 * float(exact.abs().max())  # …a little
        assert float((bf16 - batched).abs().max()) <= 0.05 * float(bf16.abs().max())
        # TensorFloat-32 is a CUDA setting: on a CPU the float32 path itself
        assert torch.equal(outcomes["sequential", "tf32"][c].vector, exact)


def test_the_tf32_scope_puts_cudas_flags_back():
    from cflpipe.fl.local import precision_scope

    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with precision_scope("tf32", "cuda"):
            assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


def test_local_epochs_set_each_clients_steps_from_its_data(tmp_path):
    run = tiny_run(tmp_path, "sequential", local_epochs=0.1)
    trained = run.ctx.run({c: ClientPlan(run.ctx.init) for c in range(4)})
    for c in range(4):
        n = len(run.data.client(c, "train")[1])
        assert trained[c].result.steps == math.ceil(0.1 * n / 8) == 5  # ~360 samples, batches of 8


def test_clients_without_data_or_steps_train_alone_and_one_sample_clients_batch(tmp_path, capsys):
    """A client with no training data or no steps is returned untouched with an empty loss record
    by both trainers, without a fallback; clients of one sample each still train as a group."""
    outcomes = {}
    for trainer in ("sequential", "batched"):
        run = tiny_run(tmp_path, trainer, clients=6)
        split = run.data.train
        # clients 0 and 1 own no rows, 2 and 3 one row each, 4 and 5 the rest
        split.offsets = np.array([0, 0, 0, 1, 2, 500, len(split.y)])
        start = run.ctx.init
        plans = {c: ClientPlan(start, lr=0.1) for c in range(4)}
        plans.update({c: ClientPlan(start, lr=0.1, steps=0) for c in (4, 5)})
        outcomes[trainer] = run.ctx.run(plans)
        if trainer == "batched":
            assert run.trainer.counts == {"batched": 2, "sequential": 4}
    assert capsys.readouterr().err == ""
    for trained in outcomes.values():
        for c in (0, 1, 4, 5):
            assert trained[c].result == LocalResult(0.0, 0, 0)
            assert torch.equal(trained[c].vector, start)
        for c in (2, 3):
            assert (trained[c].result.steps, trained[c].result.samples) == (3, 3)
            assert not torch.equal(trained[c].vector, start)
    for c in (2, 3):
        a, b = outcomes["sequential"][c].vector, outcomes["batched"][c].vector
        assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())


# ---------------------------------------------------------------------- step rules by hand


def pull_to(w, x, y):
    """The loss ½‖w − x‖² and its gradient w − x (a fresh tensor, as vmap's is): the batch `x` is
    a target vector, so each rule's arithmetic can be followed by hand."""
    return (0.5 * (w - x) ** 2).sum(), w - x


def vec(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_the_sgd_step_adds_weight_decay_and_pulls_then_momentum_by_hand():
    w = vec(1.0, 2.0)
    config = step_config(w, 0.1, 0.5, 0.1, [Anchor(vec(0.0, 0.0), 0.5)], None)
    state = LoopState(vec(1.0, 1.0), {})
    loss = SGD.step(w, [(vec(0.0, 1.0), None)], pull_to, state, config)
    # g = w − x = (1, 1); + 0.1·w → (1.1, 1.2); + 0.5·(w − 0) → (1.6, 2.2)
    # v = 0.5·(1, 1) + g = (2.1, 2.7); w = (1, 2) − 0.1·v
    assert torch.allclose(w, vec(0.79, 1.73), rtol=0, atol=1e-12)
    assert torch.allclose(state.velocity, vec(2.1, 2.7), rtol=0, atol=1e-12)
    assert float(loss) == 1.0


def test_gradient_clipping_shortens_long_gradients_and_leaves_short_ones():
    rule, config = SGDStep(clip=1.0), StepConfig(lr=1.0)
    for g, expected in ((vec(3.0, 4.0), -vec(3.0, 4.0) / (5 + 1e-6)),  # norm 5: scaled to 1
                        (vec(3e-7, 4e-7), -vec(3e-7, 4e-7))):  # norm 5e-7, below the 1e-6 guard: as it is
        w = vec(0.0, 0.0)
        rule.step(w, [(-g, None)], pull_to, LoopState(None, {}), config)
        assert torch.allclose(w, expected, rtol=1e-12, atol=0)


def test_the_fomaml_step_by_hand_with_momentum_and_weight_decay():
    w, state = vec(1.0, 2.0), LoopState(vec(1.0, 1.0), {})
    config = StepConfig(lr=0.1, momentum=0.5, weight_decay=0.1)
    loss = FOMAMLStep(alpha=0.5).step(w, [(vec(0.0, 0.0), None), (vec(1.0, 1.0), None)], pull_to, state, config)
    # w̃ = w − 0.5·(w − 0) = (0.5, 1); meta-gradient w̃ − (1, 1) = (−0.5, 0), at w̃: loss 0.125
    # from w again: d = (−0.5, 0) + 0.1·(1, 2) = (−0.4, 0.2); v = 0.5·(1, 1) + d = (0.1, 0.7); w − 0.1·v
    assert torch.allclose(w, vec(0.99, 1.93), rtol=0, atol=1e-12)
    assert torch.allclose(state.velocity, vec(0.1, 0.7), rtol=0, atol=1e-12)
    assert float(loss) == 0.125


def test_the_moreau_step_by_hand_with_momentum_and_weight_decay():
    theta, local = vec(1.0, 2.0), vec(1.0, 0.0)
    state = LoopState(vec(1.0, 1.0), {"local": local})
    config = StepConfig(lr=0.1, momentum=0.5, weight_decay=0.1)
    rule = MoreauStep(lam=1.0, inner_steps=2, personal_lr=0.5)
    loss = rule.step(theta, [(vec(1.0, 1.0), None)], pull_to, state, config)
    # inner 1: (θ − x) + (θ − w) = (0, 1) + (0, 2); θ = (1, 2) − 0.5·(0, 3) = (1, 0.5)
    # inner 2: (0, −0.5) + (0, 0.5) = 0: θ stays, loss ½·0.25 = 0.125
    # envelope λ(w − θ) = (0, −0.5); d = (0, −0.5) + 0.1·(1, 0); v = 0.5·(1, 1) + d = (0.6, 0); w − 0.1·v
    assert torch.allclose(theta, vec(1.0, 0.5), rtol=0, atol=1e-12)
    assert torch.allclose(local, vec(0.94, 0.0), rtol=0, atol=1e-12)
    assert torch.allclose(state.velocity, vec(0.6, 0.0), rtol=0, atol=1e-12)
    assert float(loss) == 0.125


def test_anchors_of_strength_zero_are_dropped_and_every_other_kept():
    w, mask = torch.zeros(3), torch.tensor([True, False, True])
    config = step_config(w, 0.1, 0.0, 0.0, [Anchor(w + 1, 1.0), Anchor(w + 2, 0.0), Anchor(w + 3, 0.5, mask)],
                         None)
    assert [float(v[0]) for v, _ in config.pulls] == [1.0, 3.0]
    assert config.pulls[0][1] == 1.0 and config.pulls[1][1].tolist() == [0.5, 0.0, 0.5]


def test_rules_without_anchors_refuse_a_plan_with_anchors_or_a_trainable_mask():
    w = torch.zeros(3)
    for anchors, trainable in (([Anchor(w + 1, 0.5)], None), ((), torch.tensor([True, False, True]))):
        config = step_config(w, 0.1, 0.0, 0.0, anchors, trainable)
        with pytest.raises(ValueError, match="FOMAMLStep does not apply anchors or a trainable mask"):
            run_loop(w, torch.zeros(1, 2, 1, dtype=torch.long), lambda b: (w, None), pull_to, FOMAMLStep(0.1),
                     config, {}, torch.zeros(()))


def test_the_local_loss_is_the_mean_of_the_steps_losses():
    model = nn.Linear(4, 10)
    nn.init.zeros_(model.weight), nn.init.zeros_(model.bias)
    space = ParamSpace(model)
    x, y = torch.randn(6, 4), torch.arange(6)
    result = sgd(space, x, y, steps=3, batch_size=2, lr=0.0, generator=torch.Generator().manual_seed(0))
    # zero logits: every batch's cross-entropy is ln 10
    assert result.loss == pytest.approx(math.log(10), rel=1e-6)
    assert (result.steps, result.samples) == (3, 6)


def test_batch_indices_draw_only_the_passes_they_use():
    generator = torch.Generator().manual_seed(5)
    rows = batch_indices(10, 4, 5, generator)  # 5 batches of 4 from 10 samples: two passes
    replay = torch.Generator().manual_seed(5)
    passes = torch.cat([torch.randperm(10, generator=replay) for _ in range(2)])
    assert torch.equal(rows, passes[:20].view(5, 4))
    # the generator was advanced by those two permutations and no more (each costs O(n))
    assert torch.equal(torch.randperm(10, generator=generator), torch.randperm(10, generator=replay))


# ---------------------------------------------------------------------- the flat parameter space


def test_the_param_space_numbers_layers_and_keeps_the_models_dtype():
    space = ParamSpace(MLP((4,), 3, hidden=5))  # fc1 4·5 + 5, fc2 5·5 + 5, fc3 5·3 + 3
    assert space.num_layers == 3 and space.size == 25 + 30 + 18
    assert space.first_layers(1).tolist() == [True] * 25 + [False] * 48
    assert space.first_layers(2).tolist() == [True] * 55 + [False] * 18
    assert torch.equal(space.first_layers(2), space.body) and torch.equal(~space.body, space.head)
    # a network without layer names (a method's auxiliary one): a layer per parameter tensor
    aux = ParamSpace(nn.Linear(4, 3, bias=False).double())
    assert aux.num_layers == 1 and aux.flat.dtype == aux.grad.dtype == torch.float64


def test_grads_are_flat_notices_a_gradient_outside_the_flat_vector():
    model = nn.Linear(2, 2)
    space = ParamSpace(model)
    assert space.grads_are_flat()
    model.bias.grad = torch.zeros(2)  # a tensor of its own: backward would no longer fill space.grad
    assert not space.grads_are_flat()


def test_cluster_average_counts_a_cluster_with_any_positive_weight():
    vectors = torch.tensor([[1.0, 1.0], [3.0, 5.0], [2.0, 0.0]])
    means, present = cluster_average(vectors, torch.tensor([0, 0, 2]), torch.tensor([0.5, 0.5, 1.0]), 3)
    assert present.tolist() == [True, False, True]  # total weights 1, 0, 1
    assert means.tolist() == [[2.0, 3.0], [0.0, 0.0], [2.0, 0.0]]


def test_adam_step_is_torch_adam_on_a_vector_and_on_each_row_of_a_matrix():
    """AdamStep (FCCA's cINN) follows torch.optim.Adam, and on a (clients × P) matrix, as the
    batched trainer calls it, each row moves as that client's vector alone (moments per entry)."""
    from cflpipe.fl.local import AdamStep, LoopState, StepConfig

    generator = torch.Generator().manual_seed(0)
    x, y = torch.randn(2, 20, 5, generator=generator), torch.randn(2, 20, generator=generator)
    starts = torch.randn(2, 5, generator=generator)

    def gradient(weights, xb, yb):
        w = weights.detach().clone().requires_grad_(True)
        loss = ((xb @ w.unsqueeze(-1)).squeeze(-1) - yb).square().mean(-1).sum()
        loss.backward()
        return loss.detach(), w.grad

    rule, config = AdamStep(clip=1.0), StepConfig(lr=0.01)
    alone, state = starts[0].clone(), LoopState(None, {})
    reference = starts[0].clone().requires_grad_(True)
    optimizer = torch.optim.Adam([reference], lr=0.01)
    both, both_state = starts.clone(), LoopState(None, {})
    for _ in range(30):
        rule.step(alone, [(x[0], y[0])], gradient, state, config)
        rule.step(both, [(x, y)], gradient, both_state, config)
        optimizer.zero_grad()
        ((x[0] @ reference) - y[0]).square().mean().backward()
        torch.nn.utils.clip_grad_norm_([reference], 1.0)
        optimizer.step()
    torch.testing.assert_close(alone, reference.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(both[0], alone, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(both[1], starts[1])


def test_adam_step_with_kept_moments_continues_one_torch_adam_across_loops_and_rows():
    """AdamStep(kept=True) (FCCA's flow_moments: keep): two loops of 15 steps that hand their
    moments and step count on through the companions are one torch.optim.Adam of 30 steps; on a
    (clients × P) matrix with per-client counts each row is that client alone, a client further
    on in its own steps included. Without the hand-over (moments afresh) the second loop differs."""
    from cflpipe.fl.local import KEPT_MOMENTS, AdamStep, LoopState, StepConfig

    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(2, 20, 5, generator=generator), torch.randn(2, 20, generator=generator)
    starts = torch.randn(2, 5, generator=generator)

    def gradient(weights, xb, yb):
        w = weights.detach().clone().requires_grad_(True)
        loss = ((xb @ w.unsqueeze(-1)).squeeze(-1) - yb).square().mean(-1).sum()
        loss.backward()
        return loss.detach(), w.grad

    def moments(rows: int | None, steps: list[float]) -> dict[str, torch.Tensor]:
        shape = (5,) if rows is None else (rows, 5)
        count = torch.tensor(steps).view(-1) if rows is None else torch.tensor(steps).view(rows, 1)
        return dict(zip(KEPT_MOMENTS, (torch.zeros(shape), torch.zeros(shape), count)))

    rule, config = AdamStep(clip=1.0, kept=True), StepConfig(lr=0.01)
    reference = starts[0].clone().requires_grad_(True)
    optimizer = torch.optim.Adam([reference], lr=0.01)
    alone, kept = starts[0].clone(), moments(None, [0.0])
    fresh = starts[0].clone()
    for loop in range(2):
        fresh_state = LoopState(None, {})  # AdamStep() starts its moments again each loop
        state = LoopState(None, kept)  # a new loop, the companions handed on
        for _ in range(15):
            rule.step(alone, [(x[0], y[0])], gradient, state, config)
            AdamStep(clip=1.0).step(fresh, [(x[0], y[0])], gradient, fresh_state, config)
            optimizer.zero_grad()
            ((x[0] @ reference) - y[0]).square().mean().backward()
            torch.nn.utils.clip_grad_norm_([reference], 1.0)
            optimizer.step()
    torch.testing.assert_close(alone, reference.detach(), rtol=1e-5, atol=1e-6)
    assert kept["adam_steps"].tolist() == [30.0]
    assert not torch.allclose(fresh, alone, rtol=1e-4, atol=1e-5)
    # rows: client 0 from the start, client 1 already 7 steps into its optimizer
    ahead = starts[1].clone()
    ahead_kept = moments(None, [0.0])
    warm = LoopState(None, ahead_kept)
    for _ in range(7):
        rule.step(ahead, [(x[1], y[1])], gradient, warm, config)
    both = torch.stack([starts[0], ahead])
    both_kept = moments(2, [0.0, 7.0])
    both_kept["adam_first"][1], both_kept["adam_second"][1] = ahead_kept["adam_first"], ahead_kept["adam_second"]
    one = starts[0].clone()
    one_state, both_state = LoopState(None, moments(None, [0.0])), LoopState(None, both_kept)
    ahead_state = LoopState(None, ahead_kept)
    for _ in range(10):
        rule.step(both, [(x, y)], gradient, both_state, config)
        rule.step(one, [(x[0], y[0])], gradient, one_state, config)
        rule.step(ahead, [(x[1], y[1])], gradient, ahead_state, config)
    torch.testing.assert_close(both[0], one, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(both[1], ahead, rtol=1e-5, atol=1e-6)
    assert both_kept["adam_steps"].flatten().tolist() == [10.0, 17.0]


def test_apply_batched_equals_one_by_one_for_shared_and_own_inputs_and_any_call():
    """Trainer.apply: the batched trainer's vmap over the stacked vectors (its path on a GPU)
    gives what loading them one by one gives, to float rounding: the same inputs for every vector
    (cluster models on a split), each vector its own inputs of any length (personal models on
    their clients' rows; padded inside), another method of the network (features), and chunks of
    rows. On a CPU the batched trainer applies one by one (measured faster there)."""
    from cflpipe.fl.trainers import SequentialTrainer

    space = ParamSpace(MLP((64,), 10))
    generator = torch.Generator().manual_seed(0)
    vectors = 0.05 * torch.randn(5, space.size, generator=generator)
    x = torch.randn(300, 64, generator=generator)
    one, batched = SequentialTrainer(), BatchedTrainer()
    expected = one.apply(space, vectors, (x,), "forward", 128)
    assert expected.shape == (5, 300, 10)
    torch.testing.assert_close(batched.apply_batched(space, vectors, (x,), "forward", 128), expected)
    torch.testing.assert_close(batched.apply_batched(space, vectors, (x,), "forward", None), expected)
    assert torch.equal(batched.apply(space, vectors, (x,), "forward", 128), expected)  # CPU: one by one
    for j in range(5):  # the sequential path is the network itself, vector by vector
        space.load(vectors[j])
        with torch.no_grad():
            assert torch.equal(expected[j], torch.cat([space.model(x[:128]), space.model(x[128:256]), space.model(x[256:])]))
    own = [(torch.randn(n, 64, generator=generator),) for n in (3, 10, 0, 7, 1)]
    alone = one.apply(space, vectors, own, "features", 4)
    together = batched.apply_batched(space, vectors, own, "features", 4)
    assert [tuple(t.shape) for t in together] == [(3, 200), (10, 200), (0, 200), (7, 200), (1, 200)]
    for a, b in zip(alone, together):
        torch.testing.assert_close(b, a)
    assert batched.counts == {"sequential": 0, "batched": 0}  # applying is not training


def test_apply_inverts_every_cinn_at_once_as_one_by_one():
    from cflpipe.fl.trainers import SequentialTrainer
    from cflpipe.methods.fcca import ConditionalFlow

    torch.manual_seed(0)
    space = ParamSpace(ConditionalFlow(6, 3, 2, 8))
    vectors = space.read()[None] + 0.1 * torch.randn(4, space.size, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(12, 6, generator=torch.Generator().manual_seed(2))
    context = space.model.onehot(torch.arange(3).repeat_interleave(4), torch.float32)
    expected = SequentialTrainer().apply(space, vectors, (noise, context), "inverse", None)
    torch.testing.assert_close(BatchedTrainer.apply_batched(space, vectors, (noise, context), "inverse", None),
                               expected)


def test_per_tensor_gradients_equal_the_gradient_with_respect_to_the_flat_vector():
    """#32 item 1: the batched trainer takes each client's gradient with respect to per-parameter
    views of its row and cats them; the reference takes it with respect to the whole row (the
    slices' backward). Same maths, so equal to float rounding on a CNN with conv, norm and linear
    parameters."""
    from torch.func import functional_call, grad, vmap

    from cflpipe.models import build_model

    torch.manual_seed(0)
    space = ParamSpace(build_model("cnn", (1, 12, 12), 10))
    clients = 3
    w = space.flat[None].repeat(clients, 1) + 0.01 * torch.randn(clients, space.size)
    x, y = torch.randn(clients, 8, 1, 12, 12), torch.randint(0, 10, (clients, 8))

    def flat_loss(row, xb, yb):
        params = {s.name: row[s.offset:s.offset + s.numel].view(s.shape) for s in space.slots}
        return F.cross_entropy(functional_call(space.model, params, (xb,)), yb)

    reference = vmap(grad(flat_loss))(w, x, y)
    trainer = BatchedTrainer()
    item_grad = trainer.gradient_function(space, lambda forward, xb, yb: F.cross_entropy(forward(xb), yb), False)
    ours = item_grad(w, x, y)[1]
    assert ours.shape == reference.shape == (clients, space.size)
    torch.testing.assert_close(ours, reference, rtol=1e-6, atol=1e-7)


def test_the_processes_trainer_is_the_sequential_one_bit_for_bit(tmp_path):
    """Plans of several settings (anchors, a companion vector, other step counts) spread over two
    worker processes: every trained vector, companion and loss record is the sequential trainer's."""
    outcomes = {}
    for trainer in ("sequential", "processes"):
        run = tiny_run(tmp_path, trainer, clients=6, workers=2)
        start, space = run.ctx.init, run.space
        anchor = Anchor(start + 0.01, 0.5, space.body)
        plans = {0: ClientPlan(start, lr=0.1), 1: ClientPlan(start, (anchor,), momentum=0.5, lr=0.1),
                 2: ClientPlan(start, lr=0.1, steps=7),
                 3: ClientPlan(start, lr=0.1, rule=MoreauStep(lam=15.0, inner_steps=2, personal_lr=0.05),
                               companions={"local": start.clone()}),
                 4: ClientPlan(start, lr=0.05), 5: ClientPlan(start, lr=0.1, steps=0)}
        try:
            outcomes[trainer] = run.ctx.run(plans)
        finally:
            run.trainer.close()
        if trainer == "processes":
            assert run.trainer.counts == {"sequential": 6, "batched": 0} and run.trainer.pool is None
    for c in range(6):
        a, b = outcomes["sequential"][c], outcomes["processes"][c]
        assert torch.equal(a.vector, b.vector) and a.result == b.result
        assert a.companions.keys() == b.companions.keys()
        assert all(torch.equal(a.companions[k], b.companions[k]) for k in a.companions)


def test_switching_between_trainers_that_give_the_same_bytes_retrains_nothing(tmp_path):
    """`processes` (and `distributed`) give a run the sequential trainer's bytes: a run trained with
    one is the same run as with `sequential` (config.yaml, summary.json and the spec's hash say so,
    timing.json says which trainer ran), so switching skips it; `batched` is another run."""
    from cflpipe.fl.engine import train_run
    from cflpipe.report.aggregate import load_runs
    from cflpipe.spec import spec_sha256

    def spec(trainer: str, results: str):
        return parse_spec({
            "seeds": [0], "results_dir": str(tmp_path / results),
            "training": {"model": "mlp", "rounds": 2, "clients_per_round": 4, "local_steps": 2, "batch_size": 16,
                         "device": "cpu", "trainer": trainer, "workers": 2},
            "scenarios": {"iid": {"dataset": "digits", "clients": 4, "partition": [{"kind": "iid"}]}},
            "methods": {"fedavg": {}}})

    first = train_run(spec("processes", "a"), "iid", "fedavg", 0, progress=False)
    assert not first.skipped and json.loads((first.run_dir / "timing.json").read_text())["trainer"] == "processes"
    alone = train_run(spec("sequential", "b"), "iid", "fedavg", 0, progress=False)
    for name in ("config.yaml", "summary.json", "metrics.parquet", "rounds.parquet"):
        assert (first.run_dir / name).read_bytes() == (alone.run_dir / name).read_bytes(), name
    for trainer in ("sequential", "distributed", "processes"):
        assert train_run(spec(trainer, "a"), "iid", "fedavg", 0, progress=False).skipped, trainer
        assert spec_sha256(spec(trainer, "a")) == spec_sha256(spec("processes", "a"))
        assert len(load_runs(spec(trainer, "a"))) == 1  # not stale for the report
    # A config.yaml written before the trainer was read as sequential still names it.
    config = first.run_dir / "config.yaml"
    config.write_text(config.read_text().replace("trainer: sequential", "trainer: processes"))
    assert train_run(spec("sequential", "a"), "iid", "fedavg", 0, progress=False).skipped
    assert not train_run(spec("batched", "a"), "iid", "fedavg", 0, progress=False).skipped
    assert spec_sha256(spec("batched", "a")) != spec_sha256(spec("sequential", "a"))


def test_a_checkpoint_that_names_a_trainer_giving_the_same_bytes_resumes(tmp_path, capsys):
    """A checkpoint written while config.yaml still named `processes` (before it read as the
    `sequential` it equals) is this run's: the run resumes from it instead of starting afresh."""
    from cflpipe.fl.checkpoint import read_state, write_state
    from cflpipe.fl.engine import train_run

    spec = parse_spec({
        "seeds": [0], "results_dir": str(tmp_path),
        "training": {"model": "mlp", "rounds": 3, "clients_per_round": 4, "local_steps": 2, "batch_size": 16,
                     "device": "cpu", "trainer": "sequential", "checkpoint_every": 1, "keep_state": True},
        "scenarios": {"iid": {"dataset": "digits", "clients": 4, "partition": [{"kind": "iid"}]}},
        "methods": {"fedavg": {}}})
    first = train_run(spec, "iid", "fedavg", 0, progress=False)
    rounds = (first.run_dir / "rounds.parquet").read_bytes()
    path = first.run_dir / "state" / "state.pt"
    state, problem = read_state(path)
    assert problem is None and "trainer: sequential" in state["config"]
    state["config"] = state["config"].replace("trainer: sequential", "trainer: processes")
    write_state(path, state)
    (first.run_dir / "summary.json").unlink()
    (first.run_dir / "rounds.parquet").unlink()
    capsys.readouterr()
    again = train_run(spec, "iid", "fedavg", 0, progress=False)
    assert not again.skipped and "another configuration" not in capsys.readouterr().err
    assert (again.run_dir / "rounds.parquet").read_bytes() == rounds
    state["config"] = state["config"].replace("trainer: processes", "trainer: batched")  # another run
    write_state(path, state)
    (first.run_dir / "summary.json").unlink()
    train_run(spec, "iid", "fedavg", 0, progress=False)
    assert "a checkpoint of another configuration (differs in training.trainer)" in capsys.readouterr().err


def test_work_is_cut_into_contiguous_shards_of_about_equal_cost():
    from cflpipe.fl.processes import shard_indices as _shards

    assert _shards([1] * 5, 2) == [[0, 1, 2], [3, 4]]
    assert _shards([8, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4]]
    assert _shards([1], 3) == [[0], [], []]


def test_the_processes_trainer_is_for_cpus():
    with pytest.raises(Exception, match="training.trainer: processes spreads training over CPU processes"):
        build_trainer("processes", torch.device("cuda"))


def test_dropout_seeding_draws_what_torch_manual_seed_draws():
    """WorkItem.generator seeds dropout through seed_default_generators, torch.manual_seed's
    cheap part: the same CPU draws (CUDA's generators are seeded alike where CUDA has started)."""
    from cflpipe.fl.work import seed_default_generators

    seed_default_generators(12345)
    ours = torch.rand(5)
    torch.manual_seed(12345)
    assert torch.equal(ours, torch.rand(5))


def test_dropout_seeding_seeds_every_cuda_generator_once_cuda_has_started(monkeypatch):
    from cflpipe.fl.work import seed_default_generators

    devices = (torch.Generator(), torch.Generator())  # stand-ins for two GPUs' default generators
    monkeypatch.setattr(torch.cuda, "default_generators", devices)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    seed_default_generators(99)
    assert [g.initial_seed() for g in devices] != [99, 99]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    seed_default_generators(99)
    assert [g.initial_seed() for g in devices] == [99, 99]


def test_the_distributed_trainer_without_torchrun_is_the_sequential_one(tmp_path, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    outcomes = {}
    for trainer in ("sequential", "distributed"):
        run = tiny_run(tmp_path, trainer, clients=4)
        outcomes[trainer] = run.ctx.run({c: ClientPlan(run.ctx.init, lr=0.1) for c in range(4)})
    assert run.trainer.counts == {"sequential": 4, "batched": 0, "on_other_ranks": 0}
    assert all(torch.equal(outcomes["sequential"][c].vector, outcomes["distributed"][c].vector) for c in range(4))


def test_the_distributed_trainer_is_for_cpus():
    with pytest.raises(Exception, match="training.trainer: distributed spreads training over the CPU processes "
                                        "torchrun starts, and this run's device is cuda; allowed: device: cpu, "
                                        "or trainer auto or batched on the GPU"):
        build_trainer("distributed", torch.device("cuda"))


@pytest.mark.slow
def test_a_run_over_three_torchrun_ranks_is_the_sequential_run_byte_for_byte(tmp_path):
    import json
    import subprocess
    import sys

    import yaml

    outputs = {}
    for trainer in ("sequential", "distributed"):
        spec = {"seeds": [0], "results_dir": str(tmp_path / trainer),
                "training": {"model": "mlp", "rounds": 4, "clients_per_round": 6, "local_steps": 3, "batch_size": 8,
                             "eval_every": 2, "device": "cpu", "trainer": trainer},
                "scenarios": {"s": {"dataset": "digits", "clients": 8,
                                    "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
                "methods": {"fedavg": {}, "ifca": {"clusters": 2}, "ditto": {}}}
        (tmp_path / f"{trainer}.yaml").write_text(yaml.safe_dump(spec))
        launch = ([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3"]
                  if trainer == "distributed" else [sys.executable])
        done = subprocess.run([*launch, "-m", "cflpipe", "train", "--config", str(tmp_path / f"{trainer}.yaml"),
                               "--scenario", "s", "--method", "fedavg", "ifca", "ditto", "--seed", "0", "--quiet"],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        for method in ("fedavg", "ifca", "ditto"):
            run_dir = tmp_path / trainer / "runs" / "s" / method / "seed0"
            outputs[trainer, method] = {name: (run_dir / name).read_bytes()
                                        for name in ("metrics.parquet", "rounds.parquet", "clusters.parquet")}
            if trainer == "distributed":
                trained = json.loads((run_dir / "timing.json").read_text())["plans_trained"]
                assert 0 < trained["on_other_ranks"] < trained["sequential"]  # ranks 1 and 2 trained, rank 0 too
    for method in ("fedavg", "ifca", "ditto"):
        assert outputs["sequential", method] == outputs["distributed", method]


_FAILURES = {
    # rank 0's own shard, after the other ranks were sent theirs
    0: "if os.environ['RANK'] == '0':\n    trainers.Trainer.one = broken\n",
    # another rank's shard: its error comes back to rank 0
    1: "if os.environ['RANK'] == '1':\n    trainers.Trainer.one = broken\n",
    # rank 2's shard cannot be pickled, after rank 1's was: rank 1 must not be left busy
    "pickle": ("import contextlib\nfrom cflpipe.fl import distributed\nreal, calls = distributed.pickled_together, []\n"
               "@contextlib.contextmanager\ndef failing():\n    calls.append(1)\n"
               "    if len(calls) == 2:\n        raise RuntimeError('injected failure')\n"
               "    with real():\n        yield\n"
               "if os.environ['RANK'] == '0':\n    distributed.pickled_together = failing\n"),
}


@pytest.mark.slow
@pytest.mark.parametrize("failing", list(_FAILURES))
def test_a_rank_that_fails_mid_round_ends_the_job_instead_of_hanging_it(tmp_path, failing):
    """A failure in rank 0's own shard, in another rank's, or in pickling a later rank's shard:
    the job ends with an error, promptly, and leaves no rank waiting to be heard."""
    import subprocess
    import sys

    import yaml

    spec = {"seeds": [0], "results_dir": str(tmp_path / "results"),
            "training": {"model": "mlp", "rounds": 3, "clients_per_round": 6, "local_steps": 2, "batch_size": 8,
                         "eval_every": 3, "device": "cpu", "trainer": "distributed"},
            "scenarios": {"s": {"dataset": "digits", "clients": 6, "partition": [{"kind": "iid"}]}},
            "methods": {"fedavg": {}}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    fail = ("import os\nfrom cflpipe.fl import trainers\n"
            "def broken(self, spaces, item):\n    raise RuntimeError('injected failure')\n" + _FAILURES[failing])
    script = tmp_path / "fail.py"
    script.write_text(fail + "from cflpipe.cli import main\nraise SystemExit(main(['train', '--config', %r, "
                             "'--scenario', 's', '--method', 'fedavg', '--seed', '0', '--quiet']))\n"
                      % str(tmp_path / "spec.yaml"))
    ranks = "3" if failing == "pickle" else "2"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", ranks,
                           str(script)], capture_output=True, text=True, timeout=240)
    assert done.returncode != 0
    assert "injected failure" in done.stderr
    if failing == 1:
        assert "rank 1 failed to train its clients: RuntimeError: injected failure" in done.stderr


def test_items_pickled_together_carry_a_shared_start_once(tmp_path):
    """A round's items mostly share one start vector: pickled together it is written once (and
    shared again when unpickled), not once per item as a compact copy of its own."""
    import pickle

    from cflpipe.fl.work import pickled_together

    run = tiny_run(tmp_path, "sequential", clients=6)
    items = [run.ctx.work_item(c, ClientPlan(run.ctx.init, lr=0.1)) for c in range(6)]
    alone = pickle.dumps(items)
    with pickled_together():
        together = pickle.dumps(items)
    start_bytes = run.ctx.init.numel() * run.ctx.init.element_size()
    assert len(alone) - len(together) >= 5 * start_bytes * 0.99
    back = pickle.loads(together)
    assert all(item.start is back[0].start for item in back)
    assert torch.equal(back[0].start, run.ctx.init) and back[0].start.untyped_storage().nbytes() == start_bytes
    assert all(torch.equal(a.x, b.x) and torch.equal(a.y, b.y) for a, b in zip(items, back))


def test_a_damaged_results_record_of_choices_is_an_error_not_a_fresh_start(tmp_path, monkeypatch):
    """Rewriting a results folder's record that cannot be read would drop every choice its runs
    were made with; a damaged per-user cache is only a cache."""
    from cflpipe.errors import SpecError

    monkeypatch.setenv("CFLPIPE_CACHE_DIR", str(tmp_path / "cache"))
    record = tmp_path / "results" / "trainer-choices.json"
    record.parent.mkdir()
    record.write_text('{"MLP[...] clients 4": {"trainer": "batch')  # cut short
    with pytest.raises(SpecError, match="not a record of trainer choices"):
        record_choice("shape", {"trainer": "batched"}, record, results=True)
    assert record.read_text().endswith('"batch')
    choices_file().parent.mkdir(parents=True)
    choices_file().write_text("[]")
    assert read_choices() == {} and record_choice("k", {"trainer": "sequential"})["trainer"] == "sequential"
