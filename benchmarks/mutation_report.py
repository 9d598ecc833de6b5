"""Summarise a mutmut run (mutants/ after `mutmut run`): killed / survived / not checked per
module, and the survivors sorted into the kinds docs/testing.md gives reasons for.

    python3 benchmarks/mutation_report.py            # table per module, survivors by kind
    python3 benchmarks/mutation_report.py --list     # also the diff of every survivor of kind other
    python3 benchmarks/mutation_report.py --write docs/mutation-survivors.md   # every survivor, with its reason
"""

from __future__ import annotations

import argparse
import ast
import difflib
import glob
import json
import re
from collections import Counter, defaultdict
from pathlib import Path

# mutmut's exit codes per mutant: 1 (and other test failures) killed, 0 survived, 33 no test
# reaches the function, -24 / 24 / 152 timeout, None not checked yet.
SURVIVED, NO_TESTS, NOT_CHECKED = 0, 33, None
TIMEOUTS = {-24, 24, 152}



def kind_of(removed: str, added: str) -> str:
    """The kinds of survivor docs/testing.md gives a reason for; "other" needs a look."""
    if "device" in removed and ("device=None" in added or ".to(None)" in added or "device" not in added):
        return "device argument (identical on CPU)"
    if "dtype" in removed and ("dtype=None" in added or "astype(None)" in added or "dtype" not in added
                               or ".to(None)" in added):
        return "dtype argument (the default, or the input's, here)"
    if "XX" in added or re.search(r"\"[A-Z0-9_ ]+\"", added) and not re.search(r"\"[A-Z0-9_ ]+\"", removed):
        return "text of a message, key or metric name"
    return "other"


# Why the survivors of kind "other" in a function change nothing a user reads, or why no test
# within the budget sees them, by mutmut's function name (module.x_function or
# module.xǁClassǁmethod, without the __mutmut_N suffix). Written after reading each function's
# survivors (`--list`); a function not here is listed as "not reviewed".
REASONS: dict[str, str] = {}


_FUNCTIONS: dict[str, dict[str, list[str]]] = {}


def _functions(module: str) -> dict[str, list[str]]:
    """Source lines of every function mutmut wrote into mutants/<module>.py, by name (mutants and
    the original of each function sit side by side there; methods inside their class)."""
    if module not in _FUNCTIONS:
        path = Path("mutants", *module.split(".")).with_suffix(".py")
        text = path.read_text()
        lines = text.splitlines()
        _FUNCTIONS[module] = {node.name: lines[node.lineno:node.end_lineno]  # the body, not the def line
                              for node in ast.walk(ast.parse(text))
                              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name}
    return _FUNCTIONS[module]


def diff(name: str) -> tuple[str, str]:
    """(removed, added) source lines of a mutant, read from mutants/ (no `mutmut show` per mutant)."""
    module, function = name.rsplit(".", 1)
    functions = _functions(module)
    original = functions[function.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"]
    changed = [line for line in difflib.ndiff(original, functions[function]) if line[:2] in ("- ", "+ ")]
    return (" ".join(line[2:].strip() for line in changed if line[0] == "-"),
            " ".join(line[2:].strip() for line in changed if line[0] == "+"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="print the diff of every survivor of kind other")
    parser.add_argument("--write", metavar="FILE", help="write every survivor with its kind and reason (Markdown)")
    args = parser.parse_args()
    per_module: dict[str, Counter] = defaultdict(Counter)
    survivors: list[str] = []
    for meta in sorted(glob.glob("mutants/cflpipe/**/*.py.meta", recursive=True)):
        module = meta[len("mutants/"):-len(".meta")]
        for name, code in json.load(open(meta))["exit_code_by_key"].items():
            state = ("not checked" if code is NOT_CHECKED else "survived" if code == SURVIVED else
                     "no tests" if code == NO_TESTS else "timeout" if code in TIMEOUTS else "killed")
            per_module[module][state] += 1
            if state == "survived":
                survivors.append(name)
    print("| module | mutants | checked | killed | survived | no tests | timeout | score |")
    print("|---|---|---|---|---|---|---|---|")
    total = Counter()
    for module, c in sorted(per_module.items()):
        total += c
        _row(module, c)
    _row("**all**", total)
    kinds = defaultdict(list)
    for name in survivors:
        kinds[kind_of(*diff(name))].append(name)
    print()
    for kind, names in sorted(kinds.items(), key=lambda item: -len(item[1])):
        print(f"- {kind}: {len(names)}")
    if args.list:
        for name in kinds.get("other", []):
            removed, added = diff(name)
            print(f"\n## {name}\n- {removed}\n+ {added}")
    if args.write:
        Path(args.write).write_text(survivor_list(survivors))
        print(f"\n{args.write}: {len(survivors)} survivors")


def reason_of(name: str) -> str:
    removed, added = diff(name)
    kind = kind_of(removed, added)
    if kind != "other":
        return kind
    return REASONS.get(name.rsplit("__mutmut_", 1)[0], "not reviewed")


def survivor_list(survivors: list[str]) -> str:
    """Markdown: per module, per function, every surviving mutant's change and its reason."""
    lines = ["# Surviving mutants", "",
             "Written by `python3 benchmarks/mutation_report.py --write docs/mutation-survivors.md` after",
             "a mutmut run (docs/testing.md). Per function: why its survivors change nothing a user reads,",
             "or why no test in the budget sees them; then each mutant's change (removed → added).", ""]
    by_function: dict[str, list[str]] = defaultdict(list)
    for name in survivors:
        by_function[name.rsplit("__mutmut_", 1)[0]].append(name)
    module = None
    for function in sorted(by_function, key=lambda f: (f.rsplit(".", 1)[0], f)):
        if function.rsplit(".", 1)[0] != module:
            module = function.rsplit(".", 1)[0]
            lines += [f"## {module}", ""]
        names = sorted(by_function[function], key=lambda n: int(n.rsplit("_", 1)[1]))
        lines += [f"### `{function.rsplit('.', 1)[1].replace('ǁ', '.').removeprefix('x_').removeprefix('x.')}`"
                  f" ({len(names)})", ""]
        if function in REASONS:
            lines += [REASONS[function], ""]
        for name in names:
            removed, added = diff(name)
            kind = kind_of(removed, added)
            note = "" if kind == "other" and function in REASONS else f" — {reason_of(name)}"
            lines.append(f"- `{name.rsplit('__mutmut_', 1)[1]}`{note}: `{_short(removed)}` → `{_short(added)}`")
        lines.append("")
    return "\n".join(lines)


def _short(code: str, width: int = 110) -> str:
    code = code.replace("`", "'")
    return code if len(code) <= width else code[:width - 1] + "…"


def _row(module: str, c: Counter) -> None:
    checked = c["killed"] + c["survived"] + c["timeout"]
    score = f"{(c['killed'] + c['timeout']) / checked:.0%}" if checked else "–"
    print(f"| {module} | {sum(c.values())} | {checked} | {c['killed']} | {c['survived']} | {c['no tests']} "
          f"| {c['timeout']} | {score} |")


if __name__ == "__main__":
    main()
