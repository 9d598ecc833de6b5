"""Each spec file owns its results folder (issue #14, item 8): a spec without `results_dir`
writes to results/<file name>, so a second spec never replaces the first one's report; and a
report covers its own spec's runs only, saying which spec and folder those are."""

from __future__ import annotations

import pandas as pd
import torch
import yaml

from cflpipe.cli import main
from cflpipe.spec import load_spec, parse_spec, spec_sha256

from conftest import ROOT

SPEC = {
    "seeds": [0],
    "training": {"model": "mlp", "rounds": 2, "clients_per_round": 2, "local_steps": 1, "batch_size": 16,
                 "eval_every": 1, "device": "cpu"},
    "scenarios": {"swap": {"dataset": "digits", "clients": 4,
                           "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
    "methods": {"fedavg": {}},
}


def write(path, data) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def test_a_spec_file_without_results_dir_writes_to_results_slash_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "specs").mkdir()
    first = load_spec(write(tmp_path / "specs/first.yaml", SPEC))
    second = load_spec(write(tmp_path / "specs/second.yaml", SPEC))
    assert first.results_dir == "results/first" and second.results_dir == "results/second"
    assert first.run_dir("swap", "fedavg", 0) != second.run_dir("swap", "fedavg", 0)
    given = load_spec(write(tmp_path / "specs/third.yaml", {**SPEC, "results_dir": "elsewhere"}))
    assert given.results_dir == "elsewhere"
    # The folder is where a spec keeps its files, not part of the experiment: one hash.
    assert spec_sha256(first) == spec_sha256(second) == spec_sha256(given)
    assert parse_spec(SPEC).results_dir == "results"  # a spec built in code (tests, bench)


def test_the_default_spec_keeps_results():
    assert load_spec(ROOT / "config/config.yaml").results_dir == "results"
    for path in sorted((ROOT / "config/experiments").glob("*.yaml")):  # each names its own folder
        assert yaml.safe_load(path.read_text())["results_dir"].startswith("results/"), path


def test_two_specs_in_one_folder_report_apart(tmp_path, monkeypatch, capsys):
    """Two specs sharing a scenario name: each report shows its own runs and names its spec; a
    third spec pointed at the first one's folder adds runs there, and the first spec's aggregate
    still holds only its own."""
    monkeypatch.chdir(tmp_path)
    first = write(tmp_path / "first.yaml", SPEC)
    second = write(tmp_path / "second.yaml", {**SPEC, "methods": {"local": {}}})
    shared = write(tmp_path / "shared.yaml", {**SPEC, "methods": {"fedavg": {}, "oracle": {}},
                                              "results_dir": "results/first"})
    threads = torch.get_num_threads()
    try:
        for config, methods in ((first, ["fedavg"]), (second, ["local"]), (shared, ["oracle"])):
            assert main(["partition", "--config", config, "--scenario", "swap"]) == 0
            for method in methods:
                assert main(["train", "--config", config, "--scenario", "swap", "--method", method,
                             "--seed", "0", "--quiet"]) == 0
        for config in (first, second):
            assert main(["aggregate", "--config", config]) == 0
            assert main(["report", "--config", config]) == 0
    finally:
        torch.set_num_threads(threads)
    capsys.readouterr()
    for config, name, method in ((first, "first", "fedavg"), (second, "second", "local")):
        runs = pd.read_parquet(tmp_path / "results" / name / "aggregate/runs.parquet")
        assert runs["method"].tolist() == [method]  # not the oracle run the shared spec put there
        html = (tmp_path / "results" / name / "report/index.html").read_text()
        # the spec as the report shows it: relative to the working directory (tmp_path here)
        assert f"Spec <code>{name}.yaml</code>" in html and f"<code>results/{name}/</code>" in html
    assert (tmp_path / "results/first/runs/swap/oracle/seed0/summary.json").is_file()
