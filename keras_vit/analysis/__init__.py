"""Analysis: FLOP and parameter counts, evaluation metrics, attention maps
and rollout."""
