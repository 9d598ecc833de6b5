"""User-facing errors: each carries exactly one line that names the field, the value and what
is allowed. The CLI prints the line and exits non-zero; nothing else is shown."""


class CflpipeError(Exception):
    """An error caused by the user's input or environment, not by a bug."""

    exit_code = 2

    def __init__(self, message: str):
        # Each line is one complete error; stray whitespace inside a line is folded.
        lines = [" ".join(line.split()) for line in str(message).splitlines()]
        super().__init__("\n".join(line for line in lines if line))


class SpecError(CflpipeError):
    """A bad value in the YAML spec or in CLI arguments."""


class DataError(CflpipeError):
    """A dataset cannot be downloaded, verified or parsed."""

    exit_code = 3


class PartitionError(CflpipeError):
    """A partition request that cannot be satisfied by the data."""


class DivergenceError(CflpipeError):
    """Training produced a NaN/inf loss."""

    exit_code = 4


class CompileError(CflpipeError):
    """training.compile could not compile the batched trainer's step (no C++ compiler or Triton,
    a backend failure, too many distinct group shapes)."""


class BusyError(CflpipeError):
    """Another process is writing the same output (a second `cflpipe train` of one run)."""

    exit_code = 5
