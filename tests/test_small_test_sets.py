"""Clients with tiny test sets (issue #14, item 14): their accuracies move in coarse steps, so
`cflpipe partition` warns and the report's scenario overview says so."""

from __future__ import annotations

import pandas as pd
import torch
import yaml

from cflpipe.cli import main
from cflpipe.partition import SMALL_TEST_SET, small_test_sets


def test_the_note_counts_the_small_clients_and_names_the_fewest():
    assert small_test_sets(pd.DataFrame({"n_test": [SMALL_TEST_SET, 40, 12]})) is None
    note = small_test_sets(pd.DataFrame({"n_test": [4, 9, 10, 40]}))
    assert note.startswith("2 of 4 clients have fewer than 10 test samples (fewest: 4, one sample is 25 % of "
                           "that client's accuracy)")
    assert "(fewest: 0 (no accuracy at all" in small_test_sets(pd.DataFrame({"n_test": [0, 30]}))


def test_partition_warns_and_the_report_says_it(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    spec = {"seeds": [0], "results_dir": "results",
            "training": {"model": "mlp", "rounds": 1, "clients_per_round": 2, "local_steps": 1, "eval_every": 1,
                         "device": "cpu"},
            # 1,797 digits over 100 clients: 18 samples each, 4 of them (0.2) held out for testing
            "scenarios": {"many": {"dataset": "digits", "clients": 100}},
            "methods": {"fedavg": {}}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    threads = torch.get_num_threads()
    try:
        assert main(["partition", "--config", "spec.yaml", "--scenario", "many"]) == 0
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith("warning: scenarios.many: 100 of 100 clients have fewer than "
                                                   "10 test samples (fewest: ")
        for command in (["train", "--scenario", "many", "--method", "fedavg", "--seed", "0", "--quiet"],
                        ["aggregate"], ["report"]):
            assert main([*command[:1], "--config", "spec.yaml", *command[1:]]) == 0
    finally:
        torch.set_num_threads(threads)
    html = (tmp_path / "results/report/index.html").read_text()
    assert "100 of 100 clients have fewer than 10 test samples" in html


def test_a_user_level_split_counts_only_the_held_out_clients():
    # training users hold no test samples by design; the held-out users are the ones tested
    stats = pd.DataFrame({"n_train": [50, 60, 0, 0], "n_test": [0, 0, 40, 12]})
    assert small_test_sets(stats) is None
    note = small_test_sets(stats.assign(n_test=[0, 0, 40, 3]))
    assert note.startswith("1 of 2 clients have fewer than 10 test samples (fewest: 3")
