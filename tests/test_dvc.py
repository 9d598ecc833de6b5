"""The DVC pipeline: its run list follows the spec, `dvc repro` builds the same bytes as Snakemake
from the same spec, a second `dvc repro` does nothing, and a param edit re-runs only what it
touches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from cflpipe import dvcgen
from cflpipe.errors import SpecError
from cflpipe.spec import load_spec

from conftest import ROOT, TINY_RUNS, TINY_SPEC, run, write_spec

# Deterministic outputs (everything but timing.*), compared byte for byte.
RUN_FILES = ("metrics.parquet", "clusters.parquet", "rounds.parquet", "plots.csv", "summary.json", "config.yaml")
PARTITION_FILES = ("clients.parquet", "stats.parquet")


def not_copied(folder: str, names: list[str]) -> set[str]:
    """The checkout minus results, caches and git/DVC/Snakemake state."""
    top = {".git", "results", "resources", ".snakemake", ".pytest_cache", ".hypothesis", ".benchmarks", "dvc.lock"}
    skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    if Path(folder) == ROOT:
        skip |= top & set(names)
    if Path(folder) == ROOT / ".dvc":
        skip |= {"tmp", "cache", "config.local"} & set(names)
    return skip


def test_dvc_runs_file_is_in_sync_with_default_spec(monkeypatch):
    monkeypatch.chdir(ROOT)
    text = (ROOT / dvcgen.DEFAULT_OUTPUT).read_text()
    assert text == dvcgen.render("config/config.yaml"), "run: cflpipe dvc-runs --config config/config.yaml"
    data = yaml.safe_load(text)
    spec = load_spec(ROOT / "config/config.yaml")
    assert [(j["scenario"], m, int(k)) for j in data["jobs"].values() for m in j["methods"].split()
            for k in j["seeds"].split()] == spec.matrix()
    assert list(data["jobs"]) == list(spec.scenarios)  # one stage per scenario (workflow.train_jobs)
    assert {j["param"] for j in data["jobs"].values()} == {"methods"}
    assert list(data["partitions"]) == list(spec.scenarios)
    assert data["downloads"] == []  # the default spec runs offline


def test_dvc_runs_one_stage_per_method_on_request(tmp_path, monkeypatch):
    """`workflow.train_jobs: method`: a stage per scenario × method keeping its own runs' folder
    and tracking its own method entry (a sweep's entry for the entries it expands into)."""
    monkeypatch.chdir(tmp_path)
    methods = {"fedavg": {}, "prox": {"method": "fedprox", "sweep": {"mu": [0.1, 1.0]}}}
    write_spec(tmp_path / "spec.yaml", {**TINY_SPEC, "methods": methods, "workflow": {"train_jobs": "method"}})
    jobs = dvcgen.dvc_runs("spec.yaml")["jobs"]
    assert jobs == {f"swap.{m}": {"scenario": "swap", "methods": m, "runs": f"swap/{m}", "param": f"methods.{e}",
                                  "seeds": "0"}
                    for m, e in (("fedavg", "fedavg"), ("prox-mu0p1", "prox"), ("prox-mu1p0", "prox"))}


def test_dvc_runs_check_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_spec(tmp_path / "spec.yaml")
    dvcgen.write("spec.yaml", "runs.yaml")
    dvcgen.check("spec.yaml", "runs.yaml")
    spec = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    spec["seeds"] = [0, 1]
    write_spec(tmp_path / "spec.yaml", spec)
    with pytest.raises(SpecError, match=r"runs.yaml: is out of date .* `cflpipe dvc-runs --config spec.yaml`"):
        dvcgen.check("spec.yaml", "runs.yaml")


@pytest.mark.slow
def test_dvc_repro_matches_snakemake_and_is_idempotent(tmp_path, tiny_snakemake_run):
    if shutil.which("dvc") is None or shutil.which("git") is None:
        pytest.skip("dvc or git is not installed")
    repo = tmp_path / "repo"
    shutil.copytree(ROOT, repo, ignore=not_copied)
    write_spec(repo / "config/config.yaml")
    git = ["git", "-c", "user.name=test", "-c", "user.email=test@example.com"]
    for cmd in (["cflpipe", "dvc-runs", "--config", "config/config.yaml"], ["git", "init", "-q"],
                ["git", "add", "-A"], [*git, "commit", "-qm", "tiny spec"]):
        done = run(cmd, repo)
        assert done.returncode == 0, done.stdout

    first = run(["dvc", "repro"], repo, timeout=600)
    assert first.returncode == 0, first.stdout
    assert sorted(line.split("'")[1] for line in first.stdout.splitlines() if line.startswith("Running stage")) \
        == sorted(["partition@swap", "train@swap", "aggregate", "report"])

    theirs, ours = tiny_snakemake_run.results, repo / "results/config"  # results/<spec file name>
    assert tiny_snakemake_run.first.returncode == 0, tiny_snakemake_run.first.stdout
    compared = [f"runs/{s}/{m}/seed{k}/{name}" for s, m, k in TINY_RUNS for name in RUN_FILES]
    compared += [f"partitions/swap/{name}" for name in PARTITION_FILES]
    compared += ["aggregate/runs.parquet", "aggregate/curves.parquet"]  # no wall-clock columns
    for name in compared:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    assert (ours / "report/index.html").is_file()

    second = run(["dvc", "repro"], repo)
    assert second.returncode == 0, second.stdout
    assert "Running stage" not in second.stdout
    assert "Data and pipelines are up to date." in second.stdout, second.stdout
    shown = run(["dvc", "metrics", "show", "--json"], repo)
    assert shown.returncode == 0, shown.stdout
    metrics = next(iter(yaml.safe_load(shown.stdout).values()))["data"]["results/config/aggregate/metrics.json"]["data"]
    assert set(metrics["swap"]) == {"fedavg", "fedprox"} and 0 < metrics["swap"]["fedavg"]["acc"] <= 1
    assert set(metrics["swap"]["fedavg"]) == {"acc", "ari", "clusters"}  # the headline only, no wall-clock

    # `dvc exp run -S config/config.yaml:methods.fedprox.mu=0.5` edits the spec, then reproduces:
    # the scenario's stage (which would skip its finished fedavg run) and the aggregate depend on it.
    original = (repo / "config/config.yaml").read_text()
    spec = yaml.safe_load(original)
    spec["methods"]["fedprox"]["mu"] = 0.5
    write_spec(repo / "config/config.yaml", spec)
    status = run(["dvc", "status", "--json"], repo)
    assert status.returncode == 0, status.stdout
    assert sorted(yaml.safe_load(status.stdout)) == ["aggregate", "train@swap"]
    (repo / "config/config.yaml").write_text(original)

    # Two experiments as the README runs them: each keeps its own metrics (a git-only metric under
    # the git-ignored results/ showed `!`), and the table of what changed stays narrow.
    for mu in ("0.5", "2.0"):
        done = run(["dvc", "exp", "run", "-S", f"config/config.yaml:methods.fedprox.mu={mu}"], repo, timeout=600)
        assert done.returncode == 0, done.stdout
    shown = run(["dvc", "exp", "show", "--json"], repo)
    assert shown.returncode == 0, shown.stdout
    experiments = {}
    for baseline in json.loads(shown.stdout):
        for experiment in baseline.get("experiments") or []:
            for rev in experiment["revs"]:
                data = rev["data"]
                mu = data["params"]["config/config.yaml"]["data"]["methods"]["fedprox"]["mu"]
                experiments[mu] = data["metrics"]["results/config/aggregate/metrics.json"]["data"]["swap"]
    assert sorted(experiments) == [0.5, 2.0], shown.stdout
    for figures in experiments.values():
        assert 0 < figures["fedprox"]["acc"] <= 1 and figures["fedprox"]["clusters"] == 1
        assert figures["fedavg"] == metrics["swap"]["fedavg"]  # a finished run is not re-trained
    # The README's comparison: what differs, without the stages' dependency paths (columns with a /).
    changed = run(["dvc", "exp", "show", "--only-changed", "--drop", ".*/", "--csv"], repo)
    assert changed.returncode == 0, changed.stdout
    header = changed.stdout.splitlines()[0].split(",")
    assert header == ["Experiment", "rev", "typ", "Created", *(f"swap.{m}.{f}" for m in ("fedavg", "fedprox")
                      for f in ("acc", "ari", "clusters")), "methods.fedprox.mu"], header  # no wall-clock
    plots = run(["dvc", "plots", "show", "--json"], repo)
    assert plots.returncode == 0, plots.stdout
    drawn = json.loads(plots.stdout)["data"]
    assert list(drawn) == ["results/config/aggregate/plots/swap.csv"]  # a plot per scenario
    values = drawn["results/config/aggregate/plots/swap.csv"][0]["content"]["data"]["values"]
    assert {v["field"] for v in values} == {"fedavg", "fedprox"}  # a line per method
    assert {v["round"] for v in values} == {"1", "2"}
