"""The commands that take a spec from validation to the report: validate, partition, aggregate,
report, clean."""

from __future__ import annotations

import argparse
import sys

from cflpipe.commands import Command, add_config, count, load, scenario_of
from cflpipe.errors import SpecError


def cmd_validate(args) -> int:
    from cflpipe.data_checks import data_problems
    from cflpipe.spec import spec_warnings

    spec = load(args)
    errors, notes = data_problems(spec)
    if errors:
        raise SpecError("\n".join(errors))
    for line in [*spec_warnings(spec), *notes]:
        print(f"warning: {line}", file=sys.stderr)
    runs = len(spec.matrix())
    counts = ", ".join(count(n, what) for n, what in ((len(spec.scenarios), "scenario"),
                                                        (len(spec.methods), "method"), (len(spec.seeds), "seed")))
    tuning = ""
    if spec.tuning is not None:
        trials = sum(len(spec.trials(m)) for m in spec.tuned_methods())
        tuning = (f"; tuning: {count(len(spec.tuning_matrix()), 'trial run')} ({count(trials, 'trial')} of "
                  f"{count(len(spec.tuned_methods()), 'method')} × {count(len(spec.tuning.seeds), 'tuning seed')} "
                  f"× their scenarios)")
    print(f"{args.config}: ok ({count(runs, 'run')}: {counts}{tuning}; results in {spec.results_dir}/)")
    for line in _sampled_populations(spec):
        print(line)
    return 0


def _sampled_populations(spec) -> list[str]:
    """A line for each scenario whose full evaluations read a sample of its clients: its figures
    are then estimates (training.full_eval_clients)."""
    from cflpipe.spec._models import evaluated_clients

    lines = []
    for scenario, sc in spec.scenarios.items():
        read = sorted({evaluated_clients(spec.resolved_training(scenario, m), sc.participants, bool(sc.drift))
                       for m in spec.methods if spec.runs_on(m, scenario)} - {sc.participants})
        if read:
            same = ", the same for every method" if len(read) == 1 else " (by method)"
            lines.append(f"scenario {scenario}: full evaluations read a seeded sample of "
                         f"{' or '.join(f'{n:,}' for n in read)} of its {sc.participants:,} clients{same} "
                         f"(training.full_eval_clients; all: every client)")
    return lines


def cmd_partition(args) -> int:
    from cflpipe.partition_files import partition_scenario

    from cflpipe.partition import small_test_sets, small_validation_sets
    from cflpipe.store import read_parquet

    spec = load(args, check_methods=False)
    out = partition_scenario(spec, scenario_of(spec, args.scenario), force=True)
    print(f"partition of {args.scenario} written to {out}")
    stats = read_parquet(out / "stats.parquet")
    for note in (small_test_sets(stats), small_validation_sets(stats)):
        if note:
            print(f"warning: scenarios.{args.scenario}: {note}", file=sys.stderr)
    return 0


def cmd_clean(args) -> int:
    from cflpipe.fl.runs import clean_runs

    spec = load(args, check_methods=False)
    verb = "would free" if args.dry_run else "freed"
    cleaned = clean_runs(spec, dry_run=args.dry_run)
    for run in cleaned:
        if run.freed is None:
            print(f"{run.run_dir}: another process is writing this run; left alone")
        else:
            print(f"{run.run_dir}/state: {verb} {_size(run.freed)}")
    freed = [run.freed for run in cleaned if run.freed is not None]
    if not freed:
        print(f"{args.config}: nothing to clean: no finished run of the {count(len(spec.matrix()), 'run')} "
              f"holds models in its checkpoint ({spec.results_dir}/runs)")
    else:
        print(f"{args.config}: {verb} {_size(sum(freed))} in {count(len(freed), 'finished run')} of "
              f"{len(spec.matrix())} ({spec.results_dir}/runs)")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def cmd_aggregate(args) -> int:
    from cflpipe.report.aggregate import aggregate

    out = aggregate(load(args).with_tuning_choices())
    print(f"aggregate written to {out}")
    return 0


def cmd_report(args) -> int:
    from cflpipe.report.build import build_report

    from cflpipe.report.page import GLANCE_FILE

    out = build_report(load(args).with_tuning_choices())
    print("At a glance:")
    print("".join(f"  {line}\n" for line in (out.parent / GLANCE_FILE).read_text().splitlines()), end="")
    print(f"report written to {out}")
    return 0


def _validate_arguments(p: argparse.ArgumentParser) -> None:
    add_config(p)


def _partition_arguments(p: argparse.ArgumentParser) -> None:
    add_config(p)
    p.add_argument("--scenario", required=True, metavar="NAME", help="one of the spec's scenarios")


def _aggregate_arguments(p: argparse.ArgumentParser) -> None:
    add_config(p)


def _report_arguments(p: argparse.ArgumentParser) -> None:
    add_config(p)


def _clean_arguments(p: argparse.ArgumentParser) -> None:
    add_config(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be freed; change nothing")


VALIDATE = Command(
    "validate", "check a spec; one line per problem",
    "Reads the spec as every other command does and prints one line per problem (YAML path, value,\n"
    "what is allowed), exit code 2; on success the number of runs and where their results go.",
    "  cflpipe validate --config config/experiments/fesem.yaml\n",
    _validate_arguments, cmd_validate)


PARTITION = Command(
    "partition", "split a scenario's dataset among its clients",
    "Writes RESULTS/partitions/SCENARIO/: clients.parquet (every sample's client, split, group and\n"
    "transform), stats.parquet (per-client sizes and label counts), label_hist.png. Fixed per\n"
    "scenario (its `seed`), whatever the training seeds.",
    "  cflpipe partition --scenario digits-swap4\n",
    _partition_arguments, cmd_partition)


AGGREGATE = Command(
    "aggregate", "mean ± std over seeds of the spec's runs",
    "Reads every run of the spec (its scenarios × methods × seeds, nothing else under RESULTS/runs)\n"
    "and writes RESULTS/aggregate/: runs, summary, curves and timing as Parquet, summary.csv, and\n"
    "for DVC metrics.json (the headline per scenario × method) and plots.csv (accuracy per round).\n"
    "Fails with one line when a run is missing or stale.",
    "  cflpipe aggregate --config config/experiments/fesem.yaml\n",
    _aggregate_arguments, cmd_aggregate)


REPORT = Command(
    "report", "the HTML report and paper-style tables",
    "Writes RESULTS/report/index.html (self-contained, interactive) and\n"
    "RESULTS/report/tables/summary.{md,tex,csv} from the aggregate (run `cflpipe aggregate` first).",
    "  cflpipe report && xdg-open results/report/index.html\n",
    _report_arguments, cmd_report)


CLEAN = Command(
    "clean", "free the checkpoints of the spec's finished runs",
    "Removes the models and method state from the state/ checkpoint of every finished run of the\n"
    "spec, keeping what the run's outputs are made from (a few kB), and prints the space freed.\n"
    "Unfinished runs keep their checkpoints (they resume from them); runs of other specs are\n"
    "not touched. `training.keep_state: false` (the default) does this as each run finishes.",
    "  cflpipe clean --dry-run\n"
    "  cflpipe clean --config config/experiments/fesem.yaml\n",
    _clean_arguments, cmd_clean)
