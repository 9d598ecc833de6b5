"""Extending cflpipe from outside: methods, models and datasets from entry points (the example
plugin package in examples/cflpipe-plugin-example) and from `module:attr` references, and one
line for every plugin that does not load.

The plugin package's tests need it installed (`python3 -m pip install -e
examples/cflpipe-plugin-example`, as .ci/run does); they skip without it, except under CI=true,
where that is a failure."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cflpipe import plugins
from cflpipe.errors import SpecError
from cflpipe.spec import parse_spec

from conftest import PLUGIN, ROOT, require_plugin, run

PLUGIN_DIR = ROOT / "examples" / PLUGIN


def cli(*args: str, cwd: Path, pythonpath: list[Path] = ()) -> subprocess.CompletedProcess:
    """`python -m cflpipe ARGS` in its own process, as Snakemake and DVC jobs run it."""
    path = os.pathsep.join([*map(str, pythonpath), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "cflpipe", *args], cwd=cwd, env={**os.environ, "PYTHONPATH": path},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)


def small_spec(results: Path, methods: dict, model: str = "mlp", dataset="digits") -> dict:
    return {
        "seeds": [0],
        "training": {"model": model, "rounds": 4, "clients_per_round": 3, "local_steps": 2, "batch_size": 8,
                     "eval_every": 2, "checkpoint_every": 2, "device": "cpu"},
        "scenarios": {"s": {"dataset": dataset, "clients": 6,
                            "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
        "methods": methods,
        "results_dir": str(results),
    }


def train(spec: dict, method: str) -> Path:
    from cflpipe.fl.engine import train_run

    parsed = parse_spec(spec)
    train_run(parsed, "s", method, 0, progress=False)
    return parsed.run_dir("s", method, 0)


# --------------------------------------------------------------------------- the example plugin


def test_the_plugins_entry_points_give_a_method_a_model_and_a_dataset():
    require_plugin()
    from cflpipe.data.base import dataset_info
    from cflpipe.registry import all_methods, method_info
    from cflpipe.models import LayeredModel, build_model

    info = method_info("fedavgm")
    assert info.cls.__module__ == "cflpipe_plugin_example.fedavgm" and "fedavgm" in all_methods()
    assert set(info.params.model_fields) == {"server_momentum", "server_lr", "nesterov"}
    model = build_model("tiny_cnn", (1, 8, 8), 10)
    assert isinstance(model, LayeredModel) and model.layers == ["conv1", "conv2", "fc1", "fc2"]
    blobs = dataset_info("blobs")
    data = blobs.load(blobs.params(classes=3, dimension=5, samples=100), Path("unused"))
    assert data.x_train.shape == (80, 5) and data.x_test.shape == (20, 5) and data.num_classes == 3
    assert set(plugins.entry_point_names(plugins.MODELS_GROUP)) >= {"tiny_cnn"}
    # Imported before cflpipe loads its own methods (a user's script, a test), the plugin is still a plugin.
    code = ("import cflpipe_plugin_example.fedavgm\nfrom cflpipe.methods import all_methods\n"
            "print(all_methods()['fedavgm'].cls.__name__)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "FedAvgM"), done.stderr


def test_fedavgm_without_momentum_is_fedavg_and_momentum_changes_training(tmp_path):
    """β = 0, η = 1 steps by exactly the averaged update (up to float rounding); β > 0 does not."""
    require_plugin()
    spec = small_spec(tmp_path, {"fedavg": {}, "m0": {"method": "fedavgm", "server_momentum": 0, "server_lr": 1},
                                 "m9": {"method": "fedavgm", "server_momentum": 0.9}})
    loss = {m: pd.read_parquet(train(spec, m) / "rounds.parquet")["train_loss"].to_numpy() for m in spec["methods"]}
    assert loss["m0"] == pytest.approx(loss["fedavg"], rel=1e-5)
    assert loss["m9"][-1] != pytest.approx(loss["fedavg"][-1], rel=1e-3)


@pytest.mark.slow
def test_the_example_spec_runs_end_to_end_with_a_sweep_and_the_plugin(tmp_path):
    """The plugin package's own spec, as a new user runs it: validate, partition, train every
    run (each `cflpipe` call its own process, as in Snakemake and DVC jobs), aggregate, report;
    every method entry, the expanded sweep's included, is told apart in the report."""
    require_plugin()
    shutil.copy(PLUGIN_DIR / "spec.yaml", tmp_path / "spec.yaml")
    spec = parse_spec(yaml.safe_load((PLUGIN_DIR / "spec.yaml").read_text()))
    swept = ["fedavgm-server_momentum0", "fedavgm-server_momentum0p5", "fedavgm-server_momentum0p9"]
    assert [m for m in spec.methods if m.startswith("fedavgm")] == swept

    done = cli("validate", "--config", "spec.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "10 runs: 2 scenarios, 5 methods, 1 seed" in done.stdout
    for scenario in spec.scenarios:
        done = cli("partition", "--config", "spec.yaml", "--scenario", scenario, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    for scenario, method, seed in spec.matrix():
        done = cli("train", "--config", "spec.yaml", "--scenario", scenario, "--method", method,
                   "--seed", str(seed), "--threads", "1", "--quiet", cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    for command in ("aggregate", "report"):
        done = cli(command, "--config", "spec.yaml", cwd=tmp_path)
        assert done.returncode == 0, done.stderr

    results = tmp_path / "results" / "spec"  # a spec without results_dir writes to results/<file name>
    config = yaml.safe_load((results / "runs/digits-swap2/fedavgm-server_momentum0p5/seed0/config.yaml").read_text())
    assert (config["method_type"], config["hyperparams"]) == \
        ("fedavgm", {"server_momentum": 0.5, "server_lr": 1.0, "nesterov": False})
    assert config["training"]["model"] == "tiny_cnn"
    # the plugin's release is part of what a run is: a new release re-runs it
    assert config["plugins"] == {PLUGIN: metadata.version(PLUGIN)}
    builtin = yaml.safe_load((results / "runs/blobs-swap2/ifca/seed0/config.yaml").read_text())
    assert builtin["plugins"] == {PLUGIN: metadata.version(PLUGIN)}  # the plugin's dataset
    summary = pd.read_parquet(results / "aggregate/summary.parquet")
    assert len(summary) == 10 and summary["acc_macro_mean"].between(0, 1).all()
    fedavg = summary.set_index(["scenario", "method"])["acc_macro_mean"]
    for scenario in spec.scenarios:  # the sweep's β = 0 end is FedAvg
        assert fedavg[(scenario, "fedavgm-server_momentum0")] == pytest.approx(fedavg[(scenario, "fedavg")], abs=0.02)

    page = (results / "report/index.html").read_text()
    labels = [spec.method_label(m) for m in spec.methods]
    assert len(set(labels)) == len(labels)
    assert "FedAvgM (server_momentum=0.5)" in labels
    for label in labels:
        assert json.dumps(label)[1:-1] in page or label in page, label
    for scenario in spec.scenarios:  # the report's sweep figure picked up the expanded entries
        assert f"{scenario}-fedavgm-server-momentum-sweep" in page


# --------------------------------------------------------------------------- module:attr references


REFERENCED = '''
"""A method, a model and a dataset that are no installed package's: named by module:attr."""
import numpy as np
from pydantic import Field

from cflpipe.data import Dataset, DatasetInfo
from cflpipe.methods import HyperParams, register
from cflpipe.methods.fedprox import FedProx
from cflpipe.models import MLP


class HalfProxParams(HyperParams):
    mu: float = Field(0.5, ge=0)


@register("test_reference_prox", HalfProxParams)
class HalfProx(FedProx):
    """FedProx with a stronger default pull."""


def narrow_mlp(input_shape, num_classes):
    return MLP(input_shape, num_classes, hidden=16)


def load_stripes(params, data_dir):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 240).astype(np.int64)
    x = (np.eye(3, 6)[y] * 2 + rng.standard_normal((240, 6))).astype(np.float32)
    return Dataset("stripes", x[40:], y[40:], x[:40], y[:40], num_classes=3)


STRIPES = DatasetInfo(name="stripes", description="three noisy one-hot stripes", load=load_stripes, images=False)
NOT_A_DATASET = 5
'''


@pytest.fixture
def referenced_module(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "refs"
    folder.mkdir()
    (folder / "my_cfl_refs.py").write_text(textwrap.dedent(REFERENCED))
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.mark.slow
def test_the_plugins_own_tests_run_cflpipes_conformance_checks(tmp_path):
    """cflpipe.testing from a plugin's side: the example plugin's test file, run by pytest in its
    own folder, parametrizes every check over its method and passes."""
    require_plugin()
    folder = ROOT / "examples" / PLUGIN / "tests"
    result = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder),
                  "--basetemp", str(tmp_path / "base")], cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:]
    from cflpipe.testing import CHECKS

    assert f"{len(CHECKS)} passed" in result.stdout


def test_module_attr_references_name_a_method_a_model_and_a_dataset(tmp_path, referenced_module):
    spec = small_spec(tmp_path / "results", {"ref": {"method": "my_cfl_refs:HalfProx"}},
                      model="my_cfl_refs:narrow_mlp", dataset="my_cfl_refs:STRIPES")
    run = train(spec, "ref")
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert (config["method_type"], config["hyperparams"], config["training"]["model"]) == \
        ("my_cfl_refs:HalfProx", {"mu": 0.5}, "my_cfl_refs:narrow_mlp")
    assert "plugins" not in config  # a module of no installed distribution has no version to record
    assert json.loads((run / "summary.json").read_text())["rounds"] == 4


def test_a_reference_works_in_another_process_with_pythonpath(tmp_path, referenced_module):
    spec = small_spec(tmp_path / "results", {"ref": {"method": "my_cfl_refs:HalfProx", "mu": 0.1}},
                      dataset="my_cfl_refs:STRIPES")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    done = cli("validate", "--config", "spec.yaml", cwd=tmp_path, pythonpath=[referenced_module])
    assert done.returncode == 0, done.stderr
    done = cli("validate", "--config", "spec.yaml", cwd=tmp_path)  # not importable there
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: scenarios.s.dataset: cannot import module 'my_cfl_refs' of 'my_cfl_refs:STRIPES': "
        "ModuleNotFoundError: No module named 'my_cfl_refs' (install its package, or add its folder to PYTHONPATH)",
        "error: methods.ref.method: cannot import module 'my_cfl_refs' of 'my_cfl_refs:HalfProx': "
        "ModuleNotFoundError: No module named 'my_cfl_refs' (install its package, or add its folder to PYTHONPATH)"]


@pytest.mark.parametrize("field, value, line", [
    ("method", "my_cfl_refs:Missing",
     "methods.ref.method: module 'my_cfl_refs' has no attribute 'Missing' (from 'my_cfl_refs:Missing')"),
    ("method", "my_cfl_refs:narrow_mlp",
     "methods.ref.method: 'my_cfl_refs:narrow_mlp' is not a method class registered with "
     "@cflpipe.methods.register(NAME, PARAMS)"),
    ("method", "no_such_module_here:X",
     "methods.ref.method: cannot import module 'no_such_module_here' of 'no_such_module_here:X': "
     "ModuleNotFoundError: No module named 'no_such_module_here' (install its package, or add its folder to "
     "PYTHONPATH)"),
    ("model", "my_cfl_refs:NOT_A_DATASET",
     "training.model: 'my_cfl_refs:NOT_A_DATASET' is an object of type int, not a cflpipe.models.LayeredModel "
     "subclass or a function (input_shape, num_classes) -> LayeredModel"),
    ("model", "my_cfl_refs:load_stripes", None),  # callable: fails only when it builds something else
    ("dataset", "my_cfl_refs:NOT_A_DATASET",
     "scenarios.s.dataset: 'my_cfl_refs:NOT_A_DATASET' is an object of type int, not a cflpipe.data.DatasetInfo"),
    ("method", "fedavg:", "methods.ref.method: unknown method 'fedavg:'; allowed: "),
])
def test_bad_references_are_one_line(tmp_path, referenced_module, field, value, line):
    methods = {"ref": {"method": value}} if field == "method" else {"fedavg": {}}
    spec = small_spec(tmp_path, methods, **({field: value} if field != "method" else {}))
    if line is None:
        parse_spec(spec)
        from cflpipe.models import ModelError, build_model

        with pytest.raises(ModelError, match=r"^model: model 'my_cfl_refs:load_stripes' built a Dataset, not a "
                                             r"cflpipe.models.LayeredModel$"):
            build_model(value, (6,), 3)
        return
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- broken entry points


@pytest.fixture
def fake_plugins(tmp_path, monkeypatch, registry_copy):
    """Installs a distribution's metadata on sys.path (what pip writes) with the given entry
    points, and leaves the registries as they were afterwards."""
    from cflpipe import models
    from cflpipe.data import base

    monkeypatch.setattr(models, "MODELS", dict(models.MODELS))
    monkeypatch.setattr(base, "DATASETS", dict(base.DATASETS))

    def install(entry_points: str, modules: dict[str, str] | None = None) -> None:
        site = tmp_path / "site"
        info = site / "cflpipe_fake_plugin-0.1.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cflpipe-fake-plugin\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
        for name, text in (modules or {}).items():
            (site / f"{name}.py").write_text(textwrap.dedent(text))
        monkeypatch.syspath_prepend(str(site))
        plugins._entry_points.cache_clear()

    yield install
    plugins._entry_points.cache_clear()


def test_a_plugin_that_fails_to_import_is_one_line_naming_it(tmp_path, fake_plugins):
    fake_plugins("""
        [cflpipe.methods]
        broken = fake_missing_dependency_method:Broken
        [cflpipe.models]
        broken_net = fake_raising_model:Net
        [cflpipe.datasets]
        broken_data = fake_missing_dependency_data:DATA
        """, {"fake_raising_model": "raise RuntimeError('CUDA toolkit 99 required')\n"})
    spec = small_spec(tmp_path, {"b": {"method": "broken"}}, model="broken_net", dataset="broken_data")
    with pytest.raises(SpecError) as info:
        parse_spec(spec)
    assert str(info.value).splitlines() == [
        "scenarios.s.dataset: entry point 'broken_data' of group cflpipe.datasets (fake_missing_dependency_data:DATA, "
        "from cflpipe-fake-plugin 0.1) failed to load: ModuleNotFoundError: No module named "
        "'fake_missing_dependency_data'",
        "methods.b.method: entry point 'broken' of group cflpipe.methods (fake_missing_dependency_method:Broken, from "
        "cflpipe-fake-plugin 0.1) failed to load: ModuleNotFoundError: No module named 'fake_missing_dependency_method'",
        "training.model: entry point 'broken_net' of group cflpipe.models (fake_raising_model:Net, from "
        "cflpipe-fake-plugin 0.1) failed to load: RuntimeError: CUDA toolkit 99 required",
    ]
    # A spec that does not name the broken plugin is not affected by it.
    assert parse_spec(small_spec(tmp_path, {"fedavg": {}}))


BROKEN_METHOD = ("entry point 'broken' of group cflpipe.methods (fake_missing_dependency_method:Broken, from "
                 "cflpipe-fake-plugin 0.1) failed to load: ModuleNotFoundError: No module named "
                 "'fake_missing_dependency_method'")


def test_a_broken_plugin_does_not_hide_a_misspelt_method(tmp_path, fake_plugins, capsys):
    """Listing every name (for an error, or `cflpipe methods`) leaves the broken plugin out and
    says so; the misspelt name is the error, at its entry."""
    from cflpipe.cli import main
    from cflpipe.registry import all_methods, method_names, plugin_failures

    fake_plugins("""
        [cflpipe.methods]
        broken = fake_missing_dependency_method:Broken
        """)
    with pytest.raises(SpecError) as info:
        parse_spec(small_spec(tmp_path, {"fedavgg": {}}))
    assert str(info.value).splitlines() == [
        f"methods.fedavgg: unknown method 'fedavgg'; allowed: {', '.join(method_names())} (or a module:Class "
        f"reference); left out: {BROKEN_METHOD}"]
    assert "broken" not in method_names() and "fedavg" in all_methods()
    assert plugin_failures() == [BROKEN_METHOD]
    # a spec that names the broken plugin still gets its load error
    with pytest.raises(SpecError) as info:
        parse_spec(small_spec(tmp_path, {"b": {"method": "broken"}}))
    assert str(info.value).splitlines() == [f"methods.b.method: {BROKEN_METHOD}"]

    assert main(["methods", "fedprox"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("fedprox: FedProx") and captured.err == ""
    assert main(["methods", "fedprx"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.splitlines() == [
        f"error: NAME: unknown method 'fedprx'; allowed: {', '.join(method_names())} (or a module:Class "
        f"reference); left out: {BROKEN_METHOD}"]
    assert main(["methods", "broken"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: NAME: {BROKEN_METHOD}"]
    assert main(["methods"]) == 0
    captured = capsys.readouterr()
    assert "\nfedavg: " in captured.out and "broken" not in captured.out
    assert captured.err.splitlines() == [f"warning: not listed: {BROKEN_METHOD}"]


def test_methods_name_imports_only_that_names_plugin(tmp_path, fake_plugins):
    """`cflpipe methods fedprox` in its own process does not import an unrelated plugin at all."""
    fake_plugins("""
        [cflpipe.methods]
        noisy = fake_noisy_method:Noisy
        """, {"fake_noisy_method": "import sys\nprint('imported', file=sys.stderr)\n"})
    site = tmp_path / "site"
    done = cli("methods", "fedprox", cwd=tmp_path, pythonpath=[site])
    assert done.returncode == 0 and done.stdout.startswith("fedprox: FedProx"), done.stderr
    assert "imported" not in done.stderr


def test_a_plugin_cannot_take_a_built_in_name_or_register_another(tmp_path, fake_plugins):
    from cflpipe.registry import all_methods, method_info, plugin_failures

    fake_plugins("""
        [cflpipe.methods]
        fedavg = fake_shadow:Shadow
        other = fake_shadow:Shadow
        """, {"fake_shadow": """
        from cflpipe.methods import register
        from cflpipe.methods.fedavg import FedAvg

        @register("fake_shadow_name")
        class Shadow(FedAvg):
            '''FedAvg under another name.'''
        """})
    # listed without them, each named once
    assert "other" not in all_methods() and all_methods()["fedavg"].cls.__module__ == "cflpipe.methods.fedavg"
    assert plugin_failures() == [
        "entry point 'fedavg' of group cflpipe.methods has the name of a built-in method; give it another name",
        "entry point 'other' of group cflpipe.methods registers 'fake_shadow_name'; decorate its class with "
        "@cflpipe.methods.register('other', PARAMS)"]
    with pytest.raises(SpecError, match=r"^methods.o.method: entry point 'other' of group cflpipe.methods registers "
                                        r"'fake_shadow_name'; decorate its class with "
                                        r"@cflpipe.methods.register\('other', PARAMS\)$"):
        method_info("other", "methods.o.method")


def test_registering_a_taken_name_is_refused():
    from cflpipe.registry import method_info, register
    from cflpipe.methods.fedavg import FedAvg
    from cflpipe.models import MLP, register_model

    method_info("fedprox")
    with pytest.raises(ValueError, match="method name 'fedprox' is already registered by cflpipe.methods.fedprox.FedProx"):
        register("fedprox")(type("Impostor", (FedAvg,), {"__doc__": "x"}))
    with pytest.raises(ValueError, match="model name 'mlp' is already registered by cflpipe.models.MLP"):
        register_model("mlp")(lambda shape, classes: MLP(shape, classes))


@pytest.mark.parametrize("key", ["method", "training", "scenarios", "label", "sweep"])
def test_a_hyper_parameter_named_like_a_method_entry_key_is_refused_at_registration(key):
    from pydantic import create_model

    from cflpipe.registry import METHODS, HyperParams, register
    from cflpipe.methods.fedavg import FedAvg

    params = create_model("ReservedParams", __base__=HyperParams, **{key: (int, 1)})
    with pytest.raises(ValueError) as info:
        register("test_reserved_key", params)(type("Reserved", (FedAvg,), {"__doc__": "x"}))
    assert str(info.value) == (f"method 'test_reserved_key': hyper-parameter {key!r} of ReservedParams is a key of "
                               f"a spec's method entry (method, training, scenarios, label, sweep); rename it")
    assert "test_reserved_key" not in METHODS


def test_runs_of_built_in_methods_models_and_datasets_record_no_plugins(tmp_path):
    """Their config.yaml stays as before plugins existed, so no finished run is redone."""
    from cflpipe.fl.runs import run_plugins

    spec = parse_spec(small_spec(tmp_path, {"fedavg": {}, "cfl_awcfl": {}}, model="cnn"))
    assert [run_plugins(spec, "s", m) for m in spec.methods] == [{}, {}]


def test_a_plugin_says_what_keeps_it_from_the_bars_at_scale(registry_copy, capsys):
    from cflpipe.cli import main
    from cflpipe.methods.fedavg import FedAvg
    from cflpipe.registry import register

    register("wide_fedavg", at_scale="every client's copy of the model at once: 2 GiB")(
        type("WideFedAvg", (FedAvg,), {"__doc__": "Wide FedAvg: a test's."}))
    assert main(["methods", "wide_fedavg"]) == 0
    assert "\nat 10,000 clients: every client's copy of the model at once: 2 GiB" in capsys.readouterr().out


def test_a_cluster_model_subclass_with_clusters_gets_the_k_rule(registry_copy):
    """#69: a plugin on the cluster-model base that states no k_param has its `clusters` checked
    against the clients at validate, as every built-in's K is."""
    from pydantic import Field

    from cflpipe.errors import SpecError
    from cflpipe.methods.clustered import ClusterModels
    from cflpipe.registry import HyperParams, method_info, register
    from cflpipe.spec import parse_spec

    class KParams(HyperParams):
        clusters: int = Field(2, ge=1)

    @register("fixed_k", KParams)
    class FixedK(ClusterModels):
        """Fixed K: a test's cluster-model method."""

        def __init__(self, ctx):
            super().__init__(ctx, ctx.hp.clusters, np.arange(ctx.num_clients) % ctx.hp.clusters)

    assert method_info("fixed_k").capabilities.k_param == "clusters"
    raw = {"seeds": [0], "training": {"model": "mlp", "rounds": 2, "clients_per_round": 4},
           "scenarios": {"s": {"dataset": "digits", "clients": 4}}, "methods": {"fixed_k": {"clusters": 5}}}
    with pytest.raises(SpecError, match=r"methods.fixed_k.clusters: must be <= clients of scenario s \(4\), got 5"):
        parse_spec(raw)
