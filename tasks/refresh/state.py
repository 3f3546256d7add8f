"""Which artifacts are in force after corpus refreshes, and which ones a refresh starts from.

A refresh writes new versions of documents, passages, the BM25 index and the promoted encoder's
embeddings and FAISS index, then a `corpus_refresh` artifact (the change report) whose stats record
`refreshed: {stage: {from, to}}`. That record is the commit point: a version replaces another only
once a report names it, so a refresh that fails halfway changes nothing that searches use.
Following those records from an artifact the pipeline built leads to its newest refresh: its
*head*. Searches (flows/search.py) serve heads; the next refresh starts from them."""
from __future__ import annotations

from dataclasses import dataclass

from storage import Artifact, ArtifactStore
from tasks.engine import Plan

REFRESH_STAGE = "corpus_refresh"
MODEL_STAGE = "dense_model"


class RefreshChain:
    """The successions that corpus_refresh records make, read once from the store."""

    def __init__(self, store: ArtifactStore):
        self.store = store
        self.next: dict[tuple[str, str], tuple[str, str]] = {}  # (stage, from) -> (to, refresh version)
        self.prev: dict[tuple[str, str], str] = {}
        for row in store.list_artifacts(REFRESH_STAGE):  # oldest first: a later record wins
            for stage, change in ((row.get("stats") or {}).get("refreshed") or {}).items():
                if change["from"] != change["to"]:
                    self.next[(stage, change["from"])] = (change["to"], row["version"])
                    self.prev[(stage, change["to"])] = change["from"]

    def head(self, artifact: Artifact) -> Artifact:
        """The newest refresh of `artifact` (itself when none replaced it)."""
        version, seen = artifact.version, {artifact.version}
        while (artifact.stage, version) in self.next:
            version = self.next[(artifact.stage, version)][0]
            if version in seen:  # cannot happen (a version hashes its predecessor); never loop
                break
            seen.add(version)
        if version == artifact.version:
            return artifact
        found = self.store.get(artifact.stage, version)
        if found is None:
            raise RuntimeError(f"{self.store.root}: {artifact.stage} {version}, a refresh of {artifact.version}, "
                               "is missing (garbage-collected?)")
        return found

    def made_by(self, artifact: Artifact) -> str | None:
        """The corpus_refresh version that wrote `artifact`, if a refresh did."""
        for (stage, _), (to, refresh) in self.next.items():
            if stage == artifact.stage and to == artifact.version:
                return refresh
        return None

    def root(self, stage: str, version: str) -> str:
        """The version the pipeline built, before any refresh."""
        seen = {version}
        while (stage, version) in self.prev and self.prev[(stage, version)] not in seen:
            version = self.prev[(stage, version)]
            seen.add(version)
        return version


def input_of(store: ArtifactStore, artifact: Artifact, stage: str, key: str | None = None) -> Artifact:
    """The input of `artifact` under `key` when it has one, else its only input of `stage`."""
    inputs = artifact.manifest.get("inputs", {})
    if key is not None and key in inputs:
        record = inputs[key]
    else:
        records = [rec for rec in inputs.values() if rec.get("stage") == stage]
        if len(records) != 1:
            raise RuntimeError(f"{artifact.path}: expected one {stage} input, found {len(records)}")
        record = records[0]
    found = store.get(record["stage"], record["version"])
    if found is None:
        raise RuntimeError(f"{artifact.path}: its input {record['stage']} {record['version']} is not in "
                           f"{store.root} (garbage-collected?)")
    return found


def passages_of(store: ArtifactStore, index: Artifact) -> Artifact:
    """The passages an index (bm25_index, embeddings) or passages' successor was made from."""
    return input_of(store, index, "passages", key="passages")


def documents_of(store: ArtifactStore, passages: Artifact) -> Artifact:
    return input_of(store, passages, "documents", key="documents")


@dataclass(frozen=True)
class Corpus:
    documents: Artifact
    passages: Artifact
    bm25_index: Artifact


@dataclass(frozen=True)
class DenseIndex:
    model: Artifact        # the promoted dense_model
    runs: Artifact         # the dense_runs artifact recording how its passages were encoded
    embeddings: Artifact   # heads
    faiss_index: Artifact

    @property
    def system(self) -> str:
        return (self.runs.manifest.get("variant") or {}).get("system", self.runs.stage)


def corpus_of(store: ArtifactStore, plan: Plan, chain: RefreshChain) -> Corpus:
    """The heads of a config's documents, passages and BM25 index: the versions its plan builds
    (else the latest built, as single-stage reruns take them), followed through refreshes."""
    found = {}
    for name in ("ingest_documents", "chunk", "bm25_index"):
        stage = plan[name]
        artifact = store.get(stage.artifact, plan.planned_version(name)) or store.latest(stage.artifact)
        if artifact is None:
            raise RuntimeError(f"{store.root}: no {stage.artifact} artifact to refresh: run the pipeline first "
                               "(`pforge run CONFIG`)")
        found[name] = chain.head(artifact)
    corpus = Corpus(found["ingest_documents"], found["chunk"], found["bm25_index"])
    made_from = documents_of(store, corpus.passages)
    if made_from.version != corpus.documents.version:
        raise RuntimeError(f"{store.root}: passages {corpus.passages.version} were made from documents "
                           f"{made_from.version}, not {corpus.documents.version}: run the pipeline on this config "
                           "(`pforge run CONFIG`) before refreshing it")
    return corpus


def promoted_model(store: ArtifactStore) -> Artifact:
    promotions = [p for p in store.catalog.promotions() if p["stage"] == MODEL_STAGE]
    if not promotions:
        raise RuntimeError(f"{store.root}: no encoder has been promoted, so none can re-encode the changed "
                           f"passages: `pforge promote VERSION` first, or set refresh.dense: false to refresh "
                           "documents, passages and BM25 only")
    version = promotions[-1]["version"]
    model = store.get(MODEL_STAGE, version)
    if model is None:
        raise RuntimeError(f"{store.root}: the promoted {MODEL_STAGE} {version} is not in the store (garbage-collected?)")
    return model


def promoted_index(store: ArtifactStore, chain: RefreshChain, passages: Artifact) -> DenseIndex:
    """The promoted encoder's embeddings and FAISS index (heads) over the corpus of `passages`."""
    model = promoted_model(store)
    corpus_root = chain.root("passages", passages.version)
    candidates = []
    for row in store.list_artifacts("dense_runs"):
        if not any(rec.get("stage") == MODEL_STAGE and rec["version"] == model.version
                   for rec in (row.get("inputs") or {}).values()):
            continue
        runs = store.get("dense_runs", row["version"])
        embeddings = chain.head(input_of(store, runs, "embeddings"))
        faiss_index = chain.head(input_of(store, runs, "faiss_index"))
        if chain.root("passages", passages_of(store, embeddings).version) == corpus_root:
            candidates.append(DenseIndex(model, runs, embeddings, faiss_index))
    if not candidates:
        raise RuntimeError(f"{store.root}: the promoted {MODEL_STAGE} {model.version} has no FAISS index over these "
                           f"passages ({passages.version}): run a config whose dense system uses it (its own train "
                           f"stage, or init_from: {MODEL_STAGE}:{model.version}) on this corpus first")
    return max(candidates, key=lambda d: d.runs.manifest["created_at"])
