"""Metrics against hand-computed values and scikit-learn."""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score, f1_score, normalized_mutual_info_score

from cflpipe.metrics import (clustering_scores, intra_inter_accuracy, per_client_accuracy, per_client_f1,
                             personalized_summary)


def test_per_client_f1_matches_sklearn():
    rng = np.random.default_rng(0)
    owner = rng.integers(0, 5, 400)
    y_true = rng.integers(0, 6, 400)
    y_pred = np.where(rng.random(400) < 0.6, y_true, rng.integers(0, 6, 400))
    ours = per_client_f1(owner, y_true, y_pred, 5, 6)
    for c in range(5):
        m = owner == c
        assert ours[c] == pytest.approx(f1_score(y_true[m], y_pred[m], average="macro", zero_division=0))


def test_accuracy_and_personalized_summary_by_hand():
    owner = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3])
    correct = np.array([1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1], dtype=bool)
    acc, n = per_client_accuracy(owner, correct, 4)
    assert acc.tolist() == [0.75, 0.5, 1.0, 0.25] and n.tolist() == [4, 2, 10, 4]
    s = personalized_summary(acc, n)
    assert s["acc_macro"] == pytest.approx(0.625)
    assert s["acc_micro"] == pytest.approx(15 / 20)
    assert s["acc_std"] == pytest.approx(np.std([0.75, 0.5, 1.0, 0.25]))
    assert s["acc_worst10"] == pytest.approx(0.25)  # 10 % of 4 clients rounds up to one


def test_clustering_scores_match_sklearn_and_are_label_invariant():
    groups = np.array([0, 0, 1, 1, 2, 2, 2])
    assignment = np.array([5, 5, 3, 3, 3, 1, 1])
    scores = clustering_scores(assignment, groups)
    assert scores["ari"] == pytest.approx(adjusted_rand_score(groups, assignment))
    assert scores["nmi"] == pytest.approx(normalized_mutual_info_score(groups, assignment))
    assert clustering_scores(np.array([1, 1, 0, 0, 2, 2, 2]), groups)["ari"] == 1.0
    assert np.isnan(clustering_scores(assignment, np.full(7, -1))["ari"])


def test_intra_inter_accuracy_by_hand():
    # Two models, two groups: model 0 is good on group 0 only, model 1 on group 1 only.
    group_acc = np.array([[0.9, 0.2], [0.1, 0.8]])
    groups = np.array([0, 0, 1, 1])
    intra, inter = intra_inter_accuracy(group_acc, np.array([0, 0, 1, 1]), groups)
    assert intra == pytest.approx(0.85) and inter == pytest.approx(0.15)
    # One shared model: intra and inter are the same model's scores on the two groups.
    intra, inter = intra_inter_accuracy(np.array([[0.6, 0.4]]), np.zeros(4, dtype=int), groups)
    assert intra == pytest.approx(0.5) and inter == pytest.approx(0.5)


def test_f1_micro_and_macro_over_devices_as_fesem_defines_them():
    """FeSEM Sec. 6.2: micro = device metrics weighted by data amount, macro = plain mean."""
    from cflpipe.metrics import device_f1, f1_macro_over_classes

    # client 0: 3 test samples all right (F1 1.0); client 1: 1 sample wrong (F1 0.0); client 2: none
    owner = np.array([0, 0, 0, 1])
    y_true, y_pred = np.array([0, 1, 1, 2]), np.array([0, 1, 1, 0])
    f1 = per_client_f1(owner, y_true, y_pred, 3, 3)
    assert f1[:2].tolist() == [1.0, 0.0] and np.isnan(f1[2])
    figures = device_f1(f1, np.array([3, 1, 0]))
    assert figures == {"f1_micro": 0.75, "f1_macro": 0.5}
    # the pooled figure is another number: class-macro F1 of the 4 predictions = (2/3 + 1 + 0) / 3
    assert f1_macro_over_classes(y_true, y_pred, 3) == pytest.approx((2 / 3 + 1 + 0) / 3)


def test_clients_without_test_samples_keep_their_row_and_are_left_out_of_the_summary():
    """The last clients own no sample: every per-client table still has a row per client (nan),
    and the summary is over the clients that have samples."""
    from cflpipe.metrics import per_client_mean

    owner = np.array([0, 0, 1, 1, 1])
    correct = np.array([1, 0, 1, 1, 0], dtype=bool)
    acc, n = per_client_accuracy(owner, correct, 4)
    assert n.tolist() == [2, 3, 0, 0] and acc[:2].tolist() == pytest.approx([0.5, 2 / 3])
    assert np.isnan(acc[2:]).all()
    loss = per_client_mean(owner, np.array([1.0, 3.0, 2.0, 2.0, 5.0]), 4)
    assert loss[:2].tolist() == [2.0, 3.0] and np.isnan(loss[2:]).all()
    f1 = per_client_f1(owner, np.array([0, 1, 1, 1, 0]), np.array([0, 0, 1, 1, 0]), 4, 3)
    assert len(f1) == 4 and np.isnan(f1[2:]).all()
    assert f1[1] == pytest.approx(1.0)  # client 1 predicted all right
    s = personalized_summary(acc, n)
    assert s["acc_macro"] == pytest.approx((0.5 + 2 / 3) / 2) and s["acc_micro"] == pytest.approx(3 / 5)
    assert np.isnan(personalized_summary(acc[2:], n[2:])["acc_macro"])
    # worst 10 %: ceil(0.1 · 11) = 2 clients
    eleven = personalized_summary(np.linspace(0.0, 1.0, 11), np.ones(11, dtype=int))
    assert eleven["acc_worst10"] == pytest.approx(0.05)


def test_intra_and_inter_cluster_accuracy_by_hand():
    from cflpipe.metrics import intra_inter_accuracy

    # models × ground-truth groups: model j's accuracy on group g's pooled test data
    group_acc = np.array([[0.9, 0.2, 0.1],
                          [0.3, 0.8, 0.4]])
    groups = np.array([0, 1, 2, 0])
    client_model = np.array([0, 1, 1, 1])
    intra, inter = intra_inter_accuracy(group_acc, client_model, groups)
    # own group: 0.9, 0.8, 0.4, 0.3; the other two groups' mean: 0.15, 0.35, 0.55, 0.6
    assert intra == pytest.approx((0.9 + 0.8 + 0.4 + 0.3) / 4)
    assert inter == pytest.approx((0.15 + 0.35 + 0.55 + 0.6) / 4)
    # MCFL: the model a client applies to each group's data (clients × groups)
    by_data = np.array([[0, 1, 1], [1, 1, 0], [0, 0, 1], [0, 0, 0]])
    intra, inter = intra_inter_accuracy(group_acc, by_data, groups)
    assert intra == pytest.approx((0.9 + 0.8 + 0.4 + 0.9) / 4)
    assert inter == pytest.approx(((0.8 + 0.4) / 2 + (0.3 + 0.1) / 2 + (0.9 + 0.2) / 2 + (0.2 + 0.1) / 2) / 4)
    assert all(np.isnan(intra_inter_accuracy(group_acc[:, :1], client_model, np.zeros(4, int))))  # one group
    assert all(np.isnan(intra_inter_accuracy(group_acc, client_model, np.array([0, 1, -1, 0]))))  # no truth


def test_summaries_of_one_client_and_of_none():
    from cflpipe.metrics import clustering_scores, device_f1, per_client_f1, personalized_summary

    one = personalized_summary(np.array([0.75]), np.array([8]))
    assert one == {"acc_macro": 0.75, "acc_micro": 0.75, "acc_std": 0.0, "acc_worst10": 0.75}
    none = personalized_summary(np.array([0.5]), np.array([0]))
    assert list(none) == list(one) and all(np.isnan(v) for v in none.values())
    assert list(device_f1(np.array([np.nan]), np.array([0]))) == list(device_f1(np.array([0.5]), np.array([3])))
    scores = clustering_scores(np.array([0, 0, 1]), np.array([1, 1, 0]))
    assert scores == pytest.approx({"ari": 1.0, "nmi": 1.0, "ami": 1.0})
    assert list(clustering_scores(np.array([0]), np.array([-1]))) == list(scores)
    # macro over the classes in a client's labels or predictions (as scikit-learn), by hand
    f1 = per_client_f1(np.array([0, 0, 0, 1, 1, 2, 2]), np.array([3, 3, 3, 1, 2, 0, 0]),
                       np.array([3, 1, 3, 1, 1, 0, 0]), 3, 4)
    assert f1[0] == pytest.approx((0.8 + 0.0) / 2)  # class 3: tp 2, fn 1 -> 4 / 5; class 1: one fp
    assert f1[1] == pytest.approx((2 / 3 + 0.0) / 2)  # classes 1 (tp 1, fp 1) and 2 (fn 1)
    assert f1[2] == 1.0  # a single class, all right: defined, not nan
