import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks.compute.batch_encode import encode_texts, iter_shards
from tasks.compute.embeddings import embeddings_table, vectors_from_table

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "paris", "france", "capital", "is", "of",
         "river", "runs", "through", "city", "big", "small", "red", "blue"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    d = tmp_path_factory.mktemp("tok")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = BertTokenizerFast.from_pretrained(str(d))
    assert tok.convert_tokens_to_ids("cat") == vocab.index("cat")
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=120, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64)).eval()

    def encode_fn(batch):
        return model(**batch).last_hidden_state[:, 0]

    return tok, encode_fn


def _texts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(1, 30))) for _ in range(n)]


def test_order_restored_and_equal_to_one_by_one(tiny):
    tok, fn = tiny
    texts = _texts(23)
    seen = []
    batched = encode_texts(texts, tok, fn, batch_size=4, progress=lambda d, t: seen.append((d, t)))
    single = np.concatenate([encode_texts([t], tok, fn, batch_size=1) for t in texts])
    assert batched.shape == (23, 32) and batched.dtype == np.float32
    np.testing.assert_allclose(batched, single, atol=1e-5, rtol=1e-4)
    assert seen[-1] == (23, 23) and len(seen) == 6
    # lengths really differ, so sorting changed the order
    assert len({len(t.split()) for t in texts}) > 5


def test_pairs_and_batches_are_length_sorted(tiny):
    tok, fn = tiny
    widths = []

    def spy(batch):
        widths.append(batch["input_ids"].shape[1])
        assert batch["attention_mask"].shape == batch["input_ids"].shape
        return fn(batch)

    pairs = [(f"paris {i % 3}", t) for i, t in enumerate(_texts(10, seed=1))]
    out = encode_texts(pairs, tok, spy, batch_size=3, max_length=16)
    assert out.shape == (10, 32)
    assert widths == sorted(widths, reverse=True) and max(widths) <= 16
    one = encode_texts([pairs[4]], tok, fn, max_length=16)
    np.testing.assert_allclose(out[4], one[0], atol=1e-5, rtol=1e-4)


def test_float16_storage_and_bf16_autocast(tiny):
    tok, fn = tiny
    texts = _texts(8)
    f32 = encode_texts(texts, tok, fn)
    f16 = encode_texts(texts, tok, fn, dtype="float16")
    assert f16.dtype == np.float16
    np.testing.assert_allclose(f16.astype(np.float32), f32, atol=1e-2, rtol=1e-2)
    bf = encode_texts(texts, tok, fn, autocast_bf16=True)
    assert bf.dtype == np.float32
    cos = (bf * f32).sum(1) / np.linalg.norm(bf, axis=1) / np.linalg.norm(f32, axis=1)
    assert cos.min() > 0.98
    # really computed under bf16 autocast: not the fp32 result (the same batches in fp32 give
    # identical bits; measured max |bf16 - fp32| 2e-4, the final LayerNorm runs in fp32), yet close
    assert np.abs(bf - f32).max() > 1e-5
    np.testing.assert_allclose(bf, f32, atol=2e-2, rtol=2e-2)
    with pytest.raises(ValueError):
        encode_texts(texts, tok, fn, dtype="int8")


@pytest.mark.parametrize("dt", [np.float32, np.float16])
def test_embeddings_table_round_trip(dt, tmp_path):
    import pyarrow.parquet as pq

    vecs = np.random.default_rng(0).standard_normal((7, 5)).astype(dt)
    pids = [f"p{i}" for i in range(7)]
    t = embeddings_table(pids, vecs)
    assert t.schema.field("vector").type.list_size == 5
    assert t.schema.field("vector").type.value_type == pa.from_numpy_dtype(dt)
    got_pids, got = vectors_from_table(t)
    assert got_pids == pids and got.dtype == dt
    np.testing.assert_array_equal(got, vecs)
    # zero copy: the array views the Arrow buffer
    assert got.base is not None and not got.flags.owndata
    # sliced table and parquet round trip
    p2, g2 = vectors_from_table(t.slice(2, 3))
    assert p2 == pids[2:5]
    np.testing.assert_array_equal(g2, vecs[2:5])
    pq.write_table(t, tmp_path / "e.parquet")
    p3, g3 = vectors_from_table(pq.read_table(tmp_path / "e.parquet"))
    assert p3 == pids
    np.testing.assert_array_equal(g3, vecs)


def test_iter_shards():
    assert list(iter_shards(10, 4)) == [(0, 4), (4, 8), (8, 10)]
    assert list(iter_shards(0, 4)) == []
    with pytest.raises(ValueError):
        list(iter_shards(3, 0))


def test_encode_stage_helper_quantises_on_request_and_refuses_cuda(checkpoint):
    from models import BiEncoder
    from tasks.compute.bi_encoder import for_inference
    from tasks.compute.encode import EncodeConfig, EncodeSettings

    model = BiEncoder.from_pretrained(str(checkpoint), pooling="mean", normalize=True)
    texts = [("paris", "paris is the capital city"), ("seine", "the river seine flow through paris")]

    def encode(**enc):
        settings = EncodeSettings.of(EncodeConfig(batch_size=1, device="cpu", **enc))
        return settings.encode(for_inference(model, "cpu", settings.int8), texts, "passage", "cpu")

    fp32, int8 = encode(), encode(int8=True)
    assert not np.array_equal(fp32, int8) and (fp32 * int8).sum(1).min() > 0.99
    assert np.array_equal(encode(), fp32)  # the caller's model is left fp32
    with pytest.raises(ValueError, match="int8 quantises for the CPU"):
        for_inference(model, "cuda:0", int8=True)


def test_encode_stage_writes_shards_that_match_one_pass(tmp_path, checkpoint):
    from flows.registry import plan_for
    from storage import ArtifactStore, write_table
    from tasks.config import DenseConfig, DenseSystemConfig, EncodeConfig, PipelineConfig

    words = "the capital of france is paris and the river seine flow through the city".split()
    passages = pa.table({"pid": [f"p{i}" for i in range(11)], "title": [words[i] for i in range(11)],
                         "text": [" ".join(words[i:] + words[:i]) for i in range(11)]})
    store = ArtifactStore(tmp_path / "root")
    chunk = store.materialize("passages", "1", {}, {}, lambda d: {"stats": {"rows": write_table(d, passages)}})
    system = DenseSystemConfig(name="tiny", model={"base": str(checkpoint), "pooling": "mean"})

    def build(shard_size, name):
        cfg = PipelineConfig(dense=DenseConfig(systems=[system], encode=EncodeConfig(
            batch_size=4, device="cpu", shard_size=shard_size)))
        out = tmp_path / name
        stage = plan_for(cfg)["encode:tiny"]
        assert stage.resumable  # finished shards are kept in a work folder across a killed build
        work = tmp_path / f"{name}-work"
        work.mkdir()
        stats = stage.build(stage.params, {"chunk": chunk}, out, work)["stats"]
        assert stats["shards"] == -(-11 // shard_size)
        return stats, sorted(out.rglob("*.parquet"))

    one_stats, one_files = build(100, "one")
    sharded_stats, sharded_files = build(3, "sharded")
    assert one_stats["passages"] == sharded_stats["passages"] == 11
    # the shards computed with the thread count of the process running the stage, recorded
    from models.threads import resolve_threads

    assert one_stats["intra_op_threads"] == sharded_stats["intra_op_threads"] == resolve_threads()
    assert one_stats["runner"] == "local"
    one = pa.concat_tables(pq.read_table(f) for f in one_files)
    sharded = pa.concat_tables(pq.read_table(f) for f in sharded_files)
    assert sharded.column("pid").to_pylist() == passages.column("pid").to_pylist()
    # Same vectors up to float noise from different padding within a batch.
    _, a = vectors_from_table(one)
    _, b = vectors_from_table(sharded)
    assert np.allclose(a, b, atol=1e-5)
