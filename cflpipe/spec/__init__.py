"""The YAML experiment spec as pydantic models.

A spec is datasets × partition scenarios × methods × seeds. Every validation error is turned
into one line `yaml.path: what is wrong, got VALUE` so a researcher can fix the file without
reading a traceback. This package must not import torch.

Callers import from `cflpipe.spec`; the private modules are its layout, not its interface:
`_models` (training, partition steps, scenarios, method entries), `_spec` (the whole spec and
its runs), `_errors` (error lines), `_sweeps` (`sweep:` expansion), `_checks` (`parse_spec` and
the checks across a spec's parts), `_yaml` (spec files) and `_hashing` (what makes two specs
or runs the same).
"""

from cflpipe.spec._checks import MAX_SPEC_VALUES, parse_spec, spec_warnings, training_key_path
from cflpipe.spec._errors import errors_to_lines
from cflpipe.spec._hashing import SPEC_HASH_EXCLUDES, spec_sha256, without_threads
from cflpipe.spec._models import (
    FLIP_AXES,
    GROUP_TRANSFORMS,
    LABEL_MAX,
    LABEL_SPLITS,
    LATER_STEP_DEFAULTS,
    MAX_COUNT,
    MAX_MLP_DEPTH,
    BUILTIN_TRAINERS,
    MODEL_NAMES,
    NAME_PATTERN,
    TRAINING_KEYS,
    TRAINING_NOT_IN_RUN,
    DatasetRef,
    DirichletStep,
    DriftEvent,
    FlipStep,
    IIDStep,
    LabelSwapStep,
    MixtureStep,
    MethodEntry,
    NaturalStep,
    PartitionStep,
    PathologicalStep,
    PublicData,
    QuantityStep,
    RotationStep,
    step_text,
    Scenario,
    Strict,
    Training,
    check_label,
    label_field,
    merge_training,
    mlp_depth,
    model_layers,
    same_trainer_as_sequential,
)
from cflpipe.spec._spec import (
    MAX_SEED,
    PERCENT_FIGURES,
    RUN_OUTPUT_FILES,
    TABLE_FIGURES,
    PaperTableEntry,
    ReportOptions,
    Spec,
    WorkflowOptions,
)
from cflpipe.spec._sweeps import (
    HYPERPARAM_NAME,
    MAX_SWEEP_ENTRIES,
    RESERVED_ENTRY_KEYS,
    SWEEP_KEY,
    SweepOrigin,
    expand_sweeps,
)
from cflpipe.spec._yaml import (
    MAX_SPEC_BYTES,
    DuplicateKeyError,
    UniqueKeyLoader,
    apply_overrides,
    default_results_dir,
    dump_yaml,
    load_spec,
    read_yaml,
    spec_data,
)

__all__ = [
    "DatasetRef", "DirichletStep", "DuplicateKeyError", "FLIP_AXES", "FlipStep", "GROUP_TRANSFORMS",
    "HYPERPARAM_NAME", "IIDStep", "LABEL_MAX", "LABEL_SPLITS", "LATER_STEP_DEFAULTS", "LabelSwapStep", "MixtureStep",
    "MAX_COUNT", "MAX_MLP_DEPTH", "MAX_SEED", "MAX_SPEC_BYTES", "MAX_SPEC_VALUES", "MAX_SWEEP_ENTRIES",
    "BUILTIN_TRAINERS", "MODEL_NAMES", "MethodEntry", "NAME_PATTERN", "NaturalStep", "PERCENT_FIGURES", "PaperTableEntry",
    "PartitionStep", "PathologicalStep", "PublicData", "QuantityStep", "RESERVED_ENTRY_KEYS",
    "DriftEvent", "RUN_OUTPUT_FILES", "ReportOptions", "RotationStep", "step_text", "SPEC_HASH_EXCLUDES", "SWEEP_KEY", "Scenario",
    "Spec", "Strict", "SweepOrigin", "TABLE_FIGURES", "TRAINING_KEYS", "TRAINING_NOT_IN_RUN", "Training",
    "UniqueKeyLoader", "WorkflowOptions", "check_label", "default_results_dir", "dump_yaml",
    "errors_to_lines", "expand_sweeps", "label_field", "load_spec",
    "apply_overrides",
    "spec_data", "merge_training", "mlp_depth", "model_layers",
    "parse_spec", "read_yaml", "same_trainer_as_sequential", "spec_sha256", "spec_warnings", "training_key_path", "without_threads",
]
