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

VARIANTS = {"syn-as35": dict(anchor_share=0.35), "syn-as50": dict(anchor_share=0.5),
            "syn-ls05": dict(length_share=0.05), "syn-ls05-as35": dict(length_share=0.05, anchor_share=0.35),
            "syn-a128-as35": dict(anchors=128, anchor_share=0.35)}


def register_variants() -> None:
    from sparkpriv.bench.utility_methods import register, synthetic_defaults

    for name, params in VARIANTS.items():
        register(name, synthetic_defaults(**params), note=f"the synthetic release with {params}")
