# cflpipe workflow: one YAML spec → every scenario × method × seed, aggregated over seeds, then
# the report. Every rule calls the `cflpipe` CLI; this file only reads the spec to list the jobs.
#
#   snakemake --cores 4                                   # config/config.yaml
#   snakemake --cores 4 --configfile config/experiments/x.yaml
#   snakemake --workflow-profile workflow/profiles/slurm  # on a SLURM cluster
#   snakemake --report results/snakemake-report.html
#
# Outputs go to the spec's results_dir (results/ for config/config.yaml; a spec without one:
# results/<file name>): partitions/, runs/, aggregate/, report/, with logs/ and benchmarks/ of
# every job. Default options (all cores, failed jobs' logs shown) come from profiles/default/.

import time

from snakemake.utils import min_version

min_version("9.27")  # the rules' priorities are functions of the job (workflow/rules/common.smk)


# No `configfile:` directive: the spec is the one `--configfile` names, else config/config.yaml
# (workflow/rules/common.smk), and the rules read that file, never Snakemake's `config`. A
# directive made every `--configfile` run print that config/config.yaml was "extended".


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/tuning.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/report.smk"


# Runs on the machine snakemake runs on, never as cluster jobs: downloads need the internet,
# aggregate and report take seconds.
localrules:
    all,
    download,
    aggregate,
    report,


rule all:
    input:
        rules.report.output,
    default_target: True


# Who won, on the console at the end (the report's "At a glance"), and where the report is: when
# this invocation wrote the report (not for a target short of it, nor with nothing to do).
WORKFLOW_STARTED = time.time()


onsuccess:
    glance = Path(REPORT) / "glance.txt"
    if glance.exists() and glance.stat().st_mtime >= WORKFLOW_STARTED:
        print("At a glance:\n" + "".join(f"  {line}\n" for line in glance.read_text().splitlines())
              + f"report: {Path(REPORT) / 'index.html'}")
