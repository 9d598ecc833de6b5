"""Evaluation axes: what a scenario asks a run to measure beyond its participants' accuracy at the
rounds eval_every names (new clients, `new_clients`; groups that change, `drift`). Each is an
`Axis`; the run (fl/engine.py) builds the scenario's axes and calls them at fixed points, never
naming one:

- `prepare(run)` at setup, before the method's context exists: an axis may hold clients out of
  `run.data` (the new clients) and says which rounds it needs evaluated over every client;
- `attach(run)` once the method exists (what it places new clients through);
- `at_round(n)` before round n trains, and on resume with the rounds already trained (drift
  applies its moves);
- `evaluate(run, round_number, clients, result)` at each evaluation: its figures (rounds.parquet)
  and its rows of `<name>.parquet`, or None where it says nothing that round;
- `summary(run)`: what it adds to summary.json.

A third axis subclasses Axis, is built in `axes_of`, and adds its report tables under its figures'
names (report/tables.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from cflpipe.fl.evaluation import Evaluation

# `run` below is the engine's Run (fl/engine.py), which imports this package: named in words, not
# imported, so the two do not import each other.
Run = Any


# Every axis's table name: no method's own table may take one (a run without that axis too).
AXIS_TABLES = ("newcomers", "drift")


class Axis:
    name: str = ""  # its table: <name>.parquet in the run's folder
    # The 1-based rounds it needs evaluated over every client, whatever eval_every says.
    every_client_rounds: frozenset[int] = frozenset()

    def prepare(self, run: "Run") -> None:
        """At setup, before the method's context is built (run.data may be narrowed)."""

    def attach(self, run: "Run") -> None:
        """At setup, once the method is built."""

    def at_round(self, round_number: int) -> None:
        """Before 1-based round `round_number` trains (on resume: the last trained round)."""

    def evaluate(self, run: "Run", round_number: int, clients: np.ndarray | None,
                 result: "Evaluation") -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """At an evaluation that read `clients` (None: every client; `result` its participants'
        figures and tables): the axis's figures and rows, or None."""
        return None

    def summary(self, run: "Run") -> dict[str, Any]:
        return {}


def axes_of(run: "Run") -> list[Axis]:
    """The axes of the run's scenario, in a fixed order (new clients change which clients the run
    has; drift moves some of those)."""
    from cflpipe.fl.axes.drift import Drift
    from cflpipe.fl.axes.newcomers import NewClients

    axes: list[Axis] = []
    share = run.resolved.config["scenario_spec"].get("new_clients")
    if share is not None:
        axes.append(NewClients(share))
    if run.data.moves:
        axes.append(Drift())
    return axes
