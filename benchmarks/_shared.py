"""What the benchmark scripts share besides the timing protocol (timing.py) and the training-step
options (_step_args.py): their SQuAD input read through the project's reader, the answer matcher
that scores them, and the sentence-transformers peer.

(benchmarks/st_backend_peer.py builds its peer by itself: it runs under another Python, outside
the project.)
"""
from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate
from pathlib import Path
from typing import NamedTuple

import _bootstrap  # noqa: F401  (puts the project on sys.path)


# --------------------------------------------------------------------------- fixtures
class SquadParagraph(NamedTuple):
    context: str
    questions: list[dict]  # the reader's question records (qid, question, answers, ...), file order


class SquadArticle(NamedTuple):
    doc_id: str  # the reader's document id: "squad:" + the title as the file spells it
    title: str  # underscores as spaces
    paragraphs: list[SquadParagraph]


def squad_articles(path: str | Path) -> list[SquadArticle]:
    """A SQuAD json's articles in file order, each with its paragraphs and their questions, read by
    tasks.readers.squad (which checks the file: ids, answers, answer offsets).

    The reader gives an article as one document, its paragraphs joined by PARAGRAPH_SEP (a blank
    line, which no SQuAD context holds), and each question with its answer spans in that text: a
    paragraph is a piece between separators, a question belongs to the one its answer spans lie in.
    """
    from tasks.readers.squad import PARAGRAPH_SEP, iter_squad_documents, iter_squad_questions

    by_doc: dict[str, list[dict]] = {}
    for q in iter_squad_questions(path):
        by_doc.setdefault(q["doc_id"], []).append(q)
    articles = []
    for doc in iter_squad_documents(path):
        contexts = doc["text"].split(PARAGRAPH_SEP)
        starts = list(accumulate((len(c) + len(PARAGRAPH_SEP) for c in contexts[:-1]), initial=0))
        questions: list[list[dict]] = [[] for _ in contexts]
        for q in by_doc.get(doc["doc_id"], []):
            spans = q["answer_spans"]
            i = bisect_right(starts, spans[0]["start"]) - 1 if spans else -1
            if i < 0 or any(not starts[i] <= s["start"] <= s["end"] <= starts[i] + len(contexts[i]) for s in spans):
                raise SystemExit(f"{path}: question {q['qid']!r} has no answer inside one paragraph "
                                 f"(a context with a blank line, or an unanswerable question)")
            questions[i].append(q)
        articles.append(SquadArticle(doc["doc_id"], doc["title"],
                                     [SquadParagraph(c, qs) for c, qs in zip(contexts, questions)]))
    return articles


def load_has_answer():
    """(callable, source): the project's DPR matcher (tasks.evaluation.has_answer), else a flagged
    fallback that approximates its tokens (normalised, punctuation as separators, whole words)."""
    try:
        from tasks.evaluation.has_answer import has_answer

        return has_answer, "tasks.evaluation.has_answer (DPR tokens)"
    except ImportError:
        import re
        import unicodedata

        def _norm(s: str) -> str:
            s = unicodedata.normalize("NFD", s or "").lower()
            s = re.sub(r"[^\w\s]", " ", s)
            return " " + " ".join(s.split()) + " "

        def has_answer(answers, text):
            t = _norm(text)
            return any(_norm(a).strip() and _norm(a) in t for a in answers)

        return has_answer, "FALLBACK normalized substring (tasks.evaluation.has_answer missing)"


# --------------------------------------------------------------------------- peers
def st_peer(model: str | Path, device: str = "cpu", max_length: int | None = None, **kwargs):
    """The sentence-transformers peer: `SentenceTransformer` on the checkpoint `model` names (a
    models.checkpoints alias such as 'minilm', or a folder), on `device`, truncating at
    `max_length` tokens when given; `kwargs` go to the constructor (e.g. backend="onnx")."""
    from sentence_transformers import SentenceTransformer

    from models.checkpoints import resolve_checkpoint

    st = SentenceTransformer(resolve_checkpoint(model), device=device, **kwargs)
    if max_length is not None:
        st.max_seq_length = max_length
    return st
