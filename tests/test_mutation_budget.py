"""The mutation-run hook of tests/conftest.py: under mutmut it keeps a mutant's fastest tests up to
a time budget, quickest first but grouped by file; in any other run it changes nothing."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conftest import pytest_collection_modifyitems


def run_hook(tmp_path, monkeypatch, mutant: str | None, budget: str | None = None):
    durations = {"tests/test_a.py::slow": 4.0, "tests/test_a.py::quick": 0.1, "tests/test_b.py::mid": 1.0,
                 "tests/test_b.py::huge": 30.0, "tests/test_c.py::new": None}
    (tmp_path / "mutmut-stats.json").write_text(json.dumps(
        {"duration_by_test": {k: v for k, v in durations.items() if v is not None}}))
    monkeypatch.chdir(tmp_path)
    if mutant is None:
        monkeypatch.delenv("MUTANT_UNDER_TEST", raising=False)
    else:
        monkeypatch.setenv("MUTANT_UNDER_TEST", mutant)
    if budget is not None:
        monkeypatch.setenv("CFLPIPE_MUTATION_TEST_SECONDS", budget)
    deselected = []
    config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)))
    items = [SimpleNamespace(nodeid=nodeid) for nodeid in durations]
    pytest_collection_modifyitems(config, items)
    return [i.nodeid for i in items], [i.nodeid for i in deselected]


def test_a_mutant_runs_its_fastest_tests_within_the_budget_grouped_by_file(tmp_path, monkeypatch):
    kept, dropped = run_hook(tmp_path, monkeypatch, "cflpipe.metrics.x_f__mutmut_3")
    # 0.1 + 1.0 + 4.0 = 5.1 > 5: the fastest two fit; test_a's file runs first (its fastest is quickest)
    assert kept == ["tests/test_a.py::quick", "tests/test_b.py::mid"]
    assert sorted(dropped) == ["tests/test_a.py::slow", "tests/test_b.py::huge", "tests/test_c.py::new"]
    kept, _ = run_hook(tmp_path, monkeypatch, "cflpipe.metrics.x_f__mutmut_3", budget="6")
    assert kept == ["tests/test_a.py::quick", "tests/test_a.py::slow", "tests/test_b.py::mid"]  # by file
    kept, _ = run_hook(tmp_path, monkeypatch, "cflpipe.metrics.x_f__mutmut_3", budget="0")
    assert kept == ["tests/test_a.py::quick"]  # at least one test


def test_outside_a_mutant_run_nothing_changes(tmp_path, monkeypatch):
    everything = ["tests/test_a.py::slow", "tests/test_a.py::quick", "tests/test_b.py::mid", "tests/test_b.py::huge",
                  "tests/test_c.py::new"]
    for mutant in (None, "stats", "fail", "list_all_tests"):
        assert run_hook(tmp_path, monkeypatch, mutant, budget="not a number") == (everything, [])
