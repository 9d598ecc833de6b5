"""The command line as a user meets it (issue #14, item 12): every subcommand describes itself
with an example, every option has help, `cflpipe methods NAME` describes one method, and
`--config` defaults to config/config.yaml."""

from __future__ import annotations

import argparse

import pytest

from cflpipe.cli import DEFAULT_CONFIG, build_parser, main
from cflpipe.registry import all_methods

from conftest import ROOT


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_has_a_description_an_example_and_help_on_every_option():
    commands = subcommands()
    assert {"validate", "download", "partition", "train", "aggregate", "report", "methods", "clean",
            "dvc-runs", "bench"} <= set(commands)
    for name, parser in commands.items():
        text = parser.format_help()
        assert parser.description and len(parser.description.split("\n\n")) >= 2, name  # summary + what it does
        assert "\nexample:\n  cflpipe " in text, name
        for action in parser._actions:
            assert action.help, f"cflpipe {name} {action.option_strings or action.dest}: no help"
        config = next((a for a in parser._actions if "--config" in a.option_strings), None)
        if config is not None:
            assert config.default == DEFAULT_CONFIG and not config.required, name
    top = build_parser().format_help()
    assert "cflpipe validate" in top and "clustered federated learning" in top


def test_methods_name_describes_one_method(capsys):
    assert main(["methods", "fedprox"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fedprox: FedProx")
    assert "  mu = 0.01 — " in out and "paper: FedProx (Li et al. 2020)" in out
    assert "in a spec: methods: {fedprox: {mu: 0.01}}" in out
    assert "fedavg" not in out  # one method, not the list

    assert main(["methods", "cfl_awcfl"]) == 0  # a variant: the method's paper and the option's
    out = capsys.readouterr().out
    assert "beta = 0.5" in out and "eps1 = None — " in out and "0.4 absolute" in out
    assert sum(line.startswith("paper: ") for line in out.splitlines()) == 2 and "Sattler" in out

    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    assert all(f"\n{name}: " in f"\n{listing}" for name in all_methods())


def test_an_unknown_method_name_is_one_line_listing_the_allowed(capsys):
    assert main(["methods", "fedprx"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == "" and len(lines) == 1
    assert lines[0].startswith("error: NAME: unknown method 'fedprx'; allowed: ") and "fedprox" in lines[0]


def test_config_defaults_to_config_yaml(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(ROOT)
    assert main(["validate"]) == 0
    assert capsys.readouterr().out.startswith(f"{DEFAULT_CONFIG}: ok (")
    monkeypatch.chdir(tmp_path)
    assert main(["validate"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: --config: no {DEFAULT_CONFIG} in {tmp_path} (the default spec); run from the cflpipe "
                   f"checkout or give --config FILE"]


@pytest.mark.parametrize("command", ["aggregate", "report", "clean", "partition --scenario s"])
def test_every_spec_command_takes_the_default(monkeypatch, tmp_path, capsys, command):
    monkeypatch.chdir(tmp_path)
    assert main(command.split()) == 2
    assert capsys.readouterr().err.startswith(f"error: --config: no {DEFAULT_CONFIG} in ")


def _spec_file(tmp_path, **method) -> str:
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump({
        "seeds": [0], "training": {"model": "mlp", "rounds": 2, "clients_per_round": 2},
        "scenarios": {"s": {"dataset": "digits", "clients": 4, "partition": [{"kind": "iid"}]}},
        "methods": {"fedavg": method}, "results_dir": str(tmp_path / "results")}))
    return str(path)


@pytest.mark.parametrize("argv, line", [
    (lambda tmp: ["validate", "--config", str(tmp)],
     lambda tmp: f"--config: {str(tmp)!r} is a folder; give the spec's YAML file"),
    (lambda tmp: ["validate", "--config", _spec_file(tmp, scenarios=[])],
     lambda tmp: "methods.fedavg.scenarios: must not be empty, got []"),
    (lambda tmp: ["bench", "--rounds", "0"], lambda tmp: "--rounds: must be a whole number >= 1, got '0'"),
    (lambda tmp: ["bench", "--repeats", "-1"], lambda tmp: "--repeats: must be a whole number >= 1, got '-1'"),
])
def test_bad_arguments_are_one_line_naming_the_argument(tmp_path, capsys, argv, line):
    """#33 item 4: a folder as --config, a method run on no scenario, bench's counts."""
    assert main(argv(tmp_path)) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", f"error: {line(tmp_path)}\n")


def test_a_bare_cflpipe_prints_its_usage(capsys):
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: cflpipe") and "cflpipe validate" in out


def test_the_method_listing_is_grouped_by_family(capsys):
    """#35 item 5: source papers' methods first, then clustered, personalized, baselines, modifiers."""
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("# ")]
    assert [h.split(" (")[0] for h in headers] == ["# source papers' methods", "# clustered", "# personalized",
                                                   "# baselines", "# modifiers: AWCFL and MCFL on other methods"]
    family = {}
    for line in out.splitlines():
        if line.startswith("# "):
            current = line
        elif ": " in line and not line.startswith(" "):
            family[line.split(":")[0]] = current
    assert family["fcca_per"].startswith("# source") and family["ifca"].startswith("# clustered")
    assert family["oracle"].startswith("# baselines") and family["ditto"].startswith("# personalized")
    assert family["ifca_mcfl"].startswith("# modifiers") and family["mcfl"].startswith("# source")


def test_cflpipe_partition_does_not_import_torch(tmp_path):
    """#32: each partition job paid torch's import (about 2.3 s of CPU) through cflpipe.fl.data."""
    import subprocess
    import sys

    config = _spec_file(tmp_path)
    code = ("import sys; from cflpipe.cli import main; "
            f"code = main(['partition', '--config', {config!r}, '--scenario', 's']); "
            "print(code, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.strip().splitlines()[-1] == "0 False", done.stdout + done.stderr


def test_repeated_method_and_seed_flags_add_up_rather_than_replace():
    """`--method fedavg --method ifca` asks for both (argparse's default kept only the last list, so
    the first method was silently not trained)."""
    args = build_parser().parse_args(["train", "--scenario", "s", "--method", "fedavg", "--method", "ifca", "cfl",
                                      "--seed", "0", "--seed", "1"])
    assert args.method == ["fedavg", "ifca", "cfl"] and args.seed == [0, 1]
    args = build_parser().parse_args(["tune", "--scenario", "s", "--method", "ifca", "--trial", "a", "--trial", "b",
                                      "--seed", "100", "--seed", "101"])
    assert args.trial == ["a", "b"] and args.seed == [100, 101]


def test_a_method_named_twice_across_flags_is_one_line(tmp_path, capsys):
    spec = _spec_file(tmp_path)
    code = main(["train", "--config", spec, "--scenario", "s", "--method", "fedavg", "--method", "fedavg",
                 "--seed", "0", "--quiet"])
    assert code == 2 and capsys.readouterr().err.strip() == "error: --method: fedavg given twice; give each method once"
