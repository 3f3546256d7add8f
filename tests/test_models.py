"""BiEncoder, pooling and checkpoint resolution on tiny random BERTs (seconds on CPU)."""
import json
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


from models import (  # noqa: E402
    BiEncoder,
    BiEncoderConfig,
    BidirectionalSoftmaxLoss,
    InBatchSoftmaxLoss,
    Pooling,
    WeightedInBatchSoftmaxLoss,
    format_passage,
    format_passages,
    pool,
    resolve_checkpoint,
)
from tests.tiny_models import VOCAB, tiny_bert  # noqa: E402

@pytest.fixture
def batches(tokenizer):
    queries = tokenizer(["what is the capital of france", "where does the seine flow"],
                        padding=True, return_tensors="pt")
    titles, texts = format_passages(["paris", "seine"], ["paris is the capital city",
                                                         "the river seine flow through paris"])
    passages = tokenizer(titles, texts, padding=True, return_tensors="pt")
    return queries, passages


def make(shared=True, **cfg):
    q = tiny_bert(0)
    p = None if shared else tiny_bert(1)
    return BiEncoder(q, p, BiEncoderConfig(shared=shared, **cfg))


# -- pooling -----------------------------------------------------------------------------------

def test_pooling_cls_and_masked_mean():
    hidden = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert torch.equal(pool(hidden, mask, Pooling.CLS), torch.tensor([[1.0, 2.0]]))
    assert torch.equal(pool(hidden, mask, "mean"), torch.tensor([[2.0, 3.0]]))  # pad ignored
    with pytest.raises(ValueError):
        pool(hidden, mask, "max")


# -- towers, projection, normalisation, scale --------------------------------------------------

def test_shared_tower_really_shares_parameters(batches):
    q, _ = batches
    model = make(shared=True, projection_dim=8)
    n_encoder = sum(x.numel() for x in model.query_encoder.parameters())
    n_fc = 32 * 8 + 8
    assert sum(x.numel() for x in model.parameters()) == n_encoder + n_fc
    with torch.no_grad():
        assert torch.equal(model.encode_query(q), model.encode_passage(q))
        before = model.encode_passage(q)
        dense = model.query_encoder.encoder.layer[-1].output.dense.weight
        dense.add_(torch.randn_like(dense))  # perturb the one tower
        assert not torch.allclose(model.encode_passage(q), before)
        assert torch.equal(model.encode_query(q), model.encode_passage(q))


def test_separate_towers_are_separate(batches):
    q, _ = batches
    model = make(shared=False, projection_dim=8)
    assert model.passage_encoder is not model.query_encoder
    ids_q = {id(x) for x in model.query_encoder.parameters()}
    assert not ids_q & {id(x) for x in model.passage_encoder.parameters()}
    assert model.passage_projection is not None
    with torch.no_grad():
        assert not torch.allclose(model.encode_query(q), model.encode_passage(q))


def test_projection_changes_dim(batches):
    q, p = batches
    with torch.no_grad():
        assert make().encode_query(q).shape == (2, 32)
        model = make(projection_dim=8)
        assert model.encode_query(q).shape == (2, 8)
        assert model.encode_passage(p).shape == (2, 8)
        # by hand: the FC layer applied to the [CLS] state, x W^T + b
        fc = model.query_projection
        for batch, emb in ((q, model.encode_query(q)), (p, model.encode_passage(p))):
            cls = model.query_encoder(**batch).last_hidden_state[:, 0]
            assert torch.allclose(emb, cls @ fc.weight.T + fc.bias, atol=1e-6)
    assert model.embedding_dim == 8


def test_separate_towers_encode_with_their_own_encoder_and_projection(batches):
    q, p = batches
    model = make(shared=False, projection_dim=8)
    with torch.no_grad():
        q_cls = model.query_encoder(**q).last_hidden_state[:, 0]
        p_cls = model.passage_encoder(**p).last_hidden_state[:, 0]
        assert torch.allclose(model.encode_query(q), model.query_projection(q_cls), atol=1e-6)
        assert torch.allclose(model.encode_passage(p), model.passage_projection(p_cls), atol=1e-6)


def test_cls_pooling_has_no_pooler_tanh(batches):
    q, _ = batches
    model = make()
    with torch.no_grad():
        out = model.query_encoder(**q)
        assert torch.equal(model.encode_query(q), out.last_hidden_state[:, 0])
        assert not torch.allclose(model.encode_query(q), out.pooler_output)


def test_mean_pooling_differs_from_cls(batches):
    q, _ = batches
    with torch.no_grad():
        assert not torch.allclose(make(pooling="mean").encode_query(q), make().encode_query(q))


def test_mean_pooling_averages_the_unmasked_tokens_by_hand(batches):
    q, p = batches
    model = make(pooling="mean")
    for batch in (q, p):
        mask = batch["attention_mask"]
        assert (mask == 0).any()  # the batch really holds padding the mean must skip
        with torch.no_grad():
            hidden = model.query_encoder(**batch).last_hidden_state
            got = model.encode_query(batch)
        for i in range(hidden.shape[0]):
            n = int(mask[i].sum())
            real = hidden[i][mask[i].bool()]
            assert real.shape[0] == n
            assert torch.allclose(got[i], real.sum(0) / n, atol=1e-6)
            assert not torch.allclose(got[i], hidden[i].mean(0), atol=1e-4) or n == hidden.shape[1]


def test_normalize_gives_unit_norm(batches):
    q, p = batches
    model = make(projection_dim=8, normalize=True)
    raw = make(projection_dim=8)  # the same weights (same seeds), not normalised
    with torch.no_grad():
        for emb in (model.encode_query(q), model.encode_passage(p)):
            assert torch.allclose(emb.norm(dim=-1), torch.ones(2), atol=1e-6)
        for emb, plain in ((model.encode_query(q), raw.encode_query(q)),
                           (model.encode_passage(p), raw.encode_passage(p))):
            assert not torch.allclose(plain.norm(dim=-1), torch.ones(2), atol=1e-2)
            # the unit vector of the projected embedding: x / ||x||
            assert torch.allclose(emb, plain / plain.norm(dim=-1, keepdim=True), atol=1e-6)


def test_scale_multiplies_scores(batches):
    q, p = batches
    base, scaled = make(normalize=True), make(normalize=True, similarity_scale=100.0)
    with torch.no_grad():
        eq, ep = base.encode_query(q), base.encode_passage(p)
        assert torch.allclose(base.score(eq, ep), eq @ ep.T)
        assert torch.allclose(scaled.score(eq, ep), 100.0 * (eq @ ep.T))
        assert torch.allclose(scaled(q, p), 100.0 * base(q, p), atol=1e-4)
    assert InBatchSoftmaxLoss(scaled).scale == 100.0


# -- passage formatting ------------------------------------------------------------------------

def test_format_passage_pair_encoding(tokenizer):
    assert format_passage("paris", "the city") == ("paris", "the city")
    assert format_passage(None, "the city") == ("", "the city")
    titles, texts = format_passages(["paris"], ["the river"])
    ids = tokenizer(titles, texts)["input_ids"][0]
    assert tokenizer.convert_ids_to_tokens(ids) == ["[CLS]", "paris", "[SEP]", "the", "river", "[SEP]"]
    with pytest.raises(ValueError):
        format_passages(["a"], ["b", "c"])


# -- checkpoints and persistence ---------------------------------------------------------------

def test_resolve_checkpoint(checkpoint):
    path = Path(resolve_checkpoint("minilm"))
    assert (path / "config.json").is_file()
    assert resolve_checkpoint(checkpoint) == str(checkpoint)
    assert resolve_checkpoint("some-org/some-model") == "some-org/some-model"


def test_from_pretrained_tiny_bert(checkpoint, batches):
    q, p = batches
    model = BiEncoder.from_pretrained(checkpoint, shared=True, pooling="cls", projection_dim=8,
                                      normalize=True, scale=100.0)
    assert model.tokenizer is not None and model.tokenizer.vocab_size == len(VOCAB)
    assert model.config.base_model == str(checkpoint)
    with torch.no_grad():
        eq, ep = model.encode_query(q), model.encode_passage(p)
        assert eq.shape == (2, 8)
        scores = model.score(eq, ep)
        assert scores.shape == (2, 2)
        assert torch.allclose(eq.norm(dim=-1), torch.ones(2), atol=1e-6)
        # scaled cosine of the [CLS] state through the FC layer, computed by hand
        fc = model.query_projection
        hq = fc(model.query_encoder(**q).last_hidden_state[:, 0])
        hp = fc(model.query_encoder(**p).last_hidden_state[:, 0])
        cosine = (hq @ hp.T) / hq.norm(dim=-1)[:, None] / hp.norm(dim=-1)[None, :]
        assert torch.allclose(scores, 100.0 * cosine, atol=1e-4)
        assert torch.allclose(model(q, p), scores, atol=1e-5)
    two = BiEncoder.from_pretrained(checkpoint, shared=False)
    assert two.passage_encoder is not two.query_encoder
    # both towers start from the same checkpoint
    with torch.no_grad():
        assert torch.allclose(two.encode_query(q), two.encode_passage(q))


def test_from_pretrained_unknown_hub_name_fails_offline():
    with pytest.raises(OSError):
        BiEncoder.from_pretrained("no-such-org/no-such-model-xyz")


@pytest.mark.parametrize("shared", [True, False])
def test_save_load_round_trip(tmp_path, checkpoint, batches, shared):
    q, p = batches
    model = BiEncoder.from_pretrained(checkpoint, shared=shared, pooling="mean", projection_dim=8,
                                      normalize=True, scale=100.0).eval()
    with torch.no_grad():
        model.query_projection.weight.add_(1.0)  # make sure trained weights, not fresh init, reload
    out = model.save_pretrained(tmp_path / "bi")
    saved = json.loads((out / "bi_encoder_config.json").read_text())
    assert saved["shared"] is shared and saved["pooling"] == "mean" and saved["projection_dim"] == 8
    loaded = BiEncoder.from_pretrained(out).eval()
    assert loaded.config == model.config
    assert loaded.tokenizer is not None
    with torch.no_grad():
        assert torch.allclose(loaded.encode_query(q), model.encode_query(q), atol=1e-6)
        assert torch.allclose(loaded.encode_passage(p), model.encode_passage(p), atol=1e-6)
    with pytest.raises(ValueError):
        BiEncoder.from_pretrained(out, projection_dim=16)


# -- losses wired to the model -----------------------------------------------------------------

@pytest.mark.parametrize("loss_cls", [InBatchSoftmaxLoss, BidirectionalSoftmaxLoss, WeightedInBatchSoftmaxLoss])
@pytest.mark.parametrize("shared", [True, False])
def test_gradients_flow(loss_cls, shared, batches, tokenizer):
    q, p = batches
    negatives = tokenizer(["a", "b", "c", "d"], ["the city", "the river", "paris", "seine"],
                          padding=True, return_tensors="pt")  # N = 2 per question
    model = make(shared=shared, projection_dim=8, normalize=True, similarity_scale=20.0).train()
    loss_fn = loss_cls(model)
    kwargs = {"weights": torch.tensor([1.0, 0.25])} if loss_cls is WeightedInBatchSoftmaxLoss else {}
    loss = loss_fn(q, p, negatives, **kwargs)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    towers = [model.query_encoder] + ([] if shared else [model.passage_encoder])
    for tower in towers:
        assert tower.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.query_projection.weight.grad.abs().sum() > 0
    if not shared:
        assert model.passage_projection.weight.grad.abs().sum() > 0


def test_loss_forward_equals_compute_from_embeddings(batches, tokenizer):
    q, p = batches
    negatives = tokenizer(["a", "b"], ["the city", "the river"], padding=True, return_tensors="pt")
    model = make(projection_dim=8, normalize=True, similarity_scale=10.0).eval()
    loss_fn = InBatchSoftmaxLoss(model)
    with torch.no_grad():
        eq, ep, en = model.encode_query(q), model.encode_passage(p), model.encode_passage(negatives)
        expected = torch.nn.functional.cross_entropy(10.0 * eq @ torch.cat([ep, en]).T, torch.arange(2))
        assert torch.allclose(loss_fn(q, p, negatives), expected)
        assert torch.allclose(loss_fn.compute_loss_from_embeddings(eq, ep, negatives=en), expected)


def test_int8_dynamic_quantisation_close_to_fp32_and_leaves_the_original(checkpoint, batches):
    from models.quantization import quantize_dynamic_int8

    model = BiEncoder.from_pretrained(str(checkpoint), pooling="mean", normalize=True).eval()
    queries, passages = batches
    int8 = quantize_dynamic_int8(model)
    assert not any(type(m) is torch.nn.Linear for m in int8.modules())  # every Linear was swapped
    assert any(type(m) is torch.nn.Linear for m in model.modules())     # on a copy
    assert int8.tokenizer is not None
    with torch.inference_mode():
        ref, got = model.encode_passage(passages), int8.encode_passage(passages)
        q_ref, q_got = model.encode_query(queries), int8.encode_query(queries)
    assert not torch.equal(ref, got)
    assert (ref * got).sum(-1).min() > 0.99 and (q_ref * q_got).sum(-1).min() > 0.99
    assert torch.equal((q_got @ got.T).argmax(1), (q_ref @ ref.T).argmax(1))
