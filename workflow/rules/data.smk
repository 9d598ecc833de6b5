# Datasets and partitions: download (local: compute nodes often have no internet; only datasets
# that are downloaded, embedded ones need nothing) → partition per scenario.


rule download:
    output:
        marker=f"{SPEC.data_dir}/{{dataset}}/.complete",
    params:
        data_dir=lambda wildcards, output: Path(output.marker).parent.parent,
    log:
        f"{LOGS}/download/{{dataset}}.log",
    benchmark:
        f"{BENCHMARKS}/download/{{dataset}}.tsv"
    conda:
        "../envs/cflpipe.yaml"
    shell:
        "cflpipe download {wildcards.dataset} --data-dir {params.data_dir:q} --quiet > {log} 2>&1"


rule partition:
    input:
        spec=ancient(SPEC_FILE),
        data=partition_inputs,
    output:
        clients=f"{PARTITION}/clients.parquet",
        stats=f"{PARTITION}/stats.parquet",
        hist=report(
            f"{PARTITION}/label_hist.png",
            caption="../report/partition.rst",
            category="Partitions",
            labels={"scenario": "{scenario}"},
        ),
    params:
        scenario=scenario_params,
    priority: job_work
    log:
        f"{LOGS}/partition/{{scenario}}.log",
    benchmark:
        f"{BENCHMARKS}/partition/{{scenario}}.tsv"
    conda:
        "../envs/cflpipe.yaml"
    shell:
        "cflpipe partition --config {input.spec:q} --scenario {wildcards.scenario} > {log} 2>&1"
