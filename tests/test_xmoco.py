"""xMoCo (paper 000 section 4): queues, momentum update, masking, the two loss directions and
L_hard against hand-computed values, gradients, export, resume and a 2-process gloo run.

Hand-computed toy step (D=2, B=2, queue size 4, scale 1), queues pre-filled with one earlier batch:
    Q_p = [a=[1,0] id 10, b=[0,2] id 11]      Q_q = [c=[2,0] id 20, d=[0,1] id 21]
    slow p = [[1,1] id 11, [2,0] id 12]        slow q = [[0,1] id 30, [1,-1] id 31]
    fast q = [[1,0], [0,2]]                    fast p = [[1,0], [1,1]]
After the push (section 4.2: before the loss) Q_p = [a, b, sp0, sp1], Q_q = [c, d, sq0, sq1].
    L_qp row 0: q0 . Q_p = [1, 0, 1, 2], target slot 2; slot 1 has sp0's id 11: masked
    L_qp row 1: q1 . Q_p = [0, 4, 2, 0], target slot 3
    L_pq row 0: p0 . Q_q = [2, 0, 0, 1], target slot 2
    L_pq row 1: p1 . Q_q = [2, 1, 1, 0], target slot 3
"""
import math
import os
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from flows.processes import free_port  # noqa: E402
from models import BiEncoder  # noqa: E402
from models.losses import LOSSES, build_loss  # noqa: E402
from models.losses.xmoco import (  # noqa: E402
    EMPTY,
    LAMBDA,
    MOMENTUM,
    QUEUE_SIZE,
    VectorQueue,
    XMoCoLoss,
    hard_negative_contrast,
    momentum_update,
    queue_contrast,
    text_ids,
)
from tasks.training import TrainerArgs, TrainExample  # noqa: E402
from tasks.training import train_bi_encoder as _train_bi_encoder  # noqa: E402
from tests.crash import Crash, crash_at  # noqa: E402
from tests.tiny_models import WORDS  # noqa: E402

pytestmark = pytest.mark.usefixtures("flush_denormals")
E = math.exp
ROOT = Path(__file__).resolve().parents[1]


def lse(*xs):
    return math.log(sum(E(x) for x in xs))


QP = [lse(1, 1, 2) - 1, lse(0, 4, 2, 0) - 0]   # slot 1 (id 11 = the target's) left out of row 0
PQ = [lse(2, 0, 0, 1) - 0, lse(2, 1, 1, 0) - 0]


class ToyTowers(nn.Module):
    """Two separate linear 'towers' over float features in batch['x'] (shared=False)."""

    def __init__(self, dim=2, scale=1.0):
        super().__init__()
        self.config = SimpleNamespace(shared=False)
        self.embedding_dim = dim
        self.similarity_scale = scale
        self.query_encoder = nn.Linear(dim, dim, bias=False)
        self.passage_encoder = nn.Linear(dim, dim, bias=False)

    def encode_query(self, batch):
        return self.query_encoder(batch["x"])

    def encode_passage(self, batch):
        return self.passage_encoder(batch["x"])


def toy_loss(queue_size=4, **kw):
    loss = XMoCoLoss(ToyTowers(), queue_size=queue_size, **kw)
    loss.passage_queue.push(torch.tensor([[1.0, 0.0], [0.0, 2.0]]), torch.tensor([10, 11]))
    loss.question_queue.push(torch.tensor([[2.0, 0.0], [0.0, 1.0]]), torch.tensor([20, 21]))
    return loss


TOY = dict(slow_q=torch.tensor([[0.0, 1.0], [1.0, -1.0]]), question_ids=torch.tensor([30, 31]),
           slow_p=torch.tensor([[1.0, 1.0], [2.0, 0.0]]), passage_ids=torch.tensor([11, 12]))
FAST_Q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
FAST_P = torch.tensor([[1.0, 0.0], [1.0, 1.0]])


def close(t, value):
    assert t.item() == pytest.approx(value, rel=1e-6, abs=1e-7)


# -- paper defaults, registry -------------------------------------------------------------------

def test_registered_with_the_papers_defaults():
    assert LOSSES["xmoco"] is XMoCoLoss
    assert (QUEUE_SIZE, MOMENTUM, LAMBDA) == (16_384, 0.001, 0.5)
    loss = build_loss("xmoco", ToyTowers())
    assert (loss.queue_size, loss.momentum, loss.lam, loss.hard_negative_weight) == (16_384, 0.001, 0.5, 1.0)
    assert loss.scale == 1.0  # the paper's plain inner product: the model's similarity_scale


def test_refuses_a_shared_tower(checkpoint):
    with pytest.raises(ValueError, match="shared: false"):
        XMoCoLoss(BiEncoder.from_pretrained(checkpoint))  # shared=True by default


# -- queue --------------------------------------------------------------------------------------

def test_fifo_order_and_wrap_around():
    queue = VectorQueue(5, 1)
    assert queue.ids.tolist() == [EMPTY] * 5
    slots = queue.push(torch.tensor([[1.0], [2.0], [3.0]]), torch.tensor([1, 2, 3]))
    assert slots.tolist() == [0, 1, 2] and int(queue.pointer) == 3
    slots = queue.push(torch.tensor([[4.0], [5.0], [6.0]]), torch.tensor([4, 5, 6]))
    assert slots.tolist() == [3, 4, 0]  # the whole batch at once, wrapping over the oldest
    assert queue.vectors.flatten().tolist() == [6.0, 2.0, 3.0, 4.0, 5.0]
    assert queue.ids.tolist() == [6, 2, 3, 4, 5] and int(queue.pointer) == 1
    with pytest.raises(ValueError, match="overwrite itself"):
        queue.push(torch.zeros(6, 1), torch.arange(6))


def test_queue_must_hold_two_batches():
    loss = XMoCoLoss(ToyTowers(), queue_size=3)
    with pytest.raises(ValueError, match="at least 4"):
        loss.compute_loss_from_embeddings(FAST_Q, FAST_P, **TOY)
    # with one hard negative each, a step pushes 2 positives + 2 negatives: 4 passage vectors
    loss = XMoCoLoss(ToyTowers(), queue_size=4)
    with pytest.raises(ValueError, match="at least 6"):
        loss.compute_loss_from_embeddings(FAST_Q, FAST_P, torch.zeros(4, 2), **TOY,
                                          slow_negatives=torch.zeros(4, 2), negative_ids=torch.arange(4))


# -- ids and masking ----------------------------------------------------------------------------

def test_text_ids_ignore_padding_and_tell_texts_apart():
    right = {"input_ids": torch.tensor([[2, 7, 9, 3, 0, 0], [2, 7, 9, 4, 3, 0]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]])}
    left = {"input_ids": torch.tensor([[0, 2, 7, 9, 3]]), "attention_mask": torch.tensor([[0, 1, 1, 1, 1]])}
    alone = {"input_ids": torch.tensor([[2, 7, 9, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    ids = text_ids(right)
    assert ids.dtype == torch.long and (ids >= 0).all()
    assert ids[0] == text_ids(left)[0] == text_ids(alone)[0]
    assert ids[0] != ids[1]
    swapped = {"input_ids": torch.tensor([[2, 9, 7, 3]]), "attention_mask": torch.ones(1, 4, dtype=torch.long)}
    assert text_ids(swapped)[0] != ids[0]  # order matters


def test_masking_by_id_and_empty_slots():
    fast = torch.tensor([[1.0, 0.0]])
    queue = torch.tensor([[1.0, 0.0], [3.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    ids = torch.tensor([7, 7, 8, EMPTY])  # slot 1: an older copy of the target (id 7); slot 3 empty
    got = queue_contrast(fast, queue, ids, torch.tensor([0]), torch.tensor([7]), scale=1.0)
    close(got[0], lse(1, 0) - 1)  # only slots 0 and 2 compete
    moved = queue.clone()
    moved[1] = torch.tensor([-9.0, 4.0])  # masked slots do not matter
    moved[3] = torch.tensor([9.0, 9.0])
    assert torch.equal(queue_contrast(fast, moved, ids, torch.tensor([0]), torch.tensor([7]), 1.0), got)
    unmasked = queue_contrast(fast, queue, torch.tensor([7, 9, 8, EMPTY]), torch.tensor([0]), torch.tensor([7]), 1.0)
    close(unmasked[0], lse(1, 3, 0) - 1)


# -- the loss against hand-computed values ------------------------------------------------------

@pytest.mark.parametrize("lam", [0.5, 0.25])
def test_two_directions_and_lambda(lam):
    loss = toy_loss(lam=lam)
    got = loss.compute_loss_from_embeddings(FAST_Q, FAST_P, **TOY)
    close(got, lam * sum(QP) / 2 + (1 - lam) * sum(PQ) / 2)
    # the push came before the loss: the batch's slow vectors sit in slots 2 and 3
    assert loss.passage_queue.ids.tolist() == [10, 11, 11, 12]
    assert loss.question_queue.ids.tolist() == [20, 21, 30, 31]
    assert torch.equal(loss.passage_queue.vectors[2:], TOY["slow_p"])
    assert torch.equal(loss.question_queue.vectors[2:], TOY["slow_q"])


def test_each_direction_alone():
    close(toy_loss(lam=1.0).compute_loss_from_embeddings(FAST_Q, FAST_P, **TOY), sum(QP) / 2)
    close(toy_loss(lam=0.0).compute_loss_from_embeddings(FAST_Q, FAST_P, **TOY), sum(PQ) / 2)


def test_scale_multiplies_the_logits():
    loss = toy_loss(lam=1.0, scale=2.0)
    expected = (lse(2, 2, 4) - 2 + lse(0, 8, 4, 0) - 0) / 2
    close(loss.compute_loss_from_embeddings(FAST_Q, FAST_P, **TOY), expected)


def test_hard_negatives_add_l_hard_and_enter_q_p():
    # queue size 8: a step now pushes 4 passage vectors; after the pre-fill Q_p =
    # [a, b, sp0, sp1, sn0, sn1, -, -]
    fast_n = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    slow_n = torch.tensor([[0.0, 3.0], [1.0, 1.0]])
    hard = [lse(1, 0) - 1, lse(2, 0) - 2]  # q0 . [p0, n0] = [1, 0]; q1 . [p1, n1] = [2, 0]
    qp = [lse(1, 1, 2, 0, 1) - 1, lse(0, 4, 2, 0, 6, 2) - 0]  # + q . [sn0, sn1]
    for weight in (1.0, 0.5):
        loss = toy_loss(queue_size=8, lam=0.5, hard_negative_weight=weight)
        got = loss.compute_loss_from_embeddings(FAST_Q, FAST_P, fast_n, **TOY, slow_negatives=slow_n,
                                                negative_ids=torch.tensor([40, 41]))
        close(got, 0.5 * sum(qp) / 2 + 0.5 * sum(PQ) / 2 + weight * sum(hard) / 2)
        assert loss.passage_queue.ids.tolist() == [10, 11, 11, 12, 40, 41, EMPTY, EMPTY]
        assert torch.equal(loss.passage_queue.vectors[4:6], slow_n)
        assert loss.question_queue.ids.tolist()[:4] == [20, 21, 30, 31]  # questions only, no negatives
    close(hard_negative_contrast(FAST_Q, FAST_P, fast_n, 1.0).mean(), sum(hard) / 2)


# -- momentum update ----------------------------------------------------------------------------

def test_momentum_update_is_exact_on_tiny_modules():
    fast, slow = nn.Linear(2, 2), nn.Linear(2, 2)
    with torch.no_grad():  # dyadic values: the update is exact in float32
        fast.weight.copy_(torch.tensor([[1.0, 2.0], [-4.0, 0.5]]))
        fast.bias.copy_(torch.tensor([8.0, -1.0]))
        slow.weight.copy_(torch.tensor([[0.0, 4.0], [4.0, 0.25]]))
        slow.bias.copy_(torch.tensor([0.0, 3.0]))
    momentum_update(slow, fast, alpha=0.25)
    assert torch.equal(slow.weight, torch.tensor([[0.25, 3.5], [2.0, 0.3125]]))
    assert torch.equal(slow.bias, torch.tensor([2.0, 2.0]))
    assert torch.equal(fast.weight, torch.tensor([[1.0, 2.0], [-4.0, 0.5]]))  # fast untouched


def test_slow_encoders_start_as_copies_and_follow_after_each_step():
    loss = XMoCoLoss(ToyTowers(), momentum=0.5)
    model = loss.model
    for (name, f), (_, s) in zip(model.named_parameters(), loss.slow.named_parameters()):
        assert torch.equal(f, s) and f is not s and not s.requires_grad, name
    with torch.no_grad():
        model.query_encoder.weight.copy_(torch.tensor([[2.0, 0.0], [0.0, 2.0]]))
    before = loss.slow.query_encoder.weight.clone()
    loss.on_step_end(1, model, None)
    assert torch.equal(loss.slow.query_encoder.weight, 0.5 * before + 0.5 * model.query_encoder.weight)
    assert torch.equal(loss.slow.passage_encoder.weight, model.passage_encoder.weight)  # fast = slow there


# -- on a tiny BERT -----------------------------------------------------------------------------

def two_towers(checkpoint, seed=0):
    torch.manual_seed(seed)
    return BiEncoder.from_pretrained(checkpoint, shared=False, projection_dim=16)


def batches(tokenizer, n=4, neg=True):
    rng = random.Random(0)
    text = lambda k: " ".join(rng.choices(WORDS, k=k))  # noqa: E731
    q = tokenizer([text(3) for _ in range(n)], padding=True, return_tensors="pt")
    p = tokenizer([f"title {i}" for i in range(n)], [text(8) for _ in range(n)], padding=True, return_tensors="pt")
    nb = tokenizer([f"neg {i}" for i in range(n)], [text(7) for _ in range(n)], padding=True, return_tensors="pt")
    return dict(q), dict(p), (dict(nb) if neg else None)


def test_gradients_reach_only_the_fast_encoders(checkpoint, tokenizer):
    model = two_towers(checkpoint)
    loss_fn = XMoCoLoss(model, queue_size=16)
    q, p, n = batches(tokenizer)
    loss_fn(q, p, n).backward()
    assert all(p_.grad is None and not p_.requires_grad for p_ in loss_fn.slow.parameters())
    for tower in (model.query_encoder, model.passage_encoder, model.query_projection, model.passage_projection):
        assert any(p_.grad is not None and p_.grad.abs().sum() > 0 for p_ in tower.parameters())
    assert not loss_fn.passage_queue.vectors.requires_grad
    # the slow copies are not trained parameters: the optimizer sees only the model's
    own = {id(p_) for p_ in loss_fn.parameters() if p_.requires_grad}
    assert own == {id(p_) for p_ in model.parameters()}


def test_hard_negatives_are_slow_encoded_into_q_p(checkpoint, tokenizer):
    model = two_towers(checkpoint)
    loss_fn = XMoCoLoss(model, queue_size=16).eval()  # eval: no dropout, so vectors compare exactly
    q, p, n = batches(tokenizer)
    loss_fn(q, p, n)
    assert int(loss_fn.passage_queue.pointer) == 8 and int(loss_fn.question_queue.pointer) == 4
    with torch.no_grad():
        assert torch.allclose(loss_fn.passage_queue.vectors[:4], loss_fn.slow.encode_passage(p), atol=1e-6)
        assert torch.allclose(loss_fn.passage_queue.vectors[4:8], loss_fn.slow.encode_passage(n), atol=1e-6)
        assert torch.allclose(loss_fn.question_queue.vectors[:4], loss_fn.slow.encode_query(q), atol=1e-6)
    assert loss_fn.passage_queue.ids[4:8].tolist() == text_ids(n).tolist()
    assert loss_fn.passage_queue.ids[8:].tolist() == [EMPTY] * 8


# -- trainer: export and resume -----------------------------------------------------------------

def train_bi_encoder(*args, device="cpu", **kwargs):
    return _train_bi_encoder(*args, device=device, **kwargs)


def make_examples(n=12, pool=2, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        query = " ".join(rng.choices(WORDS, k=rng.randint(2, 5)))
        out.append(TrainExample(
            qid=f"q{i}", query=query, positive_id=f"p{i}",
            positive=(f"title {i % 5}", query + " " + " ".join(rng.choices(WORDS, k=rng.randint(3, 8)))),
            negatives=[(f"neg {j}", " ".join(rng.choices(WORDS, k=rng.randint(3, 8)))) for j in range(pool)]))
    return out


def tiny_args(**kw):
    base = dict(lr=1e-3, batch_size=4, max_steps=4, warmup_ratio=0.25, hard_negatives=1,
                query_max_len=16, passage_max_len=24, seed=0)
    return TrainerArgs(**{**base, **kw})


def test_export_keeps_only_the_fast_encoders(checkpoint, tmp_path):
    from models.export import export_bi_encoder

    model = two_towers(checkpoint)
    loss_fn = XMoCoLoss(model, queue_size=16, momentum=0.5)
    train_bi_encoder(model, loss_fn, make_examples(), tiny_args(max_steps=3), tmp_path / "run", progress=False)
    saved = BiEncoder.from_pretrained(tmp_path / "run" / "final")
    assert saved.state_dict().keys() == model.state_dict().keys()
    for name, tensor in saved.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name
    # the slow copies moved only halfway to the fast ones: the export is not them
    slow = loss_fn.slow.query_encoder.embeddings.word_embeddings.weight
    assert not torch.equal(saved.query_encoder.embeddings.word_embeddings.weight, slow)
    files = [p.name for p in (tmp_path / "run" / "final").rglob("*")]
    assert not any("slow" in f or "queue" in f for f in files)
    paths = export_bi_encoder(model, tmp_path / "export")
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["passage_encoder", "query_encoder"]
    assert paths["passage"].name == "passage_encoder"


def test_resume_restores_queues_and_slow_encoders_exactly(checkpoint, tmp_path):
    examples = make_examples(n=12)
    # queue 12 < 6 steps x 8 passage vectors: the queues wrap around before and after the resume
    args = tiny_args(max_steps=6, checkpoint_every=2)
    one = two_towers(checkpoint, seed=1)
    one_loss = XMoCoLoss(one, queue_size=12, momentum=0.5)
    result_one = train_bi_encoder(one, one_loss, examples, args, tmp_path / "one", progress=False)

    first = two_towers(checkpoint, seed=1)
    with pytest.raises(Crash):
        train_bi_encoder(first, XMoCoLoss(first, queue_size=12, momentum=0.5), examples, args, tmp_path / "two",
                         callbacks=[crash_at(5)], progress=False)
    second = two_towers(checkpoint, seed=3)  # other projections, fresh queues: the checkpoint restores them
    second_loss = XMoCoLoss(second, queue_size=12, momentum=0.5)
    result = train_bi_encoder(second, second_loss, examples, args, tmp_path / "two", progress=False)
    assert result["resumed_from"].endswith("step-0000004")
    for queue in ("passage_queue", "question_queue"):
        a, b = getattr(one_loss, queue), getattr(second_loss, queue)
        assert torch.equal(a.ids, b.ids) and torch.equal(a.pointer, b.pointer), queue
        assert torch.allclose(a.vectors, b.vectors, atol=1e-6, rtol=0), queue
    assert (one_loss.passage_queue.ids != EMPTY).all()  # it filled and wrapped
    for (name, a), (_, b) in zip(one_loss.slow.state_dict().items(), second_loss.slow.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    for (name, a), (_, b) in zip(one.state_dict().items(), second.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6, rtol=0), name
    assert [h["loss"] for h in result_one["history"]] == pytest.approx([h["loss"] for h in result["history"]], abs=1e-6)


# -- two processes, gloo ------------------------------------------------------------------------

DDP_STEPS = 24


def _ddp_worker(rank, world, port, checkpoint, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        from tasks.training import Collator

        model = two_towers(checkpoint, seed=0)  # every rank starts from the same weights
        loss_fn = XMoCoLoss(model, queue_size=40, momentum=0.1)
        optimizer = torch.optim.AdamW([p for p in model.parameters()], lr=2e-3)
        collator = Collator(model.tokenizer, 16, 24, hard_negatives=1, seed=rank)
        examples = make_examples(n=16, seed=0)[rank * 8:(rank + 1) * 8]  # each rank its own half
        losses = []
        for step in range(DDP_STEPS):
            batch = [examples[(step * 4 + i) % 8] for i in range(4)]
            q, p, n, _ = collator(batch, epoch=step)
            loss = loss_fn(q, p, n)
            optimizer.zero_grad()
            loss.backward()
            for param in model.parameters():  # what DDP does: average the gradients over ranks
                if param.grad is None:  # unused on every rank alike (BERT's pooler)
                    continue
                dist.all_reduce(param.grad)
                param.grad /= world
            optimizer.step()
            loss_fn.on_step_end(step + 1, model, optimizer)
            losses.append(float(loss.detach()))
        torch.save({"losses": losses, "queues": {k: v for k, v in loss_fn.state_dict().items() if "queue" in k},
                    "slow": loss_fn.slow.state_dict()}, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_share_queues_and_converge(checkpoint, tmp_path):
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, free_port(), str(checkpoint), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    for key, tensor in r0["queues"].items():
        assert torch.equal(tensor, r1["queues"][key]), key
    for key, tensor in r0["slow"].items():
        assert torch.allclose(tensor, r1["slow"][key], atol=1e-6), key
    # every step pushes 2 ranks x (4 positives + 4 negatives) passage vectors and 2 x 4 question
    # vectors through queues of 40: both ranks' vectors went into both ranks' queues
    assert (r0["queues"]["passage_queue.ids"] != EMPTY).all()
    assert int(r0["queues"]["passage_queue.pointer"]) == DDP_STEPS * 16 % 40
    assert int(r0["queues"]["question_queue.pointer"]) == DDP_STEPS * 8 % 40
    for losses in (r0["losses"], r1["losses"]):
        # from step 5 on both queues are full (a fixed number of candidates), so losses compare;
        # windows of 4 steps: each rank alternates between its two batches
        assert sum(losses[-4:]) / 4 < 0.85 * sum(losses[4:8]) / 4, losses


# -- config -------------------------------------------------------------------------------------

def test_config_selects_xmoco_and_refuses_a_bad_option(tmp_path):
    from tasks.config import ConfigError, load_config

    cfg = load_config(ROOT / "configs" / "xmoco.yaml")
    systems = {s.name: s for s in cfg.dense.systems}
    xmoco = systems["xmoco"]
    assert xmoco.train.loss == "xmoco" and xmoco.model.shared is False
    assert xmoco.train.schedule.max_steps == systems["dpr"].train.schedule.max_steps  # equal steps beside dpr
    full = load_config(ROOT / "configs" / "xmoco-full.yaml")
    options = {s.name: s.train.loss_options for s in full.dense.systems if s.train and s.train.loss == "xmoco"}
    assert options and all(o.get("queue_size", QUEUE_SIZE) == 16_384 and o.get("momentum", MOMENTUM) == 0.001
                           for o in options.values())
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"extends: {ROOT / 'configs' / 'xmoco.yaml'}\n"
                   "dense:\n  systems:\n    - name: x\n      model: {shared: false}\n"
                   "      train: {loss: xmoco, loss_options: {queue_sise: 64}}\n  hybrid: null\n")
    with pytest.raises(ConfigError, match="queue_sise"):
        load_config(bad)
