"""What the commands share: the spec of --config, the one-line checks of --scenario, --method and
--seed, the number arguments, and `Command`, what a command declares. One module per command
family beside it owns its commands' arguments and work (`steps`: validate, partition, aggregate,
report, clean; `data`: download; `train`: train, tune, tune-select; `methods`; `bench`; `dvc`:
dvc-runs); cflpipe.cli builds the parser from `COMMANDS` and dispatches."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Callable

from cflpipe.errors import SpecError

DEFAULT_CONFIG = "config/config.yaml"


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, one-line summary (in `cflpipe --help`), description and examples,
    what adds its arguments to its parser, and what runs it (returns the exit code)."""

    name: str
    summary: str
    description: str
    example: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=DEFAULT_CONFIG, metavar="FILE",
                   help=f"experiment spec (YAML; default: {DEFAULT_CONFIG})")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one key of the spec, checked as the spec is: a dotted key and a YAML value, "
                        "e.g. --set training.rounds=5 --set seeds=[0]; repeatable, applied in order (the "
                        "runs' config.yaml records what ran)")


def add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bar (logs of workflow jobs)")


def scenario_of(spec, name: str) -> str:
    if name not in spec.scenarios:
        raise SpecError(f"--scenario: unknown scenario {name!r}; allowed: {', '.join(spec.scenarios)}")
    return name


def method_of(spec, name: str) -> str:
    if name not in spec.methods:
        raise SpecError(f"--method: unknown method {name!r}; allowed: {', '.join(spec.methods)}")
    return name


def seed_of(spec, seed: int) -> int:
    if seed not in spec.seeds:
        allowed = ", ".join(str(s) for s in spec.seeds)
        raise SpecError(f"--seed: {seed} is not one of the spec's seeds; allowed: {allowed}")
    return seed


def load(args, **kwargs):
    """The spec of --config; the default file missing gets its own line (the usual cause: running
    outside the checkout)."""
    from pathlib import Path

    from cflpipe.spec import load_spec

    if args.config == DEFAULT_CONFIG and not Path(DEFAULT_CONFIG).is_file():
        raise SpecError(f"--config: no {DEFAULT_CONFIG} in {Path.cwd()} (the default spec); run from the "
                        f"cflpipe checkout or give --config FILE")
    return load_spec(args.config, overrides=getattr(args, "set", None), **kwargs)


def positive(flag: str):
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


def count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def set_threads(args) -> None:
    cpus = os.cpu_count() or 1
    if not 1 <= args.threads <= cpus:
        raise SpecError(f"--threads: must lie in [1, {cpus}] (the CPUs of this machine), got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)
