"""Personalized-FL baselines: FedPer, Ditto, Per-FedAvg (FO) and CGPFL.

Unit tests check each method's core step on hand-made tiny cases (a hand-built Context over a few
clients and a tiny model); the slow tests run the engine end to end: resume after an interruption
gives identical outputs, and on digits with Dirichlet(0.1) label skew the personalized methods
FedPer and Ditto beat FedAvg's personalized accuracy."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import nn

from cflpipe.fl import engine
from cflpipe.fl.checkpoint import read_state, write_state
from cflpipe.fl.data import FederatedData, SplitData
from cflpipe.fl.local import Anchor, FOMAMLStep, LocalResult, MoreauStep, batch_indices, sgd
from cflpipe.fl.method import Context, local_update, receive, Update
from cflpipe.seeds import mix_seed as _mix
from cflpipe.fl.params import ParamSpace
from cflpipe.registry import method_info
from cflpipe.methods.cgpfl_params import CGPFLParams
from cflpipe.methods.cgpfl import nearest
from cflpipe.models import LayeredModel, build_model
from cflpipe.spec import Training, parse_spec

torch.set_num_threads(1)

PERSONAL = ("fedper", "ditto", "perfedavg", "cgpfl")


# ---------------------------------------------------------------------------- tiny hand-made setups


class TwoLayer(LayeredModel):
    """body fc1 (4 → 5), head fc2 (5 → 3)."""

    def __init__(self):
        super().__init__((4,), 3)
        self.fc1 = nn.Linear(4, 5)
        self.fc2 = nn.Linear(5, 3)
        self.layers = ["fc1", "fc2"]

    def features(self, x):
        return torch.tanh(self.fc1(x))


class Softmax(LayeredModel):
    """Multinomial logistic regression: the head is the whole model."""

    def __init__(self, dim=3, classes=2):
        super().__init__((dim,), classes)
        self.fc = nn.Linear(dim, classes)
        self.layers = ["fc"]

    def features(self, x):
        return x


def _split(xs, ys) -> SplitData:
    sizes = [len(y) for y in ys]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return SplitData(torch.cat(xs), torch.cat(ys), offsets,
                     torch.from_numpy(np.repeat(np.arange(len(ys)), sizes)))


def make_method(name: str, hp: dict | None = None, model: LayeredModel | None = None, clients: int = 4,
                n: int = 12, seed: int = 0, **training):
    """A method on hand-made data: client c's labels are {c mod classes, (c+1) mod classes}."""
    torch.manual_seed(seed)
    model = model or TwoLayer()
    dim, classes = model.input_shape[0], model.num_classes
    g = torch.Generator().manual_seed(seed + 1)
    splits = {}
    for split in ("train", "test"):
        xs, ys = [], []
        for c in range(clients):
            y = torch.tensor([(c + i % 2) % classes for i in range(n)])
            xs.append(torch.randn(n, dim, generator=g) + y[:, None].float())
            ys.append(y)
        splits[split] = _split(xs, ys)
    data = FederatedData(splits["train"], splits["test"], np.full(clients, -1), classes, (dim,),
                         ["none"] * clients)
    space = ParamSpace(model)
    settings = Training(**{"local_steps": 3, "batch_size": 4, "lr": 0.1, "device": "cpu", **training})
    info = method_info(name)
    ctx = Context(data, space, settings, info.params(**(hp or {})), seed, space.read(), "tiny", name)
    return info.cls(ctx), ctx


def fake_update(vector_key: str, vector: torch.Tensor, n: int, **keep) -> Update:
    """An upload of `vector`; keyword tensors are what the client keeps (its head, its θ)."""
    return Update({vector_key: vector}, n, LocalResult(0.0, 1, 1), keep=keep)


def test_registered_with_described_hyperparameters():
    for name in PERSONAL:
        info = method_info(name)
        assert info.description, name
        for field, spec in info.params.model_fields.items():
            assert spec.description, f"{name}.{field} has no description"
            assert not spec.is_required(), f"{name}.{field} has no default"
        info.params()  # defaults validate


# ---------------------------------------------------------------------------- FedPer


def test_fedper_sends_only_the_body_both_ways():
    method, ctx = make_method("fedper")
    space = ctx.space
    assert not (space.body & space.head).any() and bool((space.body | space.head).all())
    payload = method.payload(1)
    assert payload.nbytes == space.nbytes(space.body) < space.nbytes()
    update = local_update(method, 1, payload)
    assert set(update.tensors) == {"body"}
    assert update.nbytes == space.nbytes(space.body)
    assert update.keep["head"].numel() == int(space.head.sum())


def test_fedper_local_training_starts_from_global_body_and_own_head():
    method, ctx = make_method("fedper", lr=1e-9)
    head = torch.randn(int(ctx.space.head.sum()))
    ctx.clients["head"][2] = head
    update = local_update(method, 2, method.payload(2))
    assert torch.allclose(update.keep["head"], head, atol=1e-6)
    assert torch.allclose(update.tensors["body"], ctx.init[ctx.space.body], atol=1e-6)


def test_fedper_averages_bodies_and_keeps_heads_personal():
    method, ctx = make_method("fedper")
    body, head = ctx.space.body, ctx.space.head
    b1, b2 = torch.randn(int(body.sum())), torch.randn(int(body.sum()))
    h1, h2 = torch.randn(int(head.sum())), torch.randn(int(head.sum()))
    receive(method, {0: fake_update("body", b1, 10, head=h1), 3: fake_update("body", b2, 30, head=h2)})
    assert torch.allclose(method.global_model[body], 0.25 * b1 + 0.75 * b2, atol=1e-6)
    evaluated = method.predictor()
    models, index = evaluated.models, evaluated.index
    assert np.array_equal(index, np.arange(4))
    stacked = torch.stack(models)
    assert torch.allclose(stacked[:, body], method.global_model[body].expand(4, -1))
    assert torch.equal(stacked[0, head], h1) and torch.equal(stacked[3, head], h2)
    for never_sampled in (1, 2):  # clients that never trained keep the initial head
        assert torch.equal(stacked[never_sampled, head], ctx.init[head])


# ---------------------------------------------------------------------------- Ditto


def test_ditto_lambda_zero_personal_model_is_local_training():
    method, ctx = make_method("ditto", {"lam": 0.0})
    start = ctx.init + 0.1 * torch.randn(ctx.init.shape, generator=torch.Generator().manual_seed(5))
    ctx.clients["personal"][1] = start
    ctx.round = 3
    update = local_update(method, 1, method.payload(1))
    expected, _ = ctx.train(1, start)  # plain local SGD from the personal model, same batches
    assert torch.equal(update.keep["personal"], expected)
    # The global part is FedAvg's local update, and the personal model is not sent.
    global_expected, _ = ctx.train(1, method.global_model)
    assert torch.equal(update.tensors["model"], global_expected)
    assert set(update.tensors) == {"model"} and update.nbytes == ctx.space.nbytes()
    receive(method, {1: update})
    assert torch.equal(ctx.clients.get("personal", 1), expected)
    evaluated = method.predictor()
    models, index = evaluated.models, evaluated.index
    assert torch.equal(models[index[1]], expected) and torch.equal(models[index[0]], ctx.init)


def test_ditto_large_lambda_keeps_personal_model_at_the_global_one():
    distances = {}
    for lam in (0.0, 1000.0):
        # lr·λ = 1: every step lands on w_global − lr·∇f, so the personal model hugs the global one.
        method, ctx = make_method("ditto", {"lam": lam}, lr=0.001)
        ctx.clients["personal"][0] = ctx.init + 1.0
        update = local_update(method, 0, method.payload(0))
        distances[lam] = float((update.keep["personal"] - method.global_model).norm())
    start_distance = float(torch.ones_like(ctx.init).norm())
    assert distances[0.0] > 0.9 * start_distance
    assert distances[1000.0] < 0.01 * start_distance


def test_ditto_personal_steps():
    method, ctx = make_method("ditto", {"personal_steps": 7})
    update = local_update(method, 0, method.payload(0))
    # λ = 1 (the default) pulls towards the received model, the initial model here.
    expected, result = ctx.train(0, ctx.init, [Anchor(ctx.init, 1.0)], steps=7)
    assert result.steps == 7 and torch.equal(update.keep["personal"], expected)
    assert update.result.steps == 3


# ---------------------------------------------------------------------------- Per-FedAvg


def _softmax_grad(weight, bias, x, y):
    """Closed-form gradient of the mean cross-entropy of softmax(x Wᵀ + b)."""
    p = torch.softmax(x @ weight.T + bias, dim=1)
    err = (p - F.one_hot(y, p.shape[1]).to(p)) / x.shape[0]
    return err.T @ x, err.sum(dim=0)


def test_perfedavg_fo_step_equals_hand_computation():
    torch.manual_seed(0)
    model = Softmax(3, 2)
    space = ParamSpace(model)
    w0, b0 = model.fc.weight.detach().clone().double(), model.fc.bias.detach().clone().double()
    x = torch.randn(6, 3)
    y = torch.tensor([0, 1, 1, 0, 1, 0])
    alpha, beta, steps, batch = 0.3, 0.2, 2, 2
    result = sgd(space, x, y, steps=steps, batch_size=batch, lr=beta, rule=FOMAMLStep(alpha),
                 generator=torch.Generator().manual_seed(11))
    order = batch_indices(6, batch, 2 * steps, torch.Generator().manual_seed(11)).view(steps, 2, batch)
    w, b, xd = w0, b0, x.double()
    for inner, outer in order:
        gw, gb = _softmax_grad(w, b, xd[inner], y[inner])
        w_adapted, b_adapted = w - alpha * gw, b - alpha * gb  # w̃ = w − α∇f(w; D)
        gw, gb = _softmax_grad(w_adapted, b_adapted, xd[outer], y[outer])
        w, b = w - beta * gw, b - beta * gb  # w ← w − β∇f(w̃; D')
    assert torch.allclose(model.fc.weight.double(), w, atol=1e-6)
    assert torch.allclose(model.fc.bias.double(), b, atol=1e-6)
    assert result.steps == steps and result.samples == 2 * steps * batch


def test_perfedavg_local_update_averaging_and_evaluation():
    method, ctx = make_method("perfedavg", {"alpha": 0.05, "beta": 0.2}, model=Softmax(4, 3))
    ctx.round = 2
    update = local_update(method, 1, method.payload(1))
    assert update.nbytes == ctx.space.nbytes() and set(update.tensors) == {"model"}
    # Same as the FO-MAML rule driven by the per-client generator of (seed, round, client).
    x, y = ctx.data.client(1, "train")
    ctx.space.load(ctx.init)
    sgd(ctx.space, x, y, steps=3, batch_size=4, lr=0.2, rule=FOMAMLStep(0.05),
        generator=torch.Generator().manual_seed(_mix(0, 2, 1)))
    assert torch.equal(update.tensors["model"], ctx.space.read())

    # The server averages uniformly (the paper's objective weights users equally).
    a, b = torch.randn(ctx.init.shape), torch.randn(ctx.init.shape)
    receive(method, {0: fake_update("model", a, 1), 2: fake_update("model", b, 100)})
    assert torch.allclose(method.global_model, (a + b) / 2, atol=1e-6)

    # Personalized model: one SGD step of size α from the global model on a training batch.
    evaluated = method.predictor()
    models, index = evaluated.models, evaluated.index
    assert np.array_equal(index, np.arange(4)) and len(models) == 4
    x, y = ctx.data.client(3, "train")
    batch = batch_indices(len(y), 4, 1, torch.Generator().manual_seed(_mix(0, 2, 3, 2)))[0]
    weight, bias = method.global_model[:12].view(3, 4), method.global_model[12:]
    gw, gb = _softmax_grad(weight, bias, x[batch], y[batch])
    expected = torch.cat([(weight - 0.05 * gw).flatten(), bias - 0.05 * gb])
    assert torch.allclose(models[3], expected, atol=1e-6)
    assert not torch.allclose(models[0], models[3])

    none, _ = make_method("perfedavg", {"eval_steps": 0})
    evaluated = none.predictor()
    models, index = evaluated.models, evaluated.index
    assert len(models) == 1 and not index.any()


# ---------------------------------------------------------------------------- CGPFL


def test_nearest_generalized_model():
    centers = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    vectors = torch.tensor([[1.0, 1.0], [9.0, -1.0], [-1.0, 8.0], [6.0, 0.0], [0.0, 4.0]])
    assert nearest(vectors, centers).tolist() == [0, 1, 2, 1, 0]


def test_cgpfl_aggregation_assigns_to_nearest_and_averages_members():
    method, ctx = make_method("cgpfl", {"clusters": 3}, clients=6)
    p = ctx.init.shape[0]
    base = torch.zeros(3, p)
    base[1, 0], base[2, 1] = 10.0, 10.0
    method.centers = base.clone()
    method.seeded[:] = True
    offsets = {0: (0, 1.0), 1: (1, 9.0), 2: (1, 11.0), 4: (0, -0.5)}  # client: (center, shift)
    updates = {}
    for client, (k, shift) in offsets.items():
        vector = base[k].clone()
        vector[2] = shift
        updates[client] = fake_update("model", vector, 1 + client, personal=vector + 100)
    receive(method, updates)
    assert method.assignment().tolist() == [0, 1, 1, 0, 0, 0]
    # Ω_0: clients 0 and 4 (weights 1 and 5); Ω_1: clients 1 and 2 (weights 2 and 3); Ω_2 untouched.
    assert method.centers[0, 2].item() == pytest.approx((1 * 1.0 + 5 * -0.5) / 6)
    assert method.centers[1, 2].item() == pytest.approx((2 * 9.0 + 3 * 11.0) / 5)
    assert torch.equal(method.centers[2], base[2])
    assert torch.equal(ctx.clients.get("personal", 1), updates[1].keep["personal"])
    assert torch.equal(ctx.clients.get("personal", 3), ctx.init)
    # Next round a sampled client receives the generalized model nearest to its last upload.
    method.centers[0], method.centers[2] = base[2], base[0]
    method.round_start(np.array([0, 4]))
    assert method.clusters[0] == 2 and torch.equal(method.payload(0).tensors["model"], base[0])


def test_cgpfl_server_step_beta():
    method, ctx = make_method("cgpfl", {"clusters": 1, "beta": 0.5})
    method.seeded[:] = True
    target = ctx.init + 2.0
    receive(method, {0: fake_update("model", target, 3, personal=target)})
    assert torch.allclose(method.centers[0], ctx.init + 1.0)


def test_cgpfl_seeds_generalized_models_from_first_uploads():
    method, ctx = make_method("cgpfl", {"clusters": 3}, clients=4)
    uploads = [ctx.init + shift for shift in (0.5, 3.0, -3.0, 3.1)]
    receive(method, {c: fake_update("model", v, 1, personal=v) for c, v in enumerate(uploads)})
    assert bool(method.seeded.all())
    seeds = {tuple(c.tolist()) for c in method.centers}
    assert len(seeds) == 3  # distinct seeds, then each moved to its members' mean
    again, _ = make_method("cgpfl", {"clusters": 3}, clients=4)
    again.aggregate({c: fake_update("model", v, 1, personal=v) for c, v in enumerate(uploads)})
    assert torch.equal(again.centers, method.centers)  # seeding draws from ctx.rng: reproducible


def test_cgpfl_bilevel_step_equals_hand_computation():
    torch.manual_seed(1)
    model = Softmax(3, 2)
    space = ParamSpace(model)
    x = torch.randn(5, 3)
    y = torch.tensor([1, 0, 1, 1, 0])
    local = torch.randn(space.size)
    personal = torch.randn(space.size)
    lam, plr, lr = 2.0, 0.1, 0.3
    space.load(personal)
    companions = {"local": local.clone()}
    result = sgd(space, x, y, steps=2, batch_size=5, lr=lr, rule=MoreauStep(lam, 2, plr), companions=companions,
                 generator=torch.Generator().manual_seed(0))
    theta, w_new = space.read(), companions["local"]
    w, t = local.double(), personal.double()
    for _ in range(2):  # full batch: every step sees all 5 samples
        for _ in range(2):
            gw, gb = _softmax_grad(t[:6].view(2, 3), t[6:], x.double(), y)
            t = t - plr * (torch.cat([gw.flatten(), gb]) + lam * (t - w))
        w = w - lr * lam * (w - t)
    assert torch.allclose(theta.double(), t, atol=1e-6)
    assert torch.allclose(w_new.double(), w, atol=1e-6)
    assert result.steps == 2


def test_cgpfl_uploads_local_model_and_keeps_personal():
    method, ctx = make_method("cgpfl")
    method.round_start(np.array([0, 1]))
    payload = method.payload(0)
    assert payload.nbytes == ctx.space.nbytes()
    update = local_update(method, 0, payload)
    assert set(update.tensors) == {"model"} and update.nbytes == ctx.space.nbytes()
    assert not torch.equal(update.keep["personal"], update.tensors["model"])
    receive(method, {0: update})
    evaluated = method.predictor()
    models, index = evaluated.models, evaluated.index
    assert torch.equal(models[index[0]], update.keep["personal"])


def test_cgpfl_rejects_an_inner_solver_that_cannot_converge():
    with pytest.raises(ValidationError, match="personal_lr"):
        CGPFLParams(lam=15, personal_lr=0.2)


# ---------------------------------------------------------------------------- state


@pytest.mark.parametrize("name", PERSONAL)
def test_state_dict_round_trip(name, tmp_path):
    method, ctx = make_method(name)
    method.round_start(np.array([0, 2]))
    updates = {c: local_update(method, c, method.payload(c)) for c in (0, 2)}
    receive(method, updates)
    path = tmp_path / "state.pt"
    write_state(path, {"method": method.state_dict(), "clients": ctx.clients.state_dict()})
    state, problem = read_state(path)
    assert problem is None, problem
    fresh, fresh_ctx = make_method(name)
    fresh.load_state_dict(state["method"])
    fresh_ctx.clients.load_state_dict(state["clients"])
    evaluated = method.predictor()
    a, ia = evaluated.models, evaluated.index
    evaluated = fresh.predictor()
    b, ib = evaluated.models, evaluated.index
    assert np.array_equal(ia, ib) and all(torch.equal(u, v) for u, v in zip(a, b))
    assert (method.assignment() is None) == (fresh.assignment() is None)
    if method.assignment() is not None:
        assert np.array_equal(method.assignment(), fresh.assignment())


# ---------------------------------------------------------------------------- end to end (slow)


def digits_spec(results: Path, seeds, rounds=30, eval_every=30, checkpoint_every=30, methods=None):
    return parse_spec({
        "seeds": list(seeds),
        "training": {"model": "cnn", "rounds": rounds, "clients_per_round": 10, "local_steps": 10,
                     "batch_size": 32, "lr": 0.05, "momentum": 0.9, "eval_every": eval_every,
                     "checkpoint_every": checkpoint_every, "device": "cpu"},
        "scenarios": {"dir01": {"dataset": "digits", "clients": 20,
                                "partition": [{"kind": "dirichlet", "alpha": 0.1, "min_size": 20}]}},
        "methods": methods or {"fedavg": {}, "fedper": {}, "ditto": {}},
        "results_dir": str(results),
        "data_dir": str(results / "data"),
    })


class Killed(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("name", PERSONAL)
def test_interrupted_run_resumes_to_identical_outputs(name, tmp_path, monkeypatch):
    methods = {name: {}}
    reference = digits_spec(tmp_path / "reference", [0], rounds=5, eval_every=2, checkpoint_every=2,
                            methods=methods)
    killed = digits_spec(tmp_path / "killed", [0], rounds=5, eval_every=2, checkpoint_every=2,
                         methods=methods)
    engine.train_run(reference, "dir01", name, 0, progress=False)

    save = engine.Run.save_state

    def save_then_die(self, round_number):
        save(self, round_number)
        if round_number == 2:
            raise Killed

    monkeypatch.setattr(engine.Run, "save_state", save_then_die)
    with pytest.raises(Killed):
        engine.train_run(killed, "dir01", name, 0, progress=False)
    monkeypatch.setattr(engine.Run, "save_state", save)
    run_dir = killed.run_dir("dir01", name, 0)
    assert not (run_dir / "summary.json").exists()
    engine.train_run(killed, "dir01", name, 0, progress=False)
    for file in ("metrics.parquet", "clusters.parquet", "rounds.parquet", "summary.json"):
        assert (run_dir / file).read_bytes() == (reference.run_dir("dir01", name, 0) / file).read_bytes(), file


@pytest.mark.slow
def test_fedper_and_ditto_beat_fedavg_on_label_skew(tmp_path):
    seeds = (0, 1, 2)
    spec = digits_spec(tmp_path, seeds)
    acc = {m: [engine.train_run(spec, "dir01", m, s, progress=False).summary["final"]["acc_macro"]
               for s in seeds] for m in ("fedavg", "fedper", "ditto")}
    for method in ("fedper", "ditto"):
        wins = sum(a > b for a, b in zip(acc[method], acc["fedavg"]))
        assert wins >= 2, acc
    # FedPer's traffic is the body only, in both directions, every round.
    summary = engine.train_run(spec, "dir01", "fedper", 0, progress=False).summary
    body = ParamSpace(build_model("cnn", (1, 8, 8), 10)).body
    per_round = 10 * int(body.sum()) * 4
    assert summary["bytes_up_total"] == summary["bytes_down_total"] == 30 * per_round


def test_perfedavg_fine_tuning_is_plain_sgd_whatever_the_training_momentum_and_decay():
    """Evaluation's eval_steps steps of size α take no momentum and no weight decay from the
    training settings (the paper's plain gradient steps)."""
    method, ctx = make_method("perfedavg", {"alpha": 0.05, "eval_steps": 2}, model=Softmax(4, 3),
                              momentum=0.9, weight_decay=0.1)
    ctx.round = 2
    method.global_model = ctx.init + 0.1 * torch.randn(ctx.init.shape, generator=torch.Generator().manual_seed(5))
    evaluated = method.predictor()
    models, _ = evaluated.models, evaluated.index
    x, y = ctx.data.client(3, "train")
    ctx.space.load(method.global_model)
    sgd(ctx.space, x, y, steps=2, batch_size=4, lr=0.05, generator=torch.Generator().manual_seed(_mix(0, 2, 3, 2)))
    assert torch.allclose(models[3], ctx.space.read(), atol=1e-6)


# ---------------------------------------------------------------------------- what each plan carries


def test_fedprox_plan_pulls_towards_the_received_global_model():
    method, ctx = make_method("fedprox", {"mu": 0.5})
    payload = method.payload(0)
    plan, _ = type(method).client_plan(ctx.view(0), payload)
    (anchor,) = plan.anchors
    assert torch.equal(anchor.vector, payload.tensors["model"]) and anchor.strength == 0.5


def test_perfedavg_alpha_null_adapts_with_the_training_lr():
    method, ctx = make_method("perfedavg", {"alpha": None, "beta": 0.2}, model=Softmax(4, 3))
    update = local_update(method, 1, method.payload(1))
    x, y = ctx.data.client(1, "train")
    ctx.space.load(ctx.init)
    sgd(ctx.space, x, y, steps=3, batch_size=4, lr=0.2, rule=FOMAMLStep(0.1),  # α = the run's lr, 0.1
        generator=torch.Generator().manual_seed(_mix(0, 0, 1)))
    assert torch.equal(update.tensors["model"], ctx.space.read())


def test_ditto_reports_a_diverged_personal_model():
    """The personal model's divergence must reach the engine's on_divergence rule even when the
    global part trained fine: λ = 10³⁰ makes every personal step overshoot."""
    method, ctx = make_method("ditto", {"lam": 1e30, "personal_steps": 5})
    ctx.clients["personal"][0] = ctx.init + 1.0
    update = local_update(method, 0, method.payload(0))
    assert torch.isfinite(update.tensors["model"]).all()
    assert update.result.diverged


def test_cgpfl_plan_trains_with_the_moreau_envelope_step():
    method, ctx = make_method("cgpfl", {"clusters": 2, "lam": 3.0, "inner_steps": 4, "personal_lr": 0.02})
    plan, _ = type(method).client_plan(ctx.view(0), method.payload(0))
    assert plan.rule == MoreauStep(3.0, 4, 0.02)


def test_cgpfl_seeds_every_generalized_model_from_nearby_uploads():
    # Squared distances between these uploads add up to far below 1: still distinct seeds.
    method, ctx = make_method("cgpfl", {"clusters": 3}, clients=4)
    uploads = [ctx.init + shift for shift in (0.001, 0.02, -0.02, 0.021)]
    receive(method, {c: fake_update("model", v, 1, personal=v) for c, v in enumerate(uploads)})
    assert bool(method.seeded.all())


def test_cgpfl_never_seeds_a_model_with_a_copy_of_a_seeded_one():
    """30 uploads of only two distinct models and K = 3: the third model waits (enough rows that
    a matrix-product distance would leave rounding noise where the distance is 0)."""
    method, ctx = make_method("cgpfl", {"clusters": 3}, clients=30)
    g = torch.Generator().manual_seed(3)
    two = ctx.init + 10.0 * torch.randn(2, ctx.init.shape[0], generator=g)
    receive(method, {c: fake_update("model", two[c % 2], 1, personal=two[c % 2]) for c in range(30)})
    assert int(method.seeded.sum()) == 2
