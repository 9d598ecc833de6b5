# Reads the spec once and derives everything the rules need: the spec file every rule passes to
# `cflpipe ... --config`, the job list (spec.matrix() as one train job per scenario, or per
# scenario × method with `workflow.train_jobs: method`, every run of a job in one process),
# wildcard constraints and the resources of a train job. No rules here; no work is done here.

import json
import os
import re
import sys
from pathlib import Path

import yaml
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from cflpipe.data.base import dataset_info
from cflpipe.errors import CflpipeError
from cflpipe import __version__
from cflpipe.spec import RUN_OUTPUT_FILES, load_spec, read_yaml


def fail(lines, code=2):
    """Stop before any job with the same one-line errors and exit code as `cflpipe validate`."""
    for line in lines:
        print(f"error: {line}", file=sys.stderr)
    sys.exit(code)


def spec_file():
    """The spec path handed to every `cflpipe` call: the `--configfile` given to snakemake, else
    DEFAULT_CONFIG (the Snakefile has no `configfile:`). Snakemake deep-merges several config files into
    `config`, but cflpipe reads exactly one file, so the rules never use `config` itself."""
    given = list(workflow.config_settings.configfiles)  # --configfile, made absolute by snakemake
    if len(given) > 1:
        fail([f"--configfile: give one spec file, got {len(given)}: " + ", ".join(map(str, given))])
    others = sorted(set(workflow.config_settings.config or {}) - {"set"})
    if others:
        fail([f"--config: cflpipe rules read the spec file and its overrides only (--config set=\"KEY=VALUE "
              f"...\"), got {', '.join(others)}; edit the spec or pass another one with --configfile"])
    path = Path(given[0]) if given else Path(DEFAULT_CONFIG)
    # Absolute without resolving symlinks: the spec's file name names its default results
    # folder, and a link must name the same folder here as in `cflpipe … --config LINK`.
    path = Path(os.path.abspath(path))
    try:  # keep commands and logs readable: relative when the spec lies under the working dir
        return str(path.relative_to(Path(os.path.abspath(os.getcwd()))))
    except ValueError:
        return str(path)


def choice(names):
    """Wildcard constraint matching exactly one of `names` (never matches when empty)."""
    names = [re.escape(str(n)) for n in names]
    return "|".join(names) if names else "(?!)"


def spec_overrides():
    """`--config set="training.rounds=5 seeds=[0,1]"`: the spec's overrides (`cflpipe … --set`), split
    as a shell splits words. Snakemake reads the value as YAML first (quotes are dropped, `: ` makes
    a mapping, ` #` starts a comment), so write values without spaces (`seeds=[0,1]`) and set
    mappings with the CLI's `--set`."""
    given = (workflow.config_settings.config or {}).get("set")
    if given is None:
        return []
    if isinstance(given, str):
        import shlex

        try:
            return shlex.split(given)
        except ValueError as exc:
            fail([f"--config set: {given!r} cannot be split into KEY=VALUE words ({exc})"])
    if isinstance(given, list) and all(isinstance(item, str) for item in given):
        return given
    fail([f"--config set: KEY=VALUE words in one string (set=\"training.rounds=5 seeds=[0]\"), got {given!r}"])


def overridden_spec_file(path, overrides):
    """The spec with its overrides, written where every rule's `cflpipe … --config` reads it (the
    rules take one file): RESULTS/.spec-set/<name>, rewritten only when its text changes, so that
    a rerun with the same overrides finds every job done (a rule's spec input is `ancient`; what
    the overrides change reruns jobs through their params). Switching between overrides and none
    changes every job's input file, so every job runs once more: a train job then finds its runs
    finished and skips them or rebuilds their outputs from their final checkpoints."""
    from cflpipe.spec import dump_yaml, spec_data

    text = dump_yaml(spec_data(path, overrides))
    target = Path(SPEC.results_dir) / ".spec-set" / Path(path).name
    if not target.exists() or target.read_text() != text:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(target)


DEFAULT_CONFIG = "config/config.yaml"
SPEC_FILE = spec_file()
SPEC_SETS = spec_overrides()
try:
    # Jobs spawned on a cluster node parse this file again: the main process has validated the
    # methods already, so they skip that (it imports torch, seconds per job).
    SPEC = load_spec(SPEC_FILE, overrides=SPEC_SETS, check_methods=workflow.is_main_process)
except CflpipeError as exc:
    fail(str(exc).splitlines(), exc.exit_code)
if SPEC_SETS:
    SPEC_FILE = overridden_spec_file(SPEC_FILE, SPEC_SETS)
if workflow.is_main_process:  # the same warnings as `cflpipe validate`, once
    from cflpipe.spec import spec_warnings

    for line in spec_warnings(SPEC):
        print(f"warning: {line}", file=sys.stderr)
# The JSON schema documents the spec's shape for snakemake users; cflpipe's parser above is the
# stricter check and runs first so that errors read like `cflpipe validate`.
try:
    validate(read_yaml(SPEC_FILE), "../schemas/config.schema.yaml")
except WorkflowError as exc:
    fail([f"{SPEC_FILE}: does not match workflow/schemas/config.schema.yaml: "
          + " ".join(str(exc).split())])

RESULTS = SPEC.results_dir
# aggregate and report take seconds: any edit of the spec re-runs them (`params` rerun trigger),
# except of how runs are cut into jobs, which changes no output.
SPEC_JSON = json.dumps(SPEC.model_dump(mode="json", exclude={"workflow"}), sort_keys=True)
RUNS = SPEC.matrix()
DOWNLOADS = sorted({sc.dataset.name for sc in SPEC.scenarios.values()
                    if dataset_info(sc.dataset.name).downloadable})

PARTITION = f"{RESULTS}/partitions/{{scenario}}"
RUN_GROUP = f"{RESULTS}/runs/{{scenario}}/{{method}}"  # every seed of one scenario × method
# `workflow.train_jobs: scenario`: one job trains every run of a scenario; it declares this marker,
# not the runs' files (a rule's outputs cannot depend on which methods a scenario has).
SCENARIO_JOBS = SPEC.workflow.train_jobs == "scenario"
TRAINED = f"{RESULTS}/runs/{{scenario}}/.trained"
AGGREGATE = f"{RESULTS}/aggregate"
REPORT = f"{RESULTS}/report"
LOGS = f"{RESULTS}/logs"
BENCHMARKS = f"{RESULTS}/benchmarks"

# `tuning:`: one job trains the trials of a tuned method entry on a scenario (every trial × tuning
# seed; a trial added later trains alone, the finished ones are skipped), one selects its values
# from their validation records, and the scenario's final training waits for the selections.
TUNED = SPEC.tuned_methods()
TUNING_VIEW = SPEC.tuning_spec() if TUNED else None
TUNED_MARKER = f"{RESULTS}/tuning/runs/{{scenario}}/{{method}}/.tuned"
CHOSEN = f"{RESULTS}/tuning/chosen/{{scenario}}/{{method}}.json"

wildcard_constraints:
    scenario=choice(SPEC.scenarios),
    method=choice(SPEC.methods),
    dataset=choice(DOWNLOADS),


def dataset_marker(name):
    """Written by `cflpipe download` once every file of the dataset is verified."""
    return f"{SPEC.data_dir}/{name}/.complete"


def partition_inputs(wildcards):
    dataset = SPEC.scenarios[wildcards.scenario].dataset
    if dataset.name in DOWNLOADS:
        return [dataset_marker(dataset.name)]
    info = dataset_info(dataset.name)
    if info.inputs is None:  # embedded
        return []
    # A user's own file or LEAF's JSON files: edits re-run the partition (mtime trigger).
    return [str(p) for p in info.inputs(info.params(**dataset.params), Path(SPEC.data_dir))]


def run_files(*names):
    """These output files of every run of the spec."""
    return [f"{RESULTS}/runs/{s}/{m}/seed{k}/{name}" for s, m, k in RUNS for name in names]


# One process per job: every run of its methods × seeds (a finished run is skipped).
def train_command(methods):
    # Everything goes to the job's log; tee also puts each finished run's line (accuracy, time,
    # runs left) on the console (a cluster job's own output file under SLURM), where snakemake
    # otherwise says only "N of M steps". pipefail, said here whatever shell runs it: the job
    # still fails when cflpipe does.
    return (f"set -o pipefail; cflpipe train --config {{input.spec:q}} --scenario {{wildcards.scenario}} "
            f"--method {methods} --seed {{params.seeds}} --threads {{threads}} --quiet 2>&1 | tee {{log}}")


def scenario_methods(scenario):
    """The spec's methods that run on `scenario`, in the spec's order."""
    return [m for m in SPEC.methods if SPEC.runs_on(m, scenario)]


def trained_markers():
    """The marker of every scenario job (scenarios without a method have none)."""
    return [TRAINED.format(scenario=s) for s in SPEC.scenarios if scenario_methods(s)]


def withdraw_stale_markers():
    """A scenario job's marker says that every run of the scenario has finished. Where a run's
    file is gone (a run folder deleted by hand) or was never written (a method or seed added
    since), that no longer holds, and the marker is removed: the next time something after it
    runs (a spec edit, `--forcerun aggregate`), the scenario's job runs again first and trains
    just those runs (it skips the finished ones) instead of leaving aggregate to fail on them.
    Like any missing intermediate file, the marker alone reruns nothing while aggregate and
    report are up to date. Every invocation of the main snakemake process withdraws, dry runs
    included (the marker is empty, and what it claimed was no longer true); a cluster job that
    parses this file does not touch another scenario's marker."""
    if not workflow.is_main_process:
        return
    from cflpipe.tuning import trial_file

    for s, m in dict.fromkeys((s, m) for s, m, _, _ in SPEC.tuning_matrix()):
        marker = Path(TUNED_MARKER.format(scenario=s, method=m))
        records = (trial_file(SPEC, s, m, t.name, k) for t in SPEC.trials(m) for k in SPEC.tuning.seeds)
        if marker.exists() and not all(f.exists() for f in records):
            marker.unlink()
    if not SCENARIO_JOBS:
        return
    for scenario in SPEC.scenarios:
        marker = Path(TRAINED.format(scenario=scenario))
        files = (SPEC.run_dir(s, m, k) / name for s, m, k in RUNS if s == scenario for name in RUN_OUTPUT_FILES)
        if marker.exists() and not all(f.exists() for f in files):
            marker.unlink()


withdraw_stale_markers()


def job_methods(wildcards):
    """The methods a train job runs: its own, or its scenario's."""
    method = getattr(wildcards, "method", None)
    return [method] if method is not None else scenario_methods(wildcards.scenario)


def scenario_method_names(wildcards):
    return " ".join(scenario_methods(wildcards.scenario))


def group_seeds(wildcards):
    """`--seed` of a train job: every seed of the spec."""
    return " ".join(str(seed) for seed in SPEC.seeds)


def seed_files(name):
    """This output file of every seed of a train job ({scenario} and {method} stay wildcards)."""
    return expand(f"{RUN_GROUP}/seed{{seed}}/{name}", seed=SPEC.seeds, allow_missing=True)


def scenario_params(wildcards):
    """What a partition depends on; a change re-runs it (snakemake's `params` rerun trigger),
    while edits elsewhere in the spec leave it alone."""
    sc = SPEC.scenarios[wildcards.scenario]
    return json.dumps({"scenario": sc.definition(), "data_dir": SPEC.data_dir}, sort_keys=True)


def run_params(wildcards):
    """What a training run depends on besides its partition: method type, hyper-parameters and
    the resolved training settings (of every method of a scenario job, by name)."""
    s = wildcards.scenario
    if hasattr(wildcards, "method"):
        return json.dumps(method_params(s, wildcards.method), sort_keys=True)
    return json.dumps({m: method_params(s, m) for m in scenario_methods(s)}, sort_keys=True)


def method_params(s, m, spec=SPEC):
    from cflpipe.fl.runs import run_plugins, training_definition  # imports torch: only where a run's params are needed
    from cflpipe.registry import resolved_hyperparams

    # The resolved hyper-parameters (defaults included) and cflpipe's version (and the versions of
    # plugins the run uses): a release that changes a default or a definition re-runs what it changes.
    # A tuned method's final runs: as written, before tuning; its chosen file is their input.
    plugins = run_plugins(spec, s, m)  # absent without plugins: older runs keep their params
    return {"method": spec.method_type(m), "cflpipe": __version__, **({"plugins": plugins} if plugins else {}),
            "hyperparams": resolved_hyperparams(spec, s, m).model_dump(mode="json"),
            "training": training_definition(spec, s, m)}


def trial_names(wildcards):
    return [t.name for t in SPEC.trials(wildcards.method)]


def tune_params(wildcards):
    """What the trials of a tune job depend on: each trial's run, as method_params says it."""
    return json.dumps({t: method_params(wildcards.scenario, SPEC.trial_entry(wildcards.method, t), TUNING_VIEW)
                       for t in trial_names(wildcards)}, sort_keys=True)


def selection_params(wildcards):
    """What a selection depends on besides its records: the rule, the tuning seeds, the trials."""
    return json.dumps({"select": SPEC.tuning.select, "seeds": SPEC.tuning.seeds,
                       "trials": {t.name: t.values for t in SPEC.trials(wildcards.method)}}, sort_keys=True)


def all_chosen_files():
    return [CHOSEN.format(scenario=s, method=m) for s, m in dict.fromkeys((s, m) for s, m, _, _ in SPEC.tuning_matrix())]


def chosen_files(wildcards):
    """The selections a train job's tuned methods need (none without tuning)."""
    return [CHOSEN.format(scenario=wildcards.scenario, method=m) for m in job_methods(wildcards) if m in TUNED]


# Resources of one train job (its runs one after another), for SLURM (and `--resources` locally).
# A GPU when the resolved training device of one of its methods is cuda (`auto` cannot be known
# before the job lands on a node); memory by dataset size; time: 30 min for the job plus the
# rounds of all its runs. Override per rule with
# `--set-resources train:mem_mb=16000 train:runtime=600` or in a profile.
# every other downloaded dataset: 8000, embedded: 2000. LEAF FEMNIST is EMNIST's size; CelebA
# (200k faces at 84x84) is far larger: its specs should keep `users` or `size` down.
TRAIN_MEM_MB = {"emnist": 16000, "femnist": 16000, "celeba": 64000, "files": 8000}
MINUTES_PER_ROUND = {"resnet18": 5}  # every other model: 1


def train_gpu(wildcards):
    return int(any(SPEC.resolved_training(wildcards.scenario, m).device == "cuda" for m in job_methods(wildcards)))


def train_mem_mb(wildcards):
    name = SPEC.scenarios[wildcards.scenario].dataset.name
    return TRAIN_MEM_MB.get(name, 8000 if name in DOWNLOADS else 2000)


def tune_work(wildcards):
    """job_work of a tune job: its trials × tuning seeds."""
    training = SPEC.resolved_training(wildcards.scenario, wildcards.method)
    return len(SPEC.trials(wildcards.method)) * len(SPEC.tuning.seeds) * training.rounds * training.clients_per_round


def tune_runtime(wildcards):
    training = SPEC.resolved_training(wildcards.scenario, wildcards.method)
    runs = len(SPEC.trials(wildcards.method)) * len(SPEC.tuning.seeds)
    return 30 + runs * training.rounds * MINUTES_PER_ROUND.get(training.model, 1)


def job_work(wildcards):
    """Priority of a partition or training job: the local trainings its runs do (rounds × sampled
    clients, summed over its methods and seeds; a partition counts its scenario's). Snakemake then
    starts the largest job first (longest first), instead of leaving it for last while the other
    cores idle."""
    trainings = [SPEC.resolved_training(wildcards.scenario, m) for m in job_methods(wildcards)]
    return len(SPEC.seeds) * sum(t.rounds * t.clients_per_round for t in trainings)


def train_runtime(wildcards):
    trainings = [SPEC.resolved_training(wildcards.scenario, m) for m in job_methods(wildcards)]
    return 30 + len(SPEC.seeds) * sum(t.rounds * MINUTES_PER_ROUND.get(t.model, 1) for t in trainings)
