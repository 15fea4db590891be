"""The value manifold of one prompt set (Paper III): PC shares beside their nulls and intervals, the participation
ratio, and PC1 against entropy."""

from __future__ import annotations

from ..stats import as_float64
from ..stats.pca import (bootstrap_shares, correlations, null_shares, participation_ratio, pca, shares, spearman,
                         spectrum)


def manifold_summary(values, entropy) -> dict:
    """PC1 and PC1+PC2 shares of the standardised values, and Spearman rho of the PC1 score with entropy."""
    ratios, _, scores = pca(values)
    return dict(pc1_share=float(ratios[0]), pc12_share=float(ratios[:2].sum()),
                spearman_pc1_entropy=spearman(scores[:, 0], entropy), n_prompts=int(len(scores)),
                dim=int(as_float64(values).shape[1]))


def manifold_report(values, entropy, *, bayes_entropy=None, groups=None, n_boot: int = 1000, n_null: int = 1000,
                    seed: int = 0) -> dict:
    """Everything Paper III measures on one value cloud, with intervals and nulls (the bootstrap over whole
    ``groups`` of rows where given: a wind tunnel's sequences).

    PC sign is arbitrary: correlations are reported with PC1 oriented so that its Pearson r with ``entropy`` is
    non-negative, and magnitudes are what compare across models.
    """
    x = as_float64(values)
    ev = spectrum(x)
    pc1, pc12 = shares(ev)
    _, _, scores = pca(x)
    score = scores[:, 0]
    corr = correlations(score, entropy)
    if corr["pearson"] < 0:
        score, corr = -score, correlations(-score, entropy)
    out = dict(
        n_prompts=int(x.shape[0]), dim=int(x.shape[1]), pc1_share=pc1, pc12_share=pc12,
        bootstrap=bootstrap_shares(x, groups=groups, n_boot=n_boot, seed=seed),
        nulls={k: null_shares(x, k, n_draws=n_null, seed=seed) for k in ("permuted", "gaussian")},
        participation_ratio=participation_ratio(ev), participation_ratio_top10=participation_ratio(ev, 10),
        pc1_vs_entropy=corr, pc1_score=score.tolist(),
    )
    if bayes_entropy is not None:
        out["pc1_vs_bayes_entropy"] = correlations(score, bayes_entropy)
    return out
