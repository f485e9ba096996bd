"""The statistics behind the gate's claims: exact binomial bounds, the paired top-1 drop's interval, and how many
labelled images a claim needs.

The top-1 drop of a candidate against its reference on the same n labelled images is (b - c) / n, b the images it
turns from right to wrong and c from wrong to right. Its 95 % interval is Tango's score interval for a difference
of paired proportions (Tango 1998; recommended by Fagerland, Lydersen & Laake 2013): unlike the interval conditional
on the discordant pairs, it stays honest when there are none (0 flips of 20 images: the drop is <= 16.1 pp, not 0).

Repeated looks at one labelled set spend its error (`look_confidence`): look k of one source model on one set is
judged at 1 - 5 % x 6 / (pi^2 k^2), so all its looks together never spend more than 5 %: 96.96 % for the first,
99.24 % for the second, 99.97 % for the tenth. After MAX_LOOKS a fresh set is required (edge.model.gate_looks).
"""

import math
from statistics import NormalDist
from typing import Callable, Dict, Tuple

Z95 = 1.959963984540054  # two-sided 95 %
Z80 = 0.8416212335729143  # one-sided 80 % (the power a "labels needed" figure is for)
FAMILY_CONFIDENCE = 0.95  # what every look of one model at one set spends together
MAX_LOOKS = 10  # looks at one labelled set per source model; then a fresh set is required


def look_confidence(look: int) -> float:
    """The two-sided confidence look `look` (1, 2, ...) is judged at: its share 6 / (pi^2 k^2) of the 5 %."""
    if look < 1:
        raise ValueError("look {} < 1".format(look))
    return 1.0 - (1.0 - FAMILY_CONFIDENCE) * 6.0 / (math.pi ** 2 * look ** 2)


def z_of(confidence: float) -> float:
    """The normal quantile of a two-sided `confidence` (0.95 -> 1.96)."""
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2)


def percent(confidence: float) -> str:
    """0.95 -> '95 %', 0.9696 -> '96.96 %': how a claim names its confidence."""
    return "{:g} %".format(round(100.0 * confidence, 2))


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exact (log-space terms: no overflow for any n)."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                                 + i * log_p + (n - i) * log_q) for i in range(k, n + 1)))


def _solve(f: Callable[[float], float], target: float, lo: float = 0.0, hi: float = 1.0) -> float:
    """x in [lo, hi] with f(x) = target, for f increasing in x (bisection to ~1e-13 of the range)."""
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> Tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided interval of a binomial proportion, k successes in n trials."""
    if n == 0:
        return 0.0, 1.0
    alpha = (1 - confidence) / 2
    lo = 0.0 if k == 0 else _solve(lambda p: binomial_tail(k, n, p), alpha)
    hi = 1.0 if k == n else _solve(lambda p: binomial_tail(k + 1, n, p), 1 - alpha)
    return lo, hi


def _tango_z(b: int, c: int, n: int, delta: float) -> float:
    """Tango's score statistic for H0: p_b - p_c = delta (decreasing in delta)."""
    a_, b_ = 2.0 * n, -b - c + (2.0 * n - b + c) * delta
    c_ = -c * delta * (1.0 - delta)
    p_c = (math.sqrt(max(b_ * b_ - 4.0 * a_ * c_, 0.0)) - b_) / (2.0 * a_)  # restricted MLE of p_c
    variance = n * (2.0 * p_c + delta * (1.0 - delta))
    numerator = b - c - n * delta
    if variance <= 0.0:
        return 0.0 if numerator == 0 else math.copysign(math.inf, numerator)
    return numerator / math.sqrt(variance)


def paired_drop_interval(b: int, c: int, n: int, z: float = Z95) -> Tuple[float, float]:
    """Tango's score interval of p_b - p_c (as fractions): {delta : |Z(delta)| <= z}. A ValueError unless
    0 <= b, c and b + c <= n (b and c are disjoint subsets of the n pairs)."""
    if min(b, c) < 0 or b + c > n:
        raise ValueError("discordant pairs b={} c={} do not fit n={} pairs".format(b, c, n))
    if n == 0:
        return -1.0, 1.0
    lo = _solve(lambda d: -_tango_z(b, c, n, d), -z, -1.0, 1.0)
    hi = _solve(lambda d: -_tango_z(b, c, n, d), z, -1.0, 1.0)
    return lo, hi


def labels_needed(discordance: float, distance_pp: float, z: float = Z95) -> int:
    """Labelled images for the interval (95 %: `z`) to land on the right side of a limit `distance_pp` away from the
    true drop with 80 % power, at this discordance (the fraction of images whose top-1 correctness changes)."""
    distance = max(abs(distance_pp), 0.05) / 100.0
    return int(math.ceil((z + Z80) ** 2 * max(discordance, 1e-4) / distance ** 2))


def min_detectable_drop_pp(discordance: float, n: int, limit_pp: float) -> float:
    """The smallest true drop this many labelled images fail (its interval above the limit) with 80 % power."""
    return limit_pp + 100.0 * (Z95 + Z80) * math.sqrt(max(discordance, 1e-4) / max(n, 1))


def top1_claim(b: int, c: int, n: int, limit_pp: float, confidence: float = 0.95) -> Dict[str, object]:
    """The non-inferiority verdict on the top-1 drop: pass when its upper bound at `confidence` is within `limit_pp`,
    fail when its lower bound is beyond it, else inconclusive; with the claim in words and what would decide it."""
    lo, hi = (round(100.0 * x, 4) for x in paired_drop_interval(b, c, n, z_of(confidence)))
    drop, at = 100.0 * (b - c) / n, percent(confidence)
    # at least one discordant image assumed: 0 flips of 20 does not mean the next 2,000 would have none
    discordance, needed = max(b + c, 1) / n, None
    if hi <= limit_pp:
        verdict = "pass"
        claim = "top-1 drop <= {:.2f} pp at {} ({} labelled images; limit {:g} pp)".format(hi, at, n, limit_pp)
    elif lo > limit_pp:
        verdict = "fail"
        claim = "top-1 drop >= {:.2f} pp at {}, beyond the {:g} pp limit ({} labelled images)".format(
            lo, at, limit_pp, n)
    else:
        verdict = "inconclusive"
        # the true drop assumed as seen, but at least half the limit away from it: a drop on the limit is undecidable
        assumed = min(max(drop, 0.0), limit_pp / 2) if drop < limit_pp else max(drop, 1.5 * limit_pp)
        needed = labels_needed(discordance, limit_pp - assumed, z_of(confidence))
        changed = ("{:.1f} % of images change correctness, as here".format(100.0 * discordance) if b + c else
                   "planning assumption: 1 in {} images changes correctness (none did here)".format(n))
        claim = ("cannot tell: the drop is {:+.2f}..{:+.2f} pp at {} on {} labelled images; deciding a {:g} pp limit "
                 "needs ~{} labelled images ({}; a true drop of {:.2f} pp, 80 % power)".format(
                     lo, hi, at, n, limit_pp, needed, changed, assumed))
    return {"verdict": verdict, "claim": claim, "top1_drop_interval_pp": [lo, hi],
            "labels_needed": needed,
            "min_detectable_drop_pp": round(min_detectable_drop_pp(discordance, n, limit_pp), 2),
            "mcnemar_p": round(binomial_tail(b, b + c, 0.5), 6)}
