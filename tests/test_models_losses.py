"""Losses against hand-computed values on toy embeddings.

Toy batch (B=2, D=2), used throughout:
    q = [[1, 0], [0, 2]]        p = [[2, 0], [1, 3]]
    q @ p.T = [[2, 1], [0, 6]]  (question -> passage)
    p @ q.T = [[2, 0], [1, 6]]  (passage -> question)
CE of a row with target t = logsumexp(row) - row[t] = log(sum_j exp(row[j] - row[t])).
"""
import math
from types import SimpleNamespace

import pytest
import torch

from models.losses import (
    LOSSES,
    BidirectionalSoftmaxLoss,
    InBatchSoftmaxLoss,
    WeightedInBatchSoftmaxLoss,
    WeightNormalization,
    build_loss,
    silver_weight,
)
from models.losses.base import forward_logits

E = math.exp
Q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
P = torch.tensor([[2.0, 0.0], [1.0, 3.0]])
# hard negatives, question-major: n0 belongs to q0, n1 to q1
NEG = torch.tensor([[0.0, 1.0], [1.0, 0.0]])

# forward rows: [2, 1] target 0 ; [0, 6] target 1
FWD_0 = math.log(1 + E(1 - 2))          # log(1 + e^-1)
FWD_1 = math.log(E(0 - 6) + 1)          # log(1 + e^-6)
FWD = (FWD_0 + FWD_1) / 2
# backward rows: [2, 0] target 0 ; [1, 6] target 1
BWD_0 = math.log(1 + E(0 - 2))          # log(1 + e^-2)
BWD_1 = math.log(E(1 - 6) + 1)          # log(1 + e^-5)
BWD = (BWD_0 + BWD_1) / 2
# with hard negatives, q @ [p0, p1, n0, n1].T = [[2, 1, 0, 1], [0, 6, 2, 0]]
HN_0 = math.log(1 + E(1 - 2) + E(0 - 2) + E(1 - 2))  # log(1 + 2e^-1 + e^-2)
HN_1 = math.log(E(0 - 6) + 1 + E(2 - 6) + E(0 - 6))  # log(1 + 2e^-6 + e^-4)


def model(scale=1.0):
    # the losses read only `similarity_scale` from the model in compute_loss_from_embeddings
    return SimpleNamespace(similarity_scale=scale)


def loss_of(cls, scale=1.0, **kw):
    return cls(model(scale), **kw)


def close(t, value):
    assert t.item() == pytest.approx(value, rel=1e-6, abs=1e-7)


def test_in_batch_hand_computed():
    close(loss_of(InBatchSoftmaxLoss).compute_loss_from_embeddings(Q, P), FWD)


def test_in_batch_scale_comes_from_model():
    # scale 2 doubles every logit: rows [4, 2] and [0, 12]
    expected = (math.log(1 + E(-2)) + math.log(1 + E(-12))) / 2
    close(loss_of(InBatchSoftmaxLoss, scale=2.0).compute_loss_from_embeddings(Q, P), expected)


def test_hard_negatives_widen_logits_to_n_plus_1_times_b():
    logits = forward_logits(Q, P, NEG, 1.0)
    assert logits.shape == (2, 4)  # (N+1)*B with N=1, B=2
    assert torch.equal(logits, torch.tensor([[2.0, 1.0, 0.0, 1.0], [0.0, 6.0, 2.0, 0.0]]))
    # N=2 per question, B=2 -> 6 columns; a (B, N, D) tensor is flattened question-major
    neg3 = torch.stack([torch.stack([NEG[0], NEG[1]]), torch.stack([NEG[1], NEG[0]])])
    assert forward_logits(Q, P, neg3, 1.0).shape == (2, 6)
    close(loss_of(InBatchSoftmaxLoss).compute_loss_from_embeddings(Q, P, negatives=NEG), (HN_0 + HN_1) / 2)


def test_negatives_must_be_a_multiple_of_batch():
    with pytest.raises(ValueError):
        forward_logits(Q, P, NEG[:1].repeat(3, 1), 1.0)


def test_bidirectional_is_half_forward_plus_backward():
    loss = loss_of(BidirectionalSoftmaxLoss)
    close(loss.compute_loss_from_embeddings(Q, P), 0.5 * (FWD + BWD))
    # hard negatives only in the question -> passage direction (paper 003 footnote 3)
    close(loss.compute_loss_from_embeddings(Q, P, negatives=NEG), 0.5 * ((HN_0 + HN_1) / 2 + BWD))


def test_weighted_all_ones_equals_unweighted():
    weighted = loss_of(WeightedInBatchSoftmaxLoss, normalization=WeightNormalization.SUM_OF_WEIGHTS)
    plain = loss_of(InBatchSoftmaxLoss)
    for neg in (None, NEG):
        a = weighted.compute_loss_from_embeddings(Q, P, negatives=neg, weights=torch.ones(2))
        b = plain.compute_loss_from_embeddings(Q, P, negatives=neg)
        close(a, b.item())
    close(weighted.compute_loss_from_embeddings(Q, P), FWD)  # no weights = all ones


def test_weighted_hand_computed_and_zero_weight_ignored():
    loss = loss_of(WeightedInBatchSoftmaxLoss, normalization=WeightNormalization.SUM_OF_WEIGHTS)
    w_silver = silver_weight(0.5)  # p = 0.5 -> w = 0.25
    assert w_silver == 0.25
    close(loss.compute_loss_from_embeddings(Q, P, weights=torch.tensor([1.0, w_silver])),
          (1 * FWD_0 + 0.25 * FWD_1) / 1.25)
    # a zero weight ignores that row: only row 0's CE remains
    close(loss.compute_loss_from_embeddings(Q, P, weights=torch.tensor([1.0, 0.0])), FWD_0)
    close(loss.compute_loss_from_embeddings(Q, P, weights=torch.tensor([0.0, 3.0])), FWD_1)


def test_weighted_other_normalizations():
    w = torch.tensor([1.0, 0.25])
    by_b = loss_of(WeightedInBatchSoftmaxLoss, normalization=WeightNormalization.BATCH_SIZE)
    close(by_b.compute_loss_from_embeddings(Q, P, weights=w), (FWD_0 + 0.25 * FWD_1) / 2)
    raw = loss_of(WeightedInBatchSoftmaxLoss, normalization=WeightNormalization("none"))
    close(raw.compute_loss_from_embeddings(Q, P, weights=w), FWD_0 + 0.25 * FWD_1)


def test_weighted_rejects_bad_weights():
    loss = loss_of(WeightedInBatchSoftmaxLoss, normalization=WeightNormalization.SUM_OF_WEIGHTS)
    with pytest.raises(ValueError):
        loss.compute_loss_from_embeddings(Q, P, weights=torch.ones(3))
    with pytest.raises(ValueError):
        loss.compute_loss_from_embeddings(Q, P, weights=torch.tensor([1.0, -1.0]))
    # all-zero weights: a zero loss, not NaN
    close(loss.compute_loss_from_embeddings(Q, P, weights=torch.zeros(2)), 0.0)


def test_unweighted_losses_refuse_weights():
    for cls in (InBatchSoftmaxLoss, BidirectionalSoftmaxLoss):
        with pytest.raises(ValueError):
            loss_of(cls).compute_loss_from_embeddings(Q, P, weights=torch.ones(2))


def test_matches_torch_cross_entropy_on_random_embeddings():
    g = torch.Generator().manual_seed(0)
    q, p, n = (torch.randn(4, 8, generator=g) for _ in range(3))
    n = torch.randn(8, 8, generator=g)  # N = 2 per question
    logits = 3.0 * q @ torch.cat([p, n]).T
    expected = torch.nn.functional.cross_entropy(logits, torch.arange(4))
    close(loss_of(InBatchSoftmaxLoss, scale=3.0).compute_loss_from_embeddings(q, p, negatives=n), expected.item())


def test_registry_maps_names_to_loss_classes():
    from models.losses import ListwiseKLLoss, MarginMSELoss, XMoCoLoss

    assert LOSSES == {"dpr": InBatchSoftmaxLoss, "bidirectional": BidirectionalSoftmaxLoss,
                      "weighted": WeightedInBatchSoftmaxLoss, "margin_mse": MarginMSELoss,
                      "listwise_kl": ListwiseKLLoss, "xmoco": XMoCoLoss}
    m = model(2.0)
    for name, cls in LOSSES.items():
        if name == "xmoco":  # needs two towers (tests/test_xmoco.py builds it)
            continue
        loss = build_loss(name, m)
        assert type(loss) is cls and loss.model is m and loss.scale == 2.0
    weighted = build_loss("weighted", m, normalization="batch_size", scale=3.0)
    assert weighted.normalization is WeightNormalization.BATCH_SIZE and weighted.scale == 3.0


def test_unknown_loss_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown loss 'moco'.*bidirectional, dpr, listwise_kl, margin_mse, weighted, xmoco"):
        build_loss("moco", model())


def test_losses_declare_whether_they_consume_weights():
    assert LOSSES["weighted"].uses_weights is True
    assert LOSSES["dpr"].uses_weights is False and LOSSES["bidirectional"].uses_weights is False
    from tasks.training.trainer import _wants_weights

    assert _wants_weights(build_loss("weighted", model())) and not _wants_weights(build_loss("dpr", model()))
