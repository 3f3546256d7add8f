import gc
import weakref

import numpy as np
import pyarrow.parquet as pq
import pytest

from tasks.compute.embeddings import embeddings_table
from tasks.negatives.blocked_topk import TopK, blocked_top_k, iter_vector_shards


def _int_data(n_q, n_p, dim=6, seed=0):
    # Small integers: every dot product is exact in float32, and ties are frequent.
    rng = np.random.default_rng(seed)
    return (rng.integers(-2, 3, size=(n_q, dim)).astype(np.float32),
            rng.integers(-2, 3, size=(n_p, dim)).astype(np.float32))


def _pids(n):
    return [f"p{i}" for i in range(n)]


def _shards(pids, vectors, rows):
    for start in range(0, len(pids), rows):
        yield pids[start:start + rows], vectors[start:start + rows]


def _brute(queries, passages, pids, k):
    scores = queries.astype(np.float64) @ passages.astype(np.float64).T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # stable: ties keep corpus order
    return [[pids[j] for j in row] for row in order], np.take_along_axis(scores, order, axis=1)


@pytest.mark.parametrize("rows", [1, 7, 50, 64, 1000])
@pytest.mark.parametrize("query_block", [1, 5, 64])
def test_equals_brute_force_with_ties(rows, query_block):
    q, p = _int_data(23, 97)
    pids = _pids(97)
    want_pids, want_scores = _brute(q, p, pids, 10)
    got = blocked_top_k(q, _shards(pids, p, rows), k=10, query_block=query_block)
    assert isinstance(got, TopK) and got.scores.shape == (23, 10) and got.scores.dtype == np.float32
    assert got.pids == want_pids
    np.testing.assert_array_equal(got.scores, want_scores)


@pytest.mark.parametrize("rows", [13, 128])
def test_equals_brute_force_on_float_vectors(rows):
    rng = np.random.default_rng(3)
    q, p = rng.normal(size=(40, 16)).astype(np.float32), rng.normal(size=(300, 16)).astype(np.float32)
    pids = _pids(300)
    want_pids, want_scores = _brute(q, p, pids, 25)
    got = blocked_top_k(q, _shards(pids, p, rows), k=25, query_block=16)
    # a float32 dot product of n = 16 terms, summed in any order by any kernel: |error| <= n * eps32 * sum|q_i p_i|
    bound = 16 * np.finfo(np.float32).eps * (np.abs(q).astype(np.float64) @ np.abs(p).astype(np.float64).T)
    exact = q.astype(np.float64) @ p.astype(np.float64).T
    top = np.argsort(-exact, axis=1, kind="stable")[:, :26]
    gaps = -np.diff(np.take_along_axis(exact, top, axis=1), axis=1)
    margins = np.take_along_axis(bound, top[:, :-1], axis=1) + np.take_along_axis(bound, top[:, 1:], axis=1)
    assert (gaps > margins).all()  # no two of the top 26 within rounding of each other: every CPU ranks alike
    assert got.pids == want_pids
    assert (np.abs(got.scores - want_scores) <= np.take_along_axis(bound, top[:, :25], axis=1)).all()


def test_ties_resolved_by_corpus_order():
    q = np.ones((2, 3), np.float32)
    p = np.zeros((10, 3), np.float32)
    p[[2, 7]] = 1.0                         # two best, tied
    pids = [f"d{9 - i}" for i in range(10)]  # pids sort the other way: order must come from position
    got = blocked_top_k(q, _shards(pids, p, 3), k=5)
    assert got.pids == [["d7", "d2", "d9", "d8", "d6"]] * 2
    np.testing.assert_array_equal(got.scores, [[3, 3, 0, 0, 0]] * 2)


def test_tie_straddling_the_cut_inside_one_shard():
    # 50 equal scores in one shard, k = 5: topk alone may pick any five; the first five must win.
    q = np.ones((3, 2), np.float32)
    p = np.ones((50, 2), np.float32)
    got = blocked_top_k(q, _shards(_pids(50), p, 50), k=5)
    assert got.pids == [["p0", "p1", "p2", "p3", "p4"]] * 3


def test_k_larger_than_corpus_ranks_everything():
    q, p = _int_data(4, 9)
    want_pids, want_scores = _brute(q, p, _pids(9), 9)
    got = blocked_top_k(q, _shards(_pids(9), p, 4), k=100)
    assert got.scores.shape == (4, 9)
    assert got.pids == want_pids
    np.testing.assert_array_equal(got.scores, want_scores)


def test_empty_shards_are_skipped_and_no_queries_is_fine():
    q, p = _int_data(3, 8)
    shards = [([], np.zeros((0, 6), np.float32)), (_pids(8)[:5], p[:5]),
              ([], np.zeros((0, 6), np.float32)), (_pids(8)[5:], p[5:])]
    assert blocked_top_k(q, iter(shards), k=3).pids == _brute(q, p, _pids(8), 3)[0]
    none = blocked_top_k(np.zeros((0, 6), np.float32), iter(shards), k=3)
    assert none.pids == [] and none.scores.shape == (0, 3)


def test_bad_inputs_raise():
    q, p = _int_data(3, 8)
    with pytest.raises(ValueError, match="no passages"):
        blocked_top_k(q, iter([]), k=3)
    with pytest.raises(ValueError, match="no passages"):
        blocked_top_k(q, iter([([], np.zeros((0, 6), np.float32))]), k=3)
    with pytest.raises(ValueError, match=r"\[n, 6\]"):
        blocked_top_k(q, _shards(_pids(8), p[:, :5], 4), k=3)
    with pytest.raises(ValueError, match="2-D"):
        blocked_top_k(q[0], _shards(_pids(8), p, 4), k=3)
    with pytest.raises(ValueError, match=r"\[n, 6\]"):
        blocked_top_k(q, iter([(_pids(6), p[:, 0])]), k=3)
    with pytest.raises(ValueError, match="k must be"):
        blocked_top_k(q, _shards(_pids(8), p, 4), k=0)
    with pytest.raises(ValueError, match="query_block"):
        blocked_top_k(q, _shards(_pids(8), p, 4), k=3, query_block=0)
    with pytest.raises(ValueError, match="3 pids for 8 vectors"):
        blocked_top_k(q, iter([(_pids(3), p)]), k=3)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_iter_vector_shards_round_trips_parquet(tmp_path, dtype):
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(53, 8)).astype(dtype)
    pids = _pids(53)
    files = []
    for i, (a, b) in enumerate([(0, 30), (30, 53)]):  # two files, small row groups
        files.append(tmp_path / f"part-{i}.parquet")
        pq.write_table(embeddings_table(pids[a:b], vectors[a:b]), files[-1], row_group_size=11)
    shards = list(iter_vector_shards(files, rows=7))
    assert all(0 < len(ids) <= 7 and v.shape == (len(ids), 8) and v.dtype == np.float32 for ids, v in shards)
    assert [p for ids, _ in shards for p in ids] == pids
    np.testing.assert_array_equal(np.concatenate([v for _, v in shards]), vectors.astype(np.float32))
    q = rng.normal(size=(5, 8)).astype(np.float32)
    got = blocked_top_k(q, iter_vector_shards(files, rows=7), k=6)
    assert got.pids == _brute(q, vectors.astype(np.float32), pids, 6)[0]
    with pytest.raises(ValueError, match="rows"):
        next(iter_vector_shards(files, rows=0))


def test_streams_shards_without_holding_them():
    """Shards are made on demand and watched: when shard i is requested, shard i-2 must be gone
    (a miner that collects the shards first, e.g. list(shards), fails)."""
    alive = []

    def shards():
        rng = np.random.default_rng(0)
        for i in range(8):
            gc.collect()
            if i >= 2:
                assert alive[i - 2]() is None, f"shard {i - 2} is still referenced at shard {i}"
            vectors = rng.normal(size=(100, 8)).astype(np.float32)
            alive.append(weakref.ref(vectors))
            yield [f"p{i}-{j}" for j in range(100)], vectors

    got = blocked_top_k(np.ones((5, 8), np.float32), shards(), k=10)
    assert len(alive) == 8 and got.scores.shape == (5, 10)


_PEAK_SCRIPT = """
import json, resource, sys
import numpy as np
import torch
from tasks.negatives.blocked_topk import blocked_top_k
torch.set_num_threads(1)  # tiny tiles: on a shared machine, thread hand-offs would dominate the time
n_q, n_p, dim, rows = 512, 100_000, 8, 2_000
def shards():
    rng = np.random.default_rng(0)
    for start in range(0, n_p, rows):
        yield [str(j) for j in range(start, start + rows)], rng.normal(size=(rows, dim)).astype(np.float32)
q = np.random.default_rng(1).normal(size=(n_q, dim)).astype(np.float32)
blocked_top_k(q[:2], shards(), k=10, query_block=128)  # warm up torch's kernels and allocator
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
top = blocked_top_k(q, shards(), k=10, query_block=128)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kb": after - before, "shape": list(top.scores.shape)}))
"""


def test_peak_memory_is_a_tile_not_the_score_matrix():
    """Peak RSS growth (fresh process, any library) while mining 512 questions over 100,000
    passages: a questions x passages float32 matrix is 205 MB; the miner needs a few MB."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT], cwd=root, capture_output=True, text=True,
                         check=True, timeout=120)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    full_matrix_kb = 512 * 100_000 * 4 // 1024
    assert result["shape"] == [512, 10]
    assert result["growth_kb"] < full_matrix_kb / 4, (result, full_matrix_kb)
