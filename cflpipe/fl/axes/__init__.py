"""Evaluation axes: what a scenario asks a run to measure beyond its participants' accuracy at the
rounds eval_every names (new clients, `new_clients`; groups that change, `drift`). Each is an
`Axis`; the run (fl/engine.py) builds the scenario's axes and calls them at fixed points, never
naming one:

- `prepare(run)` at setup, before the method's context exists: an axis may hold clients out of
  `run.data` (the new clients) and says which rounds it needs evaluated over every client;
- `attach(run)` once the method exists (what it places new clients through);
- `at_round(n)` before round n trains, and on resume with the rounds already trained (drift
  applies its moves);
- `away(n)`: the clients round n may not sample (availability's);
- `after_round(run, n)` once round n's server step is done, before the run's own evaluation of
  it (availability evaluates the few clients it follows there);
- `evaluate(run, round_number, clients, result)` at each evaluation: its figures (rounds.parquet)
  and its rows of `<name>.parquet`, or None where it says nothing that round;
- `summary(run)`: what it adds to summary.json;
- `state()` / `load_state(state)`: what it carries from one evaluation to the next, checkpointed
  with the run (new clients' kept tables).

An axis a scenario names by a key of its own arrives as one module and one line of SCENARIO_AXES
below: its class gives the key, its settings' pydantic model (`Settings`: the scenario's field,
validated with the spec), `check` (validate's lines against the runs' rounds), `describe` (the
report's setup line), the summary figures it writes under its name (`figures`: into runs.parquet
and summary.parquet) and its report tables (`tables`). Such a module imports no torch and nothing
of the run: validate reads it, and what it needs of a run it asks `run` for (`run.served_accuracy`)."""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

import numpy as np

# `run` below is the engine's Run (fl/engine.py), which imports this package, and `result` an
# evaluation's figures and tables (fl/evaluation.py): named in words, not imported, so that the
# spec can read the keyed axes' settings without importing the run.
Run = Any
Evaluation = Any

# The axes a scenario names by a key of its own: one module each (module:Class).
SCENARIO_AXES = ("cflpipe.fl.axes.availability:Availability",)


class Axis:
    name: str = ""  # its table: <name>.parquet in the run's folder
    # A keyed axis's scenario key, its settings' model, summary figures and report tables
    # (name, title, figure, scale, digits, direction: report/tables.py's TableSpec).
    key: str = ""
    title: str = ""  # its row in the report's setup table
    Settings: Any = None
    figures: tuple[str, ...] = ()
    tables: tuple[tuple, ...] = ()
    # The 1-based rounds it needs evaluated over every client, whatever eval_every says.
    every_client_rounds: frozenset[int] = frozenset()

    def prepare(self, run: "Run") -> None:
        """At setup, before the method's context is built (run.data may be narrowed)."""

    def attach(self, run: "Run") -> None:
        """At setup, once the method is built."""

    def at_round(self, round_number: int) -> None:
        """Before 1-based round `round_number` trains (on resume: the last trained round)."""

    def away(self, round_number: int) -> np.ndarray | None:
        """The clients 1-based round `round_number` may not sample (None: no one kept away)."""
        return None

    def after_round(self, run: "Run", round_number: int) -> None:
        """Once round `round_number`'s server step is done, before the run evaluates it."""

    def evaluate(self, run: "Run", round_number: int, clients: np.ndarray | None,
                 result: "Evaluation") -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
        """At an evaluation that read `clients` (None: every client; `result` its participants'
        figures and tables): the axis's figures and rows, or None."""
        return None

    def summary(self, run: "Run") -> dict[str, Any]:
        return {}

    def state(self) -> dict[str, Any]:
        """What the axis carries from one evaluation to the next (tensors, arrays, numbers),
        checkpointed with the run; empty where it carries nothing."""
        return {}

    def load_state(self, state: dict[str, Any]) -> None:
        """On resume: what `state` gave at the checkpoint."""


def plain(value: float | None) -> float | None:
    """A figure for summary.json: None where it is undefined (None, NaN)."""
    return None if value is None or not np.isfinite(value) else float(value)


# Below Axis and plain: a keyed axis's module, imported here, takes them from this package.
@cache
def scenario_axes() -> dict[str, type[Axis]]:
    """The keyed axes (SCENARIO_AXES) by their scenario key."""
    classes = [getattr(importlib.import_module(module), name)
               for module, name in (reference.split(":") for reference in SCENARIO_AXES)]
    return {cls.key: cls for cls in classes}


# Every axis's table name: no method's own table may take one (a run without that axis too).
AXIS_TABLES = ("newcomers", "drift", *(cls.name for cls in scenario_axes().values()))


def axes_of(run: "Run") -> list[Axis]:
    """The axes of the run's scenario, in a fixed order (new clients change which clients the run
    has; drift moves some of those; the keyed axes, in SCENARIO_AXES' order, see the clients
    that are left)."""
    from cflpipe.fl.axes.drift import Drift
    from cflpipe.fl.axes.newcomers import NewClients

    axes: list[Axis] = []
    scenario = run.resolved.config["scenario_spec"]
    share = scenario.get("new_clients")
    if share is not None:
        axes.append(NewClients(share))
    if run.data.moves:
        axes.append(Drift())
    for key, cls in scenario_axes().items():
        if scenario.get(key) is not None:
            axes.append(cls(cls.Settings.model_validate(scenario[key], strict=False)))
    return axes
