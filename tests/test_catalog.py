"""The built-in methods' declarations (cflpipe/methods/*_params.py, imported by catalog.py): validating a spec reads them
without importing torch, and every implementation agrees with its declaration."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cflpipe import registry
from cflpipe.registry import METHODS, Capabilities, HyperParams, declare, register

ROOT = Path(__file__).resolve().parents[1]
registry._load_all()
BUILT_IN = sorted(name for name, info in METHODS.items() if info.module.startswith("cflpipe."))


def test_validating_the_default_spec_warns_of_nothing_and_imports_neither_torch_nor_a_method():
    code = ("import runpy, sys\n"
            "sys.argv = ['cflpipe', 'validate', '--config', 'config/config.yaml']\n"
            "try:\n    runpy.run_module('cflpipe', run_name='__main__')\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('cflpipe.methods.'))\n"
            "print(' '.join(loaded))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "config/config.yaml: ok" in out.stdout
    # The default runs every method where its premises hold: no premise, budget or degeneration warning.
    assert "warning" not in out.stderr, out.stderr
    loaded = out.stdout.strip().splitlines()[-1].split()
    assert "torch" not in loaded and "cflpipe.methods.catalog" in loaded, loaded
    # only the declarations, each beside the module that implements it
    assert all(m == "cflpipe.methods.catalog" or m.endswith("_params") for m in loaded), loaded


@pytest.mark.parametrize("name", BUILT_IN)
def test_every_built_in_implementation_agrees_with_its_declaration(name):
    info = METHODS[name]
    cls = info.cls
    assert f"{cls.__module__}:{cls.__qualname__}" == info.implementation
    assert cls.name == (info.base or name)
    assert cls.capabilities is info.capabilities is registry.DECLARED[name].capabilities
    assert info == registry.DECLARED[name]  # what the catalog says, not what the class inherits


def test_a_built_in_is_named_once_by_its_declaration_and_cannot_register_too(registry_copy):
    from cflpipe.methods.cfl_params import CFLParams
    from cflpipe.methods.cfl import CFL

    before = dict(registry.METHODS)
    with pytest.raises(ValueError, match="declared in cflpipe.methods.cfl_params.*remove @register"):
        register("cfl", CFLParams)(CFL)
    assert registry.METHODS == before and CFL.capabilities is registry.DECLARED["cfl"].capabilities


def test_a_plugin_subclass_inherits_its_ancestors_clustering_start(registry_copy):
    from cflpipe.methods.cfl_params import CFLParams
    from cflpipe.methods.flhc_params import FLHCParams
    from cflpipe.methods.cfl import CFL

    Sub = type("Sub", (CFL,), {"__module__": __name__, "__qualname__": "Sub", "__doc__": "Sub: a CFL."})
    register("cfl_sub", CFLParams)(Sub)
    assert registry.METHODS["cfl_sub"].clustering_starts(CFLParams(warmup=7)) == ("warmup", 7)
    assert registry.declared_starts(Sub, FLHCParams()) is None  # parameters without CFL's warm-up: no start to tell


def test_a_plugin_registers_its_premises_and_validate_reads_them(registry_copy):
    from cflpipe.methods.fedavg import FedAvg
    from cflpipe.spec import parse_spec, spec_warnings

    def premises(hp, training, scenario):
        return [("", f"needs 20 local steps, got {training.local_steps}")] if training.local_steps < 20 else []

    Plugin = type("Plugin", (FedAvg,), {"__module__": __name__, "__qualname__": "Plugin", "__doc__": "Plugin: test."})
    register("premised", HyperParams, premises=premises)(Plugin)
    assert registry.METHODS["premised"].premise_warnings(HyperParams(), type("T", (), {"local_steps": 5})(), None) \
        == [("", "needs 20 local steps, got 5")]
    spec = parse_spec({"seeds": [0], "training": {"model": "mlp", "local_steps": 5, "clients_per_round": 4},
                       "methods": {"premised": {}},
                       "scenarios": {"s": {"dataset": "digits", "clients": 4}}})
    assert spec_warnings(spec) == ["methods.premised: needs 20 local steps, got 5 (scenario s)"]
    # a built-in declares its own; what `cflpipe methods` prints of it
    assert registry.METHODS["fcca"].needs.startswith("cINNs that have learnt each held label's conditional")
    assert registry.METHODS["fedavg"].needs == "" and registry.METHODS["fedavg"].premise_warnings(None, None, None) == []


def test_every_built_in_is_declared():
    assert len(BUILT_IN) == 53 and {"fedavg", "fcca_per_prox", "awcfl", "ifca_mcfl", "fedrc", "icfl", "lcfed", "flux",
                                    "flux_awcfl", "flux_mcfl", "srfca", "srfca_awcfl", "srfca_mcfl"} <= set(BUILT_IN)


def test_a_method_class_with_a_hook_of_the_old_client_form_is_refused_in_one_line():
    """plan()/finish() on the server object are no longer called: a plugin's class that still
    defines one would run its parent's client side without a word."""
    from cflpipe.methods.fedavg import FedAvg

    with pytest.raises(TypeError, match=r"defines plan\(\), a hook cflpipe no longer calls: write the client side"):
        type("OldStyle", (FedAvg,), {"__module__": __name__, "plan": lambda self, client, payload: None})


class Declared(HyperParams):
    steps: int = 1


def _where(qualname: str) -> str:
    return f"{__name__}:{qualname}"


def test_a_declared_class_takes_its_capabilities_from_the_declaration(registry_copy):
    from cflpipe.methods.fedavg import FedAvg

    declare("declared_x", Declared, _where("Impl"), Capabilities(personalized=True),
            description="X: a declared method.", variants=(("declared_x_more", HyperParams, "more"),), family="personalized", variant_family="modifier")
    assert registry.METHODS["declared_x_more"].description == "X + more: a declared method."
    assert (registry.METHODS["declared_x"].family, registry.METHODS["declared_x_more"].family) == \
        ("personalized", "modifier")
    Impl = type("Impl", (FedAvg,), {"__module__": __name__, "__qualname__": "Impl"})  # bound as it is defined
    assert Impl.name == "declared_x" and Impl.capabilities == Capabilities(personalized=True)
    assert registry.METHODS["declared_x"].cls is Impl and registry.METHODS["declared_x_more"].cls is Impl


def test_a_declared_class_that_states_its_own_capabilities_is_refused(registry_copy):
    from cflpipe.methods.fedavg import FedAvg

    declare("declared_y", Declared, _where("Other"), description="Y: a declared method.", family="baseline")
    for own in ({"capabilities": Capabilities(clustered=True)}, {"name": "other"}):
        with pytest.raises(ValueError, match=f"sets {next(iter(own))!r}, which its declaration"):
            type("Other", (FedAvg,), {"__module__": __name__, "__qualname__": "Other", **own})


def test_a_declared_method_whose_module_registers_nothing_says_so(registry_copy):
    declare("declared_z", Declared, "cflpipe.seeds:Nothing", description="Z: nothing.", family="baseline")
    with pytest.raises(ImportError, match="cflpipe.seeds defines no method class Nothing for method 'declared_z'"):
        registry.METHODS["declared_z"].cls


def test_a_plugin_subclass_of_fcca_gets_its_variants_under_its_own_name(registry_copy):
    from cflpipe.methods.fcca_params import FCCAParams
    from cflpipe.methods.fcca import FCCA

    Sub = type("Sub", (FCCA,), {"__module__": __name__, "__qualname__": "Sub", "__doc__": "Sub: an FCCA."})
    register("fcca_sub", FCCAParams)(Sub)
    variants = {name: info for name, info in registry.METHODS.items() if info.base == "fcca_sub"}
    assert set(variants) == {"fcca_sub_per", "fcca_sub_prox", "fcca_sub_per_prox"}
    per, prox, both = (variants[f"fcca_sub_{v}"].params() for v in ("per", "prox", "per_prox"))
    assert (per.personal, per.mu) == (True, 0.0) and (prox.personal, prox.mu) == (False, 0.01)
    assert (both.personal, both.mu) == (True, 0.01)
    assert all(info.cls is Sub for info in variants.values())


def test_fcca_variants_keep_their_defaults_over_a_plugins_own_parameters(registry_copy):
    """A plugin's parameters that subclass FCCA's inherit FCCA's personal=False and mu=0; the
    variant's own defaults must still win, or each variant would train as plain FCCA."""
    from cflpipe.methods.fcca_params import FCCAParams
    from cflpipe.methods.fcca import FCCA

    SubParams = type("SubParams", (FCCAParams,), {"__annotations__": {"knob": int}, "knob": 3})
    Sub = type("Sub", (FCCA,), {"__module__": __name__, "__qualname__": "Sub", "__doc__": "Sub: an FCCA."})
    register("fcca_own", SubParams)(Sub)
    per, prox, both = (registry.METHODS[f"fcca_own_{v}"].params() for v in ("per", "prox", "per_prox"))
    assert (per.personal, per.mu, prox.personal, prox.mu, both.personal, both.mu) == (True, 0.0, False, 0.01, True, 0.01)
    assert per.knob == prox.knob == both.knob == 3


def test_a_methods_family_is_declared_once_or_read_from_a_plugins_capabilities(registry_copy):
    """`cflpipe methods` and the report group by the declared family; a plugin's class declares
    none and gets one from its capabilities; a family outside registry.FAMILIES is refused."""
    from cflpipe.registry import all_methods
    from cflpipe.methods.fedavg import FedAvg

    declared = all_methods()
    assert {declared[n].family for n in ("fcca", "fcca_per", "awcfl", "fesem")} == {"seed"}
    assert (declared["ifca"].family, declared["ifca_mcfl"].family, declared["oracle"].family) == \
        ("clustered", "modifier", "reference")
    Plugin = type("Plugin", (FedAvg,), {"__module__": __name__, "__qualname__": "Plugin",
                                        "capabilities": Capabilities(clustered=True)})
    register("plugin_family", Declared)(Plugin)
    assert registry.METHODS["plugin_family"].family == "clustered"
    from cflpipe.methods.ifca_params import IFCAParams
    from cflpipe.methods.ifca import IFCA

    Mine = type("Mine", (IFCA,), {"__module__": __name__, "__qualname__": "Mine"})
    register("plugin_ifca", IFCAParams)(Mine)
    assert (registry.METHODS["plugin_ifca"].family, registry.METHODS["plugin_ifca_awcfl"].family) == \
        ("clustered", "modifier")  # its AWCFL/MCFL options listed with the built-ins' modifiers
    with pytest.raises(ValueError, match="family 'novel' is none of reference, baseline"):
        declare("declared_w", Declared, _where("W"), description="W: a method.", family="novel")


def test_a_built_in_is_described_by_its_class_docstring_read_without_importing_it():
    """Stated once, beside the method: `cflpipe methods` shows the class docstring's first
    paragraph, and listing or validating imports no method module (nor torch)."""
    import inspect
    import subprocess
    import sys

    from cflpipe.registry import DECLARED, first_paragraph

    for name, info in DECLARED.items():
        if info.base is None:
            assert info.description == first_paragraph(inspect.getdoc(info.cls)), name
    code = ("import sys; import cflpipe.methods.catalog; from cflpipe.registry import DECLARED; "
            "print(len({info.description for info in DECLARED.values()})); "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'cflpipe.methods.'))"
            " and not m.endswith('_params')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == [str(len(DECLARED)), "['cflpipe.methods.catalog']"]
