# Mean ± std over seeds of every run, then the HTML report and paper-style tables. Both are
# quick and read only local files, so they run where snakemake runs (also under SLURM).


rule aggregate:
    input:
        spec=ancient(SPEC_FILE),
        # the runs' files, or the markers of the scenario jobs that wrote them (common.smk)
        runs=trained_markers() if SCENARIO_JOBS else
            run_files("summary.json", "rounds.parquet", "metrics.parquet", "config.yaml", "timing.json"),
    output:
        runs=f"{AGGREGATE}/runs.parquet",
        summary=f"{AGGREGATE}/summary.parquet",
        curves=f"{AGGREGATE}/curves.parquet",
        timing=f"{AGGREGATE}/timing.parquet",
        final_clients=f"{AGGREGATE}/final_clients.parquet",
        metrics=f"{AGGREGATE}/metrics.json",
        plots=f"{AGGREGATE}/plots.csv",
        # the record of trainer: auto's choices the runs read (copy it to results/ to rerun them alike)
        choices=f"{AGGREGATE}/trainer-choices.json",
        csv=report(
            f"{AGGREGATE}/summary.csv",
            caption="../report/summary.rst",
            category="Results",
        ),
    params:
        spec=SPEC_JSON,
    log:
        f"{LOGS}/aggregate.log",
    benchmark:
        f"{BENCHMARKS}/aggregate.tsv"
    conda:
        "../envs/cflpipe.yaml"
    shell:
        "cflpipe aggregate --config {input.spec:q} > {log} 2>&1"


rule report:
    input:
        spec=ancient(SPEC_FILE),
        aggregate=rules.aggregate.output,
        stats=expand(f"{PARTITION}/stats.parquet", scenario=SPEC.scenarios),
        clusters=trained_markers() if SCENARIO_JOBS else run_files("clusters.parquet"),
        # the tuning section's chosen values and trials (none without tuning)
        chosen=all_chosen_files(),
    output:
        html=report(
            f"{REPORT}/index.html",
            caption="../report/report.rst",
            category="Results",
        ),
        csv=f"{REPORT}/tables/summary.csv",
        md=f"{REPORT}/tables/summary.md",
        tex=f"{REPORT}/tables/summary.tex",
        glance=f"{REPORT}/glance.txt",
    params:
        spec=SPEC_JSON,
    log:
        f"{LOGS}/report.log",
    benchmark:
        f"{BENCHMARKS}/report.tsv"
    conda:
        "../envs/cflpipe.yaml"
    shell:
        "cflpipe report --config {input.spec:q} > {log} 2>&1"
