"""`cflpipe bench`: the engine's overhead, the trainers, evaluation, scale and the yardstick."""

from __future__ import annotations

import argparse

from cflpipe.commands import Command, positive
from cflpipe.errors import SpecError


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
              plot_to=args.plot, limit_s=args.limit_s, limit_mib=args.limit_mib, rows_to=args.rows,
              client_store=args.client_store)
    return 0


def _bench_arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--client-store", choices=["memory", "disk"], default="memory",
                   help="scale: training.client_store of every run (disk: what clients keep, memory-mapped in "
                        "the run's folder; default memory)")
    p.add_argument("--data-dir", default="resources/datasets", metavar="DIR",
                   help="yardstick: where CIFAR-10 is if downloaded (else CIFAR-shaped random images)")


BENCH = Command(
    "bench", "engine overhead and per-round time on standard workloads",
    "Compares the engine's training rounds with a tight loop doing the same SGD steps (the ratio\n"
    "is the engine's overhead), the batched trainer with the sequential one, and evaluation's\n"
    "chunk sizes. Minutes on a CPU; figures in docs/performance.md.",
    "  cflpipe bench --part overhead --workload digits --rounds 5 --output bench.json\n",
    _bench_arguments, cmd_bench)
