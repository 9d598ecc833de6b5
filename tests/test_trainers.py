"""The plan seam's trainers beyond the built-in methods: an auxiliary per-client network trained
with a loss of its own, plans with different settings in one round, and a loss that vmap cannot
run, which the batched trainer hands to the sequential path and says so once per run."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from cflpipe.fl.engine import prepare_run
from cflpipe.fl.local import Anchor
from cflpipe.fl.plan import ClientPlan
from cflpipe.spec import parse_spec

torch.set_num_threads(1)


def tiny_run(tmp_path, trainer: str, clients: int = 4):
    spec = parse_spec({
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 2, "clients_per_round": 4, "local_steps": 3, "batch_size": 8,
                     "lr": 0.1, "device": "cpu", "trainer": trainer},
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
                 3: ClientPlan(start, lr=0.01, steps=5)}
        trained = run.ctx.run(plans)
        outcomes[trainer] = trained
        if trainer == "batched":  # {0, 1} form a group; 2 and 3 are alone and train sequentially
            assert run.trainer.counts == {"batched": 2, "sequential": 2}
    for c in range(4):
        a, b = outcomes["sequential"][c], outcomes["batched"][c]
        assert a.result.steps == b.result.steps == (5 if c == 3 else 3)
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
        run = tiny_run(tmp_path / trainer, trainer, clients=12)
        space, start = run.space, run.ctx.init
        pull = start + 0.1
        variants = [dict(trainable=space.body), dict(trainable=None),
                    dict(anchors=(Anchor(pull, 0.5, space.head),)), dict(anchors=(Anchor(pull, 0.5, None),)),
                    dict(loss=one_hot_regression), dict(inputs="own, halved")]
        # each variant twice (clients 2k and 2k + 1), so every variant could form a group of its own
        plans = {}
        for k, options in enumerate(variants):
            for client in (2 * k, 2 * k + 1):
                if "inputs" in options:
                    options = {"inputs": run.data.client(client, "train")[0] * 0.5}
                plans[client] = ClientPlan(start, lr=0.1, **options)
        outcomes[trainer] = run.ctx.run(plans)
        counts[trainer] = dict(run.trainer.counts)
    assert counts["batched"] == {"batched": 12, "sequential": 0}  # six groups of two
    for client in range(12):
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
    from cflpipe.fl.trainers import SequentialTrainer

    spec = parse_spec({
        "seeds": [0],
        "training": {"model": "cnn_tsdp", "rounds": 1, "clients_per_round": 2, "local_steps": 1, "batch_size": 4,
                     "lr": 0.05, "device": "cpu"},
        "scenarios": {"s": {"dataset": "digits", "clients": 2, "partition": [{"kind": "iid"}]}},
        "methods": {"fedavg": {}},
        "results_dir": str(tmp_path),
    })
    run = prepare_run(spec, "s", "fedavg", 0)
    ctx, trainer = run.ctx, SequentialTrainer()

    def draw(seed=0, round_index=0, client=0, stream=()):
        ctx.seed, ctx.round = seed, round_index
        trainer.generator(ctx, client, ClientPlan(ctx.init, stream=stream))
        return torch.rand(4)

    reference = draw()
    assert torch.equal(draw(), reference)
    for other in (draw(seed=1), draw(round_index=1), draw(client=1), draw(stream=(7,))):
        assert not torch.equal(other, reference)
    # the batch stream (a torch.Generator) follows the same key, drawn apart from the masks
    def batches(round_index):
        ctx.seed, ctx.round = 0, round_index
        return trainer.generator(ctx, 0, ClientPlan(ctx.init)).initial_seed()

    assert batches(0) == batches(0) and batches(1) != batches(0)
