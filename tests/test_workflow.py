"""The Snakemake workflow: a clean dry run and lint on the default spec, a tiny spec end to end
(twice: the second time there is nothing to do), and a bad spec stopping it before any job."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from cflpipe.spec import load_spec

from conftest import ROOT, TINY_RUNS, TINY_SPEC, snakemake, write_spec

RUN_FILES = ("metrics.parquet", "clusters.parquet", "rounds.parquet", "timing.parquet", "timing.json",
             "plots.csv", "summary.json", "config.yaml")


def job_counts(output: str) -> dict[str, int]:
    """The `Job stats` table of a snakemake run or dry run."""
    table = output[output.index("Job stats:"):]
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def test_rule_environment_matches_environment_yml():
    """The conda env of the rules pins cflpipe's runtime dependencies as environment.yml does."""
    rules_env = yaml.safe_load((ROOT / "workflow/envs/cflpipe.yaml").read_text())["dependencies"]
    project_env = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    assert set(rules_env) <= {d for d in project_env if isinstance(d, str)}


def test_snakemake_schema_knows_every_spec_key():
    """The Snakefile validates specs against workflow/schemas/config.schema.yaml before cflpipe
    sees them, so a key the parser accepts but the schema lacks would be refused there."""
    from cflpipe.spec import Spec, Training

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert set(schema["properties"]) == set(Spec.model_fields)
    assert set(schema["$defs"]["training"]["properties"]) == set(Training.model_fields)


@pytest.mark.slow
def test_default_spec_dry_run_and_lint(tmp_path):
    # A copy of the workflow and the default spec, so the dry run sees no results of the checkout.
    for name in ("Snakefile", "workflow", "config", "profiles"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    dry = snakemake("-n", "-p", cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout
    spec = load_spec(ROOT / "config/config.yaml")
    counts = job_counts(dry.stdout)
    groups = {(s, m) for s, m, _ in spec.matrix()}
    assert counts["train"] == len(groups)  # one job trains every seed of a scenario × method
    assert counts["partition"] == len(spec.scenarios)
    assert counts["aggregate"] == counts["report"] == counts["all"] == 1
    # every rule gets the spec file; train runs exactly the spec's matrix (which may skip pairs)
    trains = re.findall(r"cflpipe train --config config/config.yaml --scenario (\S+) --method (\S+) "
                        r"--seed ([\d ]+?) --threads", dry.stdout)
    assert sorted((s, m, int(k)) for s, m, seeds in trains for k in seeds.split()) == sorted(spec.matrix())

    lint = snakemake("--lint", cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout
    assert "Congratulations, your workflow is in a good condition!" in lint.stdout


@pytest.mark.slow
def test_tiny_spec_end_to_end_then_nothing_to_do(tiny_snakemake_run):
    first, results = tiny_snakemake_run.first, tiny_snakemake_run.results
    assert first.returncode == 0, first.stdout
    groups = {(s, m) for s, m, _ in TINY_RUNS}
    assert job_counts(first.stdout) == {"partition": 1, "train": len(groups), "aggregate": 1, "report": 1,
                                        "all": 1, "total": len(groups) + 4}
    for scenario, method, seed in TINY_RUNS:
        run_dir = results / "runs" / scenario / method / f"seed{seed}"
        assert all((run_dir / name).is_file() for name in RUN_FILES), sorted(run_dir.iterdir())
        assert (results / "logs/train" / scenario / f"{method}.log").is_file()
        assert (results / "benchmarks/train" / scenario / f"{method}.tsv").is_file()
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["rounds"] == 2
    for name in ("clients.parquet", "stats.parquet", "label_hist.png"):
        assert (results / "partitions/swap" / name).is_file()
    for name in ("runs.parquet", "summary.parquet", "curves.parquet", "summary.csv"):
        assert (results / "aggregate" / name).is_file()
    for name in ("index.html", "tables/summary.csv", "tables/summary.md", "tables/summary.tex"):
        assert (results / "report" / name).is_file()

    second = tiny_snakemake_run.second
    assert second.returncode == 0, second.stdout
    assert "Nothing to be done" in second.stdout, second.stdout


@pytest.mark.slow
def test_snakemake_report(tiny_snakemake_run):
    workdir = tiny_snakemake_run.workdir
    assert tiny_snakemake_run.first.returncode == 0
    out = snakemake("--configfile", "tiny.yaml", "--report", "results/snakemake-report.html", cwd=workdir)
    assert out.returncode == 0, out.stdout
    html = (workdir / "results/snakemake-report.html").read_text()
    assert "label_hist.png" in html and "summary.csv" in html


@pytest.mark.slow
def test_bad_spec_stops_before_any_job(tmp_path):
    bad = yaml.safe_load(yaml.safe_dump(TINY_SPEC))
    bad["scenarios"]["swap"]["partition"][0] = {"kind": "dirichlet", "alpha": -1}
    write_spec(tmp_path / "bad.yaml", bad)
    out = snakemake("--configfile", "bad.yaml", "--cores", "1", cwd=tmp_path)
    assert out.returncode == 2, out.stdout
    assert "error: scenarios.swap.partition[0].alpha: must be > 0, got -1" in out.stdout.splitlines()
    assert "Traceback" not in out.stdout and "Job stats" not in out.stdout
    assert not (tmp_path / "results").exists()


def test_default_profile_is_found_beside_the_snakefile():
    """Snakemake reads profiles/default/ next to the Snakefile by itself (not workflow/profiles/,
    since this Snakefile is at the top); the SLURM profile, which replaces it, keeps its logs."""
    profile = yaml.safe_load((ROOT / "profiles/default/config.yaml").read_text())
    assert profile["show-failed-logs"] is True and profile["cores"] == "all"
    assert profile["rerun-incomplete"] is True and "rules" not in profile["quiet"]
    slurm = yaml.safe_load((ROOT / "workflow/profiles/slurm/config.yaml").read_text())
    assert slurm["show-failed-logs"] is True


@pytest.mark.slow
def test_a_failed_job_shows_its_one_line_cause(tmp_path):
    """`snakemake` with the default profile and no --cores: a training job that diverges prints
    cflpipe's one-line error from its log, not only the log's path."""
    diverging = yaml.safe_load(yaml.safe_dump(TINY_SPEC))
    diverging["training"]["lr"] = 1.0e30
    diverging["methods"] = {"fedavg": {}}
    write_spec(tmp_path / "diverging.yaml", diverging)
    out = snakemake("--configfile", "diverging.yaml", cwd=tmp_path)
    assert out.returncode != 0, out.stdout
    assert "Using workflow specific profile" in out.stdout and "profiles/default" in out.stdout
    assert "Logfile results/diverging/logs/train/swap/fedavg.log:" in out.stdout
    lines = out.stdout.splitlines()
    assert any(line.startswith("error: round 1, client ") and "method fedavg: training loss is nan" in line
               for line in lines), out.stdout
    assert "Platform:" not in out.stdout  # quiet: host
