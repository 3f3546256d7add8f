"""Dense retrieval stages: encoding, FAISS indexes and BM25/dense fusion."""
