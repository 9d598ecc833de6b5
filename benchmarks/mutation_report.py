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
    "cflpipe.clustering.tools.x_fit_pca": "Equivalent: svd_lowrank's iterations and oversampling (4 vs 5, q + 10 vs + 11) "
    "and the seed's integer range give the same top components to the tests' tolerance; the sign fix multiplies by "
    "±1 (`/` is the same); `q` capped by n or p where the tests' q is below both.",
    "cflpipe.clustering.engine.x_kmeans": "Equivalent: restart counts, seeds and iteration caps that converge to the same "
    "partition on the tests' well-separated data; inertia ties broken either way.",
    "cflpipe.clustering.engine.x__kmeans_pp": "Not seen: k-means++ only seeds Lloyd's iterations, and on the tests' "
    "well-separated data a wrong seeding (distances to another row, a uniform draw) converges to the same "
    "partition. No test checks the seeding's distribution itself: a gap, left for a later pass.",
    "cflpipe.clustering.tools.x_hierarchical_clusters": "Equivalent: a linkage or threshold nudged by one unit that cuts "
    "the tests' well-separated dendrograms at the same height.",
    "cflpipe.fl.runs.x_resolve_device": "The CUDA branch: no GPU where the tests run (CUDA reproducibility is "
    "checked on a GPU machine, docs/performance.md).",
    "cflpipe.fl.engine.xǁRunǁsetup": "The CUDA branch (deterministic algorithms) and the field path of an error "
    "message for a model that does not exist, which the spec's validation refuses first.",
    "cflpipe.fl.sampling.x_training_clients": "Outside this pass's selection: tests/test_leaf_files.py and "
    "tests/test_small_test_sets.py check it (the latter joined the selection after the pass).",
    "cflpipe.fl.engine.xǁRunǁevaluate": "Partly equivalent (predicting all rows or only the members' gives the same "
    "predictions; the sampled models' seed constant is another valid stream); the rest, inverted accuracies and "
    "dropped figures, are killed by test_evaluation_figures_equal_a_computation_by_hand (added after the pass).",
    "cflpipe.fl.outputs.x_write_outputs": "Mostly the types of nullable integer columns and keys of timing.json "
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
    "cflpipe.methods.fedtsdp.xǁFedTSDPǁaggregate": "The sampling weights, the dampening schedule and Hopkins' "
    "sample size: killed by the FedTSDP tests added after the pass; `>=` vs `>` on a continuous Hopkins value and "
    "`len(clients) > 2` (the tests have 6) are equivalent.",
    "cflpipe.methods.fedtsdp.xǁFedTSDPǁ_draw_public_batch": "Killed by "
    "test_the_public_batch_is_drawn_by_the_sampling_weights_without_replacement (added after the pass).",
    "cflpipe.methods.fesem.xǁFeSEMǁ_initialize": "The clients missing from the initialization: killed by "
    "test_fesem_a_client_missing_from_the_initialization_takes_the_center_nearest_the_initial_model (added after "
    "the pass); the k-means seed and restarts are equivalent on its data.",
    "cflpipe.partition.groups.x__label_permutations": "The branch that enumerates every permutation (few classes) was "
    "reached by no test (every test dataset has 10 classes): now by "
    "test_few_class_label_permutations_are_distinct_non_identity_draws_of_every_permutation (added after the "
    "fourth pass). Sending few classes to the drawing branch instead is equivalent: it draws valid distinct "
    "permutations too.",
    "cflpipe.methods.cfl.xǁCFLǁ_split": "Guards for clusters of fewer than two members (never split), the halves' "
    "order (renumbered afterwards), `>=` vs `>` on a continuous γ and dtypes of label arrays.",
    "cflpipe.partition.groups.x__plan_groups":
        "The non-square guard for rotations (`odd`, each operator and constant) and the `pairs` call of "
        "label_swap (no test built a partition with `pairs` through a scenario; every dropped or None "
        "argument): killed by test_only_odd_multiples_of_90_are_refused_on_non_square_images and "
        "test_label_swap_pairs_through_a_scenario; the dataset name and field passed to the permutation "
        "draws only reach error messages, killed by "
        "test_error_messages_name_the_dataset_and_the_related_step (all added after the pass).",
    "cflpipe.partition.x_build_partition":
        "Irrelevant: the default `where` (every caller passes one, it only prefixes messages); `-2` for "
        "`-1` as the unused mark (every reader tests `owner >= 0`). Killed by tests added after the pass:"
        " the label range check (test_labels_outside_the_classes_are_refused), the default iid split "
        "without a label step, `clients >= pool_size` and `max(min_size, 2)` "
        "(test_a_pool_of_exactly_one_sample_per_client_gives_each_client_one), quantity sizes ignored or "
        "unused samples given to client 1 (test_quantity_leaves_the_rest_of_the_pool_unused; "
        "test_quantity_sets_sizes_in_either_position also), natural with `holdout: dataset` and pool "
        "train (test_natural_split_with_the_datasets_own_test_split; tests/test_leaf_files.py also, "
        "outside the selection), dataset names and fields in messages "
        "(test_error_messages_name_the_dataset_and_the_related_step). `groups` dropped (the label "
        "picture's title only) is killed by test_label_swap_pairs_through_a_scenario and "
        "test_groups_are_balanced_and_transforms_match.",
    "cflpipe.partition.x__assemble":
        "Killed by tests added after the pass: the empty-client guard "
        "(test_assemble_refuses_a_client_without_samples), `== 1` and `n_test` without minlength (a pool "
        "of one sample per client: test_a_pool_of_exactly_one_sample_per_client_gives_each_client_one), "
        "`astype(None)` turning the stats' integer columns into floats (the stats dtypes now checked in "
        "check_invariants).",
    "cflpipe.partition.splits.x__repair_min_size":
        "Equivalent: `(low + high + 2) // 2` still picks a mid in (low, high], so the search ends at the "
        "same level; `freed(mid) > total` stops one level lower only where freed(level) == total, and "
        "then take = sizes - level for every donor, the same as the original's `rest` step. The rest "
        "(client 0 or its samples left out with `> 0`, a deficit of at least 1, `total == 1` skipping a "
        "one-sample repair, `sizes >= low` taking from a client at the level) is killed by "
        "test_repair_min_size_moves_the_deficit_from_the_largest_clients (added after the pass).",
    "cflpipe.partition.splits.x__split_pathological":
        "Equivalent: argsort's default axis is the last one (axis=1 here); `starts - arange` walks the "
        "circle the other way, and the random relabelling of the labels makes that the same distribution "
        "of label sets (it changes which seed gives which partition, which only a snapshot would see: "
        "left). Random label sets ignoring quantity, and the field and `where` of their messages, are "
        "killed by test_random_label_sets_take_their_sizes_from_quantity and "
        "test_error_messages_name_the_dataset_and_the_related_step (added after the pass).",
    "cflpipe.partition.groups.x__pair_swaps":
        "Killed by tests added after the pass: the pairs guard (`2 / pairs`, which let math.factorial "
        "fail on a negative) by test_error_messages_name_the_dataset_and_the_related_step; `2 * pairs` "
        "for `2 ** pairs` (same for 1 and 2 pairs), the groups bound at capacity and `seen` never growing"
        " by test_pair_swaps_reach_every_distinct_swap_and_count_them.",
    "cflpipe.partition.splits.x__shard_pathological":
        "Equivalent: `class_sizes[c] / h + bool` assigned into the int64 counts truncates to the same "
        "integer as `//` for any pool below 2^52 samples. `holders >= class_sizes` (a label with exactly "
        "one sample per holder) is killed by "
        "test_a_pool_of_exactly_one_sample_per_client_gives_each_client_one; the short label in the "
        "message, the field passed on and `class_sizes + holders` (clients overdraw a label) by "
        "test_error_messages_name_the_dataset_and_the_related_step (added after the pass).",
    "cflpipe.partition.splits.x__fill_pathological":
        "Killed by test_pathological_fill_tops_up_exactly_and_splits_the_rest_evenly (added after the "
        "pass): a last missing sample not topped up, a client that takes exactly what its labels have "
        "left refused, a label with one spare sample not open, the remainder of an uneven top-up given to"
        " the last labels.",
    "cflpipe.partition.groups.x__format_angle":
        "A non-integer angle recorded as its integer part or as None (the transform string is what "
        "apply_transform turns by): killed by "
        "test_only_odd_multiples_of_90_are_refused_on_non_square_images (added after the pass).",
    "cflpipe.partition.splits.x__label_pools":
        "`bounds` over one class more: only bounds[0..C] are read, equivalent. An unstable argsort (whose"
        " order can depend on the CPU's sort kernel, so the same seed would deal other samples on another"
        " machine) is killed by test_label_pools_keep_the_shuffle_order_within_each_class (added after "
        "the pass).",
    "cflpipe.partition.splits.x__split_dirichlet_clientwise":
        "Killed by tests added after the pass: `need > 1` (a client of size 1 gets nothing) by "
        "test_a_pool_of_exactly_one_sample_per_client_gives_each_client_one; `remaining > 1` (a label's "
        "last sample left to the fallback) and `p * mass` (an exhausted label's share piled on the last "
        "label) by test_clientwise_dirichlet_spreads_a_runout_labels_share_by_the_clients_proportions.",
    "cflpipe.partition.splits.x__split_dirichlet_labelwise":
        "Equivalent: np.diff's default axis is the last one (axis=1 here). `needed >= pool_size` is "
        "killed by test_a_pool_of_exactly_one_sample_per_client_gives_each_client_one, `bounds[:, -2]` "
        "(the last client gets no sample of any class, only the min_size repair) by "
        "test_labelwise_dirichlet_gives_the_last_client_its_share (added after the pass).",
    "cflpipe.partition.splits.x__quantity_sizes":
        "`>=` for `>` in both checks (a quantity that uses exactly the whole pool refused): killed by "
        "test_a_pool_of_exactly_one_sample_per_client_gives_each_client_one (added after the pass).",
    "cflpipe.partition.splits.x__check_min_size_vs_quantity":
        "`>=` refused a min_size equal to the quantity min: killed by "
        "test_a_pool_of_exactly_one_sample_per_client_gives_each_client_one (added after the pass).",
    "cflpipe.fl.data.x_build_federated_data":
        "The stale-partition checks (a wrong name for clients.parquet, no fingerprint or digest check, no"
        " partition loaded) are killed by test_partition_from_another_scenario_definition_is_refused and "
        "test_partition_tables_from_another_scenario_are_refused, which reach this function beyond the "
        "pass's 5 s budget of its cheapest tests; `public = \"\"` and `transforms` None by "
        "test_federated_data_follows_the_written_partition (added after the pass). The `where` of "
        "build_partition's errors (None, the default) changes only a message's prefix.",
    "cflpipe.partition_files.x_input_digests":
        "Mostly killed by test_a_runs_config_records_the_digests_of_a_users_input_files (added after the "
        "pass); `sha256_of(p) ... or True` (hashing a missing file) by "
        "test_a_run_that_fails_before_writing_anything_leaves_the_results_folder_as_it_was (added after "
        "the pass). Equivalent for every built-in dataset: `info.inputs(params, None)`, since the one "
        "dataset that hashes its inputs (`files`) ignores data_dir; a plugin's dataset whose inputs lie "
        "under data_dir would hash the wrong path (a gap, left: no such dataset here).",
    "cflpipe.partition_files.x__fingerprint":
        "Dropping the file digests (`digests = None`, a null digest) and `sort_keys` off (the fingerprint"
        " would follow the YAML order of a dataset's params) are killed by "
        "test_the_fingerprint_follows_the_users_file_not_the_order_of_its_params (added after the pass). "
        "`indent` (None, 3, the default) changes only the layout of scenario.json, which is compared only"
        " with text the same code writes; the key's spelling is a name.",
    "cflpipe.partition_files.x_partition_scenario":
        "`force` defaulting to True, `if force and ...` (an up-to-date partition rewritten, a forced one "
        "skipped) and the picture among the digested files are killed by "
        "test_an_up_to_date_partition_is_left_alone_unless_forced; the dataset's params dropped by "
        "test_federated_data_follows_the_written_partition (a `files` dataset needs its path; digits has "
        "no params), both added after the pass. The `where` of build_partition's errors (None, the "
        "default) changes only a message's prefix.",
    "cflpipe.fl.data.xǁFederatedDataǁclient":
        "Killed by test_client_gives_train_rows_by_default_and_test_rows_when_asked (added after the "
        "pass): another default split would hand bench.py the test rows, `or True` would give the train "
        "rows to a caller asking for the test split.",
    "cflpipe.partition_files.x__digest_problem":
        "Equivalent: `rpartition(\" \")` splits each line of partition.sha256 at the same place, since a "
        "hex digest and the table names written there hold no double space. `out * name` (a TypeError "
        "instead of the one-line 'missing' error) is killed by "
        "test_federated_data_follows_the_written_partition (added after the pass).",
    "cflpipe.fl.data.x__standardizer":
        "Float64 statistics (`astype(None)`) would make a float64 copy of the whole pool: killed by "
        "test_standardized_images_stay_float32 (added after the pass).",
    "cflpipe.partition.arrays.x_apply_transform":
        "Killed by test_rotations when run by hand (`% 361`, `turned = None`, the quarter-turn count "
        "dropped or divided by 91, axes (-3, -1) or (-2, +1)), a test in the pass's selection and budget:"
        " the third pass recorded them as surviving, the fourth as killed. `angle * 90` and `angle / 91` (45° taken"
        " for no turn, 91° for 90°) and the interpolation order (3 by default, 2) are killed by "
        "test_free_angle_rotation_turns_a_ramp_by_exactly_that_angle, `cval=1.0` by "
        "test_free_angle_rotation_keeps_the_pixel_range_and_pads_with_black (both added after the pass). "
        "Equivalent: `rpartition(\":\")` (a transform holds one colon); `int(angle / 90)` where angle is a "
        "multiple of 90; axes +2 for -2 on the (N, C, H, W) arrays every caller passes (rotation and "
        "flips are refused for feature vectors); `reshape=None` (falsy) and no `cval` (0.0 is scipy's "
        "default); `np.flip(x, ())` is x itself.",
    "cflpipe.partition.files.x_write_partition":
        "`preserve_index=True` (an `__index_level_0__` column in the files) and `out * PUBLIC_FILE` (a "
        "stale public.parquet not removed) are killed by "
        "test_partition_files_hold_their_documented_columns_and_a_stale_public_file_goes (added after the"
        " pass). Equivalent: `preserve_index` None or the default, since the tables carry a RangeIndex, "
        "which pyarrow records as schema metadata, not a column (every reader sees the same columns and "
        "rows); the picture's title, which no caller passes (picture only).",
    "cflpipe.partition.files.x_load_partition":
        "Requiring label_hist.png and `public = \"\"` without a public file are killed by "
        "test_partition_files_hold_their_documented_columns_and_a_stale_public_file_goes (added after the"
        " pass). Equivalent: the top group when `stats` is empty (a scenario has at least one client, so "
        "never); `to_numpy(None)` of an int64 column.",
    "cflpipe.partition.x__holdout":
        "Killed by test_holdout_keeps_a_sample_on_each_side_of_every_client_with_two (added after the "
        "pass): the thresholds and clip bounds decide whether a client of 1, 2 or 3 samples trains and "
        "tests. Equivalent: `bincount` without `minlength` (only clients that own samples are looked up) "
        "and float counts from `astype(None)` (compared with integer ranks, same result).",
    "cflpipe.partition.x__public_samples":
        "A size of None taken as given, `size >= available` and drawing with replacement are killed by "
        "test_public_samples_are_distinct_and_default_to_the_whole_test_split (added after the pass). "
        "Equivalent: `replace=None` (falsy: numpy draws without replacement, the same draw).",
    "cflpipe.partition.arrays.x_client_indices":
        "Equivalent: `to_numpy(None)` keeps the int32 client and int64 sample columns, whose keys fit "
        "either way; a longer `np.arange` only adds bounds that are never read.",
    "cflpipe.partition.x__pool_sources":
        "`and` for `or` (concatenating a None) is killed by "
        "test_pool_sources_are_those_of_the_datasets_pool (added after the pass).",
    "cflpipe.partition.arrays.x_client_transforms":
        "Equivalent: `astype(None)` makes the keys floats, which equal and hash like the integer clients "
        "client_arrays looks up.",
    "cflpipe.fl.sampling.x_sample":
        "The held-out branch (LEAF's user-level split, sampling only the clients with training samples) "
        "was reached by no fast test: its dropped or None arguments and `replace=True` are killed by "
        "test_sampling_among_the_clients_that_train_draws_distinct_ones_each_round (added after the "
        "pass). Equivalent: `replace=None` in either branch, which numpy's choice reads as False; the "
        "seed constant 0x5A → 91 is another valid seeded stream.",
    "cflpipe.fl.engine.xǁRunǁexecute":
        "Equivalent or display only: `losses or True` gives np.mean([]) = nan (with a numpy warning) in a"
        " round whose updates were all skipped, the same figure; the progress bar's postfix and step "
        "change no output file; `skipped=None` reads as False in RunResult.message, its only use. "
        "`skipped=True` for a run just trained is killed by "
        "test_a_finished_run_is_skipped_only_unforced_and_for_the_same_config (added after the pass).",
    "cflpipe.fl.resume.x_try_resume":
        "Killed by tests added after the pass, each mutant checked by hand: a mid-run checkpoint taken "
        "for a problem (`or` for `and`, `get(None)`), never resumed (`get(None) !=`, `==`), or its empty "
        "metrics table read back without a default list (`defaultdict(None, …)`) by "
        "test_a_resume_before_the_first_evaluation_equals_an_uninterrupted_run; `or` with a damaged "
        "checkpoint's None state and `missing_ok` False or None by "
        "test_a_damaged_checkpoint_is_detected_and_the_run_starts_afresh (beyond the 5 s budget).",
    "cflpipe.fl.engine.x_prepare_run":
        "The prepared run's config, config text and run folder (seed or threads left out, a None text, "
        "`seedNone`): killed by test_prepare_run_builds_the_run_train_run_would_record (added after the "
        "pass); benchmarks and tests execute prepared runs, which then write what train_run would.",
    "cflpipe.fl.runs.x_resolved_config":
        "Equivalent: `model_dump(mode=None)` (python mode) gives the JSON mode's dict for every "
        "registered method's hyperparameters (numbers, strings, booleans, None; checked on their "
        "defaults); `threads: None` is added only for the one caller without threads "
        "(report/aggregate.py), which drops the key with without_threads. The input digests and plugin "
        "versions switched off or always written: killed by "
        "test_a_runs_config_records_the_digests_of_a_users_input_files and "
        "test_a_runs_config_records_the_release_of_a_plugin_it_runs (added after the pass; the latter "
        "skips where the example plugin is not installed).",
    "cflpipe.fl.engine.x_train_run":
        "The recorded seed (None), the force flag (None) and the folder that existed before the run "
        "(None, so a failed run removed it): killed by "
        "test_a_finished_run_is_skipped_only_unforced_and_for_the_same_config and "
        "test_a_run_that_fails_before_writing_anything_leaves_the_results_folder_as_it_was (added after "
        "the pass). `progress` False by default or None only hides tqdm's bar (the CLI passes it).",
    "cflpipe.fl.checkpoint.x_read_state":
        "Moved to cflpipe/fl/checkpoint.py (read_state, the same torch.load call) after the pass. "
        "`weights_only` None or left out is torch's default, True since torch 2.6 (2.13 here; pyproject "
        "allows torch>=2.2, whose default unpickles anything: a gap only there). `map_location` None or "
        "left out loads a CPU-written checkpoint to the CPU all the same; it matters only for a "
        "checkpoint written on a GPU and resumed without one, which no test does (a gap, left: needs a "
        "GPU).",
    "cflpipe.fl.outputs.x__frame":
        "`columns.get(None, [])` (every output table empty) is killed by "
        "test_evaluation_figures_equal_a_computation_by_hand (added after the pass). Equivalent: the "
        "default for a missing column (None, or left out) is never used: every run evaluates at its last "
        "round, which extends every column of the metrics and clusters schemas.",
    "cflpipe.fl.outputs.x__plain":
        "NaN figures written into summary.json as NaN (not JSON) instead of null: killed by "
        "test_summary_figures_that_are_nan_are_written_as_null (added after the pass).",
    "cflpipe.fl.engine.xǁRunǁ__init__":
        "`STATE.PT` for the checkpoint's name (clean_runs and _state_folders name state/state.pt): killed"
        " by test_prepare_run_builds_the_run_train_run_would_record (added after the pass).",
    "cflpipe.fl.engine.xǁRunǁcheck_trained":
        "`>=` for `>` at exactly half the updates skipped: killed by "
        "test_a_run_fails_when_more_than_half_its_updates_were_skipped (added after the pass).",
    "cflpipe.fl.resume.x_save_state":
        "Every checkpoint cut down (`or`, `or True`: a mid-run one then restarts the run) and the last "
        "one keeping the client tables (`and False`): killed by "
        "test_a_resume_before_the_first_evaluation_equals_an_uninterrupted_run (added after the pass).",
    "cflpipe.fl.engine.xǁRunǁwarn_if_exploding":
        "A non-finite first-round loss kept as the reference, `<` for `<=` and `/` for `*`: killed by "
        "test_the_exploding_loss_warning_compares_with_ten_times_the_first_finite_loss (added after the "
        "pass).",
    "cflpipe.fl.context.xǁContextǁexecute":
        "Follow-up plans (FCCA's cINN) never trained, trained only after a diverged plan, given None, or "
        "their outcome dropped: killed by "
        "test_a_follow_up_trains_from_its_plans_result_unless_that_diverged (added after the pass).",
    "cflpipe.fl.context.xǁContextǁ__init__":
        "Equivalent: the scenario and method names are read only by messages; `round = 1` before the "
        "engine first sets it changes only FedAC's initial random clusters (ctx.rng in __init__) to "
        "another valid seeded stream, the same in a fresh and a resumed run; the extra bytes start at 1 "
        "but the engine resets both to 0 before every round and nothing counts traffic earlier "
        "(test_traffic_a_method_counts_itself_is_added_to_the_rounds_bytes passes on it).",
    "cflpipe.fl.context.xǁClientStoreǁset":
        "Equivalent: the only caller (Method.receive) passes one client as an int, which indexes the "
        "table as the 0-d index tensor of the negated `isinstance` does (the same row written); the array"
        " path's `np.asarray(None…)` and missing argument are reached by no caller.",
    "cflpipe.fl.context.xǁContextǁtrain":
        "The mask and step size of a plain plan dropped: killed by "
        "test_context_train_applies_its_mask_and_step_size (added after the pass).",
    "cflpipe.fl.context.xǁClientStoreǁ__init__":
        "`device = None`: load_state_dict's `table.to(None)` leaves a resumed run's client tables where "
        "read_state loaded them, the CPU: equivalent on the CPU; on a GPU they would stay on the CPU "
        "after a resume. A gap, left: needs a GPU (no test runs on CUDA).",
    "cflpipe.fl.context.xǁContextǁadd_space":
        "Equivalent: `has_dropout` is read as a truth value (trainers.py), where None is False, and the "
        "only auxiliary network (FCCA's ConditionalFlow) has no dropout.",
    "cflpipe.fl.context.xǁContextǁlr":
        "`/` for `*` with lr_decay below 1 (the default 1 hides it): killed by "
        "test_the_learning_rate_decays_by_lr_decay_every_round (added after the pass).",
    "cflpipe.fl.context.xǁContextǁrng":
        "Equivalent: the seed constant 0x5E → 95 gives another valid seeded stream.",
    "cflpipe.fl.trainer_choice.x_build_trainer":
        "No fast test built the `auto` trainer: killed by "
        "test_the_auto_trainer_batches_on_a_gpu_and_for_the_cnn_on_a_cpu (added after the pass), which "
        "checks CPU mlp, CPU cnn and a CUDA device name; the device-name strings are labels.",
    "cflpipe.seeds.x_mix_seed":
        "Equivalent: `generate_state(2)[0]` is the same word as `generate_state(1)[0]` (SeedSequence's "
        "output is a prefix-stable stream); `<< 1` (wrapping in uint64) and `>> 2` give other valid torch"
        " seeds from the same inputs, i.e. another seeded stream, and every consumer is a torch generator"
        " or torch.manual_seed, which accept any value below 2**64.",
    "cflpipe.fl.trainers.xǁBatchedTrainerǁ__init__":
        "Equivalent: `fallback_said` is only read as `not self.fallback_said`, for which None and False "
        "are the same.",
    "cflpipe.fl.trainers.xǁBatchedTrainerǁgroup":
        "Equivalent: `jobs[1][1]` for the first plan (a group has at least two plans and every field "
        "`first` is read for is part of the group key); the initial `steps = 1`, overwritten by the loop;"
        " vmap's randomness `different` for networks without dropout, where nothing random is drawn. "
        "`steps / per_step * batch` (a float where per_step is 1) is killed by the int check in "
        "test_the_batched_trainer_applies_every_setting_of_a_plan_as_the_sequential_one (added after the pass).",
    "cflpipe.fl.trainers.xǁBatchedTrainerǁgroup_key":
        "Equivalent: `id(a.mask)` / `id(plan.trainable)` also for None (id(None) is one constant, the "
        "same partition) and the inverted `inputs is None` flag (the same partition). The rest (masks all"
        " keyed alike, a client without data or steps joining a group, one-step or one-sample clients "
        "kept apart) are killed by the body/head variants of "
        "test_plans_that_differ_in_mask_anchor_mask_loss_or_inputs_are_not_batched_together and by "
        "test_clients_without_data_or_steps_train_alone_and_one_sample_clients_batch (added after the "
        "pass).",
    "cflpipe.fl.trainers.xǁBatchedTrainerǁsay_fallback":
        "The message's reason (first line, or the exception's name when it has no message): killed by "
        "test_the_fallback_message_names_the_exception_and_its_first_line_once (added after the pass).",
    "cflpipe.fl.trainers.xǁTrainerǁone":
        "Equivalent: `space.read()` for every plan with `into` is one more copy before the same values "
        "are copied into `into`. A diverged plan returning the live parameter vector (then overwritten by"
        " the next plan) is killed by "
        "test_a_plan_with_into_writes_its_trained_vector_there_unless_it_diverged (its check added after "
        "the pass).",
    "cflpipe.fl.local.x_apply_step":
        "Equivalent: the default `momentum` (every caller passes it). The weight-decay term of FOMAML's "
        "and pFedMe's steps is killed by test_the_fomaml_step_by_hand_with_momentum_and_weight_decay and "
        "test_the_moreau_step_by_hand_with_momentum_and_weight_decay (added after the pass).",
    "cflpipe.fl.local.x_batch_indices":
        "The batches are the same (only the first permutations are used), but n times more permutations "
        "are drawn: killed by test_batch_indices_draw_only_the_passes_they_use (added after the pass).",
    "cflpipe.fl.local.x_run_loop":
        "Equivalent: a velocity buffer with momentum 0 gives `0·v + d = d`, the same step (one more "
        "vector). The guard that a rule without anchors refuses anchors or a mask alone is killed by "
        "test_rules_without_anchors_refuse_a_plan_with_anchors_or_a_trainable_mask, `total -= loss` by "
        "test_the_local_loss_is_the_mean_of_the_steps_losses (both added after the pass).",
    "cflpipe.fl.local.x_sgd":
        "A client without data or steps (the guard, and its empty LocalResult): killed by "
        "test_clients_without_data_or_steps_train_alone_and_one_sample_clients_batch (added after the "
        "pass).",
    "cflpipe.fl.local.x_step_config":
        "`strength != 1` dropped FedProx-like pulls of strength 1: killed by "
        "test_anchors_of_strength_zero_are_dropped_and_every_other_kept (added after the pass).",
    "cflpipe.fl.local.xǁFOMAMLStepǁstep":
        "No fast test used momentum or weight decay with FOMAML, nor the weights the gradient function "
        "receives (the sequential one ignores them; the batched one needs them): killed by "
        "test_the_fomaml_step_by_hand_with_momentum_and_weight_decay (added after the pass).",
    "cflpipe.fl.local.xǁMoreauStepǁstep":
        "No fast test used momentum or weight decay with pFedMe's step: killed by "
        "test_the_moreau_step_by_hand_with_momentum_and_weight_decay (added after the pass).",
    "cflpipe.fl.local.xǁSGDStepǁstep":
        "Weight decay at strength 1 is killed by "
        "test_the_sgd_step_adds_weight_decay_and_pulls_then_momentum_by_hand; `norm - 1e-6` in clipping "
        "(which reverses and blows up gradients shorter than 1e-6) by "
        "test_gradient_clipping_shortens_long_gradients_and_leaves_short_ones (both added after the "
        "pass).",
    "cflpipe.fl.params.x_cluster_average":
        "`totals > 1` marked clusters of total weight 1 or less empty: killed by "
        "test_cluster_average_counts_a_cluster_with_any_positive_weight (added after the pass).",
    "cflpipe.fl.params.xǁParamSpaceǁ__init__":
        "Equivalent: the `else 0` branch and `or True` only matter for a model without parameters, which "
        "fails at `params[0]` first; `device = None` is the CPU for torch where the tests run. Layer "
        "numbering and the model's dtype are killed by "
        "test_the_param_space_numbers_layers_and_keeps_the_models_dtype (added after the pass).",
    "cflpipe.fl.params.xǁParamSpaceǁfirst_layers":
        "`<=` shared one layer too many (FedTSDP): killed by "
        "test_the_param_space_numbers_layers_and_keeps_the_models_dtype (added after the pass).",
    "cflpipe.fl.params.xǁParamSpaceǁgrads_are_flat":
        "A test helper, read by no training code. The check made vacuous (`or`) is killed by "
        "test_grads_are_flat_notices_a_gradient_outside_the_flat_vector (added after the pass); `<= end` "
        "only admits a gradient that starts at the first byte past the flat vector, which no view of it "
        "does.",
    "cflpipe.fl.params.xǁParamSpaceǁmask_of":
        "Equivalent: the unknown-name guard protects input no caller gives (the only callers pass names "
        "read from the model itself).",
    "cflpipe.clustering.engine.x__row_slices":
        "Equivalent: `max(2, …)` rows per chunk only differs for rows of more than 2²¹ parameters, where "
        "a chunk then holds two rows instead of one (memory, not results: kmeans and nearest_center give "
        "the same answer in any chunking, test_kmeans_gives_the_same_answer_in_any_chunking); "
        "`max(features, 2)` only differs for rows of zero or one feature (chunk sizes, not results).",
    "cflpipe.clustering.engine.x_as_matrix":
        "Integer input (documented: numpy arrays are accepted and converted) left as None or as integers:"
        " killed by test_integer_input_is_converted_to_float64 (added after the pass).",
    "cflpipe.clustering.engine.x_canonical_labels":
        "Equivalent: `argsort` of the first-appearance indices, which are distinct, gives one order "
        "whatever the sort kind; `inverse.reshape(None)` and `reshape(-2)` leave numpy's 1-D inverse as "
        "it is, and every caller passes 1-D labels.",
    "cflpipe.clustering.tools.x_cfl_bipartition":
        "Equivalent: numpy reads a CPU tensor as the tensor path does (a CUDA one fails loudly); `n = "
        "s.shape[1]` is checked square next; `2.0 − …` and `/ 3.0` are increasing maps of −S, which leave"
        " complete linkage's merge order unchanged "
        "(test_cfl_bipartition_equals_reference_agglomerative_on_negative_similarity); the diagonal (None"
        " → nan, 1.0) is dropped by `squareform(checks=False)`, and `checks=True` passes on the exactly "
        "symmetric (s + sᵀ)/2 with zero diagonal; `clip(d, None, None)` drops the clamp at 0, which "
        "matters only where d < 0, which cosine similarities clamped to [−1, 1] never give.",
    "cflpipe.clustering.tools.x_cosine_similarity_matrix":
        "`(b is a) and False` normalizes b by the same operations, bit for bit (equivalent). The clamp's "
        "bounds dropped or widened: killed by test_cosine_similarity_stays_within_minus_one_and_one "
        "(added after the pass; rounding leaves self-similarities at 1 + 2⁻⁵²).",
    "cflpipe.clustering.tools.x_dbscan_precomputed":
        "`metric=\"precomputed\"` dropped (the rows read as coordinates): killed by "
        "test_dbscan_reads_the_matrix_as_distances_not_as_coordinates (added after the pass; "
        "test_fedtsdp.py's 1-D example gives the same labels either way).",
    "cflpipe.clustering.tools.x_decomposed_cosine_similarity":
        "Equivalent: `.to(None)` keeps float32 updates, and both callees (principal_directions, "
        "cosine_similarity_matrix) convert them to float64 exactly, as the original does first.",
    "cflpipe.clustering.tools.x_fcca_similarity":
        "No fast test computed D from its definition (tests/test_fcca.py's planted groups survive a "
        "normalization over the wrong axis, B / P, or an eps of 1 that leaves short vectors "
        "unnormalized): killed by test_fcca_similarity_equals_its_definition_on_short_vectors (added "
        "after the pass).",
    "cflpipe.clustering.tools.x_hopkins":
        "Killed by test_hopkins_by_hand_on_four_points_with_every_row_sampled (added after the pass): "
        "draws with replacement, `samples < n` (FedTSDP's hopkins_fraction 1 draws every client), `n <= "
        "2` (FedTSDP computes H from 2 clients on), `total > 1` (probability outputs lie closer than 1, "
        "so H was 0.5 always) and float32 points not raised to float64. Equivalent: the default seed "
        "(FedTSDP always passes one), `replace=None` (falsy, as False), the uniform draws' `.to(None)` "
        "(already float64).",
    "cflpipe.clustering.tools.x_js_divergence_matrix":
        "Numpy input (documented) broken by `or True` / `asarray(None)`: killed by "
        "test_js_divergence_takes_numpy_probabilities; nan (scipy's square root of a sum rounded below 0,"
        " about half the samples of nearly equal outputs) read as 1: killed by "
        "test_js_divergence_of_nearly_identical_outputs_is_about_zero (both added after the pass). "
        "Equivalent: the tensor test `and False` (numpy reads a CPU tensor alike), `astype(None)` "
        "(float64) and `nan_to_num`'s default nan (0.0).",
    "cflpipe.clustering.engine.x_nearest_center":
        "The zero-row branch (no caller reaches it: K-means CFL checks `len(unseen)`, FeSEM passes one "
        "row), made a 1-row or invalid result: killed by "
        "test_distances_and_nearest_centers_of_no_rows_are_empty (added after the pass).",
    "cflpipe.clustering.engine.x_pairwise_sq_distances":
        "Killed by test_distances_and_nearest_centers_of_no_rows_are_empty (added after the pass): the "
        "zero-row result's shape and `torch.cat([])`. Equivalent: `or True` on the dtype (float64 is the "
        "only other dtype callers pass); `x_sq_norms` ignored (no caller passes it, and recomputing gives"
        " what it would be).",
    "cflpipe.clustering.tools.x_principal_directions":
        "`.to(None)` (a float32 Gram matrix and float32 directions): killed by "
        "test_principal_directions_of_float32_updates_are_computed_in_float64 (added after the pass). "
        "Equivalent: `n = w.shape[1]` (the eigenvalues are n, so `[:k]` caps k at n anyway); `u / flip` "
        "for ±1; `flip == 1` only differs where a column's largest entry is 0, impossible for a unit "
        "eigenvector.",
    "cflpipe.metrics.x_per_client_f1":
        "Equivalent: a class's denominator is 0 or ≥ 1, and 1 only without a true positive (a hit adds "
        "2), so `>= 0`, `> 1` and `maximum(·, 2)` give the same F1 of 0 or 2·tp/denominator; the value "
        "where the denominator is 0 is masked out by `present`.",
    "cflpipe.metrics.x_device_f1":
        "Equivalent for its one caller (the engine's per_client_f1): a client's F1 is nan exactly when it"
        " has no test samples, so `n > 0`, `n >= 0` and `|` select the same clients.",
    "cflpipe.metrics.x_clustering_scores":
        "`len(groups) == 1`: only a federation of one client tells it from `== 0` (its scores would read "
        "nan instead of scikit-learn's 1.0); the engine always passes one group per client. Not tested: "
        "no experiment runs one client.",
    "cflpipe.metrics.x_f1_macro_over_classes":
        "Equivalent: two clients' counts instead of one, the second with no samples; row 0 is unchanged.",
    "cflpipe.metrics.x_per_client_accuracy":
        "Equivalent: `astype(None)` is float64.",
    "cflpipe.metrics.x_per_client_mean":
        "Equivalent: `astype(None)` is float64.",
    "cflpipe.methods.fedgroup.xǁFedGroupǁ__init__":
        "Equivalent: −2 for −1 as the unassigned mark (every check is `< 0` or `>= 0`); `initialized = "
        "None` is falsy like False.",
    "cflpipe.methods.fedgroup.xǁFedGroupǁ_pretrain":
        "`models + init` as the updates (the tests' initial model was zeros, where both agree): killed by"
        " test_fedgroup_pretraining_measures_updates_from_the_initial_model_and_pretrains_only_newcomers;"
        " the branch where every pre-training diverged raising (shape None, no shape) or returning one "
        "client: killed by "
        "test_fedgroup_pretrainings_that_all_diverge_leave_their_clients_unassigned_until_the_next_try "
        "(both added after the pass). Equivalent: `empty = None` or a (1 × p) empty, never read when no "
        "client came back.",
    "cflpipe.methods.fedgroup.xǁFedGroupǁround_start":
        "Killed by tests added after the pass: k-means' seed, restarts and k-means++ init, and group 0's "
        "clients pre-trained again as newcomers "
        "(test_fedgroup_pretraining_measures_updates_from_the_initial_model_and_pretrains_only_newcomers); "
        "`len(clients) <= k`, which never initialized with α = 1"
        " (test_fedgroup_initializes_when_exactly_k_clients_pretrain). Equivalent: `replace=None` (falsy)"
        " and the purposes 0xF6 / 0xF7 renumbered (another valid seeded stream).",
    "cflpipe.methods.cfl.xǁCFLǁ__init__":
        "A leading zero row in split_models (the tests' initial model was zeros, the model a client "
        "absent at the split then received): killed by "
        "test_cfl_client_absent_at_a_split_is_sent_the_model_the_split_was_computed_at; `_said_no_scale ="
        " True` (the warning never printed): killed by "
        "test_cfl_warns_once_when_no_update_arrived_during_the_warmup (both added after the pass). "
        "Equivalent: `_norms = None` (cluster_aggregate sets it before round_metrics reads it, every "
        "round); `_said_no_scale = None` (falsy).",
    "cflpipe.methods.cfl.xǁCFLǁcluster_aggregate":
        "`eps2 / scale` (relative thresholds that split below eps2 × scale): killed by "
        "test_cfl_relative_eps2_refuses_a_split_whose_largest_update_is_below_eps2_times_the_scale; the "
        "no-scale warning's condition and flag (printed for a run that has a scale, never, or every "
        "round): killed by test_cfl_warns_once_when_no_update_arrived_during_the_warmup (both added after"
        " the pass). Equivalent: `<=` / `>=` against eps × scale on continuous norms.",
    "cflpipe.methods.cfl.xǁCFLǁcluster_payload":
        "Equivalent: −2 for −1 as 'no split to pass' (read as `>= 0` / `< 0` only).",
    "cflpipe.methods.cfl.xǁCFLǁscale":
        "Equivalent: `or True` takes the mean of no norms, nan (numpy warns), as the else branch. "
        "`float(None)` there (relative thresholds with no warm-up update): killed by "
        "test_cfl_warns_once_when_no_update_arrived_during_the_warmup (added after the pass).",
    "cflpipe.methods.cgpfl.x_nearest":
        "Equivalent up to rounding: cdist's matrix-product mode (used above 25 rows) changes distances in"
        " the last digits, which can only break an exact tie between two generalized models otherwise.",
    "cflpipe.methods.cgpfl.xǁCGPFLǁseed_centers":
        "Killed by tests added after the pass: the matrix-product cdist, whose rounding noise where an "
        "upload equals a seeded model lets a copy seed another model "
        "(test_cgpfl_never_seeds_a_model_with_a_copy_of_a_seeded_one), and `weights.sum() <= 1`, which "
        "stopped seeding among nearby uploads "
        "(test_cgpfl_seeds_every_generalized_model_from_nearby_uploads). Equivalent: `bool(None)` skips "
        "the early return, and the loop then runs over no unseeded slot. `pow(3)` (D³ instead of D² "
        "sampling) only changes which upload seeds a model: no test checks the seeding's distribution, a "
        "gap left as for clustering's _kmeans_pp.",
    "cflpipe.methods.clustered.x_lowest":
        "NaN losses (a diverged model) not skipped: killed by "
        "test_ifca_never_picks_a_model_whose_loss_is_nan (added after the pass).",
    "cflpipe.methods.ifca.x_random_models":
        "Equivalent: `fork_rng(devices=None)` also forks the CUDA generators (none on CPU; the global "
        "state is restored either way); SeedSequence's `generate_state(2)[0]` equals "
        "`generate_state(1)[0]`.",
    "cflpipe.methods.ifca.x_mean_losses":
        "Equivalent: `or True` takes the mean of an empty loss array, nan (numpy warns), as the else "
        "branch.",
    "cflpipe.methods.ifca.xǁIFCAǁ__init__":
        "Equivalent: the purpose constant 0x1FCA renumbered: another valid seeded stream of random "
        "initial models.",
    "cflpipe.methods.flhc_params.xǁFLHCParamsǁcut":
        "An absolute threshold scaled by 2: killed by test_flhc_absolute_threshold_is_the_distance_itself"
        " (added after the pass).",
    "cflpipe.methods.flhc.xǁFLHCǁ__init__":
        "Equivalent: `clustered = None` is falsy; `_off_round` and `_mean_update_norm` are reset by "
        "round_start, which runs every round before aggregation and round_metrics read them.",
    "cflpipe.methods.flhc.xǁFLHCǁround_start":
        "Equivalent: `_off_round = None` outside the clustering round; only the clustering round reads "
        "it, and there round_start sets it a few lines below.",
    "cflpipe.methods.fesem.xǁFeSEMǁ__init__":
        "Equivalent: `initialized = None` is falsy; `_off_round` is reset by round_start before anything "
        "reads it.",
    "cflpipe.methods.fesem.xǁFeSEMǁround_start":
        "Equivalent: `_off_round = None` once initialized; only _initialize reads it, which runs only "
        "while not initialized, in rounds where round_start sets it a few lines below.",
    "cflpipe.methods.fesem.xǁFeSEMǁpull_strength":
        "A client with one training sample treated as two: killed by "
        "test_fesem_pull_of_a_client_with_one_training_sample (added after the pass).",
    "cflpipe.methods.intercluster.x_awcfl_mix":
        "`k <= 2` / `k < 3` (AWCFL off with two clusters, the paper's two rotation groups): killed by "
        "test_two_clusters_each_move_beta_towards_the_other (added after the pass). Equivalent: `sum(0)` "
        "without keepdim broadcasts the same way.",
    "cflpipe.methods.intercluster.x_sample_mean":
        "Draws with replacement and an empty image set's size (`shape[2:]`): killed by "
        "test_sample_mean_draws_distinct_inputs_and_flattens_an_empty_set (added after the pass). "
        "Equivalent: `replace=None` (falsy); `len(x) >= n` draws all n rows, sorted, when there are "
        "exactly n: the same mean.",
    "cflpipe.methods.kmeans_cfl.xǁKMeansCFLǁ__init__":
        "Two cluster models before cluster_start: killed by "
        "test_kmeans_cfl_clusters_the_uploaded_models_from_cluster_start_on (added after the pass).",
    "cflpipe.methods.perfedavg.xǁPerFedAvgǁalpha":
        "`alpha: null` gave FOMAMLStep(None): killed by "
        "test_perfedavg_alpha_null_adapts_with_the_training_lr (added after the pass).",
    "cflpipe.methods.clustered.xǁClusterModelsǁ__init__":
        "AWCFL switched off (`awcfl_beta = None`): killed by "
        "test_awcfl_mixes_the_cluster_models_after_each_aggregation; MCFL's selection by data switched "
        "off (`selects_by_data`, which the engine reads) and `_cluster_means = \"\"` (select_model before "
        "any evaluation): killed by test_mcfl_uploads_train_feature_means_and_the_engine_selects_by_them "
        "(both added after the pass).",
    "cflpipe.methods.clustered.xǁClusterModelsǁaggregate":
        "Uploaded feature means never marked (`has_mean`): killed by "
        "test_mcfl_uploads_train_feature_means_and_the_engine_selects_by_them (added after the pass). "
        "Equivalent: `_cluster_means = \"\"`: eval_models resets it before the engine's select_model calls.",
    "cflpipe.methods.clustered.xǁClusterModelsǁcluster_feature_means":
        "A one-member cluster's mean halved (`clamp_min(2)`) or its cluster dropped (`counts > 1`): "
        "killed by test_mcfl_uploads_train_feature_means_and_the_engine_selects_by_them (added after the "
        "pass). Equivalent: one-hot entries of 2 double both the sums and the counts.",
    "cflpipe.methods.clustered.xǁClusterModelsǁload_state_dict":
        "Equivalent: `_cluster_means = \"\"`: the engine calls eval_models, which resets it, before any "
        "select_model.",
    "cflpipe.methods.clustered.xǁClusterModelsǁpayload":
        "`== own` (the own model sent twice instead of the K − 1 others; with K = 2 the byte count is the"
        " same): killed by test_mcfl_sends_every_other_cluster_model_with_the_own_one (added after the "
        "pass, K = 3).",
    "cflpipe.methods.fcca.xǁFlowLikelihoodǁ__call__":
        "The sign, the factor 1/2 and the sum axes of Eq. 3 and of its α-weighted augmentation term: "
        "killed by test_flow_loss_is_the_negative_log_likelihood_with_an_alpha_weighted_augmentation "
        "(added after the review; it compares with the flow's own log_prob). Equivalent: `.sum(+1)` for "
        "`.sum(-1)` (3 mutants), since the rows are 2-D (samples × features), so axis 1 is the last axis.",
    "cflpipe.methods.fcca.xǁFCCAǁrecluster":
        "Killed by test_the_server_clusters_by_the_cinns_with_noise_drawn_from_the_run_seed_and_round "
        "(added after the pass): `labels = None` or `canonical_labels(None)` (everyone in cluster 0), "
        "and server noise not seeded by the run's seed and round (generator None, a part of mix_seed "
        "dropped). Equivalent: mix_seed without the purpose gives another stream that still follows seed "
        "and round. Not seen (a gap, left): the k-means seed (None or the default 0) and init (Forgy for "
        "k-means++) reach the same partition on the tests' well-separated D. Equivalent: `.to(None)` "
        "leaves D float64 and the weights are "
        "cast by cluster_average (`weights.to(vectors)`).",
    "cflpipe.methods.fcca.xǁFCCAǁ__init__":
        "α and flow_clip not passed on to the cINN's training, and the cINN init without the run seed: "
        "killed by test_the_run_seeds_the_cinn_init_and_its_settings_reach_the_cinn_training (added after"
        " the review). `mix_seed(ctx.seed)` without the purpose is another per-seed stream. `_flow_losses"
        " = None` is equivalent: round_start sets it to [] before any finish. The `devices` mutants are "
        "the CUDA branch: on a CPU run fork_rng forks the CPU generator either way (devices=None means "
        "every CUDA device, none here). No GPU where the tests run; on a GPU `and False` or `index and "
        "0`/`or 1` would let the flow's seeding reseed the run's CUDA generator or fork the wrong device.",
    "cflpipe.methods.fcca.x_reconstructions":
        "Noise not drawn from the server's generator (global RNG), and ε1's inversions replaced by ε2's "
        "(which makes B_{y,i,i} trivially 1 and turns off the confidence weighting P): killed by "
        "test_reconstructions_invert_every_flow_on_the_generators_two_noise_draws (added after the "
        "review).",
    "cflpipe.methods.fcca.xǁConditionalFlowǁ__init__":
        "The number of couplings (zuko's default of 3 for `2 * blocks`): killed by "
        "test_each_block_is_two_couplings_on_alternating_halves (added after the pass). Equivalent: "
        "slope exp(+CLAMP) for exp(−CLAMP). zuko's MonotonicAffineTransform only uses `abs(scale / "
        "log(slope))`, so the bound |log scale| < 2 is the same.",
    "cflpipe.methods.fcca.xǁFCCAǁround_metrics":
        "`float(None)` for a round without a finite cINN loss: killed by "
        "test_a_client_uploads_and_keeps_its_trained_cinn_and_a_diverged_one_is_left_out (added after the"
        " review). Equivalent: `or True` takes np.mean of an empty list, which is NaN as well (with a "
        "RuntimeWarning).",
    "cflpipe.methods.fedac.xǁFedACǁ__init__":
        "Equivalent: initial values overwritten before they are read. pca_round (None, +1, -2) is read "
        "only once a map exists, and the fit that creates it also sets pca_round. pca_version 1 and "
        "client_pca_version -2 are only compared for inequality. The first LrCos aggregation replaces "
        "projections (zeros of shape (0,), (m,), (m, 1)) with the full projection, and the L2 ablation "
        "never reads them. `_said_dims = None` is falsy like False. `rng(173)` for `rng(0xAC)` (172) is "
        "another valid random R⁰.",
    "cflpipe.methods.fedac.xǁFedACǁ_update_projections":
        "Killed by test_the_pca_map_is_refitted_every_pca_every_rounds_and_follows_its_seed (added after "
        "the review): the refit schedule (`round + pca_round`), an unseeded randomized SVD (seed=None) "
        "and the D-components warning also printed when D is kept whole (`<=`). Equivalent: the seed left"
        " at fit_pca's default 0 or the purpose 203 for 0xCA, which give another deterministic stream.",
    "cflpipe.methods.fedac.xǁFedACǁe_step":
        "The L2 branch: killed by "
        "test_the_l2_e_step_assigns_the_nearest_center_where_lrcos_sees_no_difference (added after the "
        "pass).",
    "cflpipe.methods.fedac.xǁFedACǁstate_dict":
        "Resume with no PCA map (before the first round, or the L2 ablation, which never fits one) and "
        "with one: a one-element `empty` that resumes as a bogus map, a crash when there is no map, the "
        "mean dropped. Killed by test_a_resumed_run_has_the_pca_map_it_was_saved_with_or_none (added "
        "after the review).",
    "cflpipe.methods.fedac.x_cluster_ratios":
        "`k == 2` and `np.array(None)`: killed by "
        "test_cnt_splits_when_the_models_have_more_parameters_than_max_clusters (added after the pass). "
        "Equivalent: bincount without minlength, because the callers pass clusters right after an M-step,"
        " so every label 0..K−1 has a member. `clamp_min(2)` differs only for a one-member cluster, whose"
        " center is that member, so its intra distance is 0 (up to rounding) either way.",
    "cflpipe.methods.fedac.xǁFedACǁload_state_dict":
        "A map built from empty tensors instead of None: killed by "
        "test_a_resumed_run_has_the_pca_map_it_was_saved_with_or_none (added after the pass). `device ="
        " None` is identical on CPU (Tensor.to(None) returns the tensor); on a GPU the resumed map would "
        "stay on the CPU.",
    "cflpipe.methods.fedac.xǁFedACǁround_metrics":
        "A lone cluster's infinite G written as inf rather than missing: killed by "
        "test_the_g_value_of_a_lone_cluster_is_reported_as_missing (added after the pass).",
    "cflpipe.methods.fedtsdp.xǁFedTSDPǁ__init__":
        "`shared_layers` ignored (`or True`): killed by "
        "test_shared_layers_sets_the_initial_number_of_shared_layers (added after the pass). "
        "Equivalent: last_hopkins, last_clustered, _round_shared and _mask are set again by round_start "
        "before the round's first payload or round_metrics. times_clustered is only checkpointed and "
        "incremented, and nothing reads it.",
    "cflpipe.methods.fedtsdp.x_two_stage_clusters":
        "Equivalent: a start label of 1 or a gap of 2 between stage-1 groups keeps the groups' labels "
        "disjoint, and canonical_labels renumbers them.",
    "cflpipe.methods.fedtsdp.xǁFedTSDPǁ_recluster":
        "Equivalent: `offset + 1` leaves one unused label, whose padding center (the initial model) is "
        "dropped when the labels are renumbered. The mapping moves each center with its label.",
    "cflpipe.fl.checkpoint.x__externalize":
        "Equivalent: a table of exactly MIN_ROWS_BYTES goes to row blocks or into state.pt; either way it"
        " round-trips to the same bytes (storage, not state).",
    "cflpipe.fl.checkpoint.x__read_blocks":
        "Gap, left: `and` for `or` in the check of a row-table entry (17-19) lets an entry with zero rows"
        " per block or one dimension through to a ZeroDivisionError or a reshape error instead of the "
        "clean refusal; only a hand-made state.pt with a matching digest has such an entry, and no fast "
        "test builds one. Equivalent: `min(shape) <= 0` or `< 1` and the `shape[0]` guards of `row_bytes`"
        " (40, 43, 44) differ only for a table with a zero dimension, which is never large enough "
        "(MIN_ROWS_BYTES) to be stored as row blocks; `read(None)` or `read(2)` after the block is filled"
        " is non-empty exactly when `read(1)` is (77, 78).",
    "cflpipe.fl.checkpoint.x__write_blocks":
        "`.to(None)` for `.to(\"cpu\")`: identical for CPU tables, where the tests run; a CUDA table would "
        "then fail loudly at `.numpy()` (a GPU-only gap). `max(row_bytes, 2)` differs only for rows of "
        "one byte, which no table of at least MIN_ROWS_BYTES that a method keeps has.",
    "cflpipe.fl.checkpoint.x_manifest_bytes":
        "Killed by test_clean_reports_exactly_the_bytes_it_frees_and_a_dry_run_the_same (added after the "
        "fourth pass).",
    "cflpipe.fl.checkpoint.x_state_bytes":
        "Equivalent: globbing a missing folder finds nothing, so `or True` gives 0 as well; `else 1` adds"
        " a byte to both sides of clean's difference (before and after), which cancels; the figure is "
        "otherwise read only by the benchmark.",
    "cflpipe.fl.checkpoint.x_write_state":
        "Equivalent: `missing_ok` None or False only matters if a block listed by the glob a moment "
        "before is gone, i.e. another writer, which the run's lock excludes.",
    "cflpipe.fl.runs.x__cut_down_state":
        "Killed by test_clean_reports_exactly_the_bytes_it_frees_and_a_dry_run_the_same (added after the "
        "fourth pass).",
    "cflpipe.fl.runs.x_clean_runs":
        "The lock's description (None) only reaches the message a second process prints; mutant 1 "
        "changes no line mutmut can show. `break` for a `continue` stops cleaning at the first run it "
        "skips, so later finished runs keep their models: a gap, left (the clean test's skipped run is "
        "last in its matrix).",
    "cflpipe.partition.files.x_small_test_sets":
        "Text: 101 for 100 in the percentage a warning prints.",
}


_FUNCTIONS: dict[str, dict[str, list[str]]] = {}


def _functions(module: str) -> dict[str, list[str]]:
    """Source lines of every function mutmut wrote into mutants/<module>.py, by name (mutants and
    the original of each function sit side by side there; methods inside their class)."""
    if module not in _FUNCTIONS:
        path = Path("mutants", *module.split(".")).with_suffix(".py")
        if not path.exists():  # a package's own functions
            path = Path("mutants", *module.split("."), "__init__.py")
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
