"""What makes two specs, or two runs, the same experiment: the spec's hash and a run's config
without its thread count."""

from __future__ import annotations

from cflpipe.fl.axes import scenario_axes
from cflpipe.spec._models import LATER_TRAINING_DEFAULTS, TRAINING_NOT_IN_RUN, same_trainer_as_sequential
from cflpipe.spec._spec import Spec
from cflpipe.spec._yaml import dump_yaml

# Left out of a spec's hash: what it only shows (labels, description, report tables) and where it
# keeps files (results_dir, data_dir), so the same experiment has one hash wherever it runs; also
# what it keeps of finished runs (TRAINING_NOT_IN_RUN) and how the workflow cuts it into jobs;
# `processes` and `distributed` read as the `sequential` trainer whose bytes they give.
SPEC_HASH_EXCLUDES = ("description", "protocol", "report", "results_dir", "data_dir", "workflow")


def spec_sha256(spec: Spec) -> str:
    """The sha256 of the experiment a spec defines (seeds, training, scenarios, methods), as
    canonical JSON without cosmetic fields and paths (SPEC_HASH_EXCLUDES, labels)."""
    import hashlib
    import json

    data = spec.model_dump(mode="json", exclude=set(SPEC_HASH_EXCLUDES))
    if data.get("tuning") is None:  # added later: specs without it keep their hash
        data.pop("tuning", None)
    for key in TRAINING_NOT_IN_RUN:
        data["training"].pop(key, None)
    for key, default in LATER_TRAINING_DEFAULTS.items():  # so specs written before them keep their hash
        if data["training"].get(key) == default:
            data["training"].pop(key)
    data["training"] = same_trainer_as_sequential(data["training"])
    for entry in data["scenarios"].values():
        for axis in scenario_axes():  # added later: a scenario without one keeps its hash
            if entry.get(axis) is None:
                entry.pop(axis, None)
    for key in ("scenarios", "methods"):
        for entry in data[key].values():
            entry.pop("label", None)
            for name in TRAINING_NOT_IN_RUN:
                entry.get("training", {}).pop(name, None)
            if entry.get("training"):
                entry["training"] = same_trainer_as_sequential(entry["training"])
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def without_threads(config: dict) -> str:
    """A run's resolved config as text, less the torch thread count it ran with: what makes two
    runs the same run (threads change a run's bytes, not what the run is). A trainer that gives
    the sequential trainer's bytes reads as `sequential` (config.yaml files written before it did)."""
    config = {k: v for k, v in config.items() if k != "threads"}
    if isinstance(config.get("training"), dict):
        config["training"] = same_trainer_as_sequential(config["training"])
    return dump_yaml(config)
