"""Using what was built: search one question against a system's artifacts (`pforge search`).

A system is found through its runs artifact (`bm25_runs`, `dense_runs` or `hybrid_runs`): that
artifact's manifest records exactly how its runs were made (the BM25 index and its k1/b; the
encoder, its encode settings and the FAISS index; the fused runs and their weights), so a search
here ranks a new question the way the pipeline ranked its own questions. For a question of the
question set, the results are the pipeline's run for it (the tests hold them to that). After a
corpus refresh (`pforge refresh`), the same recipe runs over the refreshed indexes: the newest
BM25 and FAISS index that refreshes made from the ones the runs record (tasks/refresh/state.py).
Which runs serve a system: flows/system_runs.py; their recipe, read from the manifest:
flows/recipes.py; ranking with it: flows/rankers.py; the promoted encoder: flows/promotion.py.

    >>> from flows.search import search
    >>> result = search("Which team won Super Bowl 50?", system="bm25", k=5)
    >>> [(h.rank, h.title, round(h.score, 2)) for h in result.hits]
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from flows.promotion import latest_promotion
from flows.rankers import Ranker
from flows.system_runs import encoder_of, planned_runs, promoted_runs, system_name, system_runs
from storage import Artifact, ArtifactStore, resolve_root
from tasks.config import PipelineConfig, load_config

logger = logging.getLogger("passage_forge")


@dataclass(frozen=True)
class Hit:
    """One retrieved passage: its rank (from 1), the system's score, and the passage as the
    `passages` table holds it."""
    rank: int
    pid: str
    score: float
    doc_id: str
    title: str
    text: str


@dataclass
class SearchResult:
    """What `search` returns: the ranked `hits` and the artifacts that produced them."""
    question: str
    system: str                    # the system's name in runs and metrics
    runs: Artifact                 # the runs artifact whose recipe ranked the question
    hits: list[Hit] = field(default_factory=list)
    encoder: str | None = None     # dense_model version behind a dense system, when it has one
    refresh: str | None = None     # the corpus_refresh version whose indexes served, when one did


def search(question: str, system: str | None = None, *, promoted: bool = False, k: int = 10,
           root: str | Path | None = None, config: PipelineConfig | str | Path | None = None,
           store: ArtifactStore | None = None) -> SearchResult:
    """The top `k` passages for `question`, ranked with exactly the recipe a system's runs
    artifact records (what `pforge search` prints).

    Args:
        question: the question text.
        system: a system name of the runs (`bm25`, a dense system, `hybrid(NAME)` or just
            `hybrid`, a fusion's name) or a stage name (`search:NAME`, `bm25_search`,
            `fusion:NAME`). Neither this nor `promoted`: the promoted encoder if there is one,
            else BM25.
        promoted: the dense system whose encoder was promoted last (`pforge promote`).
        k: how many passages.
        root: the artifact root (default: `$PFORGE_HOME`, else `./artifacts`); it must exist.
        config: a config (or its path): search the artifacts that config builds (it must have
            run), instead of the latest artifacts of the system in the store.
        store: an open store, instead of `root`.

    Returns:
        The hits, best first, with the runs artifact used, the encoder version of a dense
        system and the corpus refresh whose indexes served, if any.

    Raises:
        ValueError: an empty question, `k < 1`, both `system` and `promoted`, a system with no
            runs in the store (or not in `config`), or `promoted` when nothing was promoted.
        RuntimeError: `config` has not built that system yet, or the promoted encoder has no
            index and runs yet.
        MissingStoreError: the root does not exist.

    Examples:
        ```python
        from flows.search import search

        result = search("Who gave their name to Normandy?", system="bm25", k=5)
        for hit in result.hits:
            print(hit.rank, round(hit.score, 2), hit.title, hit.pid)
        ```
    """
    if not question or not question.strip():
        raise ValueError("search: the question is empty")
    if k < 1:
        raise ValueError(f"search: k must be >= 1, got {k}")
    if system is not None and promoted:
        raise ValueError("search: give a system or --promoted, not both")
    store = store or ArtifactStore(resolve_root(str(root) if root is not None else None), create=False)
    cfg = load_config(config) if isinstance(config, (str, Path)) else config
    planned = planned_runs(cfg)
    if promoted:
        runs = promoted_runs(store, planned)
    elif system is None and latest_promotion(store) is not None:
        try:
            runs = promoted_runs(store, planned)
        except RuntimeError as exc:  # promoted, but nothing built with it yet: say so, serve BM25
            logger.warning("%s; searching with BM25", exc)
            runs = system_runs(store, "bm25", cfg, planned)
    else:
        runs = system_runs(store, system or "bm25", cfg, planned)
    ranker = Ranker(store, planned)
    table = ranker.run(runs, question, k)
    hits = _hits(store, ranker.passages or [_passages_of(store, runs)], table)
    return SearchResult(question=question, system=system_name(runs), runs=runs, hits=hits, encoder=encoder_of(runs),
                        refresh=max(ranker.refreshes, default=None, key=_refresh_order(store)))


def _passages_of(store: ArtifactStore, runs: Artifact) -> Artifact:
    for item in store.lineage(runs.stage, runs.version):
        if item["stage"] == "passages" and not item.get("missing"):
            return store.get("passages", item["version"])
    raise RuntimeError(f"{runs.path}: no passages artifact in its lineage")


def _refresh_order(store: ArtifactStore):
    def created(version: str) -> str:
        artifact = store.get("corpus_refresh", version)
        return artifact.manifest["created_at"] if artifact is not None else ""
    return created


def _hits(store: ArtifactStore, sources: list[Artifact], table: pa.Table) -> list[Hit]:
    """The ranked pids with their passages, looked up in `sources` (the passages behind the indexes
    searched; the first that holds a pid describes it)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if table.num_rows == 0:
        return []
    pids = table.column("pid").to_pylist()
    by_pid: dict = {}
    for passages in sources:
        wanted = [pid for pid in pids if pid not in by_pid]
        if not wanted:
            break
        found = ds.dataset([str(f) for f in passages.table_files()], format="parquet").to_table(
            columns=["pid", "doc_id", "title", "text"], filter=pc.field("pid").isin(wanted))
        by_pid.update({row["pid"]: row for row in found.to_pylist()})
    hits = []
    for pid, rank, score in zip(pids, table.column("rank").to_pylist(), table.column("score").to_pylist()):
        row = by_pid.get(pid, {"doc_id": "", "title": "", "text": ""})
        hits.append(Hit(rank=int(rank), pid=pid, score=float(score), doc_id=row["doc_id"], title=row["title"],
                        text=row["text"]))
    return hits
