"""`cflpipe methods [NAME]`: the registered methods by family, or one with its hyper-parameters,
capabilities, needs and paper."""

from __future__ import annotations

import argparse
import json
import sys

from cflpipe.commands import Command
from cflpipe.errors import SpecError


# The listing's sections, in its order, and the declared families (registry.FAMILIES) in each.
METHOD_SECTIONS = {"source papers' methods": ("seed",), "clustered": ("clustered",),
                   "personalized": ("personalized",), "baselines": ("baseline", "reference"),
                   "modifiers: AWCFL and MCFL on other methods": ("modifier",)}


def cmd_methods(args) -> int:
    from cflpipe.registry import all_methods, method_info, plugin_failures, unknown_method

    if args.name is None:
        families: dict[str, list[str]] = {section: [] for section in METHOD_SECTIONS}
        methods = all_methods()
        for name, info in methods.items():
            families[next(s for s, kinds in METHOD_SECTIONS.items() if info.family in kinds)].append(name)
        for family, names in families.items():
            if not names:
                continue
            print(f"# {family} ({len(names)})")
            for name in names:
                info = methods[name]
                print(f"{name}: {info.description}")
                if info.capabilities.summary():
                    print(f"    [{info.capabilities.summary()}]")
                if info.needs:
                    print(f"    needs: {info.needs}")
                if info.params.model_fields:
                    print(f"    hyper-parameters: {', '.join(info.params.model_fields)}")
            print()
        print("cflpipe methods NAME describes one method: its hyper-parameters with their defaults, its paper")
        for line in plugin_failures():
            print(f"warning: not listed: {line}", file=sys.stderr)
        return 0
    # Only this name's plugin is imported: a broken plugin of another name does not matter here.
    try:
        info = method_info(args.name, "NAME")
    except KeyError:
        raise SpecError(unknown_method(args.name, "NAME")) from None
    print(f"{args.name}: {info.description}")
    if info.capabilities.summary():
        print(f"capabilities: {info.capabilities.summary()}")
    if info.needs:
        print(f"needs: {info.needs}")
    if info.capabilities.pairs:
        caps = info.capabilities
        each = (f" and {caps.pair_rows_bytes} more with each evaluation (of the pairs of the clients it reads)"
                if caps.pair_rows_bytes else "")
        print(f"memory: {caps.pairs}; its paper needs all pairs: about {caps.pair_bytes} bytes a pair{each}, "
              f"{caps.pair_bytes * 10_000 ** 2 / 2 ** 30:,.1f} GiB at 10,000 clients (validate warns past this "
              f"machine's memory)")
    if info.at_scale:
        print(f"at 10,000 clients: {info.at_scale} (docs/performance.md, \"Every clustered method at scale\")")
    fields = info.params.model_fields
    print("hyper-parameters (default):" if fields else "hyper-parameters: none")
    for field, f in fields.items():
        doc = f" — {f.description}" if f.description else ""
        print(f"  {field} = {f.default!r}{doc}")
    rule = getattr(info.cls, "newcomer_rule", "")
    print(f"new clients (scenario new_clients): {rule}" if rule else
          "new clients (scenario new_clients): no rule; its new-client figures are NaN")
    for text in _papers(info):
        print(f"paper: {text}")
    example = next((f"{name}: {json.dumps(f.default)}" for name, f in fields.items()
                    if isinstance(f.default, (bool, int, float, str))), "")
    print(f"in a spec: methods: {{{args.name}: {{{example}}}}}")
    return 0


def _papers(info) -> list[str]:
    """The first paragraph of the docstring of the module that implements the method and of the
    module of each option its parameters add (AWCFL, MCFL): where cflpipe names the paper (and
    reference code) it follows."""
    import textwrap

    from cflpipe.methods.intercluster_params import AWCFLParams, MCFLParams

    options = {AWCFLParams: "cflpipe.methods.intercluster", MCFLParams: "cflpipe.methods.intercluster"}
    modules = [info.cls.__module__] + [options[c] for c in info.params.__mro__ if c in options]
    texts = []
    for name in dict.fromkeys(modules):
        doc = (getattr(sys.modules.get(name), "__doc__", None) or "").strip()
        if doc:
            texts.append(" ".join(textwrap.dedent(doc).split("\n\n")[0].split()))
    return texts


def _methods_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", nargs="?", default=None,
                   help="a method type (e.g. ifca, cfl_awcfl); omit to list all")


METHODS = Command(
    "methods", "list methods, or describe one",
    "Without NAME: every registered method type with its hyper-parameters and defaults. With NAME:\n"
    "that method's description, hyper-parameters, defaults and paper.",
    "  cflpipe methods\n"
    "  cflpipe methods fedprox\n",
    _methods_arguments, cmd_methods)
