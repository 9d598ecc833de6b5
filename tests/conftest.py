"""Shared fixtures of the workflow tests: a tiny spec and one Snakemake run of it per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

# trainer: auto keeps what it measures per machine: the tests' choices live and die with the
# session (the runs and subprocesses it starts inherit the variable), never in the user's cache.
if "CFLPIPE_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["CFLPIPE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cflpipe-test-cache-")
# A run keeps its choices in its results folder, and many tests compare the runs of two folders:
# one record for the session, so that they never measure apart (tests/test_trainers.py, which
# checks the results' own record, unsets it).
if "CFLPIPE_TRAINER_CHOICES" not in os.environ:
    import tempfile

    os.environ["CFLPIPE_TRAINER_CHOICES"] = os.path.join(tempfile.mkdtemp(prefix="cflpipe-test-choices-"),
                                                         "trainer-choices.json")

# Seconds, not minutes: 1 scenario of 4 digits clients, 2 methods, 1 seed, 2 rounds of an MLP.
TINY_SPEC = {
    "description": "tiny end-to-end spec of the workflow tests",
    "seeds": [0],
    "training": {"model": "mlp", "rounds": 2, "clients_per_round": 2, "local_steps": 2, "batch_size": 16,
                 "eval_every": 1, "checkpoint_every": 1},
    "scenarios": {"swap": {"dataset": "digits", "clients": 4,
                           "partition": [{"kind": "iid"}, {"kind": "label_swap", "groups": 2}]}},
    "methods": {"fedavg": {}, "fedprox": {"mu": 0.1}},
}
TINY_RUNS = [("swap", "fedavg", 0), ("swap", "fedprox", 0)]

PLUGIN = "cflpipe-plugin-example"


def require_plugin() -> None:
    """Skip a test that needs the example plugin package where it is not installed; under CI=true
    fail instead (.ci/run installs it, so a skip there would hide a broken install)."""
    from importlib import metadata

    try:
        metadata.distribution(PLUGIN)
    except metadata.PackageNotFoundError:
        message = f"{PLUGIN} is not installed (python3 -m pip install -e examples/{PLUGIN})"
        if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
            pytest.fail(f"{message}; CI=true, where the plugin tests must run, not skip")
        pytest.skip(message)


def write_spec(path: Path, spec: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec or TINY_SPEC, sort_keys=False))
    return path


def validate_refuses(tmp_path: Path, spec: dict) -> str:
    """`cflpipe validate` on `spec` (written under tmp_path): it must fail and leave no results
    folder; its last line on stderr (the one that names the field)."""
    out = subprocess.run([sys.executable, "-m", "cflpipe", "validate", "--config",
                          str(write_spec(tmp_path / "spec.yaml", spec))], capture_output=True, text=True)
    assert out.returncode != 0 and not (tmp_path / "results").exists()
    return out.stderr.strip().splitlines()[-1]


def run(cmd: list[str], cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a command; stdout and stderr together in `.stdout`."""
    return subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def snakemake(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """The repository's Snakefile with `cwd` as working directory (so .snakemake/ and the results
    of a test never touch the checkout)."""
    exe = shutil.which("snakemake")
    if exe is None:
        pytest.skip("snakemake is not installed")
    return run([exe, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(cwd), *args], cwd,
               timeout, env)


@dataclass
class WorkflowRun:
    workdir: Path
    spec: Path
    results: Path
    first: subprocess.CompletedProcess
    second: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def tiny_snakemake_run(tmp_path_factory) -> WorkflowRun:
    """`snakemake --cores 2 --configfile tiny.yaml` twice in a fresh working directory."""
    workdir = tmp_path_factory.mktemp("snakemake")
    spec = write_spec(workdir / "tiny.yaml")
    first = snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=workdir)
    second = snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=workdir)
    return WorkflowRun(workdir, spec, workdir / "results/tiny", first, second)  # results/<spec file name>


@pytest.fixture
def registry_copy(monkeypatch, tmp_path):
    """The method registry's tables as copies, and the method modules first imported during the
    test forgotten afterwards: a module imported while the tables were copies would otherwise stay
    imported with its classes bound only in the discarded copies, and a later test in the same
    process would find its method missing."""
    from cflpipe import plugins, registry

    registry._load_all()
    import cflpipe.methods.fedavg  # noqa: F401  (bound outside the copies: tests subclass FedAvg and IFCA)
    import cflpipe.methods.ifca  # noqa: F401

    imported = set(sys.modules)
    monkeypatch.setattr(registry, "METHODS", dict(registry.METHODS))
    monkeypatch.setattr(registry, "DECLARED", dict(registry.DECLARED))
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
    monkeypatch.setattr(registry, "_PLUGINS_LOADED", False)
    monkeypatch.setattr(registry, "_PLUGIN_FAILURES", [])
    yield registry
    for name in set(sys.modules) - imported:
        module = sys.modules[name]
        where = str(getattr(module, "__file__", "") or "")
        if name.startswith(("cflpipe.methods.", "cflpipe_plugin_example")) or where.startswith(str(tmp_path)):
            del sys.modules[name]
    plugins._entry_points.cache_clear()


@pytest.fixture
def record_start_rounds(monkeypatch):
    """Call it to record, from then on, the round every engine run starts at (a resumed run
    starts after its checkpoint)."""
    from cflpipe.fl import engine

    def install() -> list[int]:
        started: list[int] = []
        execute = engine.Run.execute

        def record(self, resume, progress):
            out = execute(self, resume, progress)
            started.append(self.start_round)
            return out

        monkeypatch.setattr(engine.Run, "execute", record)
        return started

    return install


FIXTURE_SECONDS = "mutmut-fixture-seconds.json"  # next to mutmut-stats.json, in mutants/
_fixture_seconds: dict = {"own": {}, "shared": {}, "uses": {}}


def _mutmut_phase() -> str:
    return os.environ.get("MUTANT_UNDER_TEST", "")


def _shared_fixture_key(item, scope: str, name: str) -> str:
    """One key per instance of a fixture wider than a test: a module-scoped fixture is built once
    per test file, a session-scoped one once per run."""
    if scope == "session":
        return f"session::{name}"
    if scope == "class" and getattr(item, "cls", None) is not None:
        return f"{item.nodeid.rsplit('::', 1)[0]}::{name}"
    return f"{item.nodeid.split('::')[0]}::{name}"  # module (and package: at most as often)


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """During mutmut's stats phase, time every fixture's set-up: mutmut times only a test's call,
    so a test whose fixture trains several runs would look quick and be run for every mutant."""
    if _mutmut_phase() != "stats":
        yield
        return
    import time

    start = time.perf_counter()
    yield
    seconds = time.perf_counter() - start
    item = getattr(request, "_pyfuncitem", None)
    if item is None:
        return
    if fixturedef.scope == "function":
        own = _fixture_seconds["own"]
        own[item.nodeid] = own.get(item.nodeid, 0.0) + seconds
    else:
        _fixture_seconds["shared"][_shared_fixture_key(item, fixturedef.scope, fixturedef.argname)] = seconds


def pytest_runtest_setup(item):
    if _mutmut_phase() != "stats":
        return
    info = getattr(item, "_fixtureinfo", None)
    uses = []
    for name in getattr(info, "names_closure", ()):
        definitions = info.name2fixturedefs.get(name)
        if definitions and definitions[-1].scope != "function":
            uses.append(_shared_fixture_key(item, definitions[-1].scope, name))
    _fixture_seconds["uses"][item.nodeid] = uses


def pytest_sessionfinish(session):
    """Merge this stats phase's fixture times into mutants/mutmut-fixture-seconds.json (mutmut
    re-runs the stats of changed functions' tests only, so earlier entries stay)."""
    if _mutmut_phase() != "stats" or not any(_fixture_seconds.values()):
        return
    import json

    path = Path(FIXTURE_SECONDS)
    merged = json.loads(path.read_text()) if path.is_file() else {"own": {}, "shared": {}, "uses": {}}
    for part, values in _fixture_seconds.items():
        merged.setdefault(part, {}).update(values)
    path.write_text(json.dumps(merged, sort_keys=True))


def pytest_collection_modifyitems(config, items):
    """Under a mutation run (mutmut names the mutant in MUTANT_UNDER_TEST), check the mutant
    against its cheapest tests only, up to CFLPIPE_MUTATION_TEST_SECONDS (5) of them
    (docs/testing.md). A test's cost is its call as timed in mutmut's stats phase, plus the
    set-up of its fixtures as timed then (mutants/mutmut-fixture-seconds.json); a fixture shared
    by a file's tests is paid by the first test kept from that file. Cheapest first: mutmut stops
    at the first failure, so a mutant that a unit test kills no longer waits for the end-to-end
    tests listed before it, and a survivor is not re-run through every end-to-end test that
    passes through its function. The kept tests stay grouped by file, so a module's fixtures are
    built once per mutant."""
    if "__mutmut_" not in _mutmut_phase():
        return
    stats = Path("mutmut-stats.json")  # mutmut runs the tests from inside mutants/
    if not stats.is_file():
        return
    import json
    import math

    budget = float(os.environ.get("CFLPIPE_MUTATION_TEST_SECONDS", "5"))
    calls = json.loads(stats.read_text())["duration_by_test"]
    fixtures_file = Path(FIXTURE_SECONDS)
    fixtures = json.loads(fixtures_file.read_text()) if fixtures_file.is_file() else {}
    own, shared, uses = fixtures.get("own", {}), fixtures.get("shared", {}), fixtures.get("uses", {})

    paid: set[str] = set()

    def cost(nodeid: str) -> float:
        if nodeid not in calls:
            return float("inf")
        return calls[nodeid] + own.get(nodeid, 0.0) + sum(shared.get(k, 0.0) for k in uses.get(nodeid, ())
                                                          if k not in paid)

    spent, picked = 0.0, []
    remaining = sorted({item.nodeid for item in items})
    while remaining:
        nodeid = min(remaining, key=cost)
        if picked and spent + cost(nodeid) > budget:
            break
        spent += cost(nodeid)
        paid.update(uses.get(nodeid, ()))
        picked.append(nodeid)
        remaining.remove(nodeid)
    order = {nodeid: rank for rank, nodeid in enumerate(picked)}
    file_rank: dict[str, int] = {}
    for nodeid in picked:
        file_rank.setdefault(nodeid.split("::")[0], order[nodeid])
    chosen = sorted((item for item in items if item.nodeid in order),
                    key=lambda item: (file_rank[item.nodeid.split("::")[0]], order[item.nodeid]))
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in order])
    items[:] = chosen
    if math.isfinite(spent):  # kept tests without stats: mutmut's own limit stays
        _limit_cpu_seconds(mutant_cpu_limit(spent))


# An endless-loop mutant is stopped after this many times the kept tests' cost, plus a constant
# for pytest's own work in the worker.
MUTANT_CPU_FACTOR, MUTANT_CPU_CONSTANT = 4.0, 10.0


def mutant_cpu_limit(kept_seconds: float) -> float:
    """CPU seconds a mutant's worker may use from the moment its tests are chosen. mutmut's own
    limit scales with every test that reaches the mutated function (222 CPU seconds for a
    partition helper that 187 tests reach), not with the few this hook keeps. The kept tests'
    times are wall-clock times of the stats phase; the test files train with one torch thread,
    so CPU time stays close to them."""
    return MUTANT_CPU_FACTOR * kept_seconds + MUTANT_CPU_CONSTANT


def _limit_cpu_seconds(seconds: float) -> None:
    """Lower this worker's CPU limit (mutmut set it with setrlimit; SIGXCPU is its timeout)."""
    import math
    import resource

    used = resource.getrusage(resource.RUSAGE_SELF)
    limit = math.ceil(used.ru_utime + used.ru_stime + seconds)
    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if soft == resource.RLIM_INFINITY or limit < soft:
        resource.setrlimit(resource.RLIMIT_CPU, (limit, hard))


def train_spec(spec) -> None:
    """Partition every scenario of `spec` and train its whole matrix in this process, one torch
    thread as the workflow's jobs (the bytes of a run depend on it)."""
    import torch

    from cflpipe.fl.data import partition_scenario
    from cflpipe.fl.engine import train_run

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for scenario in spec.scenarios:
            partition_scenario(spec, scenario)
        for scenario, method, seed in spec.matrix():
            train_run(spec, scenario, method, seed, progress=False)
    finally:
        torch.set_num_threads(threads)


class Killed(Exception):
    """A run stopped by die_after_saving, as a kill right after a checkpoint would stop it."""


def die_after_saving(patch, round_number: int) -> None:
    """Make every run raise Killed right after it saves round `round_number`'s checkpoint
    (`patch`: pytest's monkeypatch or one of its contexts)."""
    from cflpipe.fl import engine

    save = engine.Run.save_state

    def save_then_die(self, r):
        save(self, r)
        if r == round_number:
            raise Killed

    patch.setattr(engine.Run, "save_state", save_then_die)


def other_test_data(patch) -> None:
    """Every run's test split with shuffled labels and rescaled inputs: what a selection on
    validation data must not notice."""
    import torch

    from cflpipe.fl import runs

    build = runs.build_federated_data

    def shuffled(*args, **kwargs):
        data = build(*args, **kwargs)
        data.test.y = data.test.y[torch.randperm(len(data.test.y), generator=torch.Generator().manual_seed(1))]
        data.test.x = 3.0 * data.test.x + 1.0
        return data

    patch.setattr(runs, "build_federated_data", shuffled)
