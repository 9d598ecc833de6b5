"""`cflpipe train`, `cflpipe tune` and `cflpipe tune-select`: the runs of one scenario trained in
this process, with their progress and one error for the job."""

from __future__ import annotations

import argparse

from cflpipe.commands import Command, add_config, add_quiet, count, load, method_of, scenario_of, seed_of, set_threads
from cflpipe.errors import CflpipeError, SpecError


def cmd_train(args) -> int:
    set_threads(args)
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
    spec = load(args).with_tuning_choices()
    scenario = scenario_of(spec, args.scenario)
    methods = [method_of(spec, method) for method in args.method]
    _runs_on(spec, scenario, methods)
    seeds = [seed_of(spec, seed) for seed in args.seed]
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
    from cflpipe.fl.live import live_root
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
    if spec.workflow.live and to_train:  # where the curves go, and how to watch them
        folder = live_root(spec.results_dir)
        print(f"live curves: {folder} (watch with `tensorboard --logdir {folder}`)", flush=True)
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
    set_threads(args)
    from cflpipe.errors import DivergenceError
    from cflpipe.tuning import record_trial

    spec = load(args)
    tuned = spec.tuned_methods()
    if not tuned:
        raise SpecError(f"--config: {args.config} has no tuning: section (nothing to tune)")
    scenario = scenario_of(spec, args.scenario)
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

    spec = load(args)
    tuned = spec.tuned_methods()
    if not tuned:
        raise SpecError(f"--config: {args.config} has no tuning: section (nothing to select)")
    scenarios = [scenario_of(spec, args.scenario)] if args.scenario else list(spec.scenarios)
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
                  f"{', '.join(map(str, chosen['tuning_seeds']))}; {count(len(chosen['trials']), 'trial')}) -> "
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


def _train_arguments(p: argparse.ArgumentParser) -> None:
    add_config(p)
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
    add_quiet(p)


TRAIN = Command(
    "train", "run one scenario's methods for one or more seeds",
    "Writes RESULTS/runs/SCENARIO/METHOD/seedK/ (metrics, clusters, rounds, timing as Parquet,\n"
    "summary.json, config.yaml). A finished run is skipped, a killed one resumes from its state/\n"
    "checkpoint and ends with the same bytes; after a run finishes its checkpoint keeps only what\n"
    "the outputs are made from unless training.keep_state is true. The partition comes first.",
    "  cflpipe train --scenario digits-swap4 --method fedavg --seed 0\n"
    "  cflpipe train --config config/experiments/fesem.yaml \\\n"
    "      --scenario femnist-iid --method fesem-2 fedavg --seed 0 1 2\n"
    "  # with training.trainer: distributed, rank 0 runs the job and 3 more ranks train:\n"
    "  torchrun --standalone --nproc_per_node 4 -m cflpipe train --scenario digits-swap4 \\\n"
    "      --method fedavg --seed 0\n",
    _train_arguments, cmd_train)


def _tune_arguments(p: argparse.ArgumentParser) -> None:
    add_config(p)
    p.add_argument("--scenario", required=True, metavar="NAME", help="one of the spec's scenarios")
    p.add_argument("--method", required=True, metavar="NAME", help="a method entry that tuning.space tunes")
    p.add_argument("--trial", nargs="+", action="extend", metavar="TRIAL", help="these trials only (default: all of them)")
    p.add_argument("--seed", type=int, nargs="+", action="extend", metavar="SEED",
                   help="these tuning seeds only (default: all)")
    p.add_argument("--force", action="store_true", help="re-run finished trials from scratch")
    p.add_argument("--threads", type=int, default=1, metavar="N", help="CPU threads for torch (default 1)")
    add_quiet(p)


TUNE = Command(
    "tune", "train a tuned method's trials on one scenario",
    "With a `tuning:` section: trains the trials of one tuned method entry (every point of its search\n"
    "space, or those of --trial) for the tuning seeds, into RESULTS/tuning/runs/SCENARIO/METHOD/TRIAL/\n"
    "seedK/, and records each run's validation curve in its trial.json (a run that diverges is\n"
    "recorded as diverged, never chosen). Finished trials are skipped, killed ones resume. Then\n"
    "`cflpipe tune-select`; snakemake runs both before the final seeds.",
    "  cflpipe tune --config config/experiments/tuning_default.yaml --scenario digits-swap4 --method ifca\n",
    _tune_arguments, cmd_tune)


def _tune_select_arguments(p: argparse.ArgumentParser) -> None:
    add_config(p)
    p.add_argument("--scenario", metavar="NAME", help="only this scenario (default: all)")
    p.add_argument("--method", metavar="NAME", help="only this tuned method entry (default: all)")


TUNE_SELECT = Command(
    "tune-select", "choose each tuned method's values from its trials",
    "Reads the trials' records (validation figures only) and writes, per scenario × tuned method,\n"
    "RESULTS/tuning/chosen/SCENARIO/METHOD.json: the trial with the highest mean validation accuracy\n"
    "over the tuning seeds (tuning.select: at the last round, or at each seed's best round; the\n"
    "first of equal ones), with every trial's score. `cflpipe train` runs the final seeds with it.",
    "  cflpipe tune-select --config config/experiments/tuning_default.yaml\n",
    _tune_select_arguments, cmd_tune_select)
