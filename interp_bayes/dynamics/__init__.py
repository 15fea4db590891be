"""Paper II: gradient dynamics of attention (methods.md §2), and the frame-precision dissociation (§1.7d).

- ``laws``: the closed-form gradients of one causal head and their check against autograd;
- ``sticky``: the single head on the sticky chain, SGD vs EM-like vs closed-form EM, with paired statistics;
- ``deep``: the 4-layer variant of the same experiment;
- ``frames``: frame vs precision metric curves over a checkpoint series, and their settle steps;
- ``measures``: float64 measurements the last three share;
- ``cli``: ``interp-bayes dynamics`` (also ``python -m interp_bayes.dynamics``); a command line, so not re-exported
  here (it imports the report).
"""

from .deep import DeepSticky, train_deep
from .frames import (FRAME_METRICS, LOG_METRICS, PRECISION_METRICS, Snapshot, attention_similarity, checkpoint_series,
    dissociation, frame_precision_from_checkpoints, frame_precision_run, key_orthogonality, low_entropy_separation,
    ratio_interval, settle_step, snapshot_metrics, take_snapshot)
from .laws import (attention_gradients, causal_attention, law_check, law_errors, readout_signal, relative_error,
    routing_gradients, single_head_gradients)
from .measures import cv_r2, geometric_mean_interval, pc1_share
from .sticky import (METHODS, PAPER_SEEDS, PAPER_SPEEDUP, closed_form_value_step, init_single_head, steps_to_reach,
    sticky_comparison, sticky_seed, summarise_sticky, train_single_head)
