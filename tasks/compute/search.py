"""Texts searched in a dense system's FAISS index, shared by the search stage and by whatever
searches texts that have no run of their own (silver's generated queries); and where a search
artifact keeps its question vectors, which miners and embedding fusion read instead of
re-encoding."""
from __future__ import annotations

from storage import Artifact
from tasks.compute.encode import EncodeSettings
from tasks.compute.origin import Origin

#: The table of a search stage's artifact holding its question vectors (qid, vector).
QUERY_VECTORS = "query_vectors"


def search_texts(origin: Origin, settings: EncodeSettings, inputs: dict[str, Artifact], encoded: Artifact,
                 index: Artifact, qids, texts: list[str], k: int, device: str, system: str, log=None):
    """(RUNS, query vectors): `texts` encoded by `origin`'s encoder with `settings`, searched in
    the FAISS `index` artifact whose rows are the `encoded` artifact's passages."""
    from tasks.compute import faiss_index

    pids = encoded.read_table(columns=["pid"]).column("pid")
    model = settings.for_inference(origin.load(inputs), device)
    vectors = settings.encode(model, texts, "query", device, log=log)
    loaded = faiss_index.load_index(index.subdir("index"))
    return faiss_index.search(loaded, vectors.astype("float32"), k, pids, qids, system=system), vectors
