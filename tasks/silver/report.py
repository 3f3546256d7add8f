"""The cross_encoder stage's classification report (paper 001 table 2) on the report split's
pairs: the classifier at p >= 0.5 against the majority baseline and the base checkpoint as a
dual encoder, whose cosine threshold is tuned on the classifier's dev pairs."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tasks.silver.classifier import best_threshold, classification_report
from tasks.silver.sampling import LabelledPair, as_text_pairs


def report_rows(model, base: str, dev: Sequence[LabelledPair], report_pairs: Sequence[LabelledPair],
                text_of: Mapping[str, str], batch_size: int, device) -> tuple[list[dict], float]:
    """(table 2's rows, with NaN as None, the dual encoder's threshold)."""
    labels = [p.label for p in report_pairs]
    p = model.score(as_text_pairs(report_pairs, text_of), batch_size=batch_size, device=device)
    dual = dual_encoder_scorer(base, device)
    dev_scores = dual(dev, text_of)
    threshold = best_threshold([x.label for x in dev], dev_scores)
    rows = classification_report(labels, p, dual(report_pairs, text_of), threshold)
    return [{k: (None if isinstance(v, float) and np.isnan(v) else v) for k, v in r.items()} for r in rows], threshold


def dual_encoder_scorer(base: str, device):
    """Cosine of the base checkpoint as a (mean-pooled, normalised) dual encoder: the paper's
    'BERT dual encoder without mined examples' baseline."""
    from tasks.compute.bi_encoder import encode_side, load_bi_encoder

    model = load_bi_encoder({"base": base, "shared": True, "pooling": "mean", "projection_dim": None,
                             "normalize": True, "scale": 1.0})
    model.to(device).eval()

    def score(pairs, text_of):
        questions = sorted({p.question for p in pairs})
        pids = sorted({p.pid for p in pairs})
        common = dict(batch_size=64, passage_max_len=256, query_max_len=64, device=str(device))
        qv = dict(zip(questions, encode_side(model, questions, "query", **common)))
        pv = dict(zip(pids, encode_side(model, [(None, text_of[x]) for x in pids], "passage", **common)))
        return np.array([float(np.dot(qv[p.question], pv[p.pid])) for p in pairs])
    return score
