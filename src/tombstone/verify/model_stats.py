"""The model level's statistics: the membership AUC with its bootstrap interval, what the sample sizes allow
that AUC to show (the exact Mann-Whitney null distribution), and the true-positive rate at a low false-positive
rate. Everything from scipy and numpy; used by :mod:`tombstone.verify.model`.

**What a sample can tell.** The membership decision compares the lower bound of a two-sided
:data:`CONFIDENCE` bootstrap interval of the AUC with the nulls: a one-sided test at :data:`ALPHA`. With ``n``
of the subject's examples and ``m`` held-out examples, the Mann-Whitney U statistic under the null (no
difference) takes each ranking of the ``n + m`` scores with equal probability, so even a perfect separation
(AUC 1) has a one-sided p-value of ``1 / C(n + m, n)``: 0.1 for one example against nine. Below
:data:`ALPHA` nothing the sample shows could be significant, and the bootstrap needs at least two observations
in each sample to resample at all. :func:`cannot_tell` says which of these the sizes miss.

**Power.** :func:`detectable_auc` is the smallest AUC whose exact one-sided Mann-Whitney p-value against 0.5
is at most :data:`ALPHA` at the sizes at hand (``scipy.stats.mannwhitneyu``, ``method="exact"``, on scores
built to have each U). The decision compares with the nulls rather than 0.5, so an AUC must at least reach
this to count: a measurement that did not separate the subject at these sizes could not have seen a weaker
memory than this.

**TPR at a low FPR.** :func:`tpr_at_fpr`: the fraction of the subject's examples scored above a threshold
that at most :data:`LOW_FPR` of the held-out examples exceed (the threshold the lowest such); with ``m``
held-out examples the lowest non-zero false-positive rate is ``1 / m``, so with fewer than ``1 / LOW_FPR`` of
them the rate reported is at a false-positive rate of 0.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

CONFIDENCE = 0.95
ALPHA = (1 - CONFIDENCE) / 2
"""The one-sided level of the membership decision: the lower bound of a two-sided 95% interval."""
RESAMPLES = 1000
"""Bootstrap resamples of each AUC's confidence interval."""
LOW_FPR = 0.05
"""The false-positive rate :func:`tpr_at_fpr` reports the true-positive rate at."""
MIN_PER_SAMPLE = 2
"""The bootstrap resamples each sample: one observation has no spread to resample."""


def auc(members: Any, others: Any, axis: int = -1) -> Any:
    """P(member score > other score) + ties/2: the Mann-Whitney U statistic over the product of sizes."""
    from scipy.stats import mannwhitneyu

    members, others = np.asarray(members, dtype=float), np.asarray(others, dtype=float)
    u = mannwhitneyu(members, others, axis=axis, method="asymptotic").statistic
    return u / (members.shape[axis] * others.shape[axis])


def auc_ci(members: Sequence[float], others: Sequence[float], seed: int) -> tuple[float, float, float]:
    """The AUC and its percentile bootstrap confidence interval (``scipy.stats.bootstrap``, both samples
    resampled). Each sample needs :data:`MIN_PER_SAMPLE` observations (:func:`cannot_tell` says so first)."""
    from scipy.stats import bootstrap

    if min(len(members), len(others)) < MIN_PER_SAMPLE:
        raise ValueError(f"a bootstrap interval needs at least {MIN_PER_SAMPLE} observations in each sample"
                         f" ({len(members)} and {len(others)} given)")
    point = float(auc(members, others))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate resample distribution (AUC 1.0 throughout) is an answer
        res = bootstrap((np.asarray(members, float), np.asarray(others, float)), auc, vectorized=True, paired=False,
                        n_resamples=RESAMPLES, confidence_level=CONFIDENCE, method="percentile",
                        random_state=np.random.default_rng(seed))
    low, high = res.confidence_interval
    low = point if not np.isfinite(low) else float(low)
    high = point if not np.isfinite(high) else float(high)
    return point, low, high


def _u_pvalue(u: int, n: int, m: int) -> float:
    """The exact one-sided (greater) Mann-Whitney p-value of U = ``u`` with sizes ``n`` and ``m``: scipy's,
    on scores built to have that U (member ``i`` above exactly ``c_i`` of the others, no ties)."""
    from scipy.stats import mannwhitneyu

    q, r = divmod(u, n)
    counts = np.array([q + 1] * r + [q] * (n - r), dtype=float)
    members = counts - 0.5 + np.arange(n) / (4.0 * n)  # above c_i others (0 .. m-1), below the next; distinct
    return float(mannwhitneyu(members, np.arange(m, dtype=float), alternative="greater", method="exact").pvalue)


def best_pvalue(n: int, m: int) -> float:
    """The smallest one-sided p-value the exact Mann-Whitney test can give at sizes ``n`` and ``m`` (every
    member above every other: AUC 1); ``1 / C(n + m, n)``."""
    return _u_pvalue(n * m, n, m)


def detectable_auc(n: int, m: int, alpha: float = ALPHA) -> float | None:
    """The smallest AUC (U / nm) whose exact one-sided Mann-Whitney p-value is at most ``alpha`` at sizes
    ``n`` and ``m``; None when not even an AUC of 1 reaches it."""
    if n < 1 or m < 1 or best_pvalue(n, m) > alpha:
        return None
    lo, hi = 0, n * m  # p falls as U grows: the smallest U with p <= alpha, by bisection
    while lo < hi:
        mid = (lo + hi) // 2
        if _u_pvalue(mid, n, m) <= alpha:
            hi = mid
        else:
            lo = mid + 1
    return lo / (n * m)


def plural(k: int, what: str) -> str:
    return f"{k} {what}" + ("" if k == 1 else "s")


def cannot_tell(n: int, m: int, alpha: float = ALPHA) -> str | None:
    """Why a membership AUC of ``n`` examples against ``m`` held-out examples cannot decide anything, or None
    when it can: ``"cannot tell: 1 example ..."``, ``"cannot tell: 1 held-out example ..."``."""
    if n == 0:
        return "cannot tell: no examples"
    if m == 0:
        return "cannot tell: no held-out examples (membership inference needs data never trained on)"
    if n < MIN_PER_SAMPLE:
        return (f"cannot tell: {plural(n, 'example')} (the AUC's bootstrap interval needs at least"
                f" {MIN_PER_SAMPLE} of the subject's examples)")
    if m < MIN_PER_SAMPLE:
        return (f"cannot tell: {plural(m, 'held-out example')} (the AUC's bootstrap interval needs at least"
                f" {MIN_PER_SAMPLE} held-out examples)")
    best = best_pvalue(n, m)
    if best > alpha:
        return (f"cannot tell: {plural(n, 'example')} against {plural(m, 'held-out example')} (even an AUC of 1"
                f" has an exact Mann-Whitney p-value of {best:.3g}, above {alpha:g})")
    return None


def tpr_at_fpr(members: Sequence[float], others: Sequence[float], fpr: float = LOW_FPR) -> dict[str, Any]:
    """The true-positive rate at a false-positive rate of at most ``fpr``: the share of ``members`` above the
    lowest threshold that at most ``fpr`` of ``others`` exceed (a score equal to it counts as not a member).
    Returns ``tpr``, the false-positive rate that threshold reaches (``fpr_reached``) and the lowest non-zero one
    the sample can reach (``lowest_fpr``: 1 / m)."""
    members, others = np.asarray(members, dtype=float), np.asarray(others, dtype=float)
    if members.size == 0 or others.size == 0:
        return {"fpr": fpr, "tpr": None, "fpr_reached": None, "lowest_fpr": None if others.size == 0 else 1 / others.size}
    thresholds = np.unique(others)  # ascending; the false-positive rate falls as the threshold rises
    rates = (others[None, :] > thresholds[:, None]).mean(axis=1)
    at = int(np.argmax(rates <= fpr))  # the highest threshold (the maximum) reaches 0, so one always qualifies
    return {"fpr": fpr, "tpr": float(np.mean(members > thresholds[at])), "fpr_reached": float(rates[at]),
            "lowest_fpr": 1 / others.size}


__all__ = ["ALPHA", "CONFIDENCE", "LOW_FPR", "MIN_PER_SAMPLE", "RESAMPLES", "auc", "auc_ci", "best_pvalue",
           "cannot_tell", "detectable_auc", "plural", "tpr_at_fpr"]
