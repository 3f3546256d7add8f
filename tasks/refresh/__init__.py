"""Incremental corpus refresh (one module per job): locate.py finds and fetches the newer dump,
diff.py compares tables by key, rechunk.py and reencode.py make the new passages and vectors from
the old ones, faiss_update.py and bm25_update.py update the indexes, report.py writes the change
report, state.py says which versions are in force, stages.py runs it all through the store, and
config.py is the `refresh:` config section."""
