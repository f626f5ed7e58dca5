"""The synthetic release's budget split on real tables (docs/research/synthesizer.md, "The sampler and
the budget split"): variants of the release as methods of ``sparkpriv bench utility``.

Run from the repository root::

    PYTHONPATH=docs/research/scripts sparkpriv bench utility --plugin budget_split_study:register_variants \\
        --tables bms_webview_2,bms_webview_1,groceries --epsilons 0.5,1 --draws 5 \\
        --methods synthetic,syn-as35,syn-as50,syn-ls05,syn-ls05-as35,syn-a128-as35

Fixed seeds: measurements, not private releases. Each variant gets its own release seeds (they
are drawn from the method's name), so the comparison is not paired.
"""

from __future__ import annotations

from scipy import sparse

VARIANTS = {"syn-as35": dict(anchor_share=0.35), "syn-as50": dict(anchor_share=0.5),
            "syn-ls05": dict(length_share=0.05), "syn-ls05-as35": dict(length_share=0.05, anchor_share=0.35),
            "syn-a128-as35": dict(anchors=128, anchor_share=0.35)}


def variant(**params):
    """The synthetic release with ``params`` instead of its defaults, scored as the suite scores it."""
    from sparkpriv.bench.utility_methods import _ModelAnswers

    def fn(X, *, epsilon, delta, seed):
        from sparkpriv.api import release_synthetic
        from sparkpriv.privacy.random import insecure_fixed_seed

        n = X.shape[0]
        with insecure_fixed_seed(int(seed) % 2**63):
            rel = release_synthetic(sparse.csr_matrix(X), epsilon=epsilon, delta=delta, **params)
        return {"table": rel.model.sample(n, int(seed) % 2**63), "expected": _ModelAnswers(rel.model, n)}

    return fn


def register_variants() -> None:
    from sparkpriv.bench.utility_methods import register

    for name, params in VARIANTS.items():
        register(name, variant(**params), note=f"the synthetic release with {params}")
