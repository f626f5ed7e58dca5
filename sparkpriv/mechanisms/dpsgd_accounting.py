"""DP-SGD's accounting: the events of the steps (Poisson-sampled Gaussians, with quantile
clipping's counts), their epsilon, and the calibration of the noise multiplier to a request
(docs/math.md section 5.1; :mod:`sparkpriv.mechanisms.dpsgd`'s docstring has the derivation and
re-exports every public name here). Public parameters only: no data, no noise drawn."""

from __future__ import annotations

import math

from dp_accounting import dp_event

from sparkpriv._validation import Interval, Options, check_param
from sparkpriv.errors import ParameterError
from sparkpriv.privacy.accounting import compose, epsilon_of

__all__ = ["NEIGHBORS", "ACCOUNTANTS", "MAX_COUNT_SHARE", "RDP_ORDERS", "sensitivity_factor", "dpsgd_event",
           "count_noise_std", "quantile_step_multiplier", "quantile_event", "accounted_epsilon",
           "calibrate_noise_multiplier"]

NEIGHBORS = ("replace-one", "add-remove")
ACCOUNTANTS = ("pld", "rdp")
MAX_COUNT_SHARE = 1.0 / 3.0  # the count's share of a step's 1/z_eff^2 (docs/math.md section 5.1)
_POS = Interval("real", 0, None, "neither")
_RATE = Interval("real", 0, 1, "right")


def sensitivity_factor(neighbors: str) -> float:
    """The L2 sensitivity of the clipped sum in units of ``C``: 2 (replace-one) or 1 (add-remove)."""
    check_param("neighbors", neighbors, [Options(NEIGHBORS)], "dpsgd")
    return 2.0 if neighbors == "replace-one" else 1.0


def _check_common(q, steps, caller):
    check_param("sampling_rate", q, [_RATE], caller)
    check_param("steps", steps, [Interval("integer", 1, 10_000_000, "both")], caller)


def dpsgd_event(q: float, noise_multiplier: float, steps: int, neighbors: str = "replace-one",
                step_event: dp_event.DpEvent | None = None) -> dp_event.DpEvent:
    """``SelfComposed(PoissonSampled(q, Gaussian(noise_multiplier / factor)), steps)``.

    ``noise_multiplier`` is sigma / C (noise std over the clip); ``factor`` is
    :func:`sensitivity_factor` (module docstring). ``step_event`` (the
    discrete noise's own ``GaussianDpEvent``, already normalised to the
    relation's sensitivity) replaces the Gaussian event when given.
    """
    caller = "dpsgd_event"
    _check_common(q, steps, caller)
    if step_event is None:
        check_param("noise_multiplier", noise_multiplier, [_POS], caller)
        step_event = dp_event.GaussianDpEvent(float(noise_multiplier) / sensitivity_factor(neighbors))
    return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(float(q), step_event), int(steps))


def count_noise_std(noise_multiplier: float, share: float) -> float:
    """``sigma_b``, the std of the noise on a step's clipped count, for the count's public
    ``share`` ``s`` in ``(0, 1/3]`` of the step's ``1/z_eff^2``.

    With ``4/sigma^2 = (1 - s) / z_eff^2`` (the sum) and ``1/sigma_b^2 = s / z_eff^2`` (the
    count): ``sigma_b = sigma sqrt((1 - s) / s) / 2``. For ``s <= 1/3`` the same-cluster case
    is the larger one in :func:`quantile_step_multiplier`, so ``z_eff = sigma sqrt(1 - s) / 2``:
    the gradient noise is ``1 / sqrt(1 - s)`` times what a declared clip needs at the same
    epsilon (docs/math.md section 5.1).
    """
    caller = "count_noise_std"
    check_param("noise_multiplier", noise_multiplier, [_POS], caller)
    check_param("count_share", share, [Interval("real", 0, MAX_COUNT_SHARE, "right")], caller)
    return float(noise_multiplier) * math.sqrt((1.0 - float(share)) / float(share)) / 2.0


def quantile_step_multiplier(noise_multiplier: float, count_std: float) -> float:
    """``z_eff`` of one quantile-clipping step (replace-one, the sum and the count released
    together): ``max(4/sigma^2 + 1/sigma_b^2, 2/sigma^2 + 2/sigma_b^2)^(-1/2)``.

    ``sigma`` = gradient noise / ``C_t``, ``sigma_b`` = count noise std (the count's
    sensitivity is 1). The first term: one record replaced in one data set (sum ``2C_t``,
    count 1); the second: the two records in different DPGM clusters (each cluster's sum
    ``C_t`` and count 1). The step is an add/remove ``Gaussian(z_eff)`` step
    (docs/math.md section 5.1).
    """
    caller = "quantile_step_multiplier"
    check_param("noise_multiplier", noise_multiplier, [_POS], caller)
    check_param("count_std", count_std, [_POS], caller)
    a, b = 1.0 / float(noise_multiplier) ** 2, 1.0 / float(count_std) ** 2
    return 1.0 / math.sqrt(max(4.0 * a + b, 2.0 * a + 2.0 * b))


def quantile_event(q: float, noise_multiplier: float, count_std: float, steps: int) -> dp_event.DpEvent:
    """``SelfComposed(PoissonSampled(q, Gaussian(z_eff)), steps)``: ``steps`` quantile-clipping
    steps (replace-one), ``z_eff`` from :func:`quantile_step_multiplier`."""
    z = quantile_step_multiplier(noise_multiplier, count_std)
    return dpsgd_event(q, z, steps, "add-remove", step_event=dp_event.GaussianDpEvent(z))


def accounted_epsilon(event: dp_event.DpEvent, delta: float, accountant: str = "pld") -> float:
    """Epsilon of ``event`` at ``delta``: the library's PLD (default) or dp_accounting's RDP."""
    check_param("accountant", accountant, [Options(ACCOUNTANTS)], "accounted_epsilon")
    if accountant == "pld":
        return epsilon_of(event, delta)
    from dp_accounting.rdp import rdp_privacy_accountant

    acc = rdp_privacy_accountant.RdpAccountant(orders=RDP_ORDERS)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


# dp_accounting's default orders minus the fractional ones below 12 (their sampled-Gaussian
# series is slow and often does not converge); integer orders have a closed form
RDP_ORDERS = [*range(2, 65), 72, 80, 96, 128, 192, 256, 512, 1024]


def calibrate_noise_multiplier(*, epsilon: float, delta: float, sampling_rate: float, steps: int,
                               neighbors: str = "replace-one", accountant: str = "pld",
                               rtol: float = 1e-3, base_event: dp_event.DpEvent | None = None,
                               count_share: float | None = None,
                               caller: str = "calibrate_noise_multiplier") -> float:
    """The smallest ``sigma = noise std / C`` (to ``rtol``, rounded up) whose DP-SGD event
    has accounted epsilon at most ``epsilon`` at ``delta``.

    ``count_share`` (quantile clipping, replace-one only): the event is
    :func:`quantile_event` with the count's noise ``count_noise_std(sigma, count_share)``.

    ``base_event`` (e.g. the k-means part of a DPGM release) is composed with
    the DP-SGD event before accounting, so the whole release meets the request.

    Bisection on ``log sigma`` (epsilon falls as sigma grows). Depends only on
    public parameters.
    """
    check_param("epsilon", epsilon, [_POS], caller)
    check_param("delta", delta, [Interval("real", 0, 1, "neither")], caller)
    _check_common(sampling_rate, steps, caller)
    check_param("accountant", accountant, [Options(ACCOUNTANTS)], caller)
    check_param("rtol", rtol, [Interval("real", 1e-9, 0.5, "both")], caller)
    if count_share is not None:
        check_param("count_share", count_share, [Interval("real", 0, MAX_COUNT_SHARE, "right")], caller)
        if neighbors != "replace-one":
            raise ParameterError(f"{caller}: quantile clipping (count_share) is accounted for replace-one "
                                 f"only. Got neighbors={neighbors!r}.")

    def event(s: float):
        e = dpsgd_event(sampling_rate, s, steps, neighbors) if count_share is None else \
            quantile_event(sampling_rate, s, count_noise_std(s, count_share), steps)
        return e if base_event is None else compose([base_event, e])

    def eps(s: float) -> float:
        # the search uses a 10x coarser PLD grid (pessimistic: it states more, never less);
        # the result is then checked with the library's accountant
        return _coarse_pld_epsilon(event(s), delta) if accountant == "pld" else \
            accounted_epsilon(event(s), delta, accountant)

    if base_event is not None:
        base_epsilon = accounted_epsilon(base_event, delta, accountant)
        if base_epsilon >= epsilon:
            hint = (" The RDP accountant states far more than the PLD one at large epsilon: "
                    "accountant='pld' may leave room." if accountant == "rdp" else "")
            raise ParameterError(
                f"{caller}: the other parts of the release "
                f"already spend epsilon={base_epsilon:.6g} by the {accountant} accountant at "
                f"delta={delta!r}, of the epsilon={epsilon!r} asked for; nothing is left for DP-SGD. "
                f"Give the other parts a smaller share.{hint}"
            )

    # bracket: the RDP calibration is cheap; for the PLD it is a good first guess
    start = 1.0
    if accountant == "pld":
        try:
            start = calibrate_noise_multiplier(epsilon=epsilon, delta=delta, sampling_rate=sampling_rate,
                                               steps=steps, neighbors=neighbors, accountant="rdp",
                                               rtol=rtol, base_event=base_event, count_share=count_share,
                                               caller=caller)
        except ParameterError:  # RDP states more than PLD: search from 1
            start = 1.0
    hi, e_hi = start, eps(start)
    lo, e_lo = hi, e_hi
    while e_hi > epsilon:
        lo, e_lo = hi, e_hi
        hi *= 1.25 if accountant == "pld" else 2.0
        if hi > 1e6:
            raise ParameterError(
                f"{caller} cannot meet epsilon={epsilon!r} at delta={delta!r} with sampling_rate="
                f"{sampling_rate!r} and steps={steps!r} (noise multiplier above 1e6): raise epsilon, "
                "lower the sampling rate or train fewer steps."
            )
        e_hi = eps(hi)
    while e_lo <= epsilon:
        hi, e_hi = lo, e_lo
        lo /= 1.25 if accountant == "pld" else 2.0
        if lo < 1e-4:
            return hi
        e_lo = eps(lo)
    # invariant: eps(hi) <= epsilon < eps(lo); regula falsi on (log s, log eps), Illinois rule
    side = 0
    target = math.log(epsilon)
    f_lo, f_hi = math.log(e_lo) - target, math.log(max(e_hi, 1e-300)) - target
    while hi / lo > 1.0 + rtol:
        a, b = math.log(lo), math.log(hi)
        x = b - f_hi * (b - a) / (f_hi - f_lo) if f_hi != f_lo else 0.5 * (a + b)
        x = min(max(x, a + 0.01 * (b - a)), b - 0.01 * (b - a))
        mid = math.exp(x)
        f_mid = math.log(max(eps(mid), 1e-300)) - target
        if f_mid <= 0:
            hi, f_hi = mid, f_mid
            if side == 1:
                f_lo /= 2.0
            side = 1
        else:
            lo, f_lo = mid, f_mid
            if side == -1:
                f_hi /= 2.0
            side = -1
    while accounted_epsilon(event(hi), delta, accountant) > epsilon:  # rare: coarse grid said yes
        hi *= 1.0 + rtol
    return hi


def _coarse_pld_epsilon(event: dp_event.DpEvent, delta: float) -> float:
    import dp_accounting
    from dp_accounting.pld import pld_privacy_accountant

    from sparkpriv.privacy.accounting import _discretization_for

    acc = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        value_discretization_interval=10.0 * _discretization_for(event, delta))
    acc.compose(event)
    return float(acc.get_epsilon(delta))
