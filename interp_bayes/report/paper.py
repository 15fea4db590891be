"""The papers' own numbers that the report sets beside a run's: Paper III Tables 1-2 and §5 (methods.md §3.9)."""

# Paper III v1 numbers, as printed (Table 1 bootstrap means; Table 2; §5.1 Spearman; §5.2 SULA MAE).
PAPER_ROWS = {
    "Pythia-410M": {"mixed PC1": "79.6% (78.4, 80.8)", "mixed PC1+PC2": "99.7%", "math PC1": "58.0%",
                    "math PC1+PC2": "99.9%", "Spearman(PC1, H) mixed / math": "-0.32 / -0.14",
                    "key orthogonality": "0.11-0.13", "attention focusing": "82%", "SULA MAE": "0.44 bits"},
    "Phi-2": {"mixed PC1": "46.4% (43.9, 48.9)", "mixed PC1+PC2": "60.6%", "math PC1": "52.2%",
              "math PC1+PC2": "63.5%", "Spearman(PC1, H) mixed / math": "+0.34 / +0.16",
              "key orthogonality": "0.034-0.051", "attention focusing": "86%", "SULA MAE": "0.31 bits"},
    "Llama-3.2-1B": {"mixed PC1": "36.6% (34.8, 38.4)", "mixed PC1+PC2": "51.4%", "math PC1": "52.5%",
                     "math PC1+PC2": "73.6%", "Spearman(PC1, H) mixed / math": "+0.59 / -0.51",
                     "key orthogonality": "0.15-0.18", "attention focusing": "31%", "SULA MAE": "0.36 bits"},
}


PAPER_ATTENTION = {"Pythia-410M": "MHA", "Phi-2": "MHA", "Llama-3.2-1B": "GQA"}  # methods.md §3.9 Table 2
