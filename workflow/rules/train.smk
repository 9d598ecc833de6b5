# Training. Every job trains several runs one after the other in one process, so Python's and
# torch's start-up (most of a small run's time) is paid once per job instead of once per run:
# `workflow.train_jobs: scenario` (the default) makes one job of every method × seed of a
# scenario, `method` one job per scenario × method. Each run keeps its own folder, checkpoint and
# outputs; a finished run is skipped and a killed one resumes from state/state.pt.

if SCENARIO_JOBS:

    # Every method × seed of one scenario. Its outputs are the runs' files, but a rule's outputs
    # cannot depend on which methods a scenario has: it declares a marker, touched when every run
    # has finished, and aggregate and report wait for the markers. A new method or seed, or changed
    # hyper-parameters, change its params: the job runs again, trains what is new and skips what
    # it had finished. A run deleted by hand withdraws the marker (withdraw_stale_markers), so the
    # job runs before aggregate does again.
    rule train:
        input:
            spec=ancient(SPEC_FILE),
            clients=f"{PARTITION}/clients.parquet",
            stats=f"{PARTITION}/stats.parquet",
            chosen=chosen_files,
        output:
            trained=touch(TRAINED),
        wildcard_constraints:
            scenario=choice(s for s in SPEC.scenarios if scenario_methods(s)),
        params:
            run=run_params,
            methods=scenario_method_names,
            seeds=group_seeds,
        priority: job_work
        log:
            f"{LOGS}/train/{{scenario}}.log",
        benchmark:
            f"{BENCHMARKS}/train/{{scenario}}.tsv"
        threads: 1
        resources:
            gpu=train_gpu,
            mem_mb=train_mem_mb,
            runtime=train_runtime,
        conda:
            "../envs/cflpipe.yaml"
        shell:
            train_command("{params.methods}")

else:

    # Every seed of one scenario × method: more, shorter jobs (long runs in parallel on a cluster).
    # Snakemake removes a rerun job's declared outputs first: the job then reloads the finished
    # seeds' final checkpoints instead of training them again.
    rule train:
        input:
            spec=ancient(SPEC_FILE),
            clients=f"{PARTITION}/clients.parquet",
            stats=f"{PARTITION}/stats.parquet",
            chosen=chosen_files,
        output:
            **{name.replace(".", "_"): seed_files(name) for name in RUN_OUTPUT_FILES},
        params:
            run=run_params,
            seeds=group_seeds,
        priority: job_work
        log:
            f"{LOGS}/train/{{scenario}}/{{method}}.log",
        benchmark:
            f"{BENCHMARKS}/train/{{scenario}}/{{method}}.tsv"
        threads: 1
        resources:
            gpu=train_gpu,
            mem_mb=train_mem_mb,
            runtime=train_runtime,
        conda:
            "../envs/cflpipe.yaml"
        shell:
            train_command("{wildcards.method}")
