"""Fusion of runs (the library is tasks/dense/hybrid.py): the `fusion:` config section and its stages."""
