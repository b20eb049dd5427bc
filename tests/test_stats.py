"""training/stats.py against scikit-learn and scipy on the same data: the numpy formulas that let training and
export run on a node without either."""

import numpy as np
import pytest
from scipy.stats import pearsonr, rankdata, spearmanr
from sklearn import metrics
from sklearn.linear_model import LogisticRegression

from training import stats


@pytest.fixture(params=[0, 1, 2])
def rng(request):
    return np.random.default_rng(request.param)


def test_ranks_and_auc_with_ties(rng):
    scores = rng.integers(0, 8, size=500).astype(float)  # many ties
    labels = (rng.random(500) < 0.3).astype(int)
    np.testing.assert_allclose(stats.average_ranks(scores), rankdata(scores))
    assert stats.roc_auc(scores, labels) == pytest.approx(metrics.roc_auc_score(labels, scores), abs=1e-12)
    assert np.isnan(stats.roc_auc(scores, np.zeros(500)))


def test_classification_figures(rng):
    y_true = rng.integers(0, 4, size=300)
    y_pred = np.where(rng.random(300) < 0.6, y_true, rng.integers(0, 4, size=300))
    y_pred[y_pred == 3] = 2  # class 3 never predicted: precision 0 by convention
    cm = stats.confusion_matrix(y_true, y_pred, 4)
    np.testing.assert_array_equal(cm, metrics.confusion_matrix(y_true, y_pred, labels=range(4)))
    ours = stats.precision_recall_f1(cm)
    theirs = metrics.precision_recall_fscore_support(y_true, y_pred, labels=range(4), zero_division=0)
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b)
    assert stats.matthews_corrcoef(cm) == pytest.approx(metrics.matthews_corrcoef(y_true, y_pred))
    assert stats.matthews_corrcoef(stats.confusion_matrix(y_true, np.zeros(300, int), 4)) == 0.0
    # The same figures without the matrix (what a many-class run computes):
    counts = stats.class_counts(y_true, y_pred, 4)
    for a, b in zip(stats.precision_recall_f1_counts(*counts), ours, strict=True):
        np.testing.assert_allclose(a, b)
    assert stats.matthews_corrcoef_counts(*counts) == pytest.approx(stats.matthews_corrcoef(cm))


def test_macro_f1_is_over_the_classes_present_as_sklearns(rng):
    """A label with one example may be in no dev row: it must not count as a class scored 0."""
    from training.finetuning.metrics import classification_metrics

    y_true = rng.choice([0, 2, 3], size=200)  # class 1 absent from this split
    y_pred = np.where(rng.random(200) < 0.7, y_true, rng.choice([0, 2, 3], size=200))
    got = classification_metrics(y_true, y_pred, ("a", "b", "c", "d"))["macro_f1"]
    assert got == pytest.approx(metrics.f1_score(y_true, y_pred, average="macro"))
    assert classification_metrics(y_true, y_true, ("a", "b", "c", "d"))["macro_f1"] == 1.0


def test_correlations(rng):
    x = rng.normal(size=200)
    y = x + rng.normal(size=200)
    y[:20] = y[0]  # ties for the ranks
    assert stats.pearson(x, y) == pytest.approx(pearsonr(x, y).statistic)
    assert stats.spearman(x, y) == pytest.approx(spearmanr(x, y).statistic)
    assert np.isnan(stats.pearson(x, np.ones(200)))


@pytest.mark.parametrize("separable", [False, True])
def test_logistic_fit_matches_sklearn(rng, separable):
    z = rng.normal(size=2000) * 3
    y = (z + (0 if separable else rng.logistic(size=2000)) > 0.5).astype(int)
    slope, intercept = stats.fit_logistic_1d(z, y)
    ref = LogisticRegression(C=1e6, max_iter=10_000, tol=1e-10).fit(z.reshape(-1, 1), y)
    if separable:  # the optimum is set by the penalty alone: far out, and the fit must separate
        assert slope > 20 and ((slope * z + intercept > 0) == y).all()
    else:
        assert slope == pytest.approx(ref.coef_[0, 0], rel=1e-4)
        assert intercept == pytest.approx(ref.intercept_[0], rel=1e-4, abs=1e-4)


def test_the_majority_baseline_is_the_training_datas_most_common_class():
    """It was this split's own most common class: the best constant answer in hindsight, which a dev set
    whose balance differs from training's overstates."""
    from training.finetuning.metrics import classification_metrics

    y = np.array([0, 1, 1, 1])  # 1 leads here; 0 led in training
    assert classification_metrics(y, y, ("a", "b"), majority=0)["majority_baseline_accuracy"] == 0.25
    assert classification_metrics(y, y, ("a", "b"))["majority_baseline_accuracy"] == 0.75
