"""Using what was built: search one question against a system's artifacts, and promote the
trained encoder that serves searches (`pforge search`, `pforge promote`).

A system is found through its runs artifact (`bm25_runs`, `dense_runs` or `hybrid_runs`): that
artifact's manifest records exactly how its runs were made (the BM25 index and its k1/b; the
encoder, its encode settings and the FAISS index; the fused runs and their weights), so a search
here ranks a new question the way the pipeline ranked its own questions. For a question of the
question set, the results are the pipeline's run for it (the tests hold them to that). After a
corpus refresh (`pforge refresh`), the same recipe runs over the refreshed indexes: the newest
BM25 and FAISS index that refreshes made from the ones the runs record (tasks/refresh/state.py).

    >>> from flows.search import search
    >>> result = search("Which team won Super Bowl 50?", system="bm25", k=5)
    >>> [(h.rank, h.title, round(h.score, 2)) for h in result.hits]
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pyarrow as pa

from storage import Artifact, ArtifactStore, resolve_root
from tasks.config import PipelineConfig, load_config

logger = logging.getLogger("passage_forge")

RUNS_STAGES = ("bm25_runs", "dense_runs", "hybrid_runs")
MODEL_STAGE = "dense_model"  # what `pforge promote` promotes


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
    planned = _planned(cfg)
    if promoted:
        runs = _promoted_runs(store, planned)
    elif system is None and latest_promotion(store) is not None:
        try:
            runs = _promoted_runs(store, planned)
        except RuntimeError as exc:  # promoted, but nothing built with it yet: say so, serve BM25
            logger.warning("%s; searching with BM25", exc)
            runs = _system_runs(store, "bm25", cfg, planned)
    else:
        runs = _system_runs(store, system or "bm25", cfg, planned)
    searcher = _Searcher(store, planned)
    table = searcher.run(runs, question, k)
    hits = _hits(store, searcher.passages or [_passages_of(store, runs)], table)
    return SearchResult(question=question, system=_system_name(runs), runs=runs, hits=hits, encoder=_encoder_of(runs),
                        refresh=max(searcher.refreshes, default=None, key=_refresh_order(store)))


# ------------------------------------------------------------------------------- promotion
def promote(version: str, *, root: str | Path | None = None, note: str | None = None,
            store: ArtifactStore | None = None) -> dict:
    """Record a trained encoder as the one that serves searches and corpus refreshes
    (`pforge promote VERSION`).

    Args:
        version: a dense_model version, a unique prefix of one, or `dense_model:VERSION`.
        root: the artifact root (default: `$PFORGE_HOME`, else `./artifacts`); it must exist.
        note: why, kept with the promotion.
        store: an open store, instead of `root`.

    Returns:
        The promotion record, with seq, stage, version, promoted_at, note and the system that
        trained the encoder.

    Raises:
        ValueError: no dense_model version matches, or several do.
        RuntimeError: the artifact has no `model/` folder to serve.
        ReadOnlyStoreError: the root is read-only.
    """
    store = store or ArtifactStore(resolve_root(str(root) if root is not None else None), create=False)
    store.require_writable()
    artifact = resolve_model(store, version)
    if not (artifact.path / "model").is_dir():
        raise RuntimeError(f"{artifact.path}: {MODEL_STAGE} {artifact.version} has no model/ folder to serve")
    record = store.catalog.record_promotion(MODEL_STAGE, artifact.version, note)
    store.reconcile(force=True)
    return {**record, "system": artifact.manifest.get("parameters", {}).get("system")}


def promotions(store: ArtifactStore) -> list[dict]:
    """The catalog's promotions, oldest first (`pforge promote` without a version): dicts of
    seq, stage, version, promoted_at and note. The last one is in force."""
    table = store.sql("SELECT seq, stage, version, promoted_at, note FROM promotions ORDER BY seq")
    return table.to_pylist()


def latest_promotion(store: ArtifactStore, stage: str = MODEL_STAGE) -> str | None:
    """The version promoted last for `stage`, or None when nothing was promoted."""
    rows = store.sql("SELECT version FROM promotions WHERE stage = $1 ORDER BY seq DESC LIMIT 1", [stage])
    return rows.column(0)[0].as_py() if rows.num_rows else None


def resolve_model(store: ArtifactStore, version: str) -> Artifact:
    stage, _, wanted = version.rpartition(":")
    if stage and stage != MODEL_STAGE:
        raise ValueError(f"promote: {version!r} is not a {MODEL_STAGE} version (only trained encoders are promoted)")
    wanted = wanted.strip()
    if not wanted:
        raise ValueError("promote: no version given")
    # A version is a hex hash of this store's dense_model: a path (another store's folder, say) or a
    # name matches nothing, so it cannot reach the record.
    plain = re.fullmatch(r"[0-9a-f]+", wanted) is not None
    exact = store.get(MODEL_STAGE, wanted) if plain else None
    if exact is not None:
        return exact
    matches = sorted({row["version"] for row in store.list_artifacts(MODEL_STAGE)
                      if plain and row["version"].startswith(wanted)})
    if len(matches) == 1:
        return store.get(MODEL_STAGE, matches[0])
    if matches:
        raise ValueError(f"promote: {wanted!r} matches several {MODEL_STAGE} versions: {', '.join(matches)}")
    known = [row["version"] for row in store.list_artifacts(MODEL_STAGE)]
    raise ValueError(f"{store.root}: no {MODEL_STAGE} version {wanted!r}"
                     + (f"; known: {', '.join(known)}" if known else " (no trained encoder in this store)"))


# -------------------------------------------------------------------------- finding systems
def _planned(cfg: PipelineConfig | None) -> dict[tuple[str, str], object]:
    """(artifact stage, version) -> the config's Stage that builds it (its full parameters)."""
    if cfg is None:
        return {}
    from flows.registry import plan_for

    plan = plan_for(cfg)
    return {(stage.artifact, plan.planned_version(stage.name)): stage for stage in plan}


def _system_runs(store: ArtifactStore, system: str, cfg: PipelineConfig | None, planned: Mapping) -> Artifact:
    if cfg is not None:
        return _configured_runs(store, system, cfg, planned)
    candidates = [a for a in (store.latest(stage, {"system": system}) for stage in RUNS_STAGES) if a is not None]
    if not candidates and system.startswith("search:"):
        return _system_runs(store, system.split(":", 1)[1], None, planned)
    if not candidates and system in ("bm25_search", "bm25_runs"):
        return _system_runs(store, "bm25", None, planned)
    if not candidates and system == "hybrid":  # the DPR hybrid of whichever dense system
        candidates = [a for a in _all_latest(store, "hybrid_runs") if _system_name(a).startswith("hybrid(")]
    if not candidates and system.startswith("fusion:"):
        return _system_runs(store, system.split(":", 1)[1], None, planned)
    if not candidates:
        known = sorted({_system_name(a) for stage in RUNS_STAGES for a in _all_latest(store, stage)})
        raise ValueError(f"{store.root}: no system {system!r} has runs" + (f"; systems: {', '.join(known)}" if known
                                                                           else ": run a pipeline first"))
    return max(candidates, key=lambda a: a.manifest["created_at"])


def _configured_runs(store: ArtifactStore, system: str, cfg: PipelineConfig, planned: Mapping) -> Artifact:
    by_system = {stage.variant["system"]: (version, stage) for (_, version), stage in planned.items()
                 if stage.produces_runs and "system" in stage.variant}
    by_stage = {stage.name: (version, stage) for (_, version), stage in planned.items() if stage.produces_runs}
    found = by_system.get(system) or by_stage.get(system) or by_stage.get({"bm25": "bm25_search"}.get(system, ""))
    if found is None:
        raise ValueError(f"config {cfg.name!r}: no system {system!r}; systems: {', '.join(sorted(by_system))}")
    version, stage = found
    artifact = store.get(stage.artifact, version)
    if artifact is None:
        raise RuntimeError(f"{store.root}: config {cfg.name!r} has not built {stage.name} ({stage.artifact} {version}): "
                           "run `pforge run` on it first")
    return artifact


def _promoted_runs(store: ArtifactStore, planned: Mapping) -> Artifact:
    version = latest_promotion(store)
    if version is None:
        raise ValueError(f"{store.root}: no encoder has been promoted: `pforge promote VERSION` first "
                         f"(versions: `pforge artifacts --stage {MODEL_STAGE}`)")
    uses = [a for a in _all_versions(store, "dense_runs") if _encoder_of(a) == version]
    if not uses:
        raise RuntimeError(f"{store.root}: the promoted {MODEL_STAGE} {version} has no FAISS index and runs yet: "
                           "run a config whose dense system uses it (its own train stage, or init_from: "
                           f"{MODEL_STAGE}:{version})")
    mine = [a for a in uses if (a.stage, a.version) in planned]
    return max(mine or uses, key=lambda a: a.manifest["created_at"])


def _all_versions(store: ArtifactStore, stage: str) -> list[Artifact]:
    rows = store.list_artifacts(stage)
    return [a for a in (store.get(r["stage"], r["version"]) for r in rows) if a is not None]


def _all_latest(store: ArtifactStore, stage: str) -> list[Artifact]:
    latest: dict[str, Artifact] = {}
    for artifact in _all_versions(store, stage):  # oldest first: the newest of each system wins
        latest[_system_name(artifact)] = artifact
    return list(latest.values())


def _system_name(artifact: Artifact) -> str:
    return (artifact.manifest.get("variant") or {}).get("system", artifact.stage)


def _encoder_of(runs: Artifact) -> str | None:
    if runs.stage != "dense_runs":
        return None
    models = [rec["version"] for rec in runs.manifest.get("inputs", {}).values() if rec.get("stage") == MODEL_STAGE]
    return models[0] if models else None


def _input(store: ArtifactStore, artifact: Artifact, key: str) -> Artifact:
    record = artifact.manifest.get("inputs", {}).get(key)
    if record is None:
        raise RuntimeError(f"{artifact.path}: {artifact.stage} {artifact.version} has no input {key!r}")
    found = store.get(record["stage"], record["version"])
    if found is None:
        raise RuntimeError(f"{artifact.path}: its input {record['stage']} {record['version']} is not in {store.root} "
                           "(garbage-collected?): rerun the pipeline that built it")
    return found


def _input_key(artifact: Artifact, stage: str) -> str:
    keys = [key for key, rec in artifact.manifest.get("inputs", {}).items() if rec.get("stage") == stage]
    if len(keys) != 1:
        raise RuntimeError(f"{artifact.path}: expected one {stage} input, found {keys}")
    return keys[0]


# -------------------------------------------------------------------------------- searching
# Loaded dense systems by (runs artifact folder, device): a process asking many questions loads
# each encoder and index once. Artifacts are immutable, so a folder's contents never go stale.
_LOADED: dict[tuple[str, str], tuple] = {}
_KEEP_LOADED = 2

class _Searcher:
    """Ranks one question with the recipe a runs artifact records (a fusion: each of its parts),
    over the newest refresh of the indexes it records. Remembers the passages behind each index
    it searched (for the hits' text) and the refreshes that made them."""

    def __init__(self, store: ArtifactStore, planned: Mapping):
        from tasks.refresh.state import RefreshChain

        self.store = store
        self.planned = planned
        self.chain = RefreshChain(store)
        self.passages: list[Artifact] = []
        self.refreshes: set[str] = set()

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

    def run(self, runs: Artifact, question: str, k: int) -> pa.Table:
        kind = {"bm25_runs": self._bm25, "dense_runs": self._dense, "hybrid_runs": self._fused}.get(runs.stage)
        if kind is None:
            raise ValueError(f"{runs.path}: {runs.stage} is not a runs artifact ({', '.join(RUNS_STAGES)})")
        return kind(runs, question, k)

    def _bm25(self, runs: Artifact, question: str, k: int) -> pa.Table:
        from tasks.bm25.search import bm25_search

        params = runs.manifest["parameters"]
        index = self._serving(_input(self.store, runs, "bm25_index"))
        return bm25_search(index.subdir("index"), [("q", question)], k=k, k1=params["k1"], b=params["b"],
                           threads=1, system=_system_name(runs))

    def _dense(self, runs: Artifact, question: str, k: int) -> pa.Table:
        from tasks.dense import faiss_index
        from tasks.compute.encode import EncodeSettings
        from tasks.compute.origin import Origin

        params = runs.manifest["parameters"]
        stage = self.planned.get((runs.stage, runs.version))
        origin = stage.params.origin if stage is not None else Origin(**params["origin"])
        if origin.init_hash is not None and origin.init_path is None:
            raise RuntimeError(f"{runs.path}: {_system_name(runs)}'s encoder came from a model folder (init_from: PATH) "
                               "that the store does not record: pass --config with the config that ran it")
        settings = EncodeSettings(**params["settings"])
        device = settings.device(stage.params.device if stage is not None else "auto")  # CPU for onnx and int8
        served = self._serving(_input(self.store, runs, _input_key(runs, "faiss_index")))
        key = (str(runs.path), str(served.path), device)
        if key not in _LOADED:  # the encoder, the index and its id -> pid map, kept for the next question
            from tasks.refresh.faiss_update import IDS_TABLE, pids_by_id

            inputs = {}
            if origin.model_input is not None:
                inputs[origin.model_input] = _input(self.store, runs, origin.model_input)
            model = settings.for_inference(origin.load(inputs), device)
            index = faiss_index.load_index(served.subdir("index"))
            if IDS_TABLE in served.tables:  # a refreshed index: ids mapped to pids, not rows
                pids, by_id = pids_by_id(served.read_table(IDS_TABLE)), True
            else:
                embeddings = _input(self.store, runs, _input_key(runs, "embeddings"))
                pids, by_id = embeddings.read_table(columns=["pid"]).column("pid"), False
            while len(_LOADED) >= _KEEP_LOADED:
                _LOADED.pop(next(iter(_LOADED)))
            _LOADED[key] = (model, index, pids, by_id)
        model, index, pids, by_id = _LOADED[key]
        vectors = settings.encode(model, [question], "query", device)
        return faiss_index.search(index, vectors.astype("float32"), k, pids, ["q"], system=_system_name(runs), by_id=by_id)

    def _fused(self, runs: Artifact, question: str, k: int) -> pa.Table:
        from tasks.dense.hybrid import fuse_linear, reciprocal_rank_fusion

        params, stats = runs.manifest["parameters"], runs.manifest.get("stats") or {}
        if "runs" not in params:
            raise ValueError(f"{runs.path}: {_system_name(runs)} is an embedding fusion, which search does not "
                             "serve; search one of its systems")
        # Each part at the depth the pipeline fused it at, so the fused top k is the pipeline's.
        parts = [_input(self.store, runs, name) for name in params["runs"]]
        ranked = [self.run(part, question, int(part.manifest["parameters"].get("k", params["k"]))) for part in parts]
        if params["method"] == "rrf":
            return reciprocal_rank_fusion(ranked, k_rrf=params["rrf_k"], k=k, system=_system_name(runs))
        weights = dict((name, w) for name, w in stats["weights"])
        return fuse_linear(ranked, [weights[name] for name in params["runs"]], k=k, system=_system_name(runs))


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
