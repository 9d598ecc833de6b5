# Tuning (a spec's `tuning:` section): the trials of each tuned method entry on each scenario it
# runs on, then the selection of its values on validation data, which the scenario's final
# training job takes as input (train.smk). Nothing here without a tuning section.

if TUNED:

    # Every trial × tuning seed of one tuned method entry on one scenario, in one process. A new
    # trial changes the job's params: it runs again and trains only what is new (finished trials
    # are skipped and their records rewritten with the same bytes). Its output is a marker, as a
    # scenario's train job's (a rule's outputs cannot depend on the trials); a record deleted by
    # hand withdraws it (withdraw_stale_markers).
    rule tune:
        input:
            spec=ancient(SPEC_FILE),
            clients=f"{PARTITION}/clients.parquet",
            stats=f"{PARTITION}/stats.parquet",
        output:
            tuned=touch(TUNED_MARKER),
        wildcard_constraints:
            method=choice(TUNED),
        params:
            run=tune_params,
            seeds=" ".join(str(seed) for seed in SPEC.tuning.seeds),
        priority: tune_work
        log:
            f"{LOGS}/tune/{{scenario}}/{{method}}.log",
        benchmark:
            f"{BENCHMARKS}/tune/{{scenario}}/{{method}}.tsv"
        threads: 1
        resources:
            gpu=train_gpu,
            mem_mb=train_mem_mb,
            runtime=tune_runtime,
        conda:
            "../envs/cflpipe.yaml"
        shell:
            "set -o pipefail; cflpipe tune --config {input.spec:q} --scenario {wildcards.scenario} "
            "--method {wildcards.method} --seed {params.seeds} --threads {threads} --quiet 2>&1 | tee {log}"

    # The selection reads the trials' records only (validation figures; no test figure is in them).
    rule tune_select:
        input:
            spec=ancient(SPEC_FILE),
            tuned=TUNED_MARKER,
        output:
            chosen=CHOSEN,
        wildcard_constraints:
            method=choice(TUNED),
        params:
            tuning=selection_params,
        log:
            f"{LOGS}/tune/{{scenario}}/{{method}}.select.log",
        conda:
            "../envs/cflpipe.yaml"
        shell:
            "cflpipe tune-select --config {input.spec:q} --scenario {wildcards.scenario} "
            "--method {wildcards.method} > {log} 2>&1"
