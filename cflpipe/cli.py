"""Command line: argument parsing, progress, exit codes and one-line errors. The work itself is
done by the modules each subcommand calls."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys

from cflpipe.errors import CflpipeError, SpecError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, like every other bad input
        raise SpecError(f"{self.prog}: {message}")


def _scenario(spec, name: str) -> str:
    if name not in spec.scenarios:
        raise SpecError(f"--scenario: unknown scenario {name!r}; allowed: {', '.join(spec.scenarios)}")
    return name


def _method(spec, name: str) -> str:
    if name not in spec.methods:
        raise SpecError(f"--method: unknown method {name!r}; allowed: {', '.join(spec.methods)}")
    return name


def _seed(spec, seed: int) -> int:
    if seed not in spec.seeds:
        allowed = ", ".join(str(s) for s in spec.seeds)
        raise SpecError(f"--seed: {seed} is not one of the spec's seeds; allowed: {allowed}")
    return seed


def _load(args, **kwargs):
    """The spec of --config; the default file missing gets its own line (the usual cause: running
    outside the checkout)."""
    from pathlib import Path

    from cflpipe.spec import load_spec

    if args.config == DEFAULT_CONFIG and not Path(DEFAULT_CONFIG).is_file():
        raise SpecError(f"--config: no {DEFAULT_CONFIG} in {Path.cwd()} (the default spec); run from the "
                        f"cflpipe checkout or give --config FILE")
    return load_spec(args.config, **kwargs)


def _positive(flag: str):
    """An argparse type: an int >= 1 (the error line names the flag)."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < 1:
            raise SpecError(f"{flag}: must be a whole number >= 1, got {text!r}")
        return value
    return convert


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def cmd_validate(args) -> int:
    from cflpipe.data_checks import data_problems
    from cflpipe.spec import spec_warnings

    spec = _load(args)
    errors, notes = data_problems(spec)
    if errors:
        raise SpecError("\n".join(errors))
    for line in [*spec_warnings(spec), *notes]:
        print(f"warning: {line}", file=sys.stderr)
    runs = len(spec.matrix())
    counts = ", ".join(_count(n, what) for n, what in ((len(spec.scenarios), "scenario"),
                                                        (len(spec.methods), "method"), (len(spec.seeds), "seed")))
    tuning = ""
    if spec.tuning is not None:
        trials = sum(len(spec.trials(m)) for m in spec.tuned_methods())
        tuning = (f"; tuning: {_count(len(spec.tuning_matrix()), 'trial run')} ({_count(trials, 'trial')} of "
                  f"{_count(len(spec.tuned_methods()), 'method')} × {_count(len(spec.tuning.seeds), 'tuning seed')} "
                  f"× their scenarios)")
    print(f"{args.config}: ok ({_count(runs, 'run')}: {counts}{tuning}; results in {spec.results_dir}/)")
    return 0


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

    spec = _load(args, check_methods=False)
    out = partition_scenario(spec, _scenario(spec, args.scenario), force=True)
    print(f"partition of {args.scenario} written to {out}")
    stats = read_parquet(out / "stats.parquet")
    for note in (small_test_sets(stats), small_validation_sets(stats)):
        if note:
            print(f"warning: scenarios.{args.scenario}: {note}", file=sys.stderr)
    return 0


def _set_threads(args) -> None:
    cpus = os.cpu_count() or 1
    if not 1 <= args.threads <= cpus:
        raise SpecError(f"--threads: must lie in [1, {cpus}] (the CPUs of this machine), got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)


def cmd_train(args) -> int:
    _set_threads(args)
    from cflpipe.fl.distributed import launched, serve, start_job, stop_workers

    rank, world = launched()
    if rank > 0:  # started by torchrun: rank 0 runs the job, the others train what it sends
        return serve()
    start_job()
    try:
        return _train_runs(args)
    finally:
        if world > 1:
            stop_workers()


def _train_runs(args) -> int:
    # The final runs of tuned methods train with what their tuning chose.
    spec = _load(args).with_tuning_choices()
    scenario = _scenario(spec, args.scenario)
    methods = [_method(spec, method) for method in args.method]
    _runs_on(spec, scenario, methods)
    seeds = [_seed(spec, seed) for seed in args.seed]
    _given_once(methods, seeds)
    return _run_each(spec, scenario, methods, seeds, args)


def _runs_on(spec, scenario: str, methods: list[str]) -> None:
    for method in methods:  # a run outside the spec's matrix would be one no aggregate reads
        if not spec.runs_on(method, scenario):
            listed = ", ".join(spec.methods[method].scenarios or [])
            raise SpecError(f"--method: {method} does not run on scenario {scenario} "
                            f"(methods.{spec.method_entry(method)}.scenarios: {listed})")


def _given_once(methods: list, seeds: list[int], method_option: str = "--method") -> None:
    for option, what, values in ((method_option, method_option.lstrip("-"), methods), ("--seed", "seed", seeds)):
        twice = [str(v) for v in dict.fromkeys(v for v in values if values.count(v) > 1)]
        if twice:
            raise SpecError(f"{option}: {' '.join(twice)} given twice; give each {what} once")


def _run_each(spec, scenario: str, methods: list[str], seeds: list[int], args, finished=None) -> int:
    """Train every method × seed of one scenario in this process. `finished(method, seed, error)`
    is told of each run's end (error: the CflpipeError it failed with, else None) and returns
    whether that failure is the job's (True) or only the run's (False)."""
    from cflpipe.fl.engine import is_finished, train_run
    from cflpipe.fl.runs import resolve_run

    # Several runs in one process pay Python's and torch's start-up once (most of a small run's
    # time); every run is still its own folder, resumed or skipped on its own. A failed run does
    # not keep the job's other runs from training; the first failure is the job's error.
    import time

    failed: list[tuple[str, CflpipeError]] = []
    total, done, trained, trained_seconds = len(methods) * len(seeds), 0, 0, 0.0
    # The estimate counts only the runs still to train: a resumed job's finished runs are skipped.
    to_train = [(m, k) for m in methods for k in seeds
                if args.force or not is_finished(resolve_run(spec, scenario, m, k, threads=args.threads))]
    for method in methods:
        for seed in seeds:
            if (method, seed) in to_train:
                to_train.remove((method, seed))
            started = time.monotonic()
            try:
                result = train_run(spec, scenario, method, seed, force=args.force, progress=not args.quiet)
            except CflpipeError as exc:
                if finished is None or finished(method, seed, exc):
                    failed.append((f"{method}/seed{seed}" if len(methods) > 1 else str(seed), exc))
                else:
                    print(f"{spec.run_dir(scenario, method, seed)}: diverged, recorded as a diverged trial: "
                          f"{str(exc).splitlines()[0]}", flush=True)
                continue
            finally:
                done += 1
            if finished is not None:
                finished(method, seed, None)
            elapsed = time.monotonic() - started
            if not result.skipped:
                trained, trained_seconds = trained + 1, trained_seconds + elapsed
            message = result.message if finished is None else result.says("val_acc_macro", "validation acc")
            print(f"{message} ({_run_progress(elapsed, done, total, trained, trained_seconds, len(to_train))})",
                  flush=True)
    if failed:
        _, first = failed[0]
        others = [name for name, _ in failed[1:]]
        also = f" ({'runs' if len(methods) > 1 else 'seeds'} {', '.join(others)} failed too)" if others else ""
        raise type(first)(f"{first}{also}")  # the first failure's class: its exit code
    return 0


def cmd_tune(args) -> int:
    """Train a tuned method entry's trials on a scenario (its tuning seeds), recording each."""
    _set_threads(args)
    from cflpipe.errors import DivergenceError
    from cflpipe.tuning import record_trial

    spec = _load(args)
    tuned = spec.tuned_methods()
    if not tuned:
        raise SpecError(f"--config: {args.config} has no tuning: section (nothing to tune)")
    scenario = _scenario(spec, args.scenario)
    if args.method not in tuned:
        raise SpecError(f"--method: {args.method!r} is not tuned (tuning.space); allowed: {', '.join(tuned)}")
    _runs_on(spec, scenario, [args.method])
    names = [t.name for t in spec.trials(args.method)]
    trials = args.trial or names
    for trial in trials:
        if trial not in names:
            raise SpecError(f"--trial: unknown trial {trial!r} of {args.method}; allowed: {', '.join(names)}")
    seeds = args.seed or list(spec.tuning.seeds)
    for seed in seeds:
        if seed not in spec.tuning.seeds:
            raise SpecError(f"--seed: {seed} is not one of tuning.seeds; allowed: "
                            f"{', '.join(map(str, spec.tuning.seeds))}")
    _given_once(trials, seeds, "--trial")
    view = spec.tuning_spec()

    def finished(entry: str, seed: int, error) -> bool:
        # A trial whose training diverged is a result of the search (that value is too large), not
        # a failure of the job: it is recorded and never chosen. Any other failure is the job's.
        if error is not None and not isinstance(error, DivergenceError):
            return True
        record_trial(spec, scenario, args.method, entry.split("/", 1)[1], seed, error)
        return False

    return _run_each(view, scenario, [spec.trial_entry(args.method, t) for t in trials], seeds, args, finished)


def cmd_tune_select(args) -> int:
    from cflpipe.tuning import select

    spec = _load(args)
    tuned = spec.tuned_methods()
    if not tuned:
        raise SpecError(f"--config: {args.config} has no tuning: section (nothing to select)")
    scenarios = [_scenario(spec, args.scenario)] if args.scenario else list(spec.scenarios)
    if args.method is not None and args.method not in tuned:
        raise SpecError(f"--method: {args.method!r} is not tuned (tuning.space); allowed: {', '.join(tuned)}")
    methods = [args.method] if args.method else tuned
    for scenario in scenarios:
        for method in methods:
            if not spec.runs_on(method, scenario):
                continue
            chosen = select(spec, scenario, method)
            best = next(t for t in chosen["trials"] if t["trial"] == chosen["chosen"])
            values = ", ".join(f"{k}={v}" for k, v in chosen["values"].items())
            print(f"{scenario}/{method}: {values} (validation acc {best['score']:.4f} over tuning seeds "
                  f"{', '.join(map(str, chosen['tuning_seeds']))}; {_count(len(chosen['trials']), 'trial')}) -> "
                  f"{spec.chosen_path(scenario, method)}")
    return 0


def _run_progress(elapsed: float, done: int, total: int, trained: int, trained_seconds: float, left: int) -> str:
    """`41 s; run 3 of 6 of this job, about 2 min left` (the estimate: the mean time of the runs
    trained so far, skipped and failed ones aside, for each of the `left` runs still to train)."""
    text = f"{_duration(elapsed)}; run {done} of {total} of this job"
    if left and trained:
        text += f", about {_duration(trained_seconds / trained * left)} left"
    return text


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# The listing's sections, in its order, and the declared families (registry.FAMILIES) in each.
METHOD_SECTIONS = {"source papers' methods": ("seed",), "clustered": ("clustered",),
                   "personalized": ("personalized",), "baselines": ("baseline", "reference"),
                   "modifiers: AWCFL and MCFL on other methods": ("modifier",)}


def cmd_methods(args) -> int:
    from cflpipe.registry import all_methods, method_info, plugin_failures, unknown_method

    if args.name is None:
        families: dict[str, list[str]] = {section: [] for section in METHOD_SECTIONS}
        methods = all_methods()
        for name, info in methods.items():
            families[next(s for s, kinds in METHOD_SECTIONS.items() if info.family in kinds)].append(name)
        for family, names in families.items():
            if not names:
                continue
            print(f"# {family} ({len(names)})")
            for name in names:
                info = methods[name]
                print(f"{name}: {info.description}")
                if info.capabilities.summary():
                    print(f"    [{info.capabilities.summary()}]")
                if info.needs:
                    print(f"    needs: {info.needs}")
                if info.params.model_fields:
                    print(f"    hyper-parameters: {', '.join(info.params.model_fields)}")
            print()
        print("cflpipe methods NAME describes one method: its hyper-parameters with their defaults, its paper")
        for line in plugin_failures():
            print(f"warning: not listed: {line}", file=sys.stderr)
        return 0
    # Only this name's plugin is imported: a broken plugin of another name does not matter here.
    try:
        info = method_info(args.name, "NAME")
    except KeyError:
        raise SpecError(unknown_method(args.name, "NAME")) from None
    print(f"{args.name}: {info.description}")
    if info.capabilities.summary():
        print(f"capabilities: {info.capabilities.summary()}")
    if info.needs:
        print(f"needs: {info.needs}")
    fields = info.params.model_fields
    print("hyper-parameters (default):" if fields else "hyper-parameters: none")
    for field, f in fields.items():
        doc = f" — {f.description}" if f.description else ""
        print(f"  {field} = {f.default!r}{doc}")
    for text in _papers(info):
        print(f"paper: {text}")
    example = next((f"{name}: {json.dumps(f.default)}" for name, f in fields.items()
                    if isinstance(f.default, (bool, int, float, str))), "")
    print(f"in a spec: methods: {{{args.name}: {{{example}}}}}")
    return 0


def _papers(info) -> list[str]:
    """The first paragraph of the docstring of the module that implements the method and of the
    module of each option its parameters add (AWCFL, MCFL): where cflpipe names the paper (and
    reference code) it follows."""
    import textwrap

    from cflpipe.methods.catalog import AWCFLParams, MCFLParams

    options = {AWCFLParams: "cflpipe.methods.intercluster", MCFLParams: "cflpipe.methods.intercluster"}
    modules = [info.cls.__module__] + [options[c] for c in info.params.__mro__ if c in options]
    texts = []
    for name in dict.fromkeys(modules):
        doc = (getattr(sys.modules.get(name), "__doc__", None) or "").strip()
        if doc:
            texts.append(" ".join(textwrap.dedent(doc).split("\n\n")[0].split()))
    return texts


def cmd_clean(args) -> int:
    from cflpipe.fl.runs import clean_runs

    spec = _load(args, check_methods=False)
    verb = "would free" if args.dry_run else "freed"
    cleaned = clean_runs(spec, dry_run=args.dry_run)
    for run in cleaned:
        if run.freed is None:
            print(f"{run.run_dir}: another process is writing this run; left alone")
        else:
            print(f"{run.run_dir}/state: {verb} {_size(run.freed)}")
    freed = [run.freed for run in cleaned if run.freed is not None]
    if not freed:
        print(f"{args.config}: nothing to clean: no finished run of the {_count(len(spec.matrix()), 'run')} "
              f"holds models in its checkpoint ({spec.results_dir}/runs)")
    else:
        print(f"{args.config}: {verb} {_size(sum(freed))} in {_count(len(freed), 'finished run')} of "
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

    out = aggregate(_load(args).with_tuning_choices())
    print(f"aggregate written to {out}")
    return 0


def cmd_report(args) -> int:
    from cflpipe.report.build import build_report

    out = build_report(_load(args).with_tuning_choices())
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
    run_bench(workloads=args.workload, rounds=args.rounds, output=args.output, repeats=args.repeats,
              parts=args.part, device=args.device, trainers=args.trainer, users=args.users, data_dir=args.data_dir,
              precisions=args.precision, compiled=args.compile)
    return 0


DEFAULT_CONFIG = "config/config.yaml"

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
             "complete. Embedded datasets (digits, synthetic) need nothing; LEAF's FEMNIST and CelebA are\n"
             "placed by hand (the command says how).",
             "  cflpipe download mnist\n"
             "  cflpipe download cifar10 --list           # URLs, target paths and checksums, to fetch by hand\n")
    p.add_argument("name", metavar="NAME", help="dataset name, e.g. mnist, fmnist, emnist, cifar10, svhn")
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
    p.add_argument("--method", required=True, nargs="+", metavar="NAME",
                   help="one or more of the spec's method entries (each method's seeds run before the next method's)")
    p.add_argument("--seed", required=True, type=int, nargs="+", metavar="SEED",
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
    p.add_argument("--trial", nargs="+", metavar="TRIAL", help="these trials only (default: all of them)")
    p.add_argument("--seed", type=int, nargs="+", metavar="SEED", help="these tuning seeds only (default: all)")
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
    p.add_argument("--rounds", type=_positive("--rounds"), default=10, metavar="N",
                   help="rounds per measured run (default 10)")
    p.add_argument("--repeats", type=_positive("--repeats"), default=3, metavar="N",
                   help="alternating repeats; the fastest counts (default 3)")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="CPU threads for torch (default: torch's)")
    p.add_argument("--output", default=None, metavar="FILE", help="also write the figures as JSON")
    p.add_argument("--part", action="append", choices=["overhead", "trainers", "steps", "eval", "apply", "scale",
                                                       "yardstick"],
                   default=None,
                   help="what to measure (repeatable; default all but scale and yardstick): engine overhead, "
                        "batched vs sequential trainer, the same where clients' step counts differ (steps), evaluation chunking, models applied one by one vs batched "
                        "in evaluation, one evaluation at 1,000 and 10,000 clients full vs a sample of 100 "
                        "(scale), pfl-research's CIFAR-10 benchmark shape (yardstick; --rounds rounds)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="device of the trainers, steps, apply, scale and yardstick parts (default cpu)")
    p.add_argument("--trainer", action="append", choices=["sequential", "batched"], default=None,
                   help="yardstick: trainers to time (repeatable; default both)")
    p.add_argument("--precision", action="append", choices=["float32", "tf32", "bf16"], default=None,
                   help="yardstick: training.precision of each trainer's run (repeatable; default float32)")
    p.add_argument("--compile", action="store_true",
                   help="yardstick: the batched trainer's step compiled (training.compile)")
    p.add_argument("--users", type=_positive("--users"), default=1000, metavar="N",
                   help="yardstick: users of 50 images (default 1000, pfl-research's; 50 sampled per round)")
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
