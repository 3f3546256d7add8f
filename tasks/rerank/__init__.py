"""Cross-encoder reranking of any run."""
