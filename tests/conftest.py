"""Shared fixtures of the workflow tests: a tiny spec and one Snakemake run of it per session."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

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


def write_spec(path: Path, spec: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(spec or TINY_SPEC, sort_keys=False))
    return path


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


def pytest_collection_modifyitems(config, items):
    """Under a mutation run (mutmut names the mutant in MUTANT_UNDER_TEST), check the mutant
    against its fastest tests only, up to CFLPIPE_MUTATION_TEST_SECONDS (5) of them as timed in
    mutmut's stats phase (docs/testing.md), quickest first: mutmut stops at the first failure, so
    a mutant that a unit test kills no longer waits for the end-to-end tests listed before it, and
    a survivor is not re-run through every end-to-end test that passes through its function.
    The kept tests stay grouped by file, so a module's fixtures are built once per mutant."""
    if "__mutmut_" not in os.environ.get("MUTANT_UNDER_TEST", ""):
        return
    stats = Path("mutmut-stats.json")  # mutmut runs the tests from inside mutants/
    if not stats.is_file():
        return
    import json

    budget = float(os.environ.get("CFLPIPE_MUTATION_TEST_SECONDS", "5"))
    seconds = json.loads(stats.read_text())["duration_by_test"]
    fastest = sorted(items, key=lambda item: seconds.get(item.nodeid, float("inf")))
    spent, kept = 0.0, set()
    for item in fastest:
        cost = seconds.get(item.nodeid, float("inf"))
        if kept and spent + cost > budget:
            break
        spent += cost
        kept.add(item.nodeid)
    first_in_file: dict[str, float] = {}
    for item in fastest:
        if item.nodeid in kept:
            first_in_file.setdefault(item.nodeid.split("::")[0], seconds.get(item.nodeid, float("inf")))
    chosen = sorted((item for item in items if item.nodeid in kept),
                    key=lambda item: (first_in_file[item.nodeid.split("::")[0]], item.nodeid.split("::")[0],
                                      seconds.get(item.nodeid, float("inf"))))
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in kept])
    items[:] = chosen
