"""`tuning:` — hyper-parameters searched per method entry and scenario on validation data, with
tuning seeds of their own, before the final seeds run with the chosen values; and `protocol:`,
how a spec's hyper-parameters were set. Here: the section's model and its trials (grid, or a
seeded Optuna sampler); the selection and the trials' records are cflpipe.tuning's."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from cflpipe.spec._errors import _short
from cflpipe.spec._models import Strict
from cflpipe.spec._sweeps import _sweep_text, _sweep_token

# The space entry that applies to every method entry (a method's own entry wins key by key).
ALL_METHODS = "all"
# Training keys a trial may vary: what changes how a client learns, not what a run is or records.
TUNABLE_TRAINING = ("lr", "momentum", "weight_decay", "lr_decay", "local_steps", "local_epochs", "batch_size")
# A grid typo (five keys of ten values) should not become 100,000 trainings per scenario.
MAX_TRIALS = 500
# Sampled floats are kept to this many significant digits: readable trial names and values, and
# nothing a learning rate's fourth digit would change.
SAMPLED_DIGITS = 3
PROTOCOLS = ("shared", "paper", "tuned")


class TuningRange(Strict):
    """A float interval to sample from (random sampler only): uniform, or log-uniform with `log`."""

    low: float
    high: float
    log: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> "TuningRange":
        if not self.high > self.low:
            raise ValueError(f"high must be > low ({self.low}), got {self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"low must be > 0 with log: true, got {self.low}")
        return self


class TuningOptions(Strict):
    """`tuning:` of a spec. The final seeds (`seeds:`) never take part in it."""

    seeds: list[int] = Field(min_length=1, description="seeds of the trials, none of them a final seed")
    space: dict[str, dict[str, Any]] = Field(
        min_length=1, description="per method entry (or `all`): {key: [values]} or {key: {low, high, log}}; keys are "
                                  f"training keys ({', '.join(TUNABLE_TRAINING)}) or the method's hyper-parameters")
    sampler: Literal["grid", "random"] = Field(
        "grid", description="grid: every combination of the listed values; random: `trials` draws of Optuna's "
                            "RandomSampler seeded by sampler_seed (adding trials keeps the earlier ones)")
    trials: int | None = Field(None, ge=1, le=MAX_TRIALS, description="draws of the random sampler")
    sampler_seed: int = Field(0, ge=0, le=2**32 - 1)
    select: Literal["last", "best"] = Field(
        "last", description="the trial with the highest mean over tuning seeds of the validation accuracy "
                            "(macro) at the last round (last) or at each seed's best validation round (best)")

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        for seed in seeds:
            if not 0 <= seed <= 2**63 - 1:
                raise ValueError(f"seeds must lie in [0, {2**63 - 1}] (torch's seed range), got {seed}")
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"seeds must be distinct, got {seeds}")
        return seeds

    @field_validator("space")
    @classmethod
    def _space(cls, space: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for entry, keys in space.items():
            if not keys:
                raise ValueError(f"@{entry}: give at least one key to tune, e.g. {{lr: [0.01, 0.05, 0.1]}}")
            for key, values in keys.items():
                if isinstance(values, dict):
                    try:
                        TuningRange(**values)
                    except ValidationError as exc:
                        from cflpipe.spec._errors import errors_to_lines

                        raise ValueError("@" + errors_to_lines(exc, values, f"{entry}.{key}")[0]) from None
                elif not isinstance(values, list) or not values:
                    raise ValueError(f"@{entry}.{key}: must be a non-empty list of values or a range "
                                     f"{{low: A, high: B, log: true}}, got {_short(values)}")
                else:
                    for index, value in enumerate(values):
                        if value is None or not isinstance(value, (bool, int, float, str)):
                            raise ValueError(f"@{entry}.{key}[{index}]: a value must be a number, a string or "
                                             f"true/false, got {_short(value)}")
                    tokens = [_sweep_token(v) for v in values]
                    if len(set(tokens)) != len(tokens):
                        raise ValueError(f"@{entry}.{key}: values must be distinct, got {_short(values)}")
        return space

    @model_validator(mode="after")
    def _budget(self) -> "TuningOptions":
        if self.sampler == "random" and self.trials is None:
            raise ValueError("@trials: the random sampler needs a number of trials")
        if self.sampler == "grid":
            if self.trials is not None:
                raise ValueError(f"@trials: a grid runs every combination; trials is for sampler: random, "
                                 f"got {self.trials}")
            for entry, keys in self.space.items():
                ranged = [key for key, values in keys.items() if isinstance(values, dict)]
                if ranged:
                    raise ValueError(f"@space.{entry}.{ranged[0]}: a range is sampled (sampler: random); a grid "
                                     f"lists its values")
        return self

    def keys_of(self, method: str) -> dict[str, Any]:
        """The search space of method entry `method`: `all`'s keys, then its own."""
        return {**self.space.get(ALL_METHODS, {}), **self.space.get(method, {})}


def training_part(values: dict[str, Any]) -> dict[str, Any]:
    """The training keys of a trial's values."""
    return {k: v for k, v in values.items() if k in TUNABLE_TRAINING}


def hyperparams_part(values: dict[str, Any]) -> dict[str, Any]:
    """The method's hyper-parameters among a trial's values."""
    return {k: v for k, v in values.items() if k not in TUNABLE_TRAINING}


@dataclass(frozen=True)
class Trial:
    """One point of a method entry's search space: its name (a path part, from its values), the
    values, and those split into training overrides and the method's hyper-parameters."""

    name: str
    values: dict[str, Any]

    @property
    def training(self) -> dict[str, Any]:
        return training_part(self.values)

    @property
    def hyperparams(self) -> dict[str, Any]:
        return hyperparams_part(self.values)

    @property
    def text(self) -> str:
        return ", ".join(f"{k}={_sweep_text(v)}" for k, v in self.values.items())


def trial_name(values: dict[str, Any]) -> str:
    return "-".join(f"{key.lower()}{_sweep_token(value)}" for key, value in values.items())


def _rounded(value: Any) -> Any:
    if isinstance(value, float) and value != 0:
        return round(value, SAMPLED_DIGITS - 1 - math.floor(math.log10(abs(value))))
    return value


def expand_trials(tuning: TuningOptions, method: str) -> list[Trial]:
    """The trials of method entry `method` (none when its space is empty), in a stable order: a
    grid's combinations in the order written; a random sampler's draws in the order drawn, the
    same first draws whatever `trials` is (so a larger budget only adds trials)."""
    keys = tuning.keys_of(method)
    if not keys:
        return []
    if tuning.sampler == "grid":
        combos = [dict(zip(keys, combo)) for combo in itertools.product(*keys.values())]
        return [Trial(trial_name(values), values) for values in combos]
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {key: FloatDistribution(values["low"], values["high"], log=bool(values.get("log", False)))
             if isinstance(values, dict) else CategoricalDistribution(values) for key, values in keys.items()}
    # The sampler's draws do not depend on results (nothing is told to the study), so trials are
    # independent jobs; a trial's name is its values (a range's rounded, within its bounds), so two
    # draws that round alike are one.
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=tuning.sampler_seed))
    trials: dict[str, Trial] = {}
    for _ in range(20 * tuning.trials):
        if len(trials) == tuning.trials:
            break
        values = {key: min(max(_rounded(value), keys[key]["low"]), keys[key]["high"])
                  if isinstance(keys[key], dict) else value for key, value in study.ask(space).params.items()}
        trials.setdefault(trial_name(values), Trial(trial_name(values), values))
    return list(trials.values())


def grid_size(tuning: TuningOptions, method: str) -> int:
    return math.prod(len(v) for v in tuning.keys_of(method).values())


@dataclass(frozen=True)
class MethodChoice:
    """What tuning chose for one method entry on one scenario (nothing for one not tuned), and
    what the selection was made over: its rule, tuning seeds and trials."""

    trial: str | None = None
    values: dict[str, Any] | None = None
    made_over: dict[str, Any] | None = None

    @property
    def training(self) -> dict[str, Any]:
        return training_part(self.values or {})

    @property
    def hyperparams(self) -> dict[str, Any]:
        return hyperparams_part(self.values or {})


def read_choice(path) -> MethodChoice:
    """The chosen trial of a selection file (cflpipe.tuning writes it); one line naming the file
    when it is not one."""
    import json

    from cflpipe.errors import SpecError

    try:
        data = json.loads(path.read_text())
        made_over = {"rule": data["rule"], "tuning_seeds": list(data["tuning_seeds"]),
                     "trials": {t["trial"]: t["values"] for t in data["trials"]}}
        return MethodChoice(str(data["chosen"]), dict(data["values"]), made_over)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"{path}: not a tuning selection ({type(exc).__name__}: {exc}); delete it and run "
                        f"`cflpipe tune-select` again") from None
