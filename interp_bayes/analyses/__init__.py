"""Questions asked of a model: manifold, keys, focusing, the entropy axis, interventions and their controls, entropy
neurons, the martingale test, decoding, belief probes, mechanisms, subspaces. Imports ``core``, ``model``, ``stats``,
``tasks`` and ``windtunnel``."""
