"""One question ranked with a runs artifact's recipe (flows/recipes.py), over the newest refresh
of the indexes the recipe records (tasks/refresh/state.py): BM25, a dense system's encoder and
FAISS index, or a fusion of such runs."""
from __future__ import annotations

import pyarrow as pa

from flows.recipes import AnyRecipe, Bm25Recipe, DenseRecipe, FusionRecipe, recipe_of
from flows.system_runs import Planned
from storage import Artifact, ArtifactStore

# Loaded dense systems by (runs artifact folder, index folder, device): a process asking many
# questions loads each encoder and index once. Artifacts are immutable, so a folder's contents
# never go stale.
_LOADED: dict[tuple[str, str, str], tuple] = {}
_KEEP_LOADED = 2


class Ranker:
    """Ranks questions with the recipes of runs artifacts (a fusion: each of its parts). Remembers
    the passages behind each index it searched (for the hits' text) and the refreshes that made
    those indexes."""

    def __init__(self, store: ArtifactStore, planned: Planned):
        from tasks.refresh.state import RefreshChain

        self.store = store
        self.planned = planned
        self.chain = RefreshChain(store)
        self.passages: list[Artifact] = []
        self.refreshes: set[str] = set()

    def run(self, runs: Artifact, question: str, k: int) -> pa.Table:
        """The top `k` for `question` as the runs artifact `runs` ranked its own questions."""
        return self.rank(recipe_of(runs, self.planned), question, k)

    def rank(self, recipe: AnyRecipe, question: str, k: int) -> pa.Table:
        if isinstance(recipe, Bm25Recipe):
            return self._bm25(recipe, question, k)
        if isinstance(recipe, DenseRecipe):
            return self._dense(recipe, question, k)
        return self._fused(recipe, question, k)

    def _serving(self, index: Artifact) -> Artifact:
        """The newest refresh of `index`; records its passages and the refresh that made it."""
        from tasks.refresh.state import input_of, passages_of

        served = self.chain.head(index)
        made_by = self.chain.made_by(served)
        if made_by is not None:
            self.refreshes.add(made_by)
        vectors = input_of(self.store, served, "embeddings", key="embeddings") if served.stage == "faiss_index" else served
        passages = passages_of(self.store, vectors)
        if all(p.version != passages.version for p in self.passages):
            self.passages.append(passages)
        return served

    def _bm25(self, recipe: Bm25Recipe, question: str, k: int) -> pa.Table:
        from tasks.bm25.search import bm25_search

        index = self._serving(recipe.index.resolve(self.store))
        return bm25_search(index.subdir("index"), [("q", question)], k=k, k1=recipe.k1, b=recipe.b, threads=1,
                           system=recipe.system)

    def _dense(self, recipe: DenseRecipe, question: str, k: int) -> pa.Table:
        from tasks.compute import faiss_index

        settings = recipe.settings
        device = settings.device(recipe.device)  # CPU for onnx and int8
        served = self._serving(recipe.index.resolve(self.store))
        key = (str(recipe.source), str(served.path), device)
        if key not in _LOADED:  # the encoder, the index and its id -> pid map, kept for the next question
            from tasks.refresh.faiss_update import IDS_TABLE, pids_by_id

            inputs = {recipe.model.key: recipe.model.resolve(self.store)} if recipe.model is not None else {}
            model = settings.for_inference(recipe.origin.load(inputs), device)
            index = faiss_index.load_index(served.subdir("index"))
            if IDS_TABLE in served.tables:  # a refreshed index: ids mapped to pids, not rows
                pids, by_id = pids_by_id(served.read_table(IDS_TABLE)), True
            else:
                embeddings = recipe.embeddings.resolve(self.store)
                pids, by_id = embeddings.read_table(columns=["pid"]).column("pid"), False
            while len(_LOADED) >= _KEEP_LOADED:
                _LOADED.pop(next(iter(_LOADED)))
            _LOADED[key] = (model, index, pids, by_id)
        model, index, pids, by_id = _LOADED[key]
        vectors = settings.encode(model, [question], "query", device)
        return faiss_index.search(index, vectors.astype("float32"), k, pids, ["q"], system=recipe.system, by_id=by_id)

    def _fused(self, recipe: FusionRecipe, question: str, k: int) -> pa.Table:
        from tasks.dense.hybrid import fuse_linear, reciprocal_rank_fusion

        # Each part at the depth the pipeline fused it at, so the fused top k is the pipeline's.
        parts = [recipe_of(part.resolve(self.store), self.planned) for part in recipe.parts]
        ranked = [self.rank(part, question, part.depth if part.depth is not None else recipe.depth) for part in parts]
        if recipe.method == "rrf":
            return reciprocal_rank_fusion(ranked, k_rrf=recipe.rrf_k, k=k, system=recipe.system)
        return fuse_linear(ranked, list(recipe.weights), k=k, system=recipe.system)
