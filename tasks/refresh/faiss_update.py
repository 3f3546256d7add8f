"""Updating a FAISS index in place of rebuilding it: vectors of deleted and changed passages are
removed by id (`remove_ids`), those of new and changed passages added with ids (`add_with_ids`).

Ids are int64s mapped from passage ids and recorded beside the index (the `faiss_ids` table: id,
pid); an index built by the pipeline has id i for row i of its embeddings. A passage keeps its id
for as long as it exists; a new passage gets the next unused one. Where the index kind cannot do
this itself it is wrapped or rebuilt once:
- flat: wrapped in an `IndexIDMap2` (exact vectors copied over), then updated;
- IVF (ivfpq): stores ids itself and is updated as it is (its trained quantizer kept);
- HNSW: FAISS cannot remove from a graph, so it is rebuilt from the current vectors, ids kept.
"""
from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.compute import faiss_index
from tasks.compute.embeddings import vectors_from_table

IDS_TABLE = "faiss_ids"
IDS_SCHEMA = pa.schema([("id", pa.int64()), ("pid", pa.string())])


def _with_rows(table: pa.Table, name: str) -> pa.Table:
    return table.select(["pid"]).append_column(name, pa.array(np.arange(table.num_rows, dtype=np.int64)))


def vector_changes(previous: pa.Table, current: pa.Table) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(pids to remove, pids to add, pids kept): a pid is kept when both tables hold it with the
    same vector bytes; removed when only `previous` holds it or its vector changed; added when
    only `current` holds it or its vector changed."""
    _, old_vectors = vectors_from_table(previous)
    _, new_vectors = vectors_from_table(current)
    joined = _with_rows(previous, "old_row").join(_with_rows(current, "new_row"), keys="pid", join_type="full outer")
    old_row, new_row = joined.column("old_row"), joined.column("new_row")
    both = pc.and_(pc.is_valid(old_row), pc.is_valid(new_row))
    paired = joined.filter(both)
    a = old_vectors[paired.column("old_row").to_numpy()]
    b = new_vectors[paired.column("new_row").to_numpy()]
    same = (a.view(np.uint8) == b.view(np.uint8)).all(axis=1) if len(a) else np.zeros(0, bool)
    pids = paired.column("pid").combine_chunks()
    kept, changed = pids.filter(pa.array(same)), pids.filter(pa.array(~same))
    only_old = joined.filter(pc.invert(pc.is_valid(new_row))).column("pid").combine_chunks()
    only_new = joined.filter(pc.invert(pc.is_valid(old_row))).column("pid").combine_chunks()
    return pa.concat_arrays([only_old, changed]), pa.concat_arrays([changed, only_new]), kept


def previous_ids(ids: pa.Table | None, embeddings: pa.Table) -> pa.Table:
    """The id map of an index: its recorded `faiss_ids` table, else row i of the embeddings it was
    built from has id i."""
    if ids is not None:
        return ids.select(IDS_SCHEMA.names).cast(IDS_SCHEMA)
    return pa.table({"id": pa.array(np.arange(embeddings.num_rows, dtype=np.int64)),
                     "pid": embeddings.column("pid").combine_chunks().cast(pa.string())}, schema=IDS_SCHEMA)


def _id_mapped(index: faiss.Index) -> faiss.Index:
    """An index that supports remove_ids and add_with_ids with our ids."""
    idx = faiss.downcast_index(index)
    if isinstance(idx, (faiss.IndexIDMap, faiss.IndexIVF)):
        return idx
    if isinstance(idx, faiss.IndexFlat):
        # A flat index renumbers its rows on removal: wrap it so ids stay put. Its ids are its rows.
        wrapped = faiss.IndexIDMap2(faiss.IndexFlat(idx.d, idx.metric_type))
        if idx.ntotal:
            wrapped.add_with_ids(idx.reconstruct_n(0, idx.ntotal), np.arange(idx.ntotal, dtype=np.int64))
        return wrapped
    raise ValueError(f"cannot update a {type(idx).__name__} in place")


def _rebuilt_hnsw(idx: faiss.IndexHNSW, vectors: np.ndarray, ids: np.ndarray) -> faiss.Index:
    fresh = faiss.IndexHNSWFlat(idx.d, int(idx.hnsw.nb_neighbors(1)), idx.metric_type)
    fresh.hnsw.efConstruction = idx.hnsw.efConstruction
    fresh.hnsw.efSearch = idx.hnsw.efSearch
    wrapped = faiss.IndexIDMap2(fresh)
    if len(ids):
        wrapped.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), ids)
    return wrapped


def update_index(index: faiss.Index, ids: pa.Table, previous: pa.Table, current: pa.Table) -> tuple[faiss.Index, pa.Table, dict]:
    """Apply the change from the `previous` embeddings (whose vectors `index` holds under `ids`)
    to the `current` ones. Returns (index, its new id map, stats)."""
    remove, add, kept = vector_changes(previous, current)
    id_of = dict(zip(ids.column("pid").to_pylist(), ids.column("id").to_pylist()))
    missing = [pid for pid in pc.unique(pa.concat_arrays([remove, kept])).to_pylist() if pid not in id_of]
    if missing:
        raise ValueError(f"the index's id map lacks {len(missing):,} passages of its embeddings, e.g. {missing[:3]}")
    next_id = int(pc.max(ids.column("id")).as_py() or 0) + 1 if ids.num_rows else 0
    remove_ids = np.array([id_of[pid] for pid in remove.to_pylist()], dtype=np.int64)
    add_pids = add.to_pylist()
    add_ids = []
    for pid in add_pids:  # a changed passage keeps its id; a new one takes the next
        if pid not in id_of:
            id_of[pid], next_id = next_id, next_id + 1
        add_ids.append(id_of[pid])
    add_ids = np.array(add_ids, dtype=np.int64)
    current_pids, current_vectors = vectors_from_table(current)
    row_of = {pid: row for row, pid in enumerate(current_pids)}
    add_vectors = np.ascontiguousarray(current_vectors[[row_of[pid] for pid in add_pids]], dtype=np.float32) \
        if add_pids else np.zeros((0, current_vectors.shape[1]), np.float32)

    idx = faiss.downcast_index(index)
    before = int(idx.ntotal)
    deleted = set(remove.to_pylist()) - set(add_pids)
    for pid in deleted:
        del id_of[pid]
    if isinstance(idx, faiss.IndexHNSW) or (isinstance(idx, faiss.IndexIDMap)
                                           and isinstance(faiss.downcast_index(idx.index), faiss.IndexHNSW)):
        hnsw = idx if isinstance(idx, faiss.IndexHNSW) else faiss.downcast_index(idx.index)
        order = np.array([id_of[pid] for pid in current_pids], dtype=np.int64)
        updated, how = _rebuilt_hnsw(hnsw, current_vectors, order), "rebuilt (HNSW cannot remove)"
    else:
        updated, how = _id_mapped(idx), "updated in place"
        removed = updated.remove_ids(remove_ids) if len(remove_ids) else 0
        if removed != len(remove_ids):
            raise RuntimeError(f"FAISS removed {removed} of {len(remove_ids)} vectors: the id map and the index disagree")
        if len(add_ids):
            updated.add_with_ids(add_vectors, add_ids)
    if updated.ntotal != len(current_pids):
        raise RuntimeError(f"the updated index holds {updated.ntotal:,} vectors for {len(current_pids):,} passages")
    new_ids = pa.table({"id": pa.array(list(id_of.values()), pa.int64()), "pid": pa.array(list(id_of), pa.string())},
                       schema=IDS_SCHEMA).sort_by("id")
    stats = {"before": before, "after": int(updated.ntotal), "removed": len(remove_ids), "added": len(add_ids),
             "kept": len(kept), "next_id": next_id, "how": how}
    return updated, new_ids, stats


def update_index_folder(previous_dir: Path, recorded_ids: pa.Table | None, previous: pa.Table, current: pa.Table,
                        out_dir: Path) -> tuple[pa.Table, dict]:
    """`update_index` from a saved index folder into `out_dir`; returns (id map, stats)."""
    index = faiss_index.load_index(previous_dir)
    updated, new_ids, stats = update_index(index, previous_ids(recorded_ids, previous), previous, current)
    faiss_index.save_index(updated, out_dir, extra={"next_id": stats["next_id"]})
    return new_ids, {**stats, **faiss_index.index_params(updated)}


def pids_by_id(ids: pa.Table) -> pa.Array:
    """An array whose item i is the pid of id i (null where no passage has that id): what
    `faiss_index.search` takes as `pids` for an id-mapped index."""
    if ids.num_rows == 0:
        return pa.array([], pa.string())
    id_col = ids.column("id").to_numpy()
    size = int(id_col.max()) + 1
    pids = np.full(size, None, dtype=object)
    pids[id_col] = np.array(ids.column("pid").to_pylist(), dtype=object)
    return pa.array(pids, pa.string())
