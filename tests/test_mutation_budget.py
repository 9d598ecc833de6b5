"""The mutation-run hook of tests/conftest.py: under mutmut it keeps a mutant's fastest tests up to
a time budget, quickest first but grouped by file; in any other run it changes nothing."""

from __future__ import annotations

import json
from types import SimpleNamespace

from conftest import pytest_collection_modifyitems


DURATIONS = {"tests/test_a.py::slow": 4.0, "tests/test_a.py::quick": 0.1, "tests/test_b.py::mid": 1.0,
             "tests/test_b.py::huge": 30.0, "tests/test_c.py::new": None}


def run_hook(tmp_path, monkeypatch, mutant: str | None, budget: str | None = None, durations=DURATIONS,
             fixtures: dict | None = None):
    import conftest

    limits = []
    monkeypatch.setattr(conftest, "_limit_cpu_seconds", limits.append)  # never on the test runner itself
    (tmp_path / "mutmut-stats.json").write_text(json.dumps(
        {"duration_by_test": {k: v for k, v in durations.items() if v is not None}}))
    (tmp_path / "mutmut-fixture-seconds.json").unlink(missing_ok=True)
    if fixtures is not None:
        (tmp_path / "mutmut-fixture-seconds.json").write_text(json.dumps(fixtures))
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


def test_fixture_set_up_counts_once_per_file_and_for_its_first_test(tmp_path, monkeypatch):
    durations = {"tests/test_e.py::a": 0.1, "tests/test_e.py::b": 0.1, "tests/test_u.py::x": 0.5,
                 "tests/test_u.py::y": 2.0, "tests/test_v.py::own": 0.2}
    # test_e's tests share a module fixture that trains for 3 s; test_v's test builds 3 s of its own
    fixtures = {"shared": {"tests/test_e.py::finished_runs": 3.0, "session::tiny": 60.0},
                "uses": {"tests/test_e.py::a": ["tests/test_e.py::finished_runs"],
                         "tests/test_e.py::b": ["tests/test_e.py::finished_runs"]},
                "own": {"tests/test_v.py::own": 3.0}}
    kept, _ = run_hook(tmp_path, monkeypatch, "m__mutmut_1", budget="3", durations=durations, fixtures=fixtures)
    assert kept == ["tests/test_u.py::x", "tests/test_u.py::y"]  # the 0.1 s tests cost 3.1 s with their fixture
    kept, _ = run_hook(tmp_path, monkeypatch, "m__mutmut_1", budget="5.75", durations=durations, fixtures=fixtures)
    # the fixture is paid once: after test_e's first test (3.1 s), its second costs 0.1 s
    assert kept == ["tests/test_u.py::x", "tests/test_u.py::y", "tests/test_e.py::a", "tests/test_e.py::b"]
    kept, _ = run_hook(tmp_path, monkeypatch, "m__mutmut_1", budget="6", durations=durations, fixtures=fixtures)
    assert kept == ["tests/test_u.py::x", "tests/test_u.py::y", "tests/test_e.py::a", "tests/test_e.py::b"]
    kept, _ = run_hook(tmp_path, monkeypatch, "m__mutmut_1", budget="9.5", durations=durations, fixtures=fixtures)
    assert kept == ["tests/test_u.py::x", "tests/test_u.py::y", "tests/test_e.py::a", "tests/test_e.py::b",
                    "tests/test_v.py::own"]
    kept, _ = run_hook(tmp_path, monkeypatch, "m__mutmut_1", budget="5", durations=durations)
    # without fixture times (a stats phase before this hook), calls alone
    assert kept == ["tests/test_e.py::a", "tests/test_e.py::b", "tests/test_v.py::own", "tests/test_u.py::x",
                    "tests/test_u.py::y"]


def test_a_mutant_worker_gets_a_cpu_limit_from_the_tests_it_runs(tmp_path):
    """In a worker (a child process here), the hook lowers RLIMIT_CPU to a multiple of the kept
    tests' cost, so an endless-loop mutant stops in seconds rather than mutmut's minutes."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "mutmut-stats.json").write_text(json.dumps({"duration_by_test": {"tests/test_a.py::quick": 0.5}}))
    child = f"""
import resource, sys
from types import SimpleNamespace
sys.path.insert(0, {str(Path(__file__).parent)!r})
hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
resource.setrlimit(resource.RLIMIT_CPU, (600 if hard == resource.RLIM_INFINITY else min(600, hard), hard))  # as mutmut
from conftest import pytest_collection_modifyitems, mutant_cpu_limit
config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: None))
used = sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
pytest_collection_modifyitems(config, [SimpleNamespace(nodeid="tests/test_a.py::quick")])
soft, _ = resource.getrlimit(resource.RLIMIT_CPU)
print(soft - used, mutant_cpu_limit(0.5))
"""
    out = subprocess.run([sys.executable, "-c", child], cwd=tmp_path, capture_output=True, text=True, check=True,
                         env={"MUTANT_UNDER_TEST": "cflpipe.x_f__mutmut_1", "PATH": "/usr/bin:/bin"}).stdout.split()
    granted, expected = float(out[0]), float(out[1])
    assert expected == 12.0 and expected <= granted <= expected + 2, out


def test_every_reviewed_survivor_names_a_function_that_exists():
    """benchmarks/mutation_report.py's reasons are kept by mutmut's function name: one that names a
    function no longer in the package (removed, or moved to another module) is a reason for nothing."""
    import ast
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    try:
        from mutation_report import REASONS
    finally:
        sys.path.remove(str(root / "benchmarks"))
    missing = []
    for key in REASONS:
        module, _, mangled = key.rpartition(".")
        name = mangled.split("ǁ")[1:] if mangled.startswith("xǁ") else [mangled[2:]]
        path = root / (module.replace(".", "/") + ".py")
        if not path.exists():
            path = root / module.replace(".", "/") / "__init__.py"
        node = ast.parse(path.read_text(encoding="utf-8")) if path.exists() else None
        for part in name:
            node = next((n for n in getattr(node, "body", []) if getattr(n, "name", None) == part), None)
        if node is None:
            missing.append(key)
    assert not missing, f"reasons for functions that do not exist: {missing}"
