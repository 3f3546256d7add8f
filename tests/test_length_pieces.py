"""A padded batch encoded in length-sorted pieces (models/length_pieces.py): the same vectors and
gradients as the whole batch, in the batch's row order, each piece cut to its own longest row; the
trainer turns it on for a run and off after it (tiny random BERTs, seconds on a CPU)."""
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from models import BiEncoder, InBatchSoftmaxLoss  # noqa: E402
from models.losses import XMoCoLoss  # noqa: E402
from models.length_pieces import encoding_in_pieces  # noqa: E402
from models.length_pieces import batch_pieces, is_right_padded, length_pieces  # noqa: E402
from tasks.training import TrainerArgs, TrainExample  # noqa: E402
from tasks.training import train_bi_encoder  # noqa: E402
from tasks.training.arguments import CPU_ROWS_PER_PIECE, rows_per_piece  # noqa: E402

pytestmark = pytest.mark.usefixtures("flush_denormals")

TEXTS = ["paris", "the river seine flow through paris", "city", "what is the largest city of france",
         "the capital of france is paris the largest city", "seine", "where does the river flow"]


@pytest.fixture
def passages(tokenizer):
    """Seven passages of mixed lengths, right-padded to the longest, as the collator pads them."""
    return dict(tokenizer(["title"] * len(TEXTS), TEXTS, padding="longest", return_tensors="pt"))


def encoder_inputs(model):
    """The (rows, columns) of every batch the model's tower reads, recorded by a forward hook."""
    seen = []
    model.query_encoder.register_forward_pre_hook(lambda _, args, kwargs: seen.append(tuple(kwargs["input_ids"].shape)),
                                                  with_kwargs=True)
    return seen


def test_pieces_give_the_whole_batchs_vectors_in_its_row_order(checkpoint, passages):
    model = BiEncoder.from_pretrained(checkpoint, pooling="mean", normalize=True, projection_dim=8).eval()
    seen = encoder_inputs(model)
    with torch.no_grad():
        whole = model.encode_passage(passages)
        with encoding_in_pieces(model, 2):
            pieced = model.encode_passage(passages)
    torch.testing.assert_close(pieced, whole, atol=1e-5, rtol=1e-5)
    rows, longest = passages["input_ids"].shape
    assert seen[0] == (rows, longest)
    assert [r for r, _ in seen[1:]] == [2, 2, 2, 1]
    lengths = sorted(passages["attention_mask"].sum(1).tolist(), reverse=True)
    assert [c for _, c in seen[1:]] == lengths[::2], "each piece is cut to its own longest row"
    assert seen[-1][1] < longest
    assert model.rows_per_piece is None, "the setting ends with the block"


def test_gradients_through_pieces_are_the_whole_batchs(checkpoint, passages):
    grads = []
    for rows in (None, 3):
        torch.manual_seed(0)   # the same projection for both
        model = BiEncoder.from_pretrained(checkpoint, pooling="cls", projection_dim=8).eval()  # eval: no dropout
        with encoding_in_pieces(model, rows):
            vectors = model.encode_passage(passages)
        (vectors * torch.linspace(-1, 1, vectors.numel()).reshape(vectors.shape)).sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 4
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_only_a_right_padded_batch_of_more_rows_than_a_piece_is_cut():
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1], [1, 1, 1, 1]])
    assert is_right_padded(right) and not is_right_padded(left)
    assert not is_right_padded(torch.tensor([[1, 0, 1, 0]])), "a gap inside a row"
    pieces = length_pieces(right, 2)
    assert [(rows.tolist(), length) for rows, length in pieces] == [([2, 0], 4), ([1], 2)]
    assert length_pieces(left, 2) is None, "cutting on the left would move a row's positions"
    assert length_pieces(right, 3) is None and length_pieces(right, None) is None and length_pieces(None, 2) is None
    ids = torch.arange(12).reshape(3, 4)
    pieces = batch_pieces({"input_ids": ids, "attention_mask": right}, 2)
    assert [(rows.tolist(), piece["input_ids"].tolist()) for rows, piece in pieces] == [
        ([2, 0], [[8, 9, 10, 11], [0, 1, 2, 3]]), ([1], [[4, 5]])]
    whole = batch_pieces({"input_ids": ids, "attention_mask": right, "position_ids": torch.arange(4)[None]}, 2)
    assert [rows for rows, _ in whole] == [None], "a tensor not shaped as the mask: the batch is read whole"


def test_the_setting_reaches_every_encoder_a_loss_holds(checkpoint):
    model = BiEncoder.from_pretrained(checkpoint, shared=False, projection_dim=8)
    loss = XMoCoLoss(model, queue_size=8)
    encoders = [m for m in loss.modules() if isinstance(m, BiEncoder)]
    assert len(encoders) == 2, "the fast model and its slow copy"
    with encoding_in_pieces(loss, 4):
        assert [m.rows_per_piece for m in encoders] == [4, 4]
    assert [m.rows_per_piece for m in encoders] == [None, None]


def test_a_module_without_a_model_that_encodes_in_pieces_is_said_to_read_whole_batches(caplog):
    with caplog.at_level("WARNING", logger="passage_forge"):
        with encoding_in_pieces(torch.nn.Linear(2, 2), None):
            pass
        assert not caplog.records, "whole batches asked for: nothing to say"
        with encoding_in_pieces(torch.nn.Linear(2, 2), 8):
            pass
    assert "Linear holds no model that encodes in pieces" in caplog.text

def test_the_trainer_encodes_in_pieces_only_while_it_trains(checkpoint, tmp_path):
    examples = [TrainExample(qid=f"q{i}", query=" ".join(TEXTS[i % 7].split()[:3]), positive=("title", TEXTS[i % 7]),
                             positive_id=f"p{i}", negatives=[("title", TEXTS[(i + 3) % 7])]) for i in range(7)]
    examples = [e for e in examples if e.query]
    model = BiEncoder.from_pretrained(checkpoint, pooling="mean", normalize=True, scale=20.0)
    seen = encoder_inputs(model)
    args = TrainerArgs(lr=1e-3, batch_size=6, max_steps=2, hard_negatives=1, query_max_len=16, passage_max_len=24, seed=0)
    result = train_bi_encoder(model, InBatchSoftmaxLoss(model), examples, args, tmp_path, progress=False, device="cpu",
                              rows_per_piece=2)
    assert len(result["history"]) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in result["history"])
    assert seen and max(rows for rows, _ in seen) == 2, "every batch of 6 was encoded 2 rows at a time"
    assert model.rows_per_piece is None


@pytest.mark.parametrize("setting, device, expected", [
    ("auto", "cpu", CPU_ROWS_PER_PIECE), ("auto", "cuda", None), (4, "cuda", 4), (None, "cpu", None)])
def test_auto_cuts_batches_on_a_cpu_only(setting, device, expected, monkeypatch):
    import tasks.training.arguments as arguments

    monkeypatch.setattr(arguments, "resolve_device", lambda device: device)   # no GPU needed to plan for one
    assert rows_per_piece(setting, device) == expected


PAIRS = [("capital of france", t) for t in TEXTS]


def test_the_classifier_scores_pieces_as_the_whole_batch(checkpoint):
    from models.cross_encoder import CrossEncoderModel

    torch.manual_seed(0)
    model = CrossEncoderModel.from_base(str(checkpoint), max_length=32).eval()
    features = model.collate(PAIRS)
    seen = []
    model.backbone.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                             with_kwargs=True)
    with torch.no_grad():
        whole = model(features)
        with encoding_in_pieces(model, 3):
            pieced = model(features)
    torch.testing.assert_close(pieced, whole, atol=1e-5, rtol=1e-5)
    assert seen == [7, 3, 3, 1] and pieced.shape == (7,)


def test_classifier_training_cuts_its_batches_as_told_and_keeps_its_version(checkpoint, tmp_path):
    from flows.registry import plan_for
    from models.cross_encoder import CrossEncoderModel
    from tasks.config import PROJECT_ROOT, load_config
    from tasks.silver.classifier import ClassifierTrainArgs, train_classifier

    model = CrossEncoderModel.from_base(str(checkpoint), max_length=32)
    seen = []
    model.backbone.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape[0]),
                                             with_kwargs=True)
    args = ClassifierTrainArgs(lr=1e-3, batch_size=6, max_steps=2, warmup_ratio=0.0, seed=3, length_pieces=2)
    result = train_classifier(model, PAIRS, [1, 0, 1, 0, 1, 0, 1], args, tmp_path, device="cpu")
    assert len(result["history"]) == 2 and seen and max(seen) == 2
    assert model.rows_per_piece is None

    config = load_config(PROJECT_ROOT / "configs" / "silver.yaml")

    def planned(**train):   # how fast a step encodes is not part of the classifier's version
        teacher = config.cross_encoder.model_copy(update={"train": config.cross_encoder.train.model_copy(update=train)})
        return plan_for(config.model_copy(update={"cross_encoder": teacher})).planned_version("cross_encoder")
    assert planned(length_pieces=None) == planned(length_pieces=4) == planned()
    assert planned(seed=99) != planned()
