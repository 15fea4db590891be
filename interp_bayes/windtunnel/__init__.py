"""Wind-tunnel models: small HF transformers (and a capacity-matched MLP) trained on tasks with exact posteriors."""
