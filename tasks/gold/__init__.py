"""Gold linking (the library, linking.py) and its stage family (stages.py): gold passages and
the gold training pairs."""
from .linking import link_qrels_gold, link_span_gold

__all__ = ["link_qrels_gold", "link_span_gold"]
