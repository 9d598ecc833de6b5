"""Command line: argument parsing, progress, exit codes and one-line errors. The work itself is
done by the modules each subcommand calls."""

from __future__ import annotations

import argparse
import errno
import os
import sys

from cflpipe.commands import DEFAULT_CONFIG
from cflpipe.commands.bench import BENCH
from cflpipe.commands.data import DOWNLOAD
from cflpipe.commands.dvc import DVC_RUNS
from cflpipe.commands.methods import METHODS
from cflpipe.commands.steps import AGGREGATE, CLEAN, PARTITION, REPORT, VALIDATE
from cflpipe.commands.train import TRAIN, TUNE, TUNE_SELECT
from cflpipe.errors import CflpipeError, SpecError

# In `cflpipe --help`'s order: the steps from a spec to the report, then the tools.
COMMANDS = (VALIDATE, DOWNLOAD, PARTITION, TRAIN, TUNE, TUNE_SELECT, AGGREGATE, REPORT, METHODS, CLEAN, DVC_RUNS,
            BENCH)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 2, like every other bad input
        raise SpecError(f"{self.prog}: {message}")


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


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="cflpipe", description=_DESCRIPTION, epilog=_TOP_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=_version(), help="print cflpipe's version")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for command in COMMANDS:  # each command's module owns its arguments
        p = sub.add_parser(command.name, help=command.summary,
                           description=f"{command.summary[0].upper()}{command.summary[1:]}.\n\n{command.description}",
                           epilog="example:\n" + command.example, formatter_class=argparse.RawDescriptionHelpFormatter)
        command.arguments(p)
        p.set_defaults(func=command.run)
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
