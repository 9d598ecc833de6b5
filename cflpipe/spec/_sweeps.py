"""`sweep:` in a method entry: its expansion into ordinary entries at load, and error lines about
the expanded entries pointed back at what the spec file says."""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from cflpipe.errors import SpecError
from cflpipe.spec._errors import _short
from cflpipe.spec._models import LABEL_MAX, NAME_PATTERN, MethodEntry

# A method entry's `sweep:` expands into one entry per combination of values when the spec is
# loaded, so every consumer (Snakemake, `cflpipe dvc-runs`, `train --method`, the report) sees
# ordinary entries, each identical to the same entry written out by hand (nothing re-trains when
# a spec switches between the two). An explicit key rather than list values: a hyper-parameter
# may itself take a list.
SWEEP_KEY = "sweep"
# A typo such as `{from: 1, to: 100000}` should not turn into a hundred thousand training jobs.
MAX_SWEEP_ENTRIES = 1000
HYPERPARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Keys of a method entry that are not hyper-parameters of its method.
RESERVED_ENTRY_KEYS = (*MethodEntry.model_fields, SWEEP_KEY)


class SweepOrigin(BaseModel):
    """Where an expanded entry comes from: the entry of the spec file and its swept values."""

    model_config = ConfigDict(frozen=True)
    entry: str
    values: dict[str, Any]
    # Whether the entry gives `method:` or its name is the type (an error about the type is
    # then at the entry itself, as for an entry written without a sweep).
    typed: bool = True


def _sweep_values(spec: Any, where: str) -> list[Any]:
    """A sweep's values: a list, or an integer range `{from: A, to: B, step: S}` (B included)."""
    if isinstance(spec, dict):
        unknown = sorted(set(spec) - {"from", "to", "step"}, key=str)
        if unknown:
            raise SpecError(f"{where}.{unknown[0]}: unknown key; allowed: from, to, step")
        bounds = {k: spec.get(k, 1 if k == "step" else None) for k in ("from", "to", "step")}
        for k, v in bounds.items():
            if not isinstance(v, int) or isinstance(v, bool):
                raise SpecError(f"{where}.{k}: must be an integer, got {_short(v)}" if v is not None
                                else f"{where}.{k}: is required (a range is {{from: A, to: B, step: S}})")
        if bounds["step"] < 1:
            raise SpecError(f"{where}.step: must be >= 1, got {bounds['step']}")
        if bounds["to"] < bounds["from"]:
            raise SpecError(f"{where}.to: must be >= from ({bounds['from']}), got {bounds['to']}")
        count = (bounds["to"] - bounds["from"]) // bounds["step"] + 1
        if count > MAX_SWEEP_ENTRIES:
            raise SpecError(f"{where}: a range of {count} values; a sweep has at most {MAX_SWEEP_ENTRIES} entries")
        return list(range(bounds["from"], bounds["to"] + 1, bounds["step"]))
    if not isinstance(spec, list) or not spec:
        raise SpecError(f"{where}: must be a non-empty list of values or a range {{from: A, to: B, step: S}}, "
                        f"got {_short(spec)}")
    for index, value in enumerate(spec):
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise SpecError(f"{where}[{index}]: a swept value must be a number, a string, true/false or null "
                            f"(it names an entry), got {_short(value)}")
    return list(spec)


def _sweep_token(value: Any) -> str:
    """A value as part of an entry name ([a-z0-9_-]): 0.5 -> 0p5, -2 -> m2, 1e-05 -> 1e-05."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value).replace("+", "")  # shortest round-trip form: 0.1, 1e-05, 1e20
        return ("m" + text[1:] if text.startswith("-") else text).replace(".", "p")
    return re.sub(r"[^a-z0-9_-]", "_", value.lower()) or "_"


def _sweep_text(value: Any) -> str:
    """A value as a label shows it."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, float) else str(value)


def expand_sweeps(data: Any) -> tuple[Any, dict[str, SweepOrigin]]:
    """The spec data with every `methods.NAME.sweep` expanded, and {expanded name: origin}.

    `NAME: {method: T, sweep: {k1: [a, b], k2: [c]}, ...}` becomes one entry per combination (the
    Cartesian product, in the order written), named `NAME-k1a-k2c` and labelled
    `LABEL (k1=a, k2=c)` (LABEL: the entry's label, else NAME), with `method: T` (T defaults to
    NAME) and every other key of the entry. Anything malformed that is not the sweep's own
    business is left to the normal validation, which reports it at the entry's path."""
    import itertools

    methods = data.get("methods") if isinstance(data, dict) else None
    if not isinstance(methods, dict) or not any(isinstance(e, dict) and SWEEP_KEY in e for e in methods.values()):
        return data, {}
    written = {name for name, entry in methods.items() if not (isinstance(entry, dict) and SWEEP_KEY in entry)}
    expanded: dict[Any, Any] = {}
    origins: dict[str, SweepOrigin] = {}
    for name, entry in methods.items():
        if not (isinstance(entry, dict) and SWEEP_KEY in entry) or not isinstance(name, str) \
                or not NAME_PATTERN.fullmatch(name):
            expanded[name] = entry  # a bad name is reported by Spec as it was written
            continue
        where = f"methods.{name}.{SWEEP_KEY}"
        sweep = entry[SWEEP_KEY]
        if not isinstance(sweep, dict) or not sweep:
            raise SpecError(f"{where}: must be a mapping of hyper-parameter to values, e.g. {{beta: [0, 0.5, 1]}}, "
                            f"got {_short(sweep)}")
        axes: list[tuple[str, list[Any]]] = []
        for key, values in sweep.items():
            if not isinstance(key, str) or not HYPERPARAM_NAME.fullmatch(key) or key in MethodEntry.model_fields:
                reserved = f" ({key} is not a hyper-parameter)" if key in MethodEntry.model_fields else ""
                raise SpecError(f"{where}.{key}: a sweep varies hyper-parameters of the method{reserved}; "
                                f"`cflpipe methods` lists them")
            if key in entry:
                raise SpecError(f"methods.{name}.{key}: also swept in {where}.{key}; give it in one place")
            values = _sweep_values(values, f"{where}.{key}")
            # Distinct as values (1 and 1.0 would train the same entry twice), as names ('A', 'a')
            # and as labels (0.1 and '0.1' would be two entries the report shows under one name).
            tokens = [_sweep_token(v) for v in values]
            texts = [_sweep_text(v) for v in values]
            for i, value in enumerate(values):
                same = [w for w, t, x in zip(values[:i], tokens[:i], texts[:i]) if t == tokens[i] or x == texts[i]
                        or (w == value and isinstance(w, bool) == isinstance(value, bool))]
                if same:
                    raise SpecError(f"{where}.{key}: values must be distinct, got {_short(same[0])} and "
                                    f"{_short(value)}")
            axes.append((key, values))
        count = math.prod(len(values) for _, values in axes)
        if count > MAX_SWEEP_ENTRIES:
            raise SpecError(f"{where}: expands to {count} entries; a sweep has at most {MAX_SWEEP_ENTRIES}")
        base = {k: v for k, v in entry.items() if k != SWEEP_KEY}
        base["method"] = entry.get("method") or name
        label = entry.get("label")
        for combination in itertools.product(*(values for _, values in axes)):
            chosen = dict(zip((key for key, _ in axes), combination))
            new_name = name + "".join(f"-{key.lower()}{_sweep_token(v)}" for key, v in chosen.items())
            if new_name in written or new_name in origins:
                other = f"methods.{origins[new_name].entry}.{SWEEP_KEY}" if new_name in origins else f"methods.{new_name}"
                raise SpecError(f"{where}: expands to the entry name {new_name!r}, which {other} gives too; rename "
                                f"one of the two")
            new_entry = {**base, **chosen}
            if label is None or isinstance(label, str):
                text = f"{label or name} ({', '.join(f'{k}={_sweep_text(v)}' for k, v in chosen.items())})"
                if len(text) <= LABEL_MAX:
                    new_entry["label"] = text
                elif label is not None:
                    raise SpecError(f"methods.{name}.label: with the swept values appended, {text!r} is longer "
                                    f"than {LABEL_MAX} characters; shorten the label")
            expanded[new_name] = new_entry
            origins[new_name] = SweepOrigin(entry=name, values=chosen, typed=bool(entry.get("method")))
    return {**data, "methods": expanded}, origins


def _sweep_paths(lines: list[str], origins: dict[str, SweepOrigin]) -> list[str]:
    """Error lines about expanded entries, pointed at what the spec file says: `methods.E.k` of a
    swept `k` becomes `methods.NAME.sweep.k`, any other `methods.E…` becomes `methods.NAME…`.
    Lines that become the same (a bad `training:` of the entry, once per expanded entry) merge."""
    out = []
    for line in lines:
        for new_name, origin in origins.items():
            prefix = f"methods.{new_name}"
            if line.startswith(prefix) and line[len(prefix):len(prefix) + 1] in ("", ".", ":", "["):
                rest = line[len(prefix):]
                key = re.match(r"\.([A-Za-z0-9_]+)", rest)
                if key and key.group(1) in origin.values:
                    # the value of one expanded entry would read as the whole sweep's
                    rest = f".{SWEEP_KEY}{re.sub(r': unknown key, got .*?; allowed:', ': unknown key; allowed:', rest)}"
                line = f"methods.{origin.entry}{rest}"
                break
        out.append(line)
    return list(dict.fromkeys(out))
