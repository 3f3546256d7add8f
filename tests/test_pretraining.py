"""Query-as-context pre-training (paper 002): masking, heads, the coCondenser and CoT-MAE
objectives, query sampling, the pairs, the config and the saved base checkpoint, on toy tensors
and tiny random BERTs (seconds on CPU)."""
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pyarrow as pa  # noqa: E402
from pydantic import ValidationError  # noqa: E402

from models import BiEncoder  # noqa: E402
from models.pretraining import (  # noqa: E402
    IGNORE,
    CoCondenserLoss,
    CotMaeLoss,
    MaskSpec,
    MlmHead,
    contrastive_loss,
    load_bert_mlm_head,
    mask_tokens,
    masked_lm_sum,
    middle_layer_of,
    step_generator,
)
from tasks.training import Collator, TrainerArgs, TrainExample, latest_checkpoint  # noqa: E402
from tasks.training import train_bi_encoder as _train_bi_encoder  # noqa: E402
from tests.crash import Crash, crash_at  # noqa: E402

pytestmark = pytest.mark.usefixtures("flush_denormals")


def train_bi_encoder(*args, **kwargs):
    return _train_bi_encoder(*args, device="cpu", progress=False, **kwargs)


def tiny_model(checkpoint, pooling="cls"):
    return BiEncoder.from_pretrained(checkpoint, pooling=pooling)


def batches(tok):
    q = dict(tok(["what is the capital", "who flow through seine", "where does river flow"], padding=True,
                 return_tensors="pt"))
    p = dict(tok(["title a", "title b", "city"], ["paris is the capital of france", "the seine flow through paris city",
                                                   "the largest river of france is the seine"], padding=True, return_tensors="pt"))
    return q, p


# ------------------------------------------------------------------------------- toy tensors
def test_contrastive_loss_on_toy_vectors():
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    # tau = 0.5: logits row 0 = [2, 2] (target 0), row 1 = [0, 2] (target 1)
    expected = (math.log(2.0) + math.log(1.0 + math.exp(-2.0))) / 2
    assert contrastive_loss(x, y, temperature=0.5).item() == pytest.approx(expected, abs=1e-6)
    assert contrastive_loss(x, y).item() == pytest.approx((math.log(2.0) + math.log(1 + math.exp(-1.0))) / 2, abs=1e-6)
    with pytest.raises(ValueError):
        contrastive_loss(x, y[:1])


def toy_head():
    """g with hidden size 2 and 3 tokens: dense = identity, so g(h) = LayerNorm(gelu(h)) E^T + c."""
    from types import SimpleNamespace

    head = MlmHead(SimpleNamespace(hidden_size=2, vocab_size=3, hidden_act="gelu", layer_norm_eps=1e-12,
                                   initializer_range=0.02))
    with torch.no_grad():
        head.dense.weight.copy_(torch.eye(2))
        head.dense.bias.zero_()
        head.bias.copy_(torch.tensor([0.0, 0.0, 0.5]))
    return head


def test_masked_lm_sum_on_toy_tensors():
    head = toy_head()
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    # Two values normalised by a 2-wide LayerNorm become (+1, -1) (the larger first) or (-1, +1).
    hidden = torch.tensor([[[9.0, 9.0], [2.0, 1.0], [0.0, 3.0]]])
    labels = torch.tensor([[IGNORE, 0, 2]])
    total, count = masked_lm_sum(head, hidden, labels, embeddings)
    # position 1: LN -> (1, -1): logits (1, -1, 0.5), target 0; position 2: LN -> (-1, 1): logits (-1, 1, 0.5), target 2
    lse = lambda xs: math.log(sum(math.exp(v) for v in xs))  # noqa: E731
    expected = (lse([1, -1, 0.5]) - 1) + (lse([-1, 1, 0.5]) - 0.5)
    assert count == 2
    assert total.item() == pytest.approx(expected, abs=1e-5)
    none, zero = masked_lm_sum(head, hidden, torch.full_like(labels, IGNORE), embeddings)
    assert zero == 0 and none.item() == 0.0


# ------------------------------------------------------------------------------------ masking
def spec(tok):
    return MaskSpec.of(tok)


def test_mask_rate_counts_positions_and_specials(tokenizer):
    texts = [" ".join(["paris", "city", "river", "the"] * k) for k in (1, 3, 5, 9)]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    s = spec(tokenizer)
    for rate in (0.15, 0.30, 0.45):
        masked, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], rate, s, step_generator(0, 1, "p"))
        real = batch["attention_mask"].bool() & ~torch.isin(batch["input_ids"], torch.tensor(s.special_ids))
        chosen = labels != IGNORE
        for row in range(len(texts)):
            n = int(real[row].sum())
            assert int(chosen[row].sum()) == max(1, math.floor(n * rate + 0.5))
        assert not (chosen & ~real).any()  # never [CLS], [SEP] or padding
        assert torch.equal(labels[chosen], batch["input_ids"][chosen])
        assert torch.equal(masked[~chosen], batch["input_ids"][~chosen])


def test_mask_replacements_split_80_10_10_and_are_seeded(tokenizer):
    batch = tokenizer([" ".join(["paris", "city", "river", "the", "seine"] * 10)] * 64, return_tensors="pt")
    s = spec(tokenizer)
    masked, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], 0.3, s, step_generator(7, 3, "p"))
    chosen = labels != IGNORE
    as_mask = (masked == s.mask_id) & chosen
    kept = (masked == batch["input_ids"]) & chosen
    swapped = chosen & ~as_mask & ~kept
    total = int(chosen.sum())
    assert total == 64 * 15
    assert abs(int(as_mask.sum()) / total - 0.8) < 0.04
    assert abs(int(swapped.sum()) / total - 0.1) < 0.03  # random tokens that differ from the original
    assert not torch.isin(masked[swapped], torch.tensor(s.special_ids)).any()
    again = mask_tokens(batch["input_ids"], batch["attention_mask"], 0.3, s, step_generator(7, 3, "p"))
    assert torch.equal(again[0], masked) and torch.equal(again[1], labels)
    other = mask_tokens(batch["input_ids"], batch["attention_mask"], 0.3, s, step_generator(7, 4, "p"))
    assert not torch.equal(other[1], labels)
    with pytest.raises(ValueError):
        mask_tokens(batch["input_ids"], batch["attention_mask"], 1.0, s, step_generator(0, 0, "p"))


def test_objectives_mask_at_the_paper_rates(checkpoint):
    model = tiny_model(checkpoint)
    q, p = batches(model.tokenizer)
    real = lambda b: int(b["attention_mask"][0].sum()) - 2  # noqa: E731  ([CLS] and [SEP])
    co, cot = CoCondenserLoss(model), CotMaeLoss(model)
    assert (co.mask_rate, cot.mask_rate, cot.decoder_mask_rate) == (0.15, 0.30, 0.45)
    _, labels = cot.mask(p, cot.mask_rate, "passage")
    assert int((labels[0] != IGNORE).sum()) == math.floor(0.30 * (int(p["attention_mask"][0].sum()) - 3) + 0.5)
    _, labels = cot.mask(q, cot.decoder_mask_rate, "context")
    assert int((labels[0] != IGNORE).sum()) == math.floor(0.45 * real(q) + 0.5)


# ------------------------------------------------------------------------ the objectives' sums
def manual_ce_mean(parts):
    """Mean CE over all masked positions of all (logits, labels) parts, by log_softmax and gather."""
    total, count = 0.0, 0
    for logits, labels in parts:
        keep = labels != IGNORE
        logp = torch.log_softmax(logits[keep].double(), dim=-1)
        total += -logp.gather(1, labels[keep].unsqueeze(1)).sum().item()
        count += int(keep.sum())
    return total / count


def sharpen(loss):
    """Peaked logits (a tiny random BERT's are near-uniform, so any input would give about ln V)."""
    with torch.no_grad():
        loss.mlm_head.layer_norm.weight.fill_(60.0)
    return loss


def test_cocondenser_terms_and_head_wiring(checkpoint):
    model = tiny_model(checkpoint)
    q, p = batches(model.tokenizer)
    loss = sharpen(CoCondenserLoss(model, temperature=0.5, seed=3)).eval()
    seen = []
    loss.head.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    loss.step = 5
    with torch.no_grad():
        total = loss(q, p)
    assert loss.step == 6  # advanced for the next batch
    terms = loss.last_terms
    assert total.item() == pytest.approx(sum(v.item() for v in terms.values()), abs=1e-5)

    # By hand: the same masks (seeded by (seed 3, step 5, span)), the encoder, g, the head.
    enc, emb = model.query_encoder, model.query_encoder.get_input_embeddings().weight
    mlm_parts, aux_parts, reps = [], [], []
    with torch.no_grad():
        for i, (batch, stream) in enumerate(((p, "passage"), (q, "context"))):
            masked, labels = mask_tokens(batch["input_ids"], batch["attention_mask"], 0.15, MaskSpec.of(model.tokenizer),
                                         step_generator(3, 5, stream))
            states = enc(input_ids=masked, attention_mask=batch["attention_mask"],
                         token_type_ids=batch["token_type_ids"], output_hidden_states=True).hidden_states
            last, middle = states[2], states[1]  # 2 layers: the middle is layer 1
            head_in = torch.cat([last[:, :1], middle[:, 1:]], dim=1)
            assert torch.allclose(seen[i], head_in, atol=1e-6)  # [CLS] of the last layer, tokens of the middle
            mlm_parts.append((F.linear(loss.mlm_head.layer_norm(loss.mlm_head.act(loss.mlm_head.dense(last))), emb,
                                       loss.mlm_head.bias), labels))
            out = loss.head(head_in, batch["attention_mask"])
            aux_parts.append((loss.mlm_head(out.reshape(-1, out.shape[-1]), emb).reshape(*out.shape[:2], -1), labels))
            reps.append(last[:, 0])
        logits = reps[0] @ reps[1].T / 0.5
        co = -torch.log_softmax(logits.double(), dim=1).diagonal().mean().item()
    assert terms["mlm"].item() == pytest.approx(manual_ce_mean(mlm_parts), abs=1e-4)
    assert terms["aux_mlm"].item() == pytest.approx(manual_ce_mean(aux_parts), abs=1e-4)
    assert terms["contrastive"].item() == pytest.approx(co, abs=1e-5)


def test_cotmae_terms(checkpoint):
    model = tiny_model(checkpoint)
    q, p = batches(model.tokenizer)
    loss = sharpen(CotMaeLoss(model, seed=1)).eval()
    loss.step = 2
    with torch.no_grad():
        total = loss(q, p)
        terms = loss.last_terms
        enc, emb = model.query_encoder, model.query_encoder.get_input_embeddings().weight
        masked, labels = mask_tokens(p["input_ids"], p["attention_mask"], 0.30, MaskSpec.of(model.tokenizer),
                                     step_generator(1, 2, "passage"))
        last = enc(input_ids=masked, attention_mask=p["attention_mask"], token_type_ids=p["token_type_ids"]).last_hidden_state
        mlm = manual_ce_mean([(loss.mlm_head(last.reshape(-1, last.shape[-1]), emb).reshape(*last.shape[:2], -1), labels)])
        q_masked, q_labels = mask_tokens(q["input_ids"], q["attention_mask"], 0.45, MaskSpec.of(model.tokenizer),
                                         step_generator(1, 2, "context"))
        d0 = torch.cat([last[:, :1], enc.embeddings(input_ids=q_masked)[:, 1:]], dim=1)
        out = loss.decoder(d0, q["attention_mask"])
        ctx = manual_ce_mean([(loss.mlm_head(out.reshape(-1, out.shape[-1]), emb).reshape(*out.shape[:2], -1), q_labels)])
    assert terms["mlm"].item() == pytest.approx(mlm, abs=1e-4)
    assert terms["context_mlm"].item() == pytest.approx(ctx, abs=1e-4)
    assert total.item() == pytest.approx(mlm + ctx, abs=1e-4)


def test_cotmae_decoder_receives_only_the_passage_cls(checkpoint):
    model = tiny_model(checkpoint)
    q, p = batches(model.tokenizer)
    loss = CotMaeLoss(model).eval()
    # Through the whole loss: the decoder's input is the passage's [CLS] state, then the masked
    # context's token embeddings, and nothing else.
    seen = []
    loss.decoder.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach().clone()))
    with torch.no_grad():
        loss(q, p)
        masked, _ = mask_tokens(p["input_ids"], p["attention_mask"], 0.30, loss.spec, step_generator(0, 0, "passage"))
        cls = model.query_encoder(input_ids=masked, attention_mask=p["attention_mask"],
                                  token_type_ids=p["token_type_ids"]).last_hidden_state[:, 0]
        q_masked, _ = mask_tokens(q["input_ids"], q["attention_mask"], 0.45, loss.spec, step_generator(0, 0, "context"))
        embedded = model.query_encoder.embeddings(input_ids=q_masked)
    assert seen[0].shape == (3, q["input_ids"].shape[1], 32)
    assert torch.allclose(seen[0][:, 0], cls, atol=1e-6)
    assert torch.allclose(seen[0][:, 1:], embedded[:, 1:], atol=1e-6)
    # Gradients: the context loss reaches the passage's states only through position 0.
    last = model.query_encoder(**p).last_hidden_state
    last.retain_grad()
    loss.context_loss(last[:, 0], q).backward()
    assert last.grad[:, 1:].abs().max().item() == 0.0
    assert last.grad[:, 0].abs().max().item() > 0.0
    with pytest.raises(ValueError, match="one \\[CLS\\] vector"):
        loss.decoder_inputs(last, q["input_ids"])


def test_middle_layer_default_and_bounds():
    assert middle_layer_of(12, None) == 6 and middle_layer_of(6, None) == 3 and middle_layer_of(2, None) == 1
    assert middle_layer_of(12, 4) == 4
    for bad in (0, 12):
        with pytest.raises(ValueError, match="middle_layer"):
            middle_layer_of(12, bad)


def test_losses_refuse_hard_negatives_and_weights(checkpoint):
    model = tiny_model(checkpoint)
    q, p = batches(model.tokenizer)
    loss = CoCondenserLoss(model)
    with pytest.raises(ValueError, match="hard negatives"):
        loss(q, p, p)
    with pytest.raises(ValueError, match="weights"):
        loss(q, p, None, torch.ones(3))


def test_mlm_head_from_a_bert_checkpoint(tmp_path, checkpoint):
    from transformers import BertForMaskedLM

    from tests.tiny_models import tiny_bert

    model = tiny_model(checkpoint)
    head = CoCondenserLoss(model).mlm_head
    assert load_bert_mlm_head(head, checkpoint) is False  # a bare BertModel: the head stays fresh
    torch.manual_seed(5)
    mlm = BertForMaskedLM(tiny_bert().config)
    mlm.save_pretrained(tmp_path)
    assert load_bert_mlm_head(head, tmp_path) is True
    assert torch.equal(head.dense.weight, mlm.cls.predictions.transform.dense.weight)
    assert torch.equal(head.bias, mlm.cls.predictions.bias)


# --------------------------------------------------------------------------- query sampling
def test_collator_draws_one_query_per_epoch_and_passage(tokenizer):
    candidates = ["what is the capital", "who flow through seine", "where does river flow"]
    examples = [TrainExample(qid=f"ctx:p{i}", query=candidates[0], positive=("title", "paris city"), positive_id=f"p{i}",
                             queries=candidates) for i in range(4)]
    plain = TrainExample(qid="q", query="the river", positive=("t", "x"), positive_id="x")
    collator = Collator(tokenizer, seed=11)
    picks = [[collator.choose_query(e, epoch) for e in examples] for epoch in range(300)]
    assert all(p in candidates for row in picks for p in row)
    assert [collator.choose_query(e, 4) for e in examples] == picks[4]  # a function of (seed, epoch, qid)
    assert [collator.choose_query(e, 4) for e in reversed(examples)] == list(reversed(picks[4]))  # not of the batch
    for i in range(4):  # afresh each epoch: every candidate comes up about a third of the time
        counts = [sum(row[i] == c for row in picks) for c in candidates]
        assert min(counts) > 60, counts
    assert any(row[0] != row[1] for row in picks)  # passages draw independently
    assert collator.choose_query(plain, 3) == "the river"
    q, _, _, _ = collator(examples, epoch=4)
    assert torch.equal(q["input_ids"], collator.encode_queries(picks[4])["input_ids"])
    assert Collator(tokenizer, seed=12).choose_query(examples[0], 0) in candidates


def test_pairs_from_queries_and_from_documents():
    from tasks.pretrain.examples import passage_context_examples, query_context_examples, sample_examples

    passages = pa.table({"pid": ["a1", "a2", "b1", "c1", "c2", "c3"], "doc_id": ["a", "a", "b", "c", "c", "c"],
                         "title": ["A", "A", "B", "C", "C", "C"], "text": ["a one", "a two", "b one", "c one", "c two", "c three"]})
    queries = pa.table({"pid": ["a1", "a1", "a1", "b1", "c2", "c2"], "n": [2, 0, 1, 0, 0, 1],
                        "query": ["third", "first", "first", "only", " ", "kept"]})
    qac = query_context_examples(passages, queries)
    assert [(e.positive_id, e.queries) for e in qac] == [("a1", ["first", "third"]), ("b1", ["only"]), ("c2", ["kept"])]
    assert qac[0].positive == ("A", "a one") and qac[0].query == "first"
    pp = passage_context_examples(passages)
    assert [(e.positive_id, e.queries) for e in pp] == [("a1", ["a two"]), ("a2", ["a one"]), ("c1", ["c two", "c three"]),
                                                         ("c2", ["c one", "c three"]), ("c3", ["c one", "c two"])]
    assert len({e.qid for e in pp}) == len(pp)
    picked = sample_examples(pp, 3, seed=1)
    assert len(picked) == 3 and picked == sample_examples(pp, 3, seed=1)
    assert [e.positive_id for e in picked] == sorted(e.positive_id for e in picked)
    assert sample_examples(pp, None, 1) is pp


# ------------------------------------------------------------------------------ length pieces
def span_batches(tok):
    """Five contexts and passages of mixed lengths, right-padded as the collator pads them."""
    texts = ["paris", "the seine flow through paris city and the largest river of france", "city of france",
             "what is the capital", "the largest river of france is the seine and it flow through paris"]
    q = dict(tok([t.split()[0] + " " + t.split()[-1] for t in texts], padding=True, return_tensors="pt"))
    p = dict(tok([f"title {i}" for i in range(5)], texts, padding=True, return_tensors="pt"))
    return q, p


def terms_and_grads(loss, q, p):
    loss.step = 4
    total = loss(q, p)
    total.backward()
    grads = {name: w.grad.clone() for name, w in loss.named_parameters() if w.grad is not None}
    return {k: v.item() for k, v in loss.last_terms.items()}, grads


@pytest.mark.parametrize("objective", ["cocondenser", "cotmae"])
def test_pretraining_reads_length_pieces_as_the_whole_batch(checkpoint, objective):
    """The trainer's length pieces (models/length_pieces.py) reach the objectives: the encoder reads
    each masked span in pieces cut to their longest row, and the terms and gradients are the whole
    batch's (the same masks; the MLM sums add over pieces; the representations in row order)."""
    from models.length_pieces import encoding_in_pieces
    from models.pretraining import build_pretraining_loss

    results, shapes = [], []
    for rows in (None, 2):
        torch.manual_seed(0)   # the same heads for both
        model = tiny_model(checkpoint)
        loss = sharpen(build_pretraining_loss(objective, model, seed=3)).eval()   # eval: no dropout
        seen = []
        model.query_encoder.register_forward_pre_hook(
            lambda _, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
        q, p = span_batches(model.tokenizer)
        with encoding_in_pieces(loss, rows):
            results.append(terms_and_grads(loss, q, p))
        shapes.append(seen)
    (whole_terms, whole_grads), (piece_terms, piece_grads) = results
    assert piece_terms == pytest.approx(whole_terms, abs=1e-5) and whole_terms["mlm"] > 0
    assert whole_grads.keys() == piece_grads.keys() and len(whole_grads) > 4
    for name in whole_grads:
        torch.testing.assert_close(piece_grads[name], whole_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    passage_rows, longest = p["input_ids"].shape
    assert shapes[0][0] == (passage_rows, longest)
    lengths = sorted(p["attention_mask"].sum(1).tolist(), reverse=True)
    assert shapes[1][:3] == [(2, lengths[0]), (2, lengths[2]), (1, lengths[4])], "the passage span, cut in pieces"


def test_a_pretraining_run_cuts_its_batches_as_told_and_keeps_its_version(checkpoint, tmp_path):
    from models.pretraining import build_pretraining_loss
    from tasks.pretrain.stages import PretrainConfig, PretrainParams, stages
    from tasks.config import PipelineConfig, PROJECT_ROOT, load_config

    model = tiny_model(checkpoint)
    seen = []
    model.query_encoder.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                                  with_kwargs=True)
    result = train_bi_encoder(model, build_pretraining_loss("cocondenser", model), pretraining_examples(),
                              tiny_args(max_steps=2, batch_size=6), tmp_path, rows_per_piece=2)
    assert len(result["history"]) == 2 and seen and max(seen) == 2, "every span of 6 read 2 rows at a time"
    assert model.rows_per_piece is None

    raw = load_config(PROJECT_ROOT / "configs" / "tiny.yaml").model_dump()
    raw["dense"] = {"systems": []}

    def planned(**run):
        cfg = PipelineConfig.model_validate({**raw, "pretrain": [{"name": "pp", "form": "passage-passage", **run}]})
        return stages(cfg, [])[0].params

    assert planned().length_pieces == "auto" and planned(length_pieces=4).length_pieces == 4
    assert "length_pieces" not in planned(length_pieces=4).pretrain.model_dump()
    assert planned(length_pieces=4).hashed() == planned(length_pieces=None).hashed() == planned().hashed()
    assert planned(seed=7).hashed() != planned().hashed()
    assert PretrainParams.RUNTIME == {"device", "length_pieces"}
    assert PretrainConfig(name="x", form="cotmae", length_pieces=None).run() == PretrainConfig(name="x", form="cotmae").run()


# ----------------------------------------------------------------- config and the checkpoint
def test_pretrain_config_defaults_and_errors():
    from tasks.pretrain.stages import PretrainConfig

    co = PretrainConfig(name="co", form="cocondenser")
    cot = PretrainConfig(name="cot", form="cotmae")
    pp = PretrainConfig(name="pp", form="passage-passage", passage_max_len=100)
    assert (co.objective, co.mask_rate, cot.objective, cot.mask_rate) == ("cocondenser", 0.15, "cotmae", 0.30)
    assert (pp.objective, pp.mask_rate, pp.query_max_len, co.query_max_len) == ("cocondenser", 0.15, 100, 32)
    assert co.hard_negatives == 0 and co.passage_max_len == 144
    assert PretrainConfig(name="x", form="passage-passage", objective="cotmae").mask_rate == 0.30
    assert PretrainConfig.model_validate(co.model_dump()) == co  # a dumped config validates again
    with pytest.raises(ValidationError, match="cotmae settings"):
        PretrainConfig(name="x", form="cocondenser", decoder_mask_rate=0.5)
    with pytest.raises(ValidationError, match="trains the cotmae objective"):
        PretrainConfig(name="x", form="cotmae", objective="cocondenser")
    with pytest.raises(ValidationError):
        PretrainConfig(name="x", form="cotmae", hard_negatives=1)
    assert co.loss_options()["temperature"] == 1.0 and "decoder_mask_rate" in cot.loss_options()


def test_pipeline_config_checks_pretrain_references():
    from tasks.config import PipelineConfig, PROJECT_ROOT, load_config

    raw = load_config(PROJECT_ROOT / "configs" / "tiny.yaml").model_dump()
    raw["pretrain"] = [{"name": "pp", "form": "passage-passage"}]
    raw["dense"] = {"systems": [{"name": "s", "init_from": "pretrain:pp", "model": {"pooling": "cls"},
                                 "train": {"max_steps": 1}}]}
    PipelineConfig.model_validate(raw)
    with pytest.raises(ValidationError, match="no pretrain run of that name"):
        PipelineConfig.model_validate({**raw, "dense": {"systems": [{"name": "s", "init_from": "pretrain:nope"}]}})
    with pytest.raises(ValidationError, match="qgen"):
        PipelineConfig.model_validate({**raw, "pretrain": [{"name": "pp", "form": "cotmae"}]})
    with pytest.raises(ValidationError, match="unique"):
        PipelineConfig.model_validate({**raw, "pretrain": raw["pretrain"] * 2})


@pytest.mark.parametrize("pretrain_pooling, system_pooling, error", [
    ("cls", "cls", None),
    ("cls", "mean", "set the system's model.pooling to 'cls'"),     # the fine-tuning discards what the heads shaped
    ("mean", "mean", "its Condenser head reads \\[CLS\\]"),       # mean everywhere still leaves the head on [CLS]
    ("mean", "cls", "its Condenser head reads \\[CLS\\]"),
])
def test_fine_tuning_from_pretraining_pools_cls(pretrain_pooling, system_pooling, error):
    from tasks.config import PipelineConfig, PROJECT_ROOT, load_config

    raw = load_config(PROJECT_ROOT / "configs" / "tiny.yaml").model_dump()
    raw["pretrain"] = [{"name": "pp", "form": "passage-passage", "pooling": pretrain_pooling}]
    raw["dense"] = {"systems": [{"name": "s", "init_from": "pretrain:pp", "model": {"pooling": system_pooling},
                                 "train": {"max_steps": 1}}]}
    if error is None:
        PipelineConfig.model_validate(raw)
    else:
        with pytest.raises(ValidationError, match=error):
            PipelineConfig.model_validate(raw)


def test_cotmae_starts_pool_cls():
    """CoT-MAE's decoder reads [CLS] (section 2.2): its fine-tuned systems pool [CLS]."""
    from tasks.config import PipelineConfig, PROJECT_ROOT, load_config

    raw = load_config(PROJECT_ROOT / "configs" / "two-stage.yaml").model_dump()
    raw["pretrain"] = [{"name": "qac", "form": "cotmae"}]
    raw["dense"]["systems"] = [{"name": "s", "init_from": "pretrain:qac", "model": {"pooling": "mean"},
                                "train": {"max_steps": 1}}]
    raw["dense"]["hybrid"] = None
    with pytest.raises(ValidationError, match="pretrain:qac shapes the \\[CLS\\]"):
        PipelineConfig.model_validate(raw)


def pretraining_examples(n=12):
    words = ["paris", "city", "river", "seine", "france", "capital", "largest", "flow"]
    return [TrainExample(qid=f"ctx:p{i}", query=words[i % 8], positive=(f"title {i}", " ".join(words[i % 5:i % 5 + 4])),
                         positive_id=f"p{i}", queries=[words[i % 8], words[(i + 3) % 8] + " " + words[(i + 1) % 8]])
            for i in range(n)]


def tiny_args(**kw):
    base = dict(batch_size=4, lr=1e-3, warmup_ratio=0.0, seed=0, hard_negatives=0, query_max_len=16, passage_max_len=32)
    return TrainerArgs(**{**base, **kw})


@pytest.mark.parametrize("objective", ["cocondenser", "cotmae"])
def test_pretraining_resumes_exactly(checkpoint, tmp_path, objective):
    """Masks are drawn per (seed, step), the heads are the loss's own state: a run killed after
    its step-2 checkpoint and resumed ends where an uninterrupted run ends."""
    from models.pretraining import build_pretraining_loss

    examples = pretraining_examples()
    args = tiny_args(max_steps=4, checkpoint_every=2)

    def fresh(seed):
        torch.manual_seed(seed)
        model = tiny_model(checkpoint)
        return model, build_pretraining_loss(objective, model, seed=9)

    one, one_loss = fresh(0)
    train_bi_encoder(one, one_loss, examples, args, tmp_path / "one")

    first, first_loss = fresh(0)
    with pytest.raises(Crash):
        train_bi_encoder(first, first_loss, examples, args, tmp_path / "two", callbacks=[crash_at(3)])
    assert latest_checkpoint(tmp_path / "two").name == "step-0000002"
    second, second_loss = fresh(4)  # other head weights: the checkpoint must restore them
    result = train_bi_encoder(second, second_loss, examples, args, tmp_path / "two")
    assert result["resumed_from"].endswith("step-0000002")
    for (name, a), (_, b) in zip(one_loss.state_dict().items(), second_loss.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    history = json.loads((tmp_path / "one" / "history.json").read_text())["history"]
    assert [h["loss"] for h in history] == pytest.approx([h["loss"] for h in result["history"]], abs=1e-5)


def test_saved_base_checkpoint_has_no_heads_and_loads_as_a_systems_base(checkpoint, tmp_path):
    from safetensors import safe_open

    from models.bi_encoder import CONFIG_NAME
    from tasks.compute.origin import Origin
    from tasks.pretrain.stages import save_base_checkpoint

    torch.manual_seed(0)
    model = tiny_model(checkpoint)
    loss = CotMaeLoss(model)
    train_bi_encoder(model, loss, pretraining_examples(), tiny_args(max_steps=2), tmp_path / "training")
    folder = save_base_checkpoint(model, tmp_path / "base")

    def keys(path):
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            return set(f.keys())

    saved, base = keys(folder), keys(checkpoint)
    assert saved == base  # the encoder's tensors, nothing of the MLM head or the decoder
    assert not (folder / CONFIG_NAME).exists()
    assert {n for n, _ in loss.named_parameters() if not n.startswith("model.")} and \
        not any(k.startswith(("mlm_head", "decoder", "head")) for k in saved)
    system_model = {"base": "unused", "shared": True, "pooling": "mean", "projection_dim": 8, "normalize": True, "scale": 20.0}
    loaded = Origin(model=system_model, init_path=str(folder)).load({})
    assert (loaded.config.pooling, loaded.config.normalize, loaded.config.projection_dim) == ("mean", True, 8)
    for name, tensor in model.query_encoder.state_dict().items():
        assert torch.equal(loaded.query_encoder.state_dict()[name], tensor), name
    assert loaded.tokenizer is not None and loaded.tokenizer("paris")["input_ids"] == model.tokenizer("paris")["input_ids"]
