"""Silver labelling with a cross-attention classifier (paper 001)."""
