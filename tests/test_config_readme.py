"""config/README.md documents every key the spec schema accepts: the README says so, and a key
added without a row (scenario `drift` once, training `eval_test`) is found here, not by a user."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

from cflpipe.spec import _models
from cflpipe.spec._spec import Spec
from cflpipe.spec._tuning import TuningOptions

README = (Path(__file__).resolve().parents[1] / "config" / "README.md").read_text()


def _section(heading: str) -> str:
    """The README's text from `heading` to the next heading of the same or a higher level."""
    start = README.index(heading)
    level = len(heading) - len(heading.lstrip("#"))
    rest = README[start + len(heading):]
    following = re.search(rf"^#{{1,{level}}} ", rest, flags=re.M)
    return rest[:following.start()] if following else rest


def _row_keys(text: str) -> set[str]:
    """The keys of a markdown table's rows: the `code` of each row's first cell (several where a
    row names a few, as "`mnist`, `fmnist`")."""
    return {key for line in text.splitlines() if line.startswith("| `")
            for key in re.findall(r"`([^`]+)`", line.split("|")[1])}


def _fields(model: type) -> set[str]:
    return set(model.model_fields)


@pytest.mark.parametrize("heading, model", [
    ("## `training`", _models.Training),
    ("## `scenarios.NAME`", _models.Scenario),
], ids=["training", "scenarios"])
def test_every_key_has_a_row_in_its_table(heading, model):
    missing = _fields(model) - _row_keys(_section(heading))
    assert not missing, f"config/README.md's {heading} table lacks {sorted(missing)}"


def test_the_top_level_block_and_the_other_sections_name_every_key():
    block = README[README.index("```yaml"):README.index("```", README.index("```yaml") + 3)]
    top = {line.split(":")[0].strip() for line in block.splitlines() if re.match(r"^[a-z_]+:", line)}
    assert _fields(Spec) - top == set(), f"top-level keys missing from the README's first block: {_fields(Spec) - top}"
    nested = {"report": _fields(typing.get_args(Spec.model_fields["report"].annotation)[0])
              if typing.get_args(Spec.model_fields["report"].annotation) else _fields(Spec.model_fields["report"].annotation),
              "workflow": _fields(Spec.model_fields["workflow"].annotation),
              "tuning": _fields(TuningOptions),
              "methods": _fields(_models.MethodEntry) | {"sweep"},
              "drift": _fields(_models.DriftEvent),
              "public": _fields(_models.PublicData)}
    for where, keys in nested.items():
        absent = sorted(k for k in keys if f"`{k}`" not in README and not re.search(rf"\b{k}:", README))
        assert not absent, f"config/README.md never names {where} key(s) {absent}"


def test_every_partition_step_and_its_parameters_are_in_the_steps_table():
    rows = {line.split("|")[1].strip().strip("`"): line for line in _section("### Partition steps").splitlines()
            if line.startswith("| `")}
    steps = [model for name, model in vars(_models).items() if name.endswith("Step") and isinstance(model, type)]
    assert steps
    for step in steps:
        kind = typing.get_args(step.model_fields["kind"].annotation)[0]
        assert kind in rows, f"partition step {kind!r} has no row in config/README.md's steps table"
        absent = [p for p in _fields(step) - {"kind"} if f"`{p}`" not in rows[kind]]
        assert not absent, f"partition step {kind!r}: parameters {absent} missing from its row"


def test_the_check_finds_a_key_that_has_no_row():
    """The table reader is not vacuous: a key it was not given is reported missing."""
    section = _section("## `scenarios.NAME`")
    assert "drift" in _row_keys(section)
    assert "drift" not in _row_keys(section.replace("| `drift` |", "| drift |"))
