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
REASONS: dict[str, str] = {
    "cflpipe.clustering.x_fit_pca": "Equivalent: svd_lowrank's iterations and oversampling (4 vs 5, q + 10 vs + 11) "
    "and the seed's integer range give the same top components to the tests' tolerance; the sign fix multiplies by "
    "±1 (`/` is the same); `q` capped by n or p where the tests' q is below both.",
    "cflpipe.clustering.x__lloyd": "Equivalent: the initial labels (-1, +1, -2) are overwritten by the first "
    "assignment, which never equals them on the first pass; `iteration > 1` vs `>= 1` or `> 2` and `counts > 0` vs "
    "`> 1` change when a run stops or a one-member cluster moves, not where it converges on the tests' data; "
    "`tol = 0` (the default) never computes a shift.",
    "cflpipe.clustering.x_kmeans": "Equivalent: restart counts, seeds and iteration caps that converge to the same "
    "partition on the tests' well-separated data; inertia ties broken either way.",
    "cflpipe.clustering.x__kmeans_pp": "Not seen: k-means++ only seeds Lloyd's iterations, and on the tests' "
    "well-separated data a wrong seeding (distances to another row, a uniform draw) converges to the same "
    "partition. No test checks the seeding's distribution itself: a gap, left for a later pass.",
    "cflpipe.clustering.x_hierarchical_clusters": "Equivalent: a linkage or threshold nudged by one unit that cuts "
    "the tests' well-separated dendrograms at the same height.",
    "cflpipe.fl.engine.x_resolve_device": "The CUDA branch: no GPU where the tests run (CUDA reproducibility is "
    "checked on a GPU machine, docs/performance.md).",
    "cflpipe.fl.engine.xǁRunǁsetup": "The CUDA branch (deterministic algorithms) and the field path of an error "
    "message for a model that does not exist, which the spec's validation refuses first.",
    "cflpipe.fl.engine.xǁRunǁheld_out_check": "Outside this pass's selection: tests/test_leaf_files.py and "
    "tests/test_small_test_sets.py check it (the latter joined the selection after the pass).",
    "cflpipe.fl.engine.xǁRunǁevaluate": "Partly equivalent (predicting all rows or only the members' gives the same "
    "predictions; the sampled models' seed constant is another valid stream); the rest, inverted accuracies and "
    "dropped figures, are killed by test_evaluation_figures_equal_a_computation_by_hand (added after the pass).",
    "cflpipe.fl.engine.xǁRunǁwrite_outputs": "Mostly the types of nullable integer columns and keys of timing.json "
    "(volatile, never compared); the summary's names are tested.",
    "cflpipe.methods.fcca.xǁFCCAǁflow_plan": "Killed by tests/test_fcca.py run whole but not within the 5 s "
    "budget (the flow's plans train a normalizing flow per client); the augmentation seed's parts give another "
    "valid seeded stream.",
    "cflpipe.methods.fedac.x_tune_cluster_number": "Equivalent: `<` vs `<=` on continuous G ratios; a one-row "
    "slice written as `k:k + 2` or `k:k - 1` whose first row is the same; `break` instead of `continue` after the "
    "last cluster. `range(centers.shape[1])` is killed by "
    "test_cnt_splits_when_the_models_have_more_parameters_than_max_clusters (added after the pass).",
    "cflpipe.methods.fedac.xǁFedACǁ_assign_rows": "The L2 ablation (`similarity: l2`), reached by no fast test "
    "during the pass; killed by test_the_l2_e_step_assigns_the_nearest_center_where_lrcos_sees_no_difference "
    "(added after the pass).",
    "cflpipe.methods.fedac.xǁFedACǁaggregate": "The CNT schedule and the L2 E-step's input: killed by "
    "test_cluster_number_tuning_runs_from_cnt_start_on_and_only_when_on and the L2 test (added after the pass).",
    "cflpipe.methods.kmeans_cfl.xǁKMeansCFLǁcluster_aggregate": "No fast test checked that K-means CFL clusters: "
    "killed by test_kmeans_cfl_clusters_the_uploaded_models_from_cluster_start_on and "
    "test_kmeans_cfl_puts_clients_that_never_trained_with_the_nearest_cluster_model (added after the pass); the "
    "k-means seed and restarts are equivalent on their data.",
    "cflpipe.methods.flhc.xǁFLHCǁcluster_aggregate": "Killed by the FL+HC tests added after the pass (FedAvg rounds, "
    "the cut's inputs and settings, a client missing from the clustering round); `-2` for `-1` as the "
    "unassigned mark is equivalent.",
    "cflpipe.methods.fedgroup.xǁFedGroupǁcluster_aggregate": "No fast test checked that group models move: killed "
    "by test_fedgroup_moves_each_group_model_by_its_members_mean_update (added after the pass).",
    "cflpipe.methods.fedgroup.xǁFedGroupǁcluster_eval_models": "Killed by the cold-start part of "
    "test_fedgroup_moves_each_group_model_by_its_members_mean_update (added after the pass).",
    "cflpipe.methods.fedtsdp.xǁFedTSDPǁaggregate": "The sampling weights, the dampening schedule and Hopkins' "
    "sample size: killed by the FedTSDP tests added after the pass; `>=` vs `>` on a continuous Hopkins value and "
    "`len(clients) > 2` (the tests have 6) are equivalent.",
    "cflpipe.methods.fedtsdp.xǁFedTSDPǁ_draw_public_batch": "Killed by "
    "test_the_public_batch_is_drawn_by_the_sampling_weights_without_replacement (added after the pass).",
    "cflpipe.methods.fesem.xǁFeSEMǁ_initialize": "The clients missing from the initialization: killed by "
    "test_fesem_a_client_missing_from_the_initialization_takes_the_center_nearest_the_initial_model (added after "
    "the pass); the k-means seed and restarts are equivalent on its data.",
    "cflpipe.partition.x__label_permutations": "The branch that enumerates every permutation (few classes) is "
    "reached by no test: every test dataset has 10 classes. A gap, left for a later pass.",
    "cflpipe.methods.cfl.xǁCFLǁ_split": "Guards for clusters of fewer than two members (never split), the halves' "
    "order (renumbered afterwards), `>=` vs `>` on a continuous γ and dtypes of label arrays.",
}


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
