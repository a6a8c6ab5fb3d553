"""Statistical checks shared by the sampling tests."""

import numpy as np
import torch
from scipy import stats

# A correct sampler fails a check with probability ALPHA; the sample sizes below make a
# biased one (wrong residual, skipped filter, off-by-one CDF) fail with near certainty.
ALPHA = 1e-6


def assert_matches_distribution(samples, probs, *, what="samples"):
    """Chi-square goodness of fit of integer ``samples`` to ``probs`` (1-D, sums to 1).

    Categories with zero probability must never be drawn; small-expectation categories are
    pooled so the chi-square approximation holds.
    """
    samples = np.asarray(samples).ravel()
    probs = np.asarray(probs, dtype=np.float64)
    n = samples.size
    counts = np.bincount(samples, minlength=probs.size)[: probs.size]
    assert samples.min() >= 0 and samples.max() < probs.size, f"{what}: token out of range"
    impossible = probs <= 0
    assert counts[impossible].sum() == 0, (
        f"{what}: drew tokens of zero probability {np.nonzero(impossible & (counts > 0))[0].tolist()}")
    keep = ~impossible
    exp = probs[keep] * n
    obs = counts[keep].astype(np.float64)
    big = exp >= 5
    if (~big).any():  # pool the small ones into one category
        exp = np.append(exp[big], exp[~big].sum())
        obs = np.append(obs[big], obs[~big].sum())
    if exp.size < 2:
        return
    p_value = stats.chisquare(obs, exp * (obs.sum() / exp.sum())).pvalue
    assert p_value > ALPHA, (
        f"{what}: chi-square p = {p_value:.2e} (n = {n}); observed {np.round(obs / n, 4).tolist()} "
        f"vs expected {np.round(exp / n, 4).tolist()}")


def first_token_resampled_from_target(draft, q, p, u_accept, u_resample):
    """Negative control of the verify_sampling distribution tests: the first output token of
    a plausibly wrong verifier that, rejecting the first draft, draws from the target p
    itself instead of the residual max(0, p - q) (so tokens the draft favours come out too
    often). CPU tensors: draft [N, k] int64, q [N, k, V], p [N, k+1, V], u_accept [N, k] and
    u_resample [N] float64, used as the kernels use them; returns numpy int64 [N]."""
    x = draft[:, 0]
    px = p[:, 0].double().gather(-1, x[:, None])[:, 0]
    qx = q[:, 0].double().gather(-1, x[:, None])[:, 0]
    cdf = p[:, 0].double().cumsum(-1)
    redo = torch.searchsorted(cdf, (u_resample * cdf[:, -1])[:, None], right=True)[:, 0].clamp(max=p.shape[-1] - 1)
    return torch.where(u_accept[:, 0] * qx < px, x, redo).numpy()
