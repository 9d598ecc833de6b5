"""One conformance suite for every registered method and variant (after scikit-learn's
check_estimator): a method that registers itself is checked here without being named. The checks
live in the package (cflpipe.testing), so a plugin's own tests run them too; what they check is
listed there. Here, beyond them: a trainer that pickles every work item and trains it in another
process equals the sequential trainer, every hyper-parameter and training setting has an effect,
and training reaches the evaluated models.
"""

from __future__ import annotations

import math
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from cflpipe.fl.engine import prepare_run
from cflpipe.registry import all_methods
from cflpipe.spec import parse_spec
from cflpipe.testing import (ADAM_TOLERANCE, ROUNDS, hyperparams, parametrize_with_checks, play, spec_dict,
                             trained_alike)

torch.set_num_threads(1)

METHODS = sorted(all_methods())


@parametrize_with_checks()
def test_conformance(method, check, tmp_path):
    check(method, tmp_path)


def test_a_client_that_writes_to_the_servers_state_fails_the_conformance_check(tmp_path, registry_copy):
    """A client's step sees the server only through its payload; a payload tensor that is a view of
    the server's state (FedAvg sends its global model itself) must not be written."""
    from cflpipe.methods import HyperParams, register
    from cflpipe.methods.fedavg import FedAvg
    from cflpipe.testing import check_clients_use_only_what_they_were_sent

    @register("writes_back", HyperParams)
    class WritesBack(FedAvg):
        """Writes back: FedAvg whose clients move the model they received in place."""

        @classmethod
        def client_plan(cls, view, payload):
            payload.tensors["model"].add_(1.0)
            return super().client_plan(view, payload)

    with pytest.raises(AssertionError, match="wrote to the server's state"):
        check_clients_use_only_what_they_were_sent("writes_back", tmp_path)
    check_clients_use_only_what_they_were_sent("fedavg", tmp_path / "fedavg")  # its parent does not


def test_an_asked_client_that_writes_to_or_reads_the_servers_state_fails_the_conformance_check(tmp_path,
                                                                                                registry_copy):
    """The clients FL+HC asks to train outside its clustering round are checked as the sampled
    ones are: one that writes to the model it was sent (a view of the server's) or answers with
    what the server holds rather than what it was sent fails."""
    from cflpipe.methods import register
    from cflpipe.methods.flhc_params import FLHCParams
    from cflpipe.methods.flhc import FLHC
    from cflpipe.testing import check_clients_use_only_what_they_were_sent

    @register("asked_writes_back", FLHCParams)
    class AskedWritesBack(FLHC):
        """Asked writes back: FL+HC whose asked clients move the model they received in place."""

        @classmethod
        def query_plan(cls, view, payload):
            payload.tensors["model"].add_(1.0)
            return super().query_plan(view, payload)

    @register("asked_reads_server", FLHCParams)
    class AskedReadsServer(FLHC):
        """Asked reads server: FL+HC whose asked clients answer with the server's model."""

        def __init__(self, ctx):
            super().__init__(ctx)
            type(self).server = self

        @classmethod
        def query(cls, view, payload, trained, scratch):
            return view.update({"model": cls.server.centers[0].clone()}, trained)

    with pytest.raises(AssertionError, match="asked in round 2 wrote to the server's state"):
        check_clients_use_only_what_they_were_sent("asked_writes_back", tmp_path / "writes")
    with pytest.raises(AssertionError, match="asked in round 2 used server state that was not in its payload"):
        check_clients_use_only_what_they_were_sent("asked_reads_server", tmp_path / "reads")


def test_a_placement_that_changes_the_method_fails_the_conformance_check(tmp_path, registry_copy):
    """Placing new clients must leave the method as it was: an IFCA whose placement nudges its
    cluster models fails, IFCA itself passes."""
    from cflpipe.methods import register
    from cflpipe.methods.ifca_params import IFCAParams
    from cflpipe.methods.ifca import IFCA
    from cflpipe.testing import check_new_clients_change_no_training

    @register("places_and_moves", IFCAParams)
    class PlacesAndMoves(IFCA):
        """Places and moves: IFCA whose placement of new clients moves its cluster models."""

        def place(self, newcomers):
            placement = super().place(newcomers)
            self.centers = self.centers + 1e-3
            return placement

    with pytest.raises(AssertionError, match="placing new clients changed the method's state"):
        check_new_clients_change_no_training("places_and_moves", tmp_path / "moves")
    check_new_clients_change_no_training("ifca", tmp_path / "ifca")


def test_a_method_whose_client_reads_its_test_split_fails_the_conformance_check(tmp_path, registry_copy):
    """#69: the test split is the evaluation's. An IFCA whose clients pick their cluster on their
    test data fails every check that trains it; IFCA itself passes."""
    from cflpipe.methods import register
    from cflpipe.methods.ifca import IFCA
    from cflpipe.methods.ifca_params import IFCAParams
    from cflpipe.testing import check_determinism

    @register("peeks_at_test", IFCAParams)
    class PeeksAtTest(IFCA):
        """Peeks at test: IFCA whose clients read their test split before they train."""

        @classmethod
        def client_plan(cls, view, payload):
            view.data("test")
            return super().client_plan(view, payload)

    with pytest.raises(ValueError, match=r"ClientView.data\('test'\): .* training split only"):
        check_determinism("peeks_at_test", tmp_path / "peeks")
    check_determinism("ifca", tmp_path / "ifca")


def test_a_sampled_predictor_that_gives_other_models_fails_the_conformance_check(tmp_path, registry_copy):
    """A sampled evaluation (the default past 1,000 clients) must give the sampled clients their
    full evaluation's models: an IFCA that serves them its first cluster model fails."""
    from cflpipe.fl.predictors import Models
    from cflpipe.methods import register
    from cflpipe.methods.ifca import IFCA
    from cflpipe.methods.ifca_params import IFCAParams
    from cflpipe.testing import check_sampled_predictor

    @register("first_when_sampled", IFCAParams)
    class FirstWhenSampled(IFCA):
        """First when sampled: IFCA whose sampled evaluation serves every client cluster 0's model."""

        def predictor(self, clients=None):
            every = super().predictor(clients)
            if clients is None:
                return every
            return Models(every.models, np.zeros(self.ctx.num_clients, dtype=np.int64))

    with pytest.raises(AssertionError, match="model differs when the evaluation samples clients"):
        check_sampled_predictor("first_when_sampled", tmp_path / "first")
    check_sampled_predictor("ifca", tmp_path / "ifca")


PROCESS_TRAINER = "process_trainer:ProcessTrainer"  # tests/process_trainer.py


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in METHODS if all_methods()[n].capabilities.batchable])
def test_a_trainer_in_another_process_equals_the_sequential_one(name, tmp_path):
    """A trainer that pickles every work item and trains it in a spawned process (what a Ray or
    Dask trainer does) trains what the sequential trainer trains."""
    from process_trainer import ProcessTrainer

    sent = ProcessTrainer.pickled_items
    trained_alike(name, tmp_path, PROCESS_TRAINER, ADAM_TOLERANCE)
    assert ProcessTrainer.pickled_items > sent


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
    ("LCFed", "pca_every"): 2,    # the default refits every round of the fixture's 4 (a tenth, at least 1)
    ("LCFed", "components"): 1,
    ("FedAC", "cnt_start"): ROUNDS + 1,  # the fixture's CNT acts in the last round only
    ("FLHC", "cluster_round"): 2,
    ("FLHC", "distance_threshold"): 1e-6,
    ("FLHC", "linkage"): "single",
    ("FLHC", "metric"): "cityblock",
    ("KMeansCFL", "cluster_start"): 2,
    ("CFLGP", "stop_after"): 2,  # the fixture's 4 rounds end before the default 10
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
    ("FCCA", "flow_epochs"): 0.2,
    # IFCA's restarts train independently: keeping the same winner (the fixture's is set 0) a
    # round later changes nothing; a run that never keeps one does.
    ("IFCA", "restart_rounds"): ROUNDS + 1,     # the fixture's local steps are 2
    (None, "feature_samples"): 1,            # MCFL: 100 and 101 samples' feature means pick alike
    ("FLUX", "th_round"): 0.0,               # never by the gains: the latest round instead
    ("FLUX", "eps_scaling"): 100.0,          # one radius that joins every client
    ("SRFCA", "threshold"): 1e-6,            # no two clients linked: every group dropped, one cluster
    ("SRFCA", "size_threshold"): 3,          # the fixture's two groups of 3 dropped: one cluster
}

# Settings of the other parameters under which the change can act, applied to both runs; a
# parameter of None applies to every parameter of the class.
SETTING = {
    # flow_steps replaces the fixture's flow_epochs; the reference ties the cINN to the local steps
    ("FCCA", "flow_steps"): {"flow_epochs": None},
    # EARLY's eps2 always splits; 0.5 splits only when it multiplies the measured scale
    ("CFL", "thresholds"): {"eps2": 0.5},
    # EARLY's K decides FL+HC's cut; the distance threshold acts only without it
    ("FLHC", "distance_threshold"): {"clusters": None},
    ("FLHC", "threshold"): {"clusters": None, "distance_threshold": 1.0},
    # FL+HC clusters all 6 clients: two true groups cut in 2 the same way under any linkage
    ("FLHC", "linkage"): {"clusters": 4},
    ("FLHC", "metric"): {"clusters": 4, "linkage": "average"},
    # EARLY's K decides PACFL's cut; the fixture's proximities lie between 5.5° and 9.1°, so
    # a threshold of 7° cuts differently under the default linkage and the changed one
    ("PACFL", "threshold"): {"clusters": None},
    # σ replaces a share of 0, which the fixture's clients reach with 3 clusters, not with 2
    ("FedSoft", "smoother"): {"clusters": 3},
    ("PACFL", "linkage"): {"clusters": None, "threshold": 7.0},
    # FLUX's trigger reads four rounds before it may cluster: eight rounds leave it room
    ("FLUX", "th_round"): {"cluster_round": None, "training": {"rounds": 8}},
    ("FLUX", "max_round_fraction"): {"cluster_round": None, "th_round": 0.0, "training": {"rounds": 8}},
    # every client linked: one cluster of all the fixture's clients, enough members for a trim
    ("SRFCA", "trim"): {"dist_fraction": 1.0, "training": {"clients_per_round": 6}},
    # the fixture's two cluster models merge at the block start: one block keeps both for the mixing
    ("SRFCA", "beta"): {"refine_steps": 1},
    # α weighs the UNKNOWN samples, which exist only with unknown: extra
    ("FCCA", "alpha"): {"unknown": "extra"},
    # the default draws a client's absent labels; the fixture's clients hold every label
    ("FCCA", "unknown"): {"scenario": {"partition": [{"kind": "pathological", "labels_per_client": 3}]}},
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
    ("PACFL", "basis"): "on digits the closest pair of two clients' basis vectors is always their leading "
                        "singular vectors, so more vectors change no angle; tests/test_pacfl.py checks one "
                        "where a second vector is the closest",
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
    raw["scenarios"]["s"] |= overrides.pop("scenario", {})
    raw["methods"][name] = hyperparams(name) | overrides
    run = prepare_run(parse_spec(raw), "s", name, 0)
    reported = play(run, ROUNDS)
    evaluated = run.method.predictor()
    vectors, index = evaluated.models, evaluated.index
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
    value = getattr(info.params(**hyperparams(name) | {k: v for k, v in setting.items()
                                                       if k not in ("training", "scenario")}),
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
    evaluated = run.method.predictor()
    vectors, index = evaluated.models, evaluated.index
    initial = run.ctx.init
    unchanged = [int(c) for c in trained if torch.equal(vectors[index[c]], initial)]
    assert not unchanged, f"{name}: clients {unchanged} trained but are evaluated with the initial model"
