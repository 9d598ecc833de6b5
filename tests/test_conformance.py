"""One conformance suite for every registered method and variant (after scikit-learn's
check_estimator): a method that registers itself is checked here without being named.

- resume: interrupted right after a checkpoint at a seeded round, the run resumes to
  byte-identical outputs (the engine's real SIGKILL test is in test_engine.py; here the
  interruption is an exception raised after the atomic state write, which leaves the same files)
- determinism: same spec and seed give identical bytes
- evaluation does not change training: evaluating every round or only at the end gives the same
  final figures and the same training losses
- traffic: the client side (plan and finish) uses only what it was sent and what it keeps; the
  server's state is poisoned with NaN after the payload is made, so a client that read anything
  not counted as bytes down would train to NaN
- state: the method's checkpoint and the client store round-trip through the engine's checkpoint
  (torch.load with weights_only, every table in row blocks) into a fresh method that then
  evaluates identically
- K: a number of clusters larger than the clients is rejected in one line, for every method that
  has one
- trainers: batched training equals sequential within 1e-5 relative (methods that are batchable)
"""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from cflpipe.fl import checkpoint, engine
from cflpipe.fl.checkpoint import read_state, write_state
from cflpipe.fl.engine import OUTPUT_FILES, prepare_run, train_run
from cflpipe.methods import all_methods
from cflpipe.errors import SpecError
from cflpipe.spec import parse_spec

torch.set_num_threads(1)

METHODS = sorted(all_methods())
ROUNDS = 4
# config.yaml names the run's own directories; timing.* holds wall-clock times.
COMPARED = [f for f in OUTPUT_FILES if not f.startswith("timing") and f != "config.yaml"]

# Settings that make each mechanism act within a few rounds on 6 clients (cluster early, split
# early); keyed by the registered class so that variants inherit them.
EARLY = {
    "FLHC": {"cluster_round": 1, "clusters": 2},
    "CFL": {"warmup": 1, "eps1": 100.0, "eps2": 1e-6, "min_members": 2, "thresholds": "absolute"},
    "KMeansCFL": {"cluster_start": 1, "clusters": 2, "n_init": 2},
    "FedAC": {"cnt_start": 1, "components": 2},
    "IFCA": {"clusters": 2},
    "FeSEM": {"clusters": 2, "init_restarts": 2},
    "FedGroup": {"clusters": 2, "pretrain_scale": 2, "pretrain_steps": 2},
    "CGPFL": {"clusters": 2},
    "FCCA": {"clusters": 2, "flow_hidden": 8, "server_samples": 4},
    "FedTSDP": {"hopkins_threshold": 0.01, "dampening": 0.5, "public_batch": 8, "eps_js": 0.01, "eps_weights": 0.5,
                "radii": "absolute", "hopkins_min_samples": 1},
}


# Settings of one registered name only (its variants refuse them): IFCA's restarts, kept at the
# end of round 2 of 4, so resume, state and trainer checks cover the switch from two sets to one.
EARLY_NAMED = {"ifca": {"restarts": 2, "restart_rounds": 2}}


def hyperparams(name: str) -> dict:
    return {**EARLY.get(all_methods()[name].cls.__name__, {}), **EARLY_NAMED.get(name, {})}


def public_data(name: str) -> dict:
    """Server-held public samples for the methods that use them (FedTSDP); the others keep the
    scenario they were checked on before public data existed."""
    if not all_methods()[name].capabilities.needs_public:
        return {}
    return {"pool": "train", "public": {"size": 40}}


def spec_dict(results: Path, name: str, **training) -> dict:
    return {
        "seeds": [0],
        "training": {"model": "mlp", "rounds": ROUNDS, "clients_per_round": 3, "local_steps": 2, "batch_size": 8,
                     "lr": 0.05, "momentum": 0.5, "eval_every": 2, "checkpoint_every": 1, "device": "cpu",
                     **training},
        "scenarios": {"s": {"dataset": "digits", "clients": 6, **public_data(name),
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": {name: hyperparams(name)},
        "results_dir": str(results),
        "data_dir": str(results.parent / "data"),
    }


def finished(results: Path, name: str, **training) -> Path:
    spec = parse_spec(spec_dict(results, name, **training))
    train_run(spec, "s", name, 0, force=True, progress=False)
    return spec.run_dir("s", name, 0)


def same_bytes(a: Path, b: Path) -> None:
    # the standard outputs and a method's own tables (e.g. FCCA's similarity.parquet)
    extra = sorted({p.name for p in a.glob("*.parquet")} - set(OUTPUT_FILES))
    assert extra == sorted({p.name for p in b.glob("*.parquet")} - set(OUTPUT_FILES))
    for f in [*COMPARED, *extra]:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("conformance")
    return {name: finished(root / name / "reference", name) for name in METHODS}


class Killed(Exception):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_resume_after_interruption_is_byte_identical(name, reference_runs, tmp_path, monkeypatch):
    # Every table of two dimensions goes to row blocks (the reference kept them inside state.pt),
    # so the resumed state is what comes back through cflpipe/fl/checkpoint.py's blocks.
    monkeypatch.setattr(checkpoint, "MIN_ROWS_BYTES", 1)
    stop_after = int(np.random.default_rng(list(name.encode())).integers(1, ROUNDS))
    save = engine.Run.save_state

    def save_then_die(self, round_number):
        save(self, round_number)
        if round_number == stop_after:
            raise Killed

    spec = parse_spec(spec_dict(tmp_path, name))
    with monkeypatch.context() as patch:
        patch.setattr(engine.Run, "save_state", save_then_die)
        with pytest.raises(Killed):
            train_run(spec, "s", name, 0, progress=False)
    assert not (spec.run_dir("s", name, 0) / "summary.json").exists()
    train_run(spec, "s", name, 0, progress=False)
    same_bytes(reference_runs[name], spec.run_dir("s", name, 0))


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_outputs_come_back_from_the_last_checkpoint_alone(name, reference_runs, tmp_path, monkeypatch):
    """Stopped after its last checkpoint, which holds no models (training.keep_state: false), a
    run's outputs are rebuilt from that checkpoint's tables: a method's own tables included."""
    def die(self):
        raise Killed

    spec = parse_spec(spec_dict(tmp_path, name))
    with monkeypatch.context() as patch:
        patch.setattr(engine.Run, "write_outputs", die)
        with pytest.raises(Killed):
            train_run(spec, "s", name, 0, progress=False)
    run_dir = spec.run_dir("s", name, 0)
    assert read_state(run_dir / "state/state.pt")[0]["method"] is None
    train_run(spec, "s", name, 0, progress=False)
    same_bytes(reference_runs[name], run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_same_seed_gives_identical_bytes(name, reference_runs, tmp_path):
    same_bytes(reference_runs[name], finished(tmp_path, name))


@pytest.mark.slow
@pytest.mark.parametrize("name", METHODS)
def test_evaluating_more_often_does_not_change_training(name, reference_runs, tmp_path):
    every_round = finished(tmp_path, name, eval_every=1)
    ours = pd.read_parquet(every_round / "rounds.parquet")
    reference = pd.read_parquet(reference_runs[name] / "rounds.parquet")
    assert ours["train_loss"].tolist() == reference["train_loss"].tolist()
    last = reference.dropna(subset=["acc_macro"]).iloc[-1]
    assert ours.dropna(subset=["acc_macro"]).iloc[-1]["acc_macro"] == last["acc_macro"]
    ours_metrics = pd.read_parquet(every_round / "metrics.parquet")
    reference_metrics = pd.read_parquet(reference_runs[name] / "metrics.parquet")
    pd.testing.assert_frame_equal(ours_metrics[ours_metrics["round"] == ROUNDS].reset_index(drop=True),
                                  reference_metrics[reference_metrics["round"] == ROUNDS].reset_index(drop=True))
    assert json.loads((every_round / "summary.json").read_text())["final"] == \
        json.loads((reference_runs[name] / "summary.json").read_text())["final"]


def play(run, rounds: int, poison: bool = False) -> list[dict]:
    """Engine rounds without outputs, returning the method's round metrics; with `poison`, every
    server tensor the method checkpoints is NaN while the clients plan and finish (restored
    before aggregation)."""
    method, ctx = run.method, run.ctx
    reported = []
    for r in range(rounds):
        ctx.round = r
        sampled = run.sample(r)
        method.round_start(sampled)
        payloads = {int(c): method.payload(int(c)) for c in sampled}
        saved = {}
        if poison:
            for attr in method.checkpoint:
                value = getattr(method, attr)
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    saved[attr] = value
                    setattr(method, attr, torch.full_like(value, float("nan")))
        started = {c: method.start_client(c, payloads[c]) for c in payloads}
        trained = ctx.run({c: plans for c, (plans, _) in started.items()})
        updates = {c: method.end_client(c, payloads[c], trained[c], started[c][1]) for c in payloads}
        for attr, value in saved.items():
            setattr(method, attr, value)
        for c, update in updates.items():
            sent = [t for t in update.tensors.values() if t.is_floating_point()]
            kept = list(update.keep.values())
            assert all(torch.isfinite(t).all() for t in sent + kept), \
                f"client {c} of round {r + 1} used server state that was not in its payload"
            assert not update.result.diverged
        method.receive(updates)
        reported.append(method.round_metrics())
    return reported


@pytest.mark.parametrize("name", METHODS)
def test_clients_use_only_what_they_were_sent(name, tmp_path):
    run = prepare_run(parse_spec(spec_dict(tmp_path, name)), "s", name, 0)
    play(run, 3, poison=True)


def _assert_state_equal(a, b) -> None:
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        # NaN marks "not known yet" in some server tables (FCCA's similarity of unheard clients)
        assert torch.equal(a.cpu(), b.cpu()) or (a.is_floating_point() and torch.allclose(
            a.cpu(), b.cpu(), rtol=0, atol=0, equal_nan=True))
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for key in a:
            _assert_state_equal(a[key], b[key])
    else:
        assert a == b or (a != a and b != b)


@pytest.mark.parametrize("name", METHODS)
def test_state_round_trips(name, tmp_path, monkeypatch):
    # Every table of two dimensions goes to row blocks, two rows per block where rows are small.
    monkeypatch.setattr(checkpoint, "MIN_ROWS_BYTES", 1)
    monkeypatch.setattr(checkpoint, "BLOCK_BYTES", 2 * 4 * 1024)
    spec = parse_spec(spec_dict(tmp_path, name))
    run = prepare_run(spec, "s", name, 0)
    play(run, 3)
    path = tmp_path / "state.pt"
    write_state(path, {"method": run.method.state_dict(), "clients": run.ctx.clients.state_dict()})
    state, problem = read_state(path)
    assert problem is None, problem
    fresh = prepare_run(spec, "s", name, 0)
    fresh.method.load_state_dict(state["method"])
    fresh.ctx.clients.load_state_dict(state["clients"])
    fresh.ctx.round = run.ctx.round  # as the engine sets it before every round and evaluation
    _assert_state_equal(run.method.state_dict(), fresh.method.state_dict())
    _assert_state_equal(run.ctx.clients.state_dict(), fresh.ctx.clients.state_dict())
    (a, ia), (b, ib) = run.method.eval_models(), fresh.method.eval_models()
    assert np.array_equal(ia, ib) and all(torch.equal(u, v) for u, v in zip(a, b))


K_METHODS = [n for n in METHODS if all_methods()[n].capabilities.k_param]


@pytest.mark.parametrize("name", K_METHODS)
def test_more_clusters_than_clients_is_rejected_in_one_line(name, tmp_path):
    k_param = all_methods()[name].capabilities.k_param
    raw = spec_dict(tmp_path, name)
    raw["methods"][name][k_param] = 7
    with pytest.raises(SpecError) as error:
        parse_spec(raw)
    assert str(error.value) == f"methods.{name}.{k_param}: must be <= clients of scenario s (6), got 7"


BATCHABLE = [n for n in METHODS if all_methods()[n].capabilities.batchable]


PROCESS_TRAINER = "process_trainer:ProcessTrainer"  # tests/process_trainer.py


@pytest.mark.parametrize("other", ["batched", pytest.param(PROCESS_TRAINER, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", BATCHABLE)
def test_batched_trainer_equals_sequential(name, other, tmp_path):
    """The batched trainer, and a trainer that pickles every work item and trains it in another
    process (what a Ray or Dask trainer does), train what the sequential trainer trains."""
    from process_trainer import ProcessTrainer

    models = {}
    sent = ProcessTrainer.pickled_items
    for trainer in ("sequential", other):
        run = prepare_run(parse_spec(spec_dict(tmp_path / trainer.replace(":", "-"), name, trainer=trainer)),
                          "s", name, 0)
        play(run, 3)
        vectors, index = run.method.eval_models()
        models[trainer] = (torch.stack(vectors), index, run.method.assignment(), run.ctx.clients.state_dict())
        if trainer == "batched":
            assert run.trainer.counts["batched"] > 0
    if other == PROCESS_TRAINER:
        assert ProcessTrainer.pickled_items > sent
    (a, ia, ca, sa), (b, ib, cb, sb) = models["sequential"], models[other]
    assert np.array_equal(ia, ib)
    assert (ca is None) == (cb is None) and (ca is None or np.array_equal(ca, cb))
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())
    # what clients keep (personal models, heads, FCCA's cINNs) trained alike on both trainers
    assert set(sa) == set(sb)
    for name in sa:
        scale = max(float(sa[name].abs().max()), 1e-12)
        assert float((sa[name] - sb[name]).abs().max()) <= ADAM_TOLERANCE.get(name, 1e-5) * scale, name


# Client state trained with Adam (FCCA's cINN): Adam divides each entry's step by the running RMS
# of its gradient, so where an entry's gradients nearly cancel over the steps, last-bit differences
# between the two trainers' sums grow to about 1e-4 of the entry (0.06 % of the cINN's entries
# when measured); a wrong batch or client is off by the steps themselves (about 0.1).
ADAM_TOLERANCE = {"flow": 1e-3}


# --- every hyper-parameter has an effect ---------------------------------------------------------
# A hyper-parameter that silently loses its effect leaves every other check green, so each one is
# changed from the fixture's value and the trained state must change. The change is generic
# (flip a bool, another Literal choice, an int + 1, a float doubled, or halved at its upper
# bound); a new method's parameters are checked without being named here.

# Values where the generic change would not act within ROUNDS rounds on the fixture; a class of
# None applies to every method with that parameter.
EFFECTIVE_VALUE = {
    ("CFL", "eps1"): 1e-6,        # EARLY splits at once (eps1 100); a tiny eps1 never splits
    ("CFL", "eps2"): 100.0,       # EARLY's eps2 1e-6 always splits; 100 never does
    ("CFL", "warmup"): 3,
    ("CFL", "min_members"): 4,
    ("CFL", "gamma_max"): 0.99,   # refuses any bipartition whose halves are not near-opposite
    ("FedAC", "pca_every"): 1,
    ("FedAC", "max_clusters"): 1,
    ("FedAC", "components"): 1,
    ("FedAC", "cnt_start"): ROUNDS + 1,  # the fixture's CNT acts in the last round only
    ("FLHC", "cluster_round"): 2,
    ("FLHC", "distance_threshold"): 1e-6,
    ("FLHC", "linkage"): "single",
    ("FLHC", "metric"): "cityblock",
    ("KMeansCFL", "cluster_start"): 2,
    ("FedGroup", "pretrain_scale"): 3,
    ("FedGroup", "kmeans_init"): 1,  # one k-means start instead of EARLY's several
    ("FeSEM", "init_restarts"): 1,
    ("Ditto", "personal_steps"): 1,
    ("PerFedAvg", "beta"): 0.5,
    ("FedTSDP", "shared_layers"): 0,
    ("FedTSDP", "eps_js"): 1.0,              # every client in one stage-1 group
    ("FedTSDP", "hopkins_threshold"): 0.99,  # the fixture's H (about 0.4) then never clusters
    ("FedTSDP", "hopkins_fraction"): 1.0,    # 0.1 and 0.2 of 3 clients both round to 1 sample
    ("FedTSDP", "hopkins_min_samples"): 3,
    ("FCCA", "flow_steps"): 3,
    # IFCA's restarts train independently: keeping the same winner (the fixture's is set 0) a
    # round later changes nothing; a run that never keeps one does.
    ("IFCA", "restart_rounds"): ROUNDS + 1,     # the fixture's local steps are 2
    (None, "feature_samples"): 1,            # MCFL: 100 and 101 samples' feature means pick alike
}

# Settings of the other parameters under which the change can act, applied to both runs; a
# parameter of None applies to every parameter of the class.
SETTING = {
    # EARLY's eps2 always splits; 0.5 splits only when it multiplies the measured scale
    ("CFL", "thresholds"): {"eps2": 0.5},
    # EARLY's K decides FL+HC's cut; the distance threshold acts only without it
    ("FLHC", "distance_threshold"): {"clusters": None},
    ("FLHC", "threshold"): {"clusters": None, "distance_threshold": 1.0},
    # FL+HC clusters all 6 clients: two true groups cut in 2 the same way under any linkage
    ("FLHC", "linkage"): {"clusters": 4},
    ("FLHC", "metric"): {"clusters": 4, "linkage": "average"},
    # α weighs the UNKNOWN samples, which exist only with unknown: extra
    ("FCCA", "alpha"): {"unknown": "extra"},
    # a third set that does not win changes nothing once one is kept: here none is
    ("IFCA", "restarts"): {"restart_rounds": ROUNDS + 1},
    # radii between the fixture's distances (JS about 0.002-0.01, weights 0.17-0.36) for the
    # stage under test, the other stage's radius taking everything
    ("FedTSDP", "eps_js"): {"eps_js": 0.003, "eps_weights": 1.0},
    ("FedTSDP", None): {"eps_js": 1.0, "eps_weights": 0.2},
}

# Parameters that cannot change the fixture's trained state, each with the reason; they are
# checked elsewhere where their effect can show.
NO_EFFECT_HERE: dict[tuple[str, str], str] = {
    ("FedGroup", "kmeans_iter"): "Lloyd's iterations: k-means of the fixture's 4 pre-trained clients "
                                 "converges in one; test_iteration_caps_reach_kmeans checks it is passed on",
    ("FeSEM", "init_iter"): "Lloyd's iterations: k-means of the fixture's 3 first models converges in one; "
                            "test_iteration_caps_reach_kmeans checks it is passed on",
}


@pytest.mark.parametrize("name,field_name", [("fedgroup", "kmeans_iter"), ("fesem", "init_iter")])
def test_iteration_caps_reach_kmeans(name, field_name, tmp_path, monkeypatch):
    """The parameters of NO_EFFECT_HERE reach the k-means call (whose max_iter test_clustering
    checks with hand-computed Lloyd steps); the real k-means runs."""
    import importlib

    module = importlib.import_module(f"cflpipe.methods.{name}")
    real, caps = module.kmeans, []

    def recording(*args, **kwargs):
        caps.append(kwargs.get("max_iter"))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "kmeans", recording)
    raw = spec_dict(tmp_path, name)
    raw["methods"][name] = hyperparams(name) | {field_name: 7}
    play(prepare_run(parse_spec(raw), "s", name, 0), ROUNDS)
    assert caps and set(caps) == {7}


def _lookup(table: dict, cls_name: str, field_name: str, default=None):
    for key in ((cls_name, field_name), (None, field_name), (cls_name, None)):
        if key in table:
            return table[key]
    return default


def _perturbed(cls_name: str, field_name: str, field, value):
    if (effective := _lookup(EFFECTIVE_VALUE, cls_name, field_name)) is not None:
        return effective
    annotation = field.annotation
    if annotation is bool:
        return not value
    if getattr(annotation, "__origin__", None) is typing.Literal:
        return next(choice for choice in annotation.__args__ if choice != value)
    upper = min([m.le for m in field.metadata if hasattr(m, "le")] +
                [m.lt - 1e-9 for m in field.metadata if hasattr(m, "lt")], default=math.inf)
    if isinstance(value, bool) or value is None:
        raise AssertionError(f"{cls_name}.{field_name}: no generic change of {value!r}; add it to EFFECTIVE_VALUE")
    if isinstance(value, int):
        return value + 1 if value + 1 <= upper else value - 1
    changed = value * 2 if value else min(0.5, upper)
    return changed if changed <= upper else value / 2


def _trained_state(tmp_path: Path, name: str, overrides: dict) -> list[torch.Tensor]:
    overrides = dict(overrides)
    raw = spec_dict(tmp_path, name, **overrides.pop("training", {}))
    raw["methods"][name] = hyperparams(name) | overrides
    run = prepare_run(parse_spec(raw), "s", name, 0)
    reported = play(run, ROUNDS)
    vectors, index = run.method.eval_models()
    parts = [torch.stack(vectors).double(), torch.as_tensor(np.asarray(index, dtype=np.float64))]
    if (assignment := run.method.assignment()) is not None:
        parts.append(torch.as_tensor(np.asarray(assignment, dtype=np.float64)))
    clients = run.ctx.clients.state_dict()
    parts += [clients[key].double().flatten() for key in sorted(clients)]
    # what the server keeps (MCFL's uploaded feature means, FedTSDP's sampling weights)
    parts += _numbers(run.method.state_dict())
    # what the method reports per round (a Hopkins statistic, a similarity) is an effect too
    parts += [torch.tensor(np.asarray(value, dtype=np.float64)).flatten()
              for metrics in reported for _, value in sorted(metrics.items())]
    return parts


def _numbers(value) -> list[torch.Tensor]:
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in _numbers(value[key])]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _numbers(item)]
    if isinstance(value, torch.Tensor):
        return [value.detach().cpu().double().flatten()]
    if isinstance(value, (np.ndarray, int, float, np.number)) and not isinstance(value, bool):
        return [torch.as_tensor(np.asarray(value, dtype=np.float64)).flatten()]
    return []


def _same_state(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(u.shape == v.shape and torch.equal(u, v) for u, v in zip(a, b))


# Variants share their base's code: each (class, parameter) is checked once, on its first name.
EFFECT_CASES = list({(all_methods()[name].cls.__name__, field): (name, field)
                     for name in reversed(METHODS) for field in all_methods()[name].params.model_fields}.values())


@pytest.mark.slow
@pytest.mark.parametrize("name,field_name", EFFECT_CASES)
def test_every_hyperparameter_changes_training(name, field_name, tmp_path):
    info = all_methods()[name]
    cls_name = info.cls.__name__
    if (cls_name, field_name) in NO_EFFECT_HERE:
        pytest.skip(NO_EFFECT_HERE[cls_name, field_name])
    setting = _lookup(SETTING, cls_name, field_name, {})
    value = getattr(info.params(**hyperparams(name) | {k: v for k, v in setting.items() if k != "training"}),
                    field_name)
    changed = _perturbed(cls_name, field_name, info.params.model_fields[field_name], value)
    reference = _trained_state(tmp_path / "reference", name, setting)
    ours = _trained_state(tmp_path / "changed", name, setting | {field_name: changed})
    assert not _same_state(reference, ours), f"{name}: {field_name} {value!r} -> {changed!r} changed nothing"


# Training settings every method's local work must honour: (setting, a value, another).
TRAINING_CHANGES = [("lr", 0.05, 0.1), ("momentum", 0.5, 0.0), ("weight_decay", 0.0, 0.01),
                    ("local_steps", 2, 3), ("batch_size", 8, 16), ("lr_decay", 1.0, 0.5)]
CLASS_CASES = list({all_methods()[name].cls.__name__: name for name in reversed(METHODS)}.values())


@pytest.mark.slow
@pytest.mark.parametrize("name", CLASS_CASES)
@pytest.mark.parametrize("setting,value,other", TRAINING_CHANGES)
def test_every_training_setting_changes_training(name, setting, value, other, tmp_path):
    reference = _trained_state(tmp_path / "reference", name, {"training": {setting: value}})
    ours = _trained_state(tmp_path / "changed", name, {"training": {setting: other}})
    assert not _same_state(reference, ours), f"{name}: training.{setting} {value!r} -> {other!r} changed nothing"


@pytest.mark.parametrize("name", METHODS)
def test_training_changes_the_evaluated_models(name, tmp_path):
    """Every client that trained is evaluated with a model other than the initial one (a method
    whose clients' work never reaches what is evaluated trains nothing)."""
    run = prepare_run(parse_spec(spec_dict(tmp_path, name)), "s", name, 0)
    play(run, 3)
    trained = np.unique(np.concatenate([run.sample(r) for r in range(3)]))
    vectors, index = run.method.eval_models()
    initial = run.ctx.init
    unchanged = [int(c) for c in trained if torch.equal(vectors[index[c]], initial)]
    assert not unchanged, f"{name}: clients {unchanged} trained but are evaluated with the initial model"
