"""The Snakemake workflow: a clean dry run and lint on the default spec, a tiny spec end to end
(twice: the second time there is nothing to do), and a bad spec stopping it before any job."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import typing

import pytest
import yaml

from cflpipe.spec import PartitionStep, load_spec, read_yaml

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
    from cflpipe.spec import Scenario, Spec, Training

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert set(schema["properties"]) == set(Spec.model_fields)
    assert set(schema["properties"]["scenarios"]["additionalProperties"]["properties"]) == set(Scenario.model_fields)
    assert set(schema["$defs"]["training"]["properties"]) == set(Training.model_fields)
    steps = typing.get_args(typing.get_args(PartitionStep)[0])
    kinds = {typing.get_args(step.model_fields["kind"].annotation)[0] for step in steps}
    assert set(schema["$defs"]["partition_step"]["properties"]["kind"]["enum"]) == kinds


@pytest.mark.parametrize("path", sorted((ROOT / "config").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_spec_passes_the_snakemake_schema(path):
    """What common.smk checks before any job: a shipped spec the schema refused would stop its
    workflow at the first line."""
    import jsonschema

    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    jsonschema.validate(read_yaml(path), schema)


@pytest.mark.slow
def test_default_spec_dry_run_and_lint(tmp_path):
    # A copy of the workflow and the default spec, so the dry run sees no results of the checkout.
    for name in ("Snakefile", "workflow", "config", "profiles"):
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    dry = snakemake("-n", "-p", cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout
    spec = load_spec(ROOT / "config/config.yaml")
    counts = job_counts(dry.stdout)
    assert counts["train"] == len(spec.scenarios)  # one job trains every method × seed of a scenario
    assert counts["partition"] == len(spec.scenarios)
    assert counts["aggregate"] == counts["report"] == counts["all"] == 1
    # every rule gets the spec file; train runs exactly the spec's matrix (which may skip pairs)
    trains = re.findall(r"cflpipe train --config config/config.yaml --scenario (\S+) --method ([\w -]+?) "
                        r"--seed ([\d ]+?) --threads", dry.stdout)
    assert sorted((s, m, int(k)) for s, methods, seeds in trains for m in methods.split() for k in seeds.split()) \
        == sorted(spec.matrix())

    lint = snakemake("--lint", cwd=tmp_path)
    assert lint.returncode == 0, lint.stdout
    assert "Congratulations, your workflow is in a good condition!" in lint.stdout


@pytest.mark.slow
def test_tiny_spec_end_to_end_then_nothing_to_do(tiny_snakemake_run):
    first, results = tiny_snakemake_run.first, tiny_snakemake_run.results
    assert first.returncode == 0, first.stdout
    # one train job for the scenario's two methods
    assert job_counts(first.stdout) == {"partition": 1, "train": 1, "aggregate": 1, "report": 1, "all": 1,
                                        "total": 5}
    for scenario, method, seed in TINY_RUNS:
        run_dir = results / "runs" / scenario / method / f"seed{seed}"
        assert all((run_dir / name).is_file() for name in RUN_FILES), sorted(run_dir.iterdir())
        assert yaml.safe_load((run_dir / "config.yaml").read_text())["training"]["rounds"] == 2
    assert (results / "runs/swap/.trained").is_file()
    assert "swap/fedavg/seed0: finished" in (results / "logs/train/swap.log").read_text()
    # each finished run is one line on the console too (#35 item 1)
    assert re.search(r"swap/fedavg/seed0: finished: personalized acc [0-9.]+ \(\d+ s; run 1 of \d+ of this job",
                     first.stdout), first.stdout
    assert (results / "benchmarks/train/swap.tsv").is_file()
    for name in ("clients.parquet", "stats.parquet", "label_hist.png"):
        assert (results / "partitions/swap" / name).is_file()
    for name in ("runs.parquet", "summary.parquet", "curves.parquet", "summary.csv"):
        assert (results / "aggregate" / name).is_file()
    for name in ("index.html", "glance.txt", "tables/summary.csv", "tables/summary.md", "tables/summary.tex"):
        assert (results / "report" / name).is_file()
    # the workflow ends with who won, and where the report is
    glance = first.stdout[first.stdout.index("At a glance:"):]
    assert "swap: best personalized accuracy " in glance
    assert re.search(r"^report: \S*results/tiny/report/index\.html$", glance, re.M), glance

    second = tiny_snakemake_run.second
    assert second.returncode == 0, second.stdout
    assert "Nothing to be done" in second.stdout, second.stdout


def run_bytes(results, runs) -> dict[str, bytes]:
    """The bytes of every output file of `runs` but the wall-clock ones (timing.*)."""
    return {f"{s}/{m}/seed{k}/{name}": (results / "runs" / s / m / f"seed{k}" / name).read_bytes()
            for s, m, k in runs for name in RUN_FILES if not name.startswith("timing")}


@pytest.mark.slow
def test_scenario_jobs_redo_only_runs_that_are_missing_or_new(tiny_snakemake_run, tmp_path):
    """After a scenario's job: a run folder deleted by hand (then, as for any intermediate file
    snakemake reruns nothing while what follows is up to date, `--forcerun aggregate`), or a method
    added to the spec, runs the scenario's job again, which trains just that run and skips the
    finished ones; then there is nothing to do."""
    assert tiny_snakemake_run.first.returncode == 0, tiny_snakemake_run.first.stdout
    workdir = tmp_path / "work"
    shutil.copytree(tiny_snakemake_run.workdir, workdir, symlinks=True)  # copy2 keeps the mtimes
    results = workdir / "results/tiny"
    before = run_bytes(results, TINY_RUNS)
    fedavg = results / "runs/swap/fedavg/seed0/metrics.parquet"
    untouched = fedavg.stat().st_mtime_ns

    shutil.rmtree(results / "runs/swap/fedprox")
    again = snakemake("--configfile", "tiny.yaml", "--cores", "2", "--forcerun", "aggregate", cwd=workdir)
    assert again.returncode == 0, again.stdout
    assert job_counts(again.stdout) == {"train": 1, "aggregate": 1, "report": 1, "all": 1, "total": 4}
    assert "is extended by additional config" not in again.stdout  # no default config merged under it
    log = (results / "logs/train/swap.log").read_text()
    assert "swap/fedavg/seed0: already finished" in log and "swap/fedprox/seed0: finished: personalized" in log
    assert run_bytes(results, TINY_RUNS) == before
    assert fedavg.stat().st_mtime_ns == untouched
    assert "Nothing to be done" in snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=workdir).stdout

    spec = yaml.safe_load((workdir / "tiny.yaml").read_text())
    spec["methods"]["local"] = {}
    write_spec(workdir / "tiny.yaml", spec)
    added = snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=workdir)
    assert added.returncode == 0, added.stdout
    assert job_counts(added.stdout)["train"] == 1, added.stdout
    log = (results / "logs/train/swap.log").read_text()
    assert log.count("already finished") == 2 and "swap/local/seed0: finished: personalized" in log, log
    assert fedavg.stat().st_mtime_ns == untouched
    assert "Nothing to be done" in snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=workdir).stdout


@pytest.mark.slow
def test_a_killed_scenario_job_skips_its_finished_runs_and_resumes_the_killed_one(tmp_path):
    """snakemake killed (SIGKILL, its whole process group) while the scenario job trains its
    second method, after that run's first checkpoint: `snakemake --unlock`, then `snakemake`
    runs the scenario job again, which skips the finished run and resumes the other; every run
    ends with the bytes of an uninterrupted workflow."""
    exe = shutil.which("snakemake")
    if exe is None:
        pytest.skip("snakemake is not installed")  # as every workflow test (conftest.snakemake)
    spec = {**TINY_SPEC, "training": {**TINY_SPEC["training"], "rounds": 60, "checkpoint_every": 2,
                                      "eval_every": 10}}
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    for workdir in (killed, whole):
        write_spec(workdir / "tiny.yaml", spec)
    runs = killed / "results/tiny/runs/swap"
    proc = subprocess.Popen([exe, "--snakefile", str(ROOT / "Snakefile"), "--directory", str(killed),
                             "--configfile", "tiny.yaml", "--cores", "1"], cwd=killed, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not ((runs / "fedavg/seed0/summary.json").exists() and (runs / "fedprox/seed0/state/state.pt").exists()):
        assert proc.poll() is None and time.monotonic() < deadline, "the job ended before it could be killed"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (runs / "fedprox/seed0/summary.json").exists() and not (runs / ".trained").exists()
    finished = (runs / "fedavg/seed0/metrics.parquet").stat().st_mtime_ns

    assert snakemake("--configfile", "tiny.yaml", "--unlock", cwd=killed).returncode == 0
    again = snakemake("--configfile", "tiny.yaml", "--cores", "1", cwd=killed)
    assert again.returncode == 0, again.stdout
    log = (killed / "results/tiny/logs/train/swap.log").read_text()
    assert "swap/fedavg/seed0: already finished" in log and "swap/fedprox/seed0: finished" in log, log
    assert (runs / "fedavg/seed0/metrics.parquet").stat().st_mtime_ns == finished
    # resumed, not restarted: this process trained fewer than the run's 60 rounds × 2 clients
    resumed = json.loads((runs / "fedprox/seed0/timing.json").read_text())["plans_trained"]
    assert 0 < sum(resumed.values()) < 120, resumed
    assert snakemake("--configfile", "tiny.yaml", "--cores", "1", cwd=whole).returncode == 0
    assert run_bytes(killed / "results/tiny", TINY_RUNS) == run_bytes(whole / "results/tiny", TINY_RUNS)
    uninterrupted = json.loads((whole / "results/tiny/runs/swap/fedprox/seed0/timing.json").read_text())
    assert sum(uninterrupted["plans_trained"].values()) == 120


@pytest.mark.slow
def test_method_jobs_write_the_same_runs(tiny_snakemake_run, tmp_path):
    """`workflow.train_jobs: method`: one job per scenario × method, the same run bytes as the
    scenario's one job (nothing of one method's run leaks into the next in one process)."""
    assert tiny_snakemake_run.first.returncode == 0, tiny_snakemake_run.first.stdout
    write_spec(tmp_path / "tiny.yaml", {**TINY_SPEC, "workflow": {"train_jobs": "method"}})
    out = snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=tmp_path)
    assert out.returncode == 0, out.stdout
    assert job_counts(out.stdout) == {"partition": 1, "train": 2, "aggregate": 1, "report": 1, "all": 1,
                                      "total": 6}
    results = tmp_path / "results/tiny"
    assert run_bytes(results, TINY_RUNS) == run_bytes(tiny_snakemake_run.results, TINY_RUNS)
    assert (results / "logs/train/swap/fedprox.log").is_file() and not (results / "runs/swap/.trained").exists()
    assert "Nothing to be done" in snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=tmp_path).stdout


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
    assert "Logfile results/diverging/logs/train/swap.log:" in out.stdout
    lines = out.stdout.splitlines()
    assert any(line.startswith("error: round 1, client ") and "method fedavg: training loss is nan" in line
               for line in lines), out.stdout
    assert "Platform:" not in out.stdout  # quiet: host


TUNED_SPEC = {**TINY_SPEC, "protocol": "tuned",
              "scenarios": {"swap": {**TINY_SPEC["scenarios"]["swap"], "validation_fraction": 0.25}},
              "tuning": {"seeds": [7], "space": {"all": {"lr": [0.02, 0.1]}}}}


@pytest.mark.slow
def test_a_tuning_spec_runs_end_to_end_and_a_new_trial_reruns_only_what_depends_on_it(tmp_path):
    """#44 item 2: trials as jobs, their selection, the final seeds with the chosen values, the
    report with them; nothing to do again; a new grid value runs its trials and the selections."""
    write_spec(tmp_path / "tiny.yaml", TUNED_SPEC)
    first = snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stdout
    assert job_counts(first.stdout) == {"partition": 1, "tune": 2, "tune_select": 2, "train": 1, "aggregate": 1,
                                        "report": 1, "all": 1, "total": 9}
    results = tmp_path / "results/tiny"
    for method in ("fedavg", "fedprox"):
        chosen = json.loads((results / f"tuning/chosen/swap/{method}.json").read_text())
        config = yaml.safe_load((results / f"runs/swap/{method}/seed0/config.yaml").read_text())
        assert config["training"]["lr"] == chosen["values"]["lr"] and config["seed"] == 0
        assert (results / f"tuning/runs/swap/{method}/lr0p1/seed7/trial.json").is_file()
    assert 'id="tuning-chosen"' in (results / "report/index.html").read_text()
    before = run_bytes(results, TINY_RUNS)
    assert "Nothing to be done" in snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=tmp_path).stdout

    write_spec(tmp_path / "tiny.yaml", {**TUNED_SPEC, "tuning": {"seeds": [7], "space": {
        "all": {"lr": [0.02, 0.1]}, "fedprox": {"lr": [0.02, 0.1, 0.05]}}}})
    second = snakemake("--configfile", "tiny.yaml", "--cores", "2", cwd=tmp_path)
    assert second.returncode == 0, second.stdout
    counts = job_counts(second.stdout)
    assert counts["tune"] == 1 and counts["tune_select"] == 1 and "partition" not in counts, second.stdout
    log = (results / "logs/tune/swap/fedprox.log").read_text()
    assert log.count("already finished") == 2 and "lr0p05/seed7: finished" in log
    chosen = json.loads((results / "tuning/chosen/swap/fedprox.json").read_text())
    if chosen["chosen"] != "lr0p05":  # the same choice: the final run is the one trained before
        assert run_bytes(results, TINY_RUNS) == before


@pytest.mark.slow
def test_overrides_reach_every_job_and_a_bad_one_is_one_line(tmp_path):
    """`--config set="training.rounds=1 seeds=[0]"`: the jobs read the spec with its overrides
    (written once to RESULTS/.spec-set/), the runs record them, and the same overrides again find
    nothing to do; a bad key is the spec's own one line, another --config key is refused."""
    spec = dict(TINY_SPEC, seeds=[0, 1], results_dir=str(tmp_path / "results"))
    path = write_spec(tmp_path / "tiny.yaml", spec)
    sets = "set=training.rounds=1 seeds=[0] methods.fedprox.mu=0.5"
    first = snakemake("--cores", "1", "--configfile", str(path), "--config", sets, cwd=tmp_path)
    assert first.returncode == 0, first.stdout
    run_dir = tmp_path / "results/runs/swap/fedprox/seed0"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["training"]["rounds"] == 1 and config["hyperparams"]["mu"] == 0.5, config
    assert not (tmp_path / "results/runs/swap/fedprox/seed1").exists()  # seeds=[0]
    written = read_yaml(tmp_path / "results/.spec-set/tiny.yaml")
    assert written["training"]["rounds"] == 1 and written["seeds"] == [0]
    again = snakemake("--cores", "1", "--configfile", str(path), "--config", sets, cwd=tmp_path)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout, again.stdout
    bad = snakemake("-n", "--configfile", str(path), "--config", "set=training.roundz=1", cwd=tmp_path)
    assert bad.returncode != 0 and "error: training.roundz: unknown key, got 1; allowed:" in bad.stdout
    other = snakemake("-n", "--configfile", str(path), "--config", "rounds=1", cwd=tmp_path)
    assert other.returncode != 0 and "error: --config: cflpipe rules read the spec file and its overrides " \
        "only" in other.stdout
