"""Sweeps: `sweep:` on a method entry expands at spec load into ordinary, named entries that are
identical to the same entries written by hand, and every mistake is one line at its YAML path."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest

from cflpipe.errors import SpecError
from cflpipe.spec import MAX_SWEEP_ENTRIES, parse_spec, spec_sha256

BASE = {
    "seeds": [0],
    "training": {"model": "mlp", "rounds": 4, "clients_per_round": 4},
    "scenarios": {"swap": {"dataset": "digits", "clients": 8,
                           "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
    "methods": {
        "fedavg": {},
        "awcfl": {"label": "AWCFL", "clusters": 2, "training": {"lr": 0.1}, "sweep": {"beta": [0, 0.5, 1]}},
        "km": {"method": "kmeans_cfl", "sweep": {"clusters": {"from": 2, "to": 4}, "n_init": [1, 10]}},
        "prox": {"method": "fedprox", "mu": 0.1},
    },
}


def with_methods(**changes) -> dict:
    data = copy.deepcopy(BASE)
    for name, entry in changes.items():
        if entry is None:
            del data["methods"][name]
        else:
            data["methods"][name] = entry
    return data


def error_of(data) -> str:
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    return str(info.value)


def test_a_sweep_expands_in_place_into_named_labelled_entries():
    spec = parse_spec(BASE)
    assert list(spec.methods) == [
        "fedavg", "awcfl-beta0", "awcfl-beta0p5", "awcfl-beta1",
        "km-clusters2-n_init1", "km-clusters2-n_init10", "km-clusters3-n_init1", "km-clusters3-n_init10",
        "km-clusters4-n_init1", "km-clusters4-n_init10", "prox"]
    entry = spec.methods["awcfl-beta0p5"]
    assert (spec.method_type("awcfl-beta0p5"), entry.hyperparams, entry.training) == \
        ("awcfl", {"clusters": 2, "beta": 0.5}, {"lr": 0.1})
    assert spec.method_label("awcfl-beta0p5") == "AWCFL (beta=0.5)"
    assert spec.method_label("km-clusters3-n_init10") == "km (clusters=3, n_init=10)"  # no label: the name
    assert spec.method_type("km-clusters3-n_init10") == "kmeans_cfl"
    assert spec.method_entry("awcfl-beta1") == "awcfl" and spec.method_entry("prox") == "prox"
    assert [m for s, m, k in spec.matrix()] == list(spec.methods)


def test_expanded_entries_are_the_entries_written_by_hand():
    """Same spec hash, same run configs (what makes Snakemake, DVC and `train` skip a finished run):
    switching between a sweep and its entries written out re-trains nothing."""
    from cflpipe.fl.runs import resolved_config

    swept = parse_spec(BASE)
    by_hand = copy.deepcopy(BASE)
    by_hand["methods"] = {"fedavg": {}}
    for beta in (0, 0.5, 1):
        by_hand["methods"][f"awcfl-beta{str(beta).replace('.', 'p')}"] = {
            "method": "awcfl", "clusters": 2, "beta": beta, "training": {"lr": 0.1}}
    for k in (2, 3, 4):
        for n in (1, 10):
            by_hand["methods"][f"km-clusters{k}-n_init{n}"] = {"method": "kmeans_cfl", "clusters": k, "n_init": n}
    by_hand["methods"]["prox"] = {"method": "fedprox", "mu": 0.1}
    written = parse_spec(by_hand)
    assert list(written.methods) == list(swept.methods)
    assert spec_sha256(written) == spec_sha256(swept)  # labels are cosmetic: not hashed
    for method in swept.methods:
        assert resolved_config(written, "swap", method, 0) == resolved_config(swept, "swap", method, 0)


def test_the_report_finds_the_expanded_entries_as_sweeps():
    from cflpipe.registry import resolved_hyperparams
    from cflpipe.report.build import find_sweeps

    spec = parse_spec(BASE)
    summary = pd.DataFrame([
        {"scenario": "swap", "method": m, "method_type": spec.method_type(m),
         "hyperparams": json.dumps(resolved_hyperparams(spec, "swap", m).model_dump(mode="json"))}
        for m in spec.methods])
    found = {(s.method_type, s.param, s.methods) for s in find_sweeps(summary, spec)}
    assert ("awcfl", "beta", ("awcfl-beta0", "awcfl-beta0p5", "awcfl-beta1")) in found
    # a grid: a K sweep at every n_init, an n_init sweep at every K
    assert ("kmeans_cfl", "clusters", ("km-clusters2-n_init1", "km-clusters3-n_init1", "km-clusters4-n_init1")) in found
    assert ("kmeans_cfl", "n_init", ("km-clusters4-n_init1", "km-clusters4-n_init10")) in found
    assert len(found) == 1 + 2 + 3


@pytest.mark.parametrize("values, names", [
    ([-1, 0.25, 1e-05, 2.5e20], ["p-betam1", "p-beta0p25", "p-beta1e-05", "p-beta2p5e20"]),
    ([True, False, None], ["p-betatrue", "p-betafalse", "p-betanone"]),
    (["LrCos", "l2"], ["p-betalrcos", "p-betal2"]),
])
def test_swept_values_become_valid_entry_names(values, names):
    data = with_methods(awcfl=None, km=None, p={"method": "fedprox", "sweep": {"beta": values}})
    from cflpipe.spec import expand_sweeps

    expanded, origins = expand_sweeps(data)
    assert [n for n in expanded["methods"] if n.startswith("p-")] == names
    assert all(origins[n].entry == "p" for n in names)


@pytest.mark.parametrize("change, line", [
    ({"awcfl": {"sweep": {"beta": [0, 2, 0.5]}}}, "methods.awcfl.sweep.beta: must be <= 1, got 2"),
    ({"awcfl": {"sweep": {"bta": [0, 1]}}},
     "methods.awcfl.sweep.bta: unknown key; allowed: beta, clusters, cluster_start, n_init, kmeans_start"),
    ({"awcfl": {"sweep": {"beta": [1, 1.0]}}}, "methods.awcfl.sweep.beta: values must be distinct, got 1 and 1.0"),
    # one label for both: reported at the values, not at a label the spec does not write
    ({"fedprox": {"sweep": {"mu": [0.1, "0.1"]}}}, "methods.fedprox.sweep.mu: values must be distinct, got 0.1 and '0.1'"),
    ({"fedprox": {"sweep": {"mu": [None, "null"]}}},
     "methods.fedprox.sweep.mu: values must be distinct, got null and 'null'"),
    ({"awcfl": {"sweep": {"beta": []}}},
     "methods.awcfl.sweep.beta: must be a non-empty list of values or a range {from: A, to: B, step: S}, got []"),
    ({"awcfl": {"sweep": [0, 1]}},
     "methods.awcfl.sweep: must be a mapping of hyper-parameter to values, e.g. {beta: [0, 0.5, 1]}, got [0, 1]"),
    ({"awcfl": {"sweep": {"beta": [[0, 1]]}}},
     "methods.awcfl.sweep.beta[0]: a swept value must be a number, a string, true/false or null (it names an "
     "entry), got [0, 1]"),
    ({"awcfl": {"beta": 0.3, "sweep": {"beta": [0, 1]}}},
     "methods.awcfl.beta: also swept in methods.awcfl.sweep.beta; give it in one place"),
    ({"awcfl": {"sweep": {"training": [1]}}},
     "methods.awcfl.sweep.training: a sweep varies hyper-parameters of the method (training is not a "
     "hyper-parameter); `cflpipe methods` lists them"),
    ({"awcfl": {"sweep": {"beta": [0, 1]}, "training": {"lr": -1}}}, "methods.awcfl.training.lr: must be > 0, got -1"),
    ({"awcfl": {"sweep": {"beta": [0, 1]}, "scenarios": ["nope"]}},
     "methods.awcfl.scenarios[0]: unknown scenario 'nope'; allowed: swap"),
    ({"awcfl": {"sweep": {"beta": [0, float("inf")]}}}, "methods.awcfl.sweep.beta[1]: must be a finite number, got inf"),
    ({"awcfl-beta0": {"method": "awcfl"}},
     "methods.awcfl.sweep: expands to the entry name 'awcfl-beta0', which methods.awcfl-beta0 gives too; rename "
     "one of the two"),
    ({"km": {"method": "kmeans_cfl", "sweep": {"clusters": {"from": 2, "to": 9}}}},
     "methods.km.sweep.clusters: must be <= clients of scenario swap (8), got 9"),
    ({"km": {"method": "kmeans_cfl", "sweep": {"clusters": {"from": 4, "to": 2}}}},
     "methods.km.sweep.clusters.to: must be >= from (4), got 2"),
    ({"km": {"method": "kmeans_cfl", "sweep": {"clusters": {"from": 2, "to": 4, "by": 1}}}},
     "methods.km.sweep.clusters.by: unknown key; allowed: from, to, step"),
    ({"km": {"method": "kmeans_cfl", "sweep": {"clusters": {"from": 2.5, "to": 4}}}},
     "methods.km.sweep.clusters.from: must be an integer, got 2.5"),
    ({"km": {"method": "kmeans_cfl", "sweep": {"clusters": {"from": 1, "to": 10**6}}}},
     f"methods.km.sweep.clusters: a range of {10**6} values; a sweep has at most {MAX_SWEEP_ENTRIES} entries"),
    ({"km": {"method": "kmeans_cfl", "sweep": {"clusters": {"from": 1, "to": 100}, "n_init": {"from": 1, "to": 20}}}},
     f"methods.km.sweep: expands to 2000 entries; a sweep has at most {MAX_SWEEP_ENTRIES}"),
    ({"awcfl": {"label": "A" * 75, "sweep": {"beta": [0.5]}}},
     f"methods.awcfl.label: with the swept values appended, '{'A' * 75} (beta=0.5)' is longer than 80 "
     f"characters; shorten the label"),
])
def test_sweep_mistakes_are_one_line_at_the_spec_files_path(change, line):
    assert error_of(with_methods(**change)) == line


def test_an_unknown_method_type_is_reported_where_the_sweeping_entry_gives_it():
    from cflpipe.registry import method_names

    allowed = f"allowed: {', '.join(method_names())} (or a module:Class reference)"
    # no `method:`: the entry's name is the type, as for an entry without a sweep
    assert error_of(with_methods(**{"cfl-x": {"sweep": {"beta": [0, 1]}}})) == \
        f"methods.cfl-x: unknown method 'cfl-x'; {allowed}"
    assert error_of(with_methods(**{"cfl-x": {"method": "cflx", "sweep": {"beta": [0, 1]}}})) == \
        f"methods.cfl-x.method: unknown method 'cflx'; {allowed}"


def test_a_sweep_of_an_entry_with_a_bad_name_is_reported_at_that_name():
    data = with_methods(awcfl=None, AWCFL={"method": "awcfl", "sweep": {"beta": [0, 1]}})
    assert error_of(data).startswith("methods: name 'AWCFL' must match")


def test_dvc_tracks_the_sweeping_entry_as_the_param_of_its_expanded_jobs(tmp_path, monkeypatch):
    import yaml

    from cflpipe import dvcgen

    monkeypatch.chdir(tmp_path)
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({**BASE, "workflow": {"train_jobs": "method"}}, sort_keys=False))
    jobs = dvcgen.dvc_runs("spec.yaml")["jobs"]
    assert jobs["swap.awcfl-beta0p5"] == {"scenario": "swap", "methods": "awcfl-beta0p5", "runs": "swap/awcfl-beta0p5",
                                          "param": "methods.awcfl", "seeds": "0"}
    assert jobs["swap.prox"]["param"] == "methods.prox"
    # One stage per scenario (the default) runs the expanded entries and tracks every method entry.
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(BASE, sort_keys=False))
    (scenario,) = dvcgen.dvc_runs("spec.yaml")["jobs"].values()
    assert "awcfl-beta0p5" in scenario["methods"].split() and scenario["param"] == "methods"
