"""The FL engine: exact local SGD, outputs and their schemas, determinism, divergence handling,
communication accounting (questions to clients included), evaluation, aggregation without held
uploads, and the methods' expected ordering. Resume and the results folder: test_engine_resume.py;
jobs of several runs: test_engine_jobs.py."""

import json
import re
import weakref

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from cflpipe.errors import DivergenceError
from cflpipe.fl import engine
from cflpipe.fl.engine import OUTPUT_FILES, prepare_run, train_run
from cflpipe.fl.local import Anchor, batch_indices, sgd
from cflpipe.fl.params import ParamSpace, cluster_average, weighted_average
from cflpipe.models import build_model
from cflpipe.spec import parse_spec

from conftest import require_plugin
from engine_helpers import _bytes, finished_runs, tiny_spec  # noqa: F401 (a fixture)

torch.set_num_threads(1)


def test_parameters_and_gradients_live_in_flat_vectors():
    torch.manual_seed(0)
    space = ParamSpace(build_model("cnn", (1, 8, 8), 10))
    assert space.size == sum(p.numel() for p in space.model.parameters())
    vector = torch.randn(space.size)
    space.load(vector)
    assert torch.equal(torch.cat([p.detach().flatten() for p in space.model.parameters()]), vector)
    space.model(torch.randn(4, 1, 8, 8)).sum().backward()
    assert space.grads_are_flat()
    assert torch.equal(torch.cat([p.grad.flatten() for p in space.model.parameters()]), space.grad)
    assert (space.body ^ space.head).all() and space.head.sum() == 84 * 10 + 10


def test_flat_sgd_equals_torch_optim_sgd():
    torch.manual_seed(0)
    x, y = torch.randn(50, 1, 8, 8), torch.randint(0, 10, (50,))
    space = ParamSpace(build_model("cnn", (1, 8, 8), 10))
    start = space.read()
    reference = build_model("cnn", (1, 8, 8), 10)
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(start, reference.parameters())
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    for batch in batch_indices(50, 16, 7, torch.Generator().manual_seed(3)):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x[batch]), y[batch]).backward()
        optimizer.step()
    sgd(space, x, y, steps=7, batch_size=16, lr=0.1, momentum=0.9, weight_decay=1e-3,
        generator=torch.Generator().manual_seed(3))
    expected = torch.nn.utils.parameters_to_vector(reference.parameters())
    assert torch.allclose(space.read(), expected, atol=1e-6)


def test_anchor_and_trainable_mask():
    torch.manual_seed(0)
    x, y = torch.randn(20, 60), torch.randint(0, 10, (20,))
    space = ParamSpace(build_model("mlp", (60,), 10))
    start = space.read()
    sgd(space, x, y, steps=5, batch_size=8, lr=0.1, generator=torch.Generator().manual_seed(0),
        trainable=space.head)
    moved = space.read() != start
    assert not moved[space.body].any() and moved[space.head].any()
    # A huge pull towards the start keeps the model there (the gradient step is dwarfed).
    space.load(start)
    far = start + 1.0
    sgd(space, x, y, steps=1, batch_size=8, lr=0.001, generator=torch.Generator().manual_seed(0),
        anchors=[Anchor(far, 1000.0, space.body)])
    delta = space.read() - start
    assert torch.allclose(delta[space.body], torch.full_like(delta[space.body], 1.0), atol=0.05)


def test_weighted_and_cluster_average():
    vectors = torch.tensor([[1.0, 0.0], [3.0, 2.0], [10.0, 10.0], [20.0, 30.0]])
    weights = torch.tensor([1.0, 3.0, 1.0, 1.0])
    assert torch.allclose(weighted_average(vectors[:2], weights[:2]), torch.tensor([2.5, 1.5]))
    means, present = cluster_average(vectors, torch.tensor([0, 0, 2, 2]), weights, 3)
    assert present.tolist() == [True, False, True]
    assert torch.allclose(means[0], torch.tensor([2.5, 1.5]))
    assert torch.allclose(means[2], torch.tensor([15.0, 20.0]))


# ---------------------------------------------------------------------------- runs


def test_outputs_and_schemas(finished_runs):
    spec, runs = finished_runs
    run_dir = runs["oracle"].run_dir
    for name in OUTPUT_FILES:
        assert (run_dir / name).exists(), name
    assert (run_dir / "state" / "state.pt").exists()
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]
    metrics = pd.read_parquet(run_dir / "metrics.parquet")
    assert list(metrics.columns) == ["round", "client", "split", "model", "group", "acc", "loss", "f1", "n"]
    assert sorted(metrics["round"].unique()) == [2, 4, 6]
    assert set(metrics["split"]) == {"train", "test"}
    assert len(metrics) == 3 * 2 * 8
    clusters = pd.read_parquet(run_dir / "clusters.parquet")
    assert list(clusters.columns) == ["round", "client", "cluster", "true_group"]
    assert (clusters["cluster"] == clusters["true_group"]).all()  # oracle uses the true groups
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert list(rounds["round"]) == [1, 2, 3, 4, 5, 6]
    evals = rounds.dropna(subset=["acc_macro"])
    assert list(evals["round"]) == [2, 4, 6]
    assert (evals["ari"] == 1.0).all() and (evals["n_clusters"] == 2).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"]["round"] == 6 and summary["method"] == "oracle"
    # The summary's personalized accuracy is the mean of the clients' test accuracies.
    last = metrics[(metrics["round"] == 6) & (metrics["split"] == "test")]
    assert summary["final"]["acc_macro"] == pytest.approx(last["acc"].mean())
    assert summary["final"]["acc_micro"] == pytest.approx((last["acc"] * last["n"]).sum() / last["n"].sum())
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["training"]["rounds"] == 6 and config["seed"] == 0


def test_communication_bytes(finished_runs):
    spec, runs = finished_runs
    size = sum(p.numel() for p in build_model("mlp", (1, 8, 8), 10).parameters()) * 4
    rounds = pd.read_parquet(runs["fedavg"].run_dir / "rounds.parquet")
    assert (rounds["bytes_down"] == 4 * size).all() and (rounds["bytes_up"] == 4 * size).all()
    local = pd.read_parquet(runs["local"].run_dir / "rounds.parquet")
    assert (local["bytes_down"] == 0).all() and (local["bytes_up"] == 0).all()


def test_same_seed_identical_different_seed_differs(tmp_path, finished_runs):
    _, runs = finished_runs
    spec = parse_spec(tiny_spec(tmp_path))
    again = train_run(spec, "swap", "oracle", 0, progress=False)
    assert _bytes(again.run_dir) == _bytes(runs["oracle"].run_dir)
    other = train_run(spec, "swap", "oracle", 1, progress=False)
    assert _bytes(other.run_dir)["metrics.parquet"] != _bytes(again.run_dir)["metrics.parquet"]


def test_divergence_stops_with_one_line_or_skips(tmp_path):
    data = tiny_spec(tmp_path, lr=1e12, momentum=0.0)
    spec = parse_spec(data)
    with pytest.raises(DivergenceError) as info:
        train_run(spec, "swap", "fedavg", 0, progress=False)
    message = str(info.value)
    assert message.startswith("round 1, client ") and "method fedavg" in message and "\n" not in message
    assert not (spec.run_dir("swap", "fedavg", 0) / "summary.json").exists()
    # skipping every update would report the initial model's accuracy: the run fails instead
    data["training"]["on_divergence"] = "skip"
    spec = parse_spec(data)
    with pytest.raises(DivergenceError) as info:
        train_run(spec, "swap", "fedavg", 0, progress=False)
    assert str(info.value) == ("swap/fedavg/seed0: 24 of 24 client updates diverged and were skipped "
                               "(training.on_divergence: skip), so the run did not train; lower training.lr")
    assert not (spec.run_dir("swap", "fedavg", 0) / "summary.json").exists()


def test_a_few_skipped_updates_are_counted_and_the_run_finishes(tmp_path, monkeypatch, capsys):
    from cflpipe.fl.local import LocalResult
    from cflpipe.methods.fedavg import FedAvg

    finish = FedAvg.client_finish

    def client_zero_diverges(view, payload, trained, scratch):
        update = finish(view, payload, trained, scratch)
        if view.client == 0:
            update.result = LocalResult(float("nan"), update.result.steps, update.result.samples)
        return update

    monkeypatch.setattr(FedAvg, "client_finish", staticmethod(client_zero_diverges))
    spec = parse_spec(tiny_spec(tmp_path, on_divergence="skip", clients_per_round=8))
    result = train_run(spec, "swap", "fedavg", 0, progress=False)
    rounds = pd.read_parquet(result.run_dir / "rounds.parquet")
    assert rounds["skipped"].tolist() == [1] * 6 and rounds["bytes_up"].nunique() == 1
    assert "warning" not in capsys.readouterr().err


def test_exploding_finite_loss_warns_once(tmp_path, capsys):
    spec = parse_spec(tiny_spec(tmp_path, lr=3.0, momentum=0.9, on_divergence="skip"))
    try:
        train_run(spec, "swap", "fedavg", 0, progress=False)
    except DivergenceError:
        pass  # it may also diverge outright later; the warning comes first
    err = capsys.readouterr().err
    assert err.count("warning: swap/fedavg/seed0: round ") == 1 and "training may be diverging" in err


@pytest.mark.slow
def test_oracle_and_local_beat_fedavg_on_label_swap(tmp_path):
    spec = parse_spec({
        "seeds": [0],
        "training": {"model": "cnn", "rounds": 20, "clients_per_round": 10, "local_steps": 10,
                     "batch_size": 32, "lr": 0.05, "momentum": 0.9, "eval_every": 10, "device": "cpu"},
        "scenarios": {"swap4": {"dataset": "digits", "clients": 20,
                                "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 4}]}},
        "methods": {"fedavg": {}, "local": {}, "oracle": {}},
        "results_dir": str(tmp_path),
    })
    acc = {m: train_run(spec, "swap4", m, 0, progress=False).summary["final"]["acc_macro"]
           for m in ("fedavg", "local", "oracle")}
    assert acc["oracle"] > acc["fedavg"] + 0.2, acc
    assert acc["local"] > acc["fedavg"] + 0.2, acc


def test_partition_from_another_scenario_definition_is_refused(tmp_path):
    from cflpipe.errors import PartitionError
    from cflpipe.fl.data import partition_scenario

    data = tiny_spec(tmp_path)
    partition_scenario(parse_spec(data), "swap")
    data["scenarios"]["swap"]["clients"] = 6
    spec = parse_spec(data)
    with pytest.raises(PartitionError) as info:
        train_run(spec, "swap", "fedavg", 0, progress=False)
    assert "built from a different definition of scenario swap" in str(info.value)
    partition_scenario(spec, "swap")  # rebuilt because the definition changed
    assert train_run(spec, "swap", "fedavg", 0, progress=False).summary["clients"] == 6


def test_partition_tables_from_another_scenario_are_refused(tmp_path):
    import shutil

    from cflpipe.errors import PartitionError
    from cflpipe.fl.data import partition_scenario

    data = tiny_spec(tmp_path)
    data["scenarios"]["other"] = {**data["scenarios"]["swap"], "seed": 1}
    spec = parse_spec(data)
    ours, theirs = partition_scenario(spec, "swap"), partition_scenario(spec, "other")
    shutil.copy(theirs / "clients.parquet", ours / "clients.parquet")  # valid, but another scenario's
    with pytest.raises(PartitionError) as info:
        train_run(spec, "swap", "fedavg", 0, progress=False)
    assert str(info.value) == (f"{ours / 'clients.parquet'}: does not match partition.sha256 (replaced or altered "
                               f"after it was written); run `cflpipe partition --config FILE --scenario swap` again")
    assert not (spec.run_dir("swap", "fedavg", 0) / "summary.json").exists()
    assert partition_scenario(spec, "swap", force=False) == ours  # the skip check notices too: rebuilt
    assert train_run(spec, "swap", "fedavg", 0, progress=False).summary["clients"] == 8


def test_sampling_changes_every_round_and_follows_the_seed(tmp_path):

    spec = parse_spec(tiny_spec(tmp_path, rounds=40, clients_per_round=3))
    seed0, seed1 = (prepare_run(spec, "swap", "fedavg", seed) for seed in (0, 1))
    draws = [seed0.sample(r) for r in range(40)]
    for sampled in draws:
        assert len(sampled) == 3 and len(set(sampled.tolist())) == 3 and list(sampled) == sorted(sampled)
        assert 0 <= sampled.min() and sampled.max() < 8
    # a new draw every round, repeated for the same seed and round, other draws for another seed
    assert len({tuple(s) for s in draws}) > 20
    assert all((seed0.sample(r) == draws[r]).all() for r in range(40))
    assert sum((seed1.sample(r) == draws[r]).all() for r in range(40)) < 10
    # uniform without replacement: every client is drawn 40 · 3/8 = 15 times in expectation
    counts = np.bincount(np.concatenate(draws), minlength=8)
    assert counts.sum() == 120 and counts.min() >= 5 and counts.max() <= 25


def test_a_rounds_uploads_are_freed_before_the_next_round_trains(tmp_path, monkeypatch):
    """At 2,000 clients one round's uploads are 442 MB: the engine must not carry them (nor
    the last update, through a loop variable) into the next round's training (#17). A method
    that reads the updates themselves (here FedAvg told not to stream its means)."""
    from cflpipe.methods.fedavg import FedAvg

    spec = parse_spec(tiny_spec(tmp_path))
    seen = {"aggregates": 0, "checked": 0}
    previous: list[weakref.ref] = []
    aggregate, round_start = FedAvg.aggregate, FedAvg.round_start

    def watched_aggregate(self, updates):
        aggregate(self, updates)
        previous[:] = [weakref.ref(update.tensors["model"]) for update in updates.values()]
        seen["aggregates"] += 1

    def watched_round_start(self, sampled):
        if previous:
            assert all(ref() is None for ref in previous)
            seen["checked"] += 1
        round_start(self, sampled)

    monkeypatch.setattr(engine, "streams_means", lambda cls: False)
    monkeypatch.setattr(FedAvg, "aggregate", watched_aggregate)
    monkeypatch.setattr(FedAvg, "round_start", watched_round_start)
    train_run(spec, "swap", "fedavg", 0, progress=False)
    assert seen == {"aggregates": 6, "checked": 5}


def test_streamed_means_hold_no_upload_while_the_next_client_trains(tmp_path, monkeypatch):
    """FedAvg's weighted mean is summed as clients finish (#32 item 8): with the sequential
    trainer, every upload already summed is freed before the next client trains."""
    from cflpipe.fl import method as method_module
    from cflpipe.fl.trainers import SequentialTrainer

    spec = parse_spec(tiny_spec(tmp_path, trainer="sequential"))
    summed: list[weakref.ref] = []
    seen = {"added": 0, "checked": 0}
    add, one = method_module.WeightedSum.add, SequentialTrainer.one

    def watched_add(self, vector, weight):
        add(self, vector, weight)
        summed.append(weakref.ref(vector))
        seen["added"] += 1

    def watched_one(self, spaces, item):
        assert all(ref() is None for ref in summed)
        seen["checked"] += len(summed) > 0
        return one(self, spaces, item)

    monkeypatch.setattr(method_module.WeightedSum, "add", watched_add)
    monkeypatch.setattr(SequentialTrainer, "one", watched_one)
    train_run(spec, "swap", "fedavg", 0, progress=False)
    assert seen["added"] == 6 * 4 and seen["checked"] == 6 * 4 - 1


def test_streamed_means_give_the_bits_of_the_held_updates(tmp_path, monkeypatch):
    """The same sums in the same order, held or streamed: the same run to the bit (one
    arithmetic against itself, so exact)."""
    from cflpipe.methods.fedavg import FedAvg

    outputs = {}
    for streamed in (True, False):
        with monkeypatch.context() as patch:
            if not streamed:
                patch.setattr(engine, "streams_means", lambda cls: False)
            assert engine.streams_means(FedAvg) is streamed
            spec = parse_spec(tiny_spec(tmp_path / str(streamed), rounds=4))
            run = train_run(spec, "swap", "fedavg", 0, progress=False).run_dir
            outputs[streamed] = {name: (run / name).read_bytes() for name in ("metrics.parquet", "clusters.parquet")}
    assert outputs[True] == outputs[False]


def test_a_method_that_overrides_aggregate_is_not_streamed():
    from cflpipe.fl.method import streams_means
    from cflpipe.methods.fedavg import FedAvg
    from cflpipe.methods.fedprox import FedProx

    class Reads(FedAvg):
        def aggregate(self, updates):
            super().aggregate(updates)

    class Momentum(FedAvg):  # only the means' use changes: streamed, and the held path agrees
        def aggregate_means(self, means):
            super().aggregate_means({"model": 2 * means["model"]})

    class ReadsAfter(Momentum):
        def aggregate(self, updates):
            super().aggregate(updates)

    class LoggedReads(Reads):  # Reads' aggregate must still run: held
        def aggregate_means(self, means):
            super().aggregate_means(means)

    class Declares(Reads):  # declared again below its aggregate: its author says it is means only
        streamed_means = ("model",)

    assert streams_means(FedAvg) and streams_means(FedProx) and streams_means(Momentum)
    assert not streams_means(Reads) and not streams_means(ReadsAfter)
    assert not streams_means(LoggedReads) and streams_means(Declares)


@pytest.mark.parametrize("hook", ["receive", "streams_means", "clustering_starts", "premises"])
@pytest.mark.parametrize("in_mixin", [False, True])
def test_a_class_that_defines_a_hook_moved_out_of_the_method_is_refused(hook, in_mixin):
    """Each would be silently ignored: the engine receives, the registration states the rest."""
    from cflpipe.methods.fedavg import FedAvg

    own = {hook: lambda self, *args: None}
    bases = (type("Mixin", (), own), FedAvg) if in_mixin else (FedAvg,)
    with pytest.raises(TypeError, match=f"defines {hook}\\(\\), which is no longer a method hook"):
        type("Old", bases, {} if in_mixin else own)


def test_stacking_updates_frees_each_clients_own_copy():
    from cflpipe.fl.local import LocalResult
    from cflpipe.fl.method import Update, stack_updates

    vectors = torch.randn(5, 100)
    updates = {c: Update({"model": vectors[c].clone()}, c + 1, LocalResult(0.0, 1, 1)) for c in range(5)}
    own = [weakref.ref(update.tensors["model"]) for update in updates.values()]
    clients, stacked, weights = stack_updates(updates)
    assert clients.tolist() == [0, 1, 2, 3, 4] and weights.tolist() == [1, 2, 3, 4, 5]
    assert torch.equal(stacked, vectors)
    assert all(ref() is None for ref in own)  # the matrix's rows replaced them
    assert all(updates[c].tensors["model"].data_ptr() == stacked[c].data_ptr() for c in range(5))
    updates[3].tensors["model"] = torch.zeros(1)  # torch.stack refused what a row would broadcast
    with pytest.raises(ValueError, match=r"client 3's 'model' is \(1,\) torch.float32, client 0's \(100,\)"):
        stack_updates(updates)


@pytest.mark.parametrize("clients,size", [(1, 10), (7, 1000), (25, 55_210), (300, 20_001)])
def test_the_running_weighted_mean_equals_the_stacked_product(clients, size):
    from cflpipe.fl.local import LocalResult
    from cflpipe.fl.method import Update, average_updates

    generator = torch.Generator().manual_seed(clients)
    vectors = torch.randn(clients, size, generator=generator) * 0.1 + 0.5  # a shared part, as models
    sizes = torch.randint(1, 500, (clients,), generator=generator)
    updates = {3 * c + 1: Update({"model": vectors[c].clone()}, int(sizes[c]), LocalResult(0.0, 1, 1))
               for c in range(clients)}
    stacked = weighted_average(vectors, sizes.to(vectors.dtype))
    # Two different reductions (a float64 running sum, a float32 product whose order the kernel
    # picks): they agree to float rounding, not to the bit. A wrong weight or a missed client is
    # off by far more than this tolerance; in float64 the running sum is the exact mean rounded.
    mean = average_updates(updates)
    assert mean.dtype == torch.float32
    torch.testing.assert_close(mean, stacked, rtol=1e-6, atol=1e-7)
    exact = (sizes.double() @ vectors.double()) / sizes.double().sum()
    if clients == 1:
        assert torch.equal(mean, vectors[0])
    else:
        torch.testing.assert_close(mean.double(), exact, rtol=1e-7, atol=1e-9)


def test_a_running_weighted_sum_refuses_a_vector_of_another_shape_or_dtype():
    from cflpipe.fl.method import WeightedSum

    total = WeightedSum()
    with pytest.raises(ValueError, match="nothing was added"):
        total.mean()
    total.add(torch.ones(3), 2)
    total.add(torch.full((3,), 4.0), 1)
    assert torch.equal(total.mean(), torch.full((3,), 2.0))
    for wrong in (torch.ones(4), torch.ones(3, dtype=torch.float64)):
        with pytest.raises(ValueError, match="added to a sum of"):
            total.add(wrong, 1)


# ---------------------------------------------------------------------------- engine units


class _Asking:
    """FedAvg's client side answering a question: the model it is sent trained at the payload's
    learning rate, and sent back; a client's payload names what it already holds."""

    @classmethod
    def query_plan(cls, view, payload):
        from cflpipe.fl.plan import ClientPlan

        return ClientPlan(payload.tensors["model"], lr=payload.meta.get("lr"), momentum=0.0), None

    @classmethod
    def query(cls, view, payload, trained, scratch):
        return view.update({"model": trained.vector}, trained, keep={"asked": torch.ones(1)})


def test_asked_clients_count_their_traffic_keep_what_they_keep_and_follow_on_divergence(tmp_path, monkeypatch):
    from cflpipe.fl.method import Payload
    from cflpipe.methods.fedavg import FedAvg

    monkeypatch.setattr(FedAvg, "query_plan", _Asking.query_plan)
    monkeypatch.setattr(FedAvg, "query", _Asking.query)
    for policy in ("skip", "stop"):
        run = prepare_run(parse_spec(tiny_spec(tmp_path / policy, on_divergence=policy)), "swap", "fedavg", 0)
        run.setup()
        ctx, start = run.ctx, run.ctx.init
        ctx.clients.add("asked", torch.zeros(1))
        payloads = {0: Payload({"model": start}), 1: Payload({"model": start}, {"lr": 1e12}),
                    2: Payload({"model": start}), 3: Payload({"model": start}, held=("model",))}
        if policy == "stop":
            with pytest.raises(DivergenceError, match="client 1"):
                ctx.ask(payloads)
            continue
        answers = ctx.ask(payloads)
        assert sorted(answers) == [0, 2, 3]  # the diverged client is left out, the ones after it kept
        size = start.numel() * start.element_size()
        # down: every payload but what client 3 holds; up: the three answers
        assert (ctx.extra_bytes_down, ctx.extra_bytes_up) == (3 * size, 3 * size)
        assert ctx.clients["asked"][:, 0].tolist() == [1, 0, 1, 1, 0, 0, 0, 0]


def test_predictor_shapes_index_each_client_into_their_models():
    from cflpipe.fl.predictors import Mixture, Models

    one, two = torch.zeros(3), torch.ones(3)
    shared = Models.shared(one, 4)
    assert shared.models == [one] and shared.index.tolist() == [0, 0, 0, 0]
    own = Models.own(torch.stack([one, two]))
    assert own.index.tolist() == [0, 1] and torch.equal(own.models[1], two)
    mixture = Mixture([one, two], np.array([[0.7, 0.3], [0.2, 0.8], [0.5, 0.5]]))
    assert mixture.index.tolist() == [0, 1, 0]  # the largest weight; a tie to the first

def test_client_state_tables_keep_their_registered_shape(tmp_path):
    from cflpipe.fl.method import ClientStore

    store = ClientStore(4, torch.device("cpu"))
    table = store.add("personal", torch.zeros(3))
    store["personal"] = table + 1
    assert torch.equal(store["personal"], torch.ones(4, 3))
    with pytest.raises(KeyError, match="keep its shape"):
        store["personal"] = torch.zeros(4, 2)
    with pytest.raises(KeyError, match="register it with add"):
        store["other"] = torch.zeros(4, 3)


def test_evaluations_checkpoints_and_timing_follow_the_schedule(tmp_path, monkeypatch):
    from cflpipe.fl import engine

    saved = []
    save_state = engine.Run.save_state
    monkeypatch.setattr(engine.Run, "save_state", lambda self, r: (saved.append(r), save_state(self, r)))
    spec = parse_spec(tiny_spec(tmp_path, rounds=7, eval_every=3, checkpoint_every=4))
    train_run(spec, "swap", "fedavg", 0, progress=False)
    run_dir = spec.run_dir("swap", "fedavg", 0)
    rounds = pd.read_parquet(run_dir / "rounds.parquet")
    assert rounds["round"].tolist() == list(range(1, 8))
    assert rounds.dropna(subset=["acc_macro"])["round"].tolist() == [3, 6, 7]  # and always the last
    assert saved == [4, 7]
    timing = pd.read_parquet(run_dir / "timing.parquet")
    assert list(timing.columns) == ["round", "seconds", "train_seconds", "server_seconds", "eval_seconds", "warmup"]
    assert timing["warmup"].sum() <= 2  # at most the process's first round and first evaluation
    assert timing["round"].tolist() == list(range(1, 8))
    parts = timing[["train_seconds", "server_seconds", "eval_seconds"]]
    assert (parts.to_numpy() >= 0).all() and (timing["train_seconds"] > 0).all()
    assert np.allclose(timing["seconds"], parts.sum(axis=1), rtol=1e-9, atol=1e-9)  # the round's three parts


def test_only_the_first_round_and_evaluation_of_the_process_count_as_warm_up(tmp_path, monkeypatch):
    """The first round a process trains and the round of its first evaluation are marked `warmup`
    and left out of the per-round means (reported apart); the next run of the same process, the
    job's second, has none."""
    monkeypatch.setattr(engine, "_process_warm", False)
    monkeypatch.setattr(engine, "_process_evaluated", False)
    # a named trainer: auto's first meeting with FedProx's plans (another shape) would be a warm-up too
    spec = parse_spec(tiny_spec(tmp_path, rounds=3, eval_every=2, trainer="sequential"))
    first = train_run(spec, "swap", "fedavg", 0, progress=False).run_dir
    second = train_run(spec, "swap", "fedprox", 0, progress=False).run_dir
    timing = pd.read_parquet(first / "timing.parquet")
    assert timing["warmup"].tolist() == [True, True, False]  # round 2: the first evaluation
    summary = json.loads((first / "timing.json").read_text())
    assert summary["seconds_per_round"] == pytest.approx(timing["seconds"].iloc[2:].mean())
    assert summary["warmup_round_seconds"] == pytest.approx(timing["seconds"].iloc[:2].sum())
    assert not pd.read_parquet(second / "timing.parquet")["warmup"].any()
    assert json.loads((second / "timing.json").read_text())["warmup_round_seconds"] == 0.0


def test_traffic_of_a_methods_questions_is_added_to_the_rounds_bytes(tmp_path, monkeypatch):
    from cflpipe.fl.method import Payload
    from cflpipe.methods.fedavg import FedAvg

    round_start = FedAvg.round_start

    def asking(self, sampled):
        # e.g. a model sent to and trained by a client not sampled (not counted: what it holds)
        self.ctx.ask({7: Payload({"model": self.ctx.init, "extra": torch.zeros(25)}, held=("model",))})
        round_start(self, sampled)

    monkeypatch.setattr(FedAvg, "round_start", asking)
    monkeypatch.setattr(FedAvg, "query", classmethod(lambda cls, view, payload, trained, scratch:
                                                     view.answer({"one": torch.zeros(1)}, seen=True)))
    spec = parse_spec(tiny_spec(tmp_path))
    summary = train_run(spec, "swap", "fedavg", 0, progress=False).summary
    size = sum(p.numel() for p in build_model("mlp", (1, 8, 8), 10).parameters()) * 4
    rounds = pd.read_parquet(spec.run_dir("swap", "fedavg", 0) / "rounds.parquet")
    assert (rounds["bytes_down"] == 4 * size + 100).all() and (rounds["bytes_up"] == 4 * size + 4).all()
    assert (summary["bytes_down_total"], summary["bytes_up_total"]) == (6 * (4 * size + 100), 6 * (4 * size + 4))


def test_the_summary_names_the_run(tmp_path):
    spec = parse_spec(tiny_spec(tmp_path))
    summary = train_run(spec, "swap", "fedprox", 1, progress=False).summary
    assert list(summary) == ["scenario", "method", "method_type", "seed", "rounds", "clients", "final",
                             "best_test_acc_macro", "best_round", "best_selected_on", "bytes_down_total",
                             "bytes_up_total", "degenerate", "degenerate_kind", "provenance"]
    assert (summary["scenario"], summary["method"], summary["method_type"], summary["seed"], summary["rounds"],
            summary["clients"]) == ("swap", "fedprox", "fedprox", 1, 6, 8)
    rounds = pd.read_parquet(spec.run_dir("swap", "fedprox", 1) / "rounds.parquet")
    assert summary["best_test_acc_macro"] == rounds["acc_macro"].max()  # no validation split: chosen on test
    assert rounds["round"].dtype == "Int64" and rounds["acc_macro"].dtype == "float64"
    run_dir = spec.run_dir("swap", "fedprox", 1)
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    timing = json.loads((run_dir / "timing.json").read_text())
    seconds = pd.read_parquet(run_dir / "timing.parquet")
    assert {"seconds_total", "seconds_per_round", "server_seconds_per_round", "warmup_round_seconds", "device",
            "trainer", "plans_trained", "auto_choices", "finished_utc", "git_commit", "git_dirty",
            "spec_sha256"} == set(timing)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", timing["finished_utc"])
    assert timing["seconds_total"] == pytest.approx(seconds["seconds"].sum())
    # per-round figures leave out the process's first round (its warm-up), reported apart
    steady = seconds[~seconds["warmup"]]
    assert timing["warmup_round_seconds"] == pytest.approx(seconds.loc[seconds["warmup"], "seconds"].sum())
    assert timing["seconds_per_round"] == pytest.approx(steady["seconds"].mean())
    assert timing["server_seconds_per_round"] == pytest.approx(steady["server_seconds"].mean())
    (choice,) = timing["auto_choices"].values()  # auto on a CPU: the trainer measured faster for the plans
    assert (timing["device"], timing["trainer"]) == ("cpu", "auto") and choice["by"] in ("measured", "cached")
    assert timing["plans_trained"][choice["trainer"]] == 24 and sum(timing["plans_trained"].values()) == 24
    plots = pd.read_csv(run_dir / "plots.csv")
    assert list(plots.columns[:3]) == ["round", "acc_macro", "acc_micro"] and plots["round"].tolist() == [2, 4, 6]
    assert plots["acc_macro"].tolist() == [float(f"{v:.6g}") for v in rounds.dropna(subset=["acc_macro"])["acc_macro"]]
    # the run's identity leaves out the thread count and where the data lives
    from cflpipe.fl.runs import run_provenance

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    same = run_provenance({**config, "threads": 7, "data_dir": "/elsewhere"}, spec.training)
    assert same["config_sha256"] == summary["provenance"]["config_sha256"]
    assert run_provenance({**config, "seed": 2}, spec.training)["config_sha256"] != same["config_sha256"]


def zero_bias_to(ctx, label: int) -> torch.Tensor:
    """A model of the run's shape whose weights are zero and whose last bias favours `label`."""
    vector = torch.zeros_like(ctx.init)
    vector[-10 + label] = 1.0  # the mlp's decision layer ends the vector: its 10 biases
    return vector


def test_a_method_that_picks_its_model_by_the_data_is_evaluated_with_its_choice(tmp_path, monkeypatch):
    """MCFL's evaluation: each client's test set (and each group's pooled one) is classified by the
    model the method selects for those inputs."""
    from cflpipe.methods.fedavg import FedAvg

    from cflpipe.fl.predictors import Selected

    chosen_for = {}

    def select(x):
        choice = int(float(x.mean()) > threshold)
        chosen_for[round(float(x.mean()), 6)] = choice
        return choice

    monkeypatch.setattr(FedAvg, "predictor",  # model 1 predicts class 0 for every input
                        lambda self, clients=None: Selected([self.global_model, zero_bias_to(self.ctx, 0)],
                                                            np.zeros(self.ctx.num_clients, np.int64), select))
    run = prepare_run(parse_spec(tiny_spec(tmp_path)), "swap", "fedavg", 0)
    run.setup()
    means = [float(run.data.test.of(c)[0].mean()) for c in range(8)]
    threshold = float(np.median(means))
    figures = run.evaluate(1)
    metrics = pd.DataFrame(dict(run.tables["metrics"]))
    test = metrics[metrics["split"] == "test"].sort_values("client")
    assert test["model"].tolist() == [int(m > threshold) for m in means]
    assert 0 < sum(test["model"]) < 8  # both models in use
    for client in np.flatnonzero(test["model"].to_numpy() == 1):  # classified by the chosen model
        y = run.data.test.of(int(client))[1]
        assert test.loc[client, "acc"] == pytest.approx(float((y == 0).double().mean()))
    groups = run.data.groups
    test_groups = groups[run.data.test.owner.numpy()]
    for h in range(run.data.num_groups):  # each group's pooled inputs were offered to the method
        pooled = run.data.test.x[torch.from_numpy(test_groups == h)]
        assert round(float(pooled.mean()), 6) in chosen_for
    assert np.isfinite(figures["intra_acc"]) and np.isfinite(figures["inter_acc"])


def test_more_models_than_max_global_models_scores_a_seeded_sample(tmp_path, monkeypatch):
    from cflpipe.fl import evaluation

    monkeypatch.setattr(evaluation, "MAX_GLOBAL_MODELS", 3)

    def global_scores(attempt: int, round_number: int) -> tuple[float, float]:
        run = prepare_run(parse_spec(tiny_spec(tmp_path / str(attempt))), "swap", "local", 0)
        run.setup()
        init = run.ctx.init
        run.ctx.clients["model"] = init * (1 + torch.arange(8, dtype=init.dtype)[:, None])  # 8 different models
        figures = run.evaluate(round_number)
        assert figures["models"] == 8 and figures["global_models"] == 3
        return figures["global_acc_mean"], figures["global_acc_std"]

    first = global_scores(0, 1)
    assert global_scores(1, 1) == first  # the sample follows the seed and the round
    assert any(global_scores(2, r) != first for r in (2, 3, 4))  # another round, another sample
    monkeypatch.setattr(evaluation, "MAX_GLOBAL_MODELS", 8)
    run = prepare_run(parse_spec(tiny_spec(tmp_path / "all")), "swap", "local", 0)
    run.setup()
    assert run.evaluate(1)["global_models"] == 8  # 8 models are not more than 8: all scored


def test_images_are_standardized_per_channel_and_vectors_left_alone(tmp_path):
    from cflpipe.fl.data import build_federated_data

    # three channels on very different scales: each is brought to mean 0 and std 1 on its own
    rng = np.random.default_rng(0)
    scale = np.array([1.0, 10.0, 100.0], dtype=np.float32)[None, :, None, None]
    x_train = (rng.random((60, 3, 4, 4), dtype=np.float32) + 2) * scale
    np.savez(tmp_path / "rgb.npz", x_train=x_train, y_train=np.arange(60) % 3,
             x_test=(rng.random((12, 3, 4, 4), dtype=np.float32) + 2) * scale, y_test=np.arange(12) % 3)
    spec = parse_spec({**tiny_spec(tmp_path / "r"), "methods": {"fedavg": {}}, "scenarios": {"s": {
        "dataset": {"name": "files", "path": str(tmp_path / "rgb.npz")}, "clients": 4,
        "partition": [{"kind": "iid"}]}}})
    data = build_federated_data(spec, "s", torch.device("cpu"))
    # by x_train's statistics, so the clients' samples (drawn from the pool) come close; unscaled,
    # channel 3 would have mean 250 and std 29
    pooled = torch.cat([data.train.x, data.test.x]).double()
    assert torch.allclose(pooled.mean(dim=(0, 2, 3)), torch.zeros(3, dtype=torch.float64), atol=0.1)
    assert torch.allclose(pooled.std(dim=(0, 2, 3)), torch.ones(3, dtype=torch.float64), atol=0.1)
    vectors = parse_spec({**tiny_spec(tmp_path / "v"), "methods": {"fedavg": {}}, "scenarios": {"s": {
        "dataset": {"name": "synthetic", "devices": 4}, "clients": 4, "partition": [{"kind": "natural"}]}}})
    data = build_federated_data(vectors, "s", torch.device("cpu"))
    from cflpipe.data import load_dataset

    raw = load_dataset("synthetic", {"devices": 4}, vectors.data_dir)
    assert torch.equal(torch.sort(torch.cat([data.train.x, data.test.x]).flatten())[0],
                       torch.sort(torch.from_numpy(np.concatenate([raw.x_train, raw.x_test]).astype(np.float32)
                                                   ).flatten())[0])


def test_evaluation_figures_equal_a_computation_by_hand(tmp_path):
    """Per-client accuracy with each client's own model, its macro mean, and every model's
    accuracy on the pooled test data, recomputed from the final models outside the engine."""
    spec = parse_spec({
        "seeds": [0],
        "training": {"model": "mlp", "rounds": 2, "clients_per_round": 4, "local_steps": 3, "batch_size": 16,
                     "lr": 0.05, "eval_every": 2, "device": "cpu"},
        "scenarios": {"s": {"dataset": "digits", "clients": 4,
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": {"local": {}},
        "results_dir": str(tmp_path),
    })
    run = prepare_run(spec, "s", "local", 0)
    run.execute(resume=False, progress=False)
    predictor = run.method.predictor()
    models, index = predictor.models, predictor.index
    test = run.data.test

    def predictions(vector, x):
        run.space.load(vector)
        run.space.model.eval()
        with torch.no_grad():
            return run.space.model(x).argmax(1)

    own = [float((predictions(models[index[c]], test.of(c)[0]) == test.of(c)[1]).double().mean()) for c in range(4)]
    pooled = [float((predictions(vector, test.x) == test.y).double().mean()) for vector in models]
    assert len(set(own)) > 1  # the clients' models differ
    metrics = pd.read_parquet(run.run_dir / "metrics.parquet")
    final = metrics[(metrics["round"] == 2) & (metrics["split"] == "test")].sort_values("client")
    # The engine predicts in chunks of eval_batch_size, this reference in one batch: the logits
    # may differ in the last bit between the two, so an exact near-tie could flip one sample.
    one = 1 / min(len(test.of(c)[1]) for c in range(4))
    np.testing.assert_allclose(final["acc"], own, rtol=0, atol=one)
    rounds = pd.read_parquet(run.run_dir / "rounds.parquet").iloc[-1]
    assert rounds["acc_macro"] == pytest.approx(np.mean(own), abs=one)
    assert rounds["global_acc_mean"] == pytest.approx(np.mean(pooled), abs=1 / len(test.y))
    assert rounds["global_acc_std"] == pytest.approx(np.std(pooled), abs=2 / len(test.y))


def test_sampling_among_the_clients_that_train_draws_distinct_ones_each_round(tmp_path):
    # With LEAF's user-level split, held_out_check leaves only the clients with training samples
    # to sample from; the set is given directly here (as it would return it).
    run = prepare_run(parse_spec(tiny_spec(tmp_path, clients_per_round=4)), "swap", "fedavg", 0)
    run.training_clients = np.array([1, 2, 4, 6, 7])
    draws = [run.sample(r) for r in range(30)]
    for sampled in draws:
        assert len(sampled) == 4 and len(set(sampled.tolist())) == 4 and list(sampled) == sorted(sampled)
        assert set(sampled.tolist()) <= {1, 2, 4, 6, 7}  # the held-out clients never train
    assert len({tuple(s) for s in draws}) > 1


def test_prepare_run_builds_the_run_train_run_would_record(tmp_path):
    # Benchmarks and tests execute prepared runs: they must write the config, checkpoint and
    # run folder that train_run gives the same run (clean_runs looks for state/state.pt).
    spec = parse_spec(tiny_spec(tmp_path))
    run = prepare_run(spec, "swap", "fedprox", 1)
    from cflpipe.fl.runs import resolved_config

    assert run.config == resolved_config(spec, "swap", "fedprox", 1, threads=torch.get_num_threads())
    assert (run.config["seed"], run.config["threads"]) == (1, torch.get_num_threads())
    assert yaml.safe_load(run.config_text) == run.config
    assert run.run_dir == spec.run_dir("swap", "fedprox", 1) == tmp_path / "runs" / "swap" / "fedprox" / "seed1"
    assert run.state_path == run.run_dir / "state" / "state.pt"


def test_a_runs_config_records_the_digests_of_a_users_input_files(tmp_path):
    # A user's own file is hashed into the run's config: an edited file makes another run (a
    # finished run is not skipped), while built-in datasets record no digests at all.
    from cflpipe import store
    from cflpipe.fl.runs import resolved_config

    path = tmp_path / "mine.npz"
    np.savez(path, x_train=np.zeros((8, 4), np.float32), y_train=np.arange(8) % 2,
             x_test=np.zeros((4, 4), np.float32), y_test=np.arange(4) % 2)
    data = tiny_spec(tmp_path / "results")
    data["scenarios"]["mine"] = {"dataset": {"name": "files", "path": str(path)}, "clients": 4,
                                 "partition": [{"kind": "iid"}]}
    spec = parse_spec({**data, "methods": {"fedavg": {}}})
    assert resolved_config(spec, "mine", "fedavg", 0)["inputs_sha256"] == {str(path): store.sha256_of(path)}
    assert "inputs_sha256" not in resolved_config(spec, "swap", "fedavg", 0)


def test_a_runs_config_records_the_release_of_a_plugin_it_runs(tmp_path):
    # A new release of a plugin re-runs what it trained (tests/test_plugins.py checks it end to
    # end, through the CLI); this checks the config itself, fast.
    from importlib import metadata

    from cflpipe.fl.runs import resolved_config

    require_plugin()
    version = metadata.version("cflpipe-plugin-example")
    spec = parse_spec({**tiny_spec(tmp_path), "methods": {"fedavg": {}, "momentum": {"method": "fedavgm"}}})
    assert resolved_config(spec, "swap", "momentum", 0)["plugins"] == {"cflpipe-plugin-example": version}
    assert "plugins" not in resolved_config(spec, "swap", "fedavg", 0)


def test_a_run_fails_when_more_than_half_its_updates_were_skipped(tmp_path):
    run = prepare_run(parse_spec(tiny_spec(tmp_path, on_divergence="skip")), "swap", "fedavg", 0)
    run.tables["rounds"].update(sampled=[4, 4], skipped=[4, 0])
    run.check_trained()  # exactly half: the run trained
    run.tables["rounds"]["skipped"] = [4, 1]
    with pytest.raises(DivergenceError, match="5 of 8 client updates diverged"):
        run.check_trained()


def test_the_exploding_loss_warning_compares_with_ten_times_the_first_finite_loss(tmp_path, capsys):
    run = prepare_run(parse_spec(tiny_spec(tmp_path)), "swap", "fedavg", 0)
    run.tables["rounds"].update(round=[1, 2, 3], train_loss=[float("nan"), 2.0, 3.0])  # round 1: all skipped
    run.warn_if_exploding(20.0)  # 10 × 2.0, not beyond it
    assert capsys.readouterr().err == ""
    run.warn_if_exploding(20.5)
    run.warn_if_exploding(30.0)
    assert capsys.readouterr().err.count("is over 10× round 2's (2)") == 1


def test_summary_figures_that_are_nan_are_written_as_null():
    # summary.json is read as strict JSON (the report, jq): NaN is not JSON.
    from cflpipe.fl.outputs import _plain

    assert _plain(float("nan")) is None and _plain(np.float64("nan")) is None
    assert _plain(np.float32(0.5)) == 0.5 and _plain(np.int64(3)) == 3 and _plain(pd.NA) is None


def test_a_follow_up_trains_from_its_plans_result_unless_that_diverged(tmp_path):
    from cflpipe.fl.plan import ClientPlan

    run = prepare_run(parse_spec(tiny_spec(tmp_path)), "swap", "fedavg", 0)
    ctx, start = run.ctx, run.ctx.init
    given = []

    def follow_up(trained):
        given.append(trained)
        return ClientPlan(trained.vector, steps=1)

    out = ctx.run({0: ClientPlan(start, then=follow_up),
                   1: ClientPlan(start, lr=1e12, momentum=0.0, then=follow_up)})
    assert given == [out[0]]  # called with the plan's outcome, and not for the diverged plan
    assert out[1].diverged and out[1].then is None
    assert out[0].then is not None and not torch.equal(out[0].then.vector, out[0].vector)
    # the same training as a plan of its own from the first plan's result
    alone = ctx.run({0: ClientPlan(out[0].vector, steps=1)})[0]
    assert torch.equal(out[0].then.vector, alone.vector)


def test_an_update_whose_follow_up_diverged_is_a_diverged_update(tmp_path):
    from cflpipe.fl.local import LocalResult
    from cflpipe.fl.plan import Trained

    run = prepare_run(parse_spec(tiny_spec(tmp_path)), "swap", "fedavg", 0)
    vector = run.ctx.init
    fine, broken = LocalResult(0.5, 3, 48), LocalResult(float("nan"), 1, 16)
    view = run.ctx.view(2)
    update = view.update({"model": vector}, Trained(vector, fine, then=Trained(vector, broken)))
    assert update.result is broken and update.result.diverged  # the engine skips it
    update = view.update({"model": vector}, Trained(vector, fine, then=Trained(vector, LocalResult(0.2, 1, 16))))
    assert update.result is fine and update.n == int(run.ctx.train_sizes()[2])


def test_context_train_applies_its_mask_and_step_size(tmp_path):
    run = prepare_run(parse_spec(tiny_spec(tmp_path)), "swap", "fedavg", 0)
    ctx, start, space = run.ctx, run.ctx.init, run.space
    masked, _ = ctx.train(0, start, trainable=space.head)
    assert torch.equal(masked[space.body], start[space.body]) and not torch.equal(masked[space.head], start[space.head])
    still, _ = ctx.train(0, start, lr=0.0)
    assert torch.equal(still, start)


def test_the_learning_rate_decays_by_lr_decay_every_round(tmp_path):
    run = prepare_run(parse_spec(tiny_spec(tmp_path, lr=0.08, lr_decay=0.5)), "swap", "fedavg", 0)
    run.ctx.round = 3
    assert run.ctx.lr() == pytest.approx(0.08 * 0.5 ** 3)
