"""LCFed as reconstructed from its abstract and FedAC: FedAC's machinery with a fixed K."""

from __future__ import annotations

import pytest

from cflpipe.fl.engine import train_run
from cflpipe.registry import method_info
from cflpipe.errors import SpecError
from cflpipe.spec import parse_spec
from cflpipe.testing import spec_dict


def _run(tmp_path, name: str, **hp):
    raw = spec_dict(tmp_path, name)
    raw["training"]["rounds"] = 6
    raw["methods"][name] = {"clusters": 3, "components": 2, **hp}
    return train_run(parse_spec(raw), "s", name, 0, progress=False).run_dir


def test_lcfed_is_fedac_without_cluster_number_tuning(tmp_path):
    lcfed = _run(tmp_path / "lcfed", "lcfed")
    fixed = _run(tmp_path / "fedac", "fedac", cnt=False)
    tuned = _run(tmp_path / "tuned", "fedac", cnt_start=1)
    same = ("metrics.parquet", "clusters.parquet")
    assert all((lcfed / f).read_bytes() == (fixed / f).read_bytes() for f in same)  # FedAC's code, not a copy
    assert any((lcfed / f).read_bytes() != (tuned / f).read_bytes() for f in same)  # CNT is what it leaves out


def test_lcfed_has_no_cnt_settings_and_says_what_it_is(tmp_path):
    info = method_info("lcfed")
    assert info.description.startswith("LCFed (reconstructed from its abstract and FedAC)")
    assert "cnt" not in info.params.model_fields and info.capabilities.k_param == "clusters"
    raw = spec_dict(tmp_path, "lcfed")
    raw["methods"]["lcfed"] = {"cnt": True}
    with pytest.raises(SpecError, match="methods.lcfed.cnt"):
        parse_spec(raw)
