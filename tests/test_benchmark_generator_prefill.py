"""benchmarks/generator_prefill.py: every system computes the torch model's last-token logits of the
same prompts (exactly enough for float32 paths to agree on the top token), and the agreement
columns measure what they say."""
import numpy as np
import pytest

from tests.benchmark_scripts import benchmark_script
from tests.test_ctranslate2_generator import llama  # noqa: F401  (fixture: a tiny Llama-layout generator)


@pytest.fixture(scope="module")
def prefill():
    with benchmark_script("generator_prefill") as module:
        yield module


def test_agreement_of_identical_and_of_shifted_distributions(prefill):
    logits = np.array([[2.0, 0.0, -1.0], [0.0, 1.0, 3.0]])
    same = prefill.agreement(logits, logits + 5.0)  # a constant shift is the same distribution
    assert same["top1"] == 1.0 and same["kl"] == pytest.approx(0.0, abs=1e-12)
    flipped = prefill.agreement(logits, logits[:, ::-1].copy())
    assert flipped["top1"] == 0.0 and flipped["kl"] > 1.0 and flipped["max_abs_dlogit"] == 3.0


def test_batches_run_longest_first_and_padding_keeps_each_prompts_tokens(prefill):
    groups = prefill.batches([[1], [1, 2, 3], [1, 2]], 2)
    assert groups == [[[1, 2, 3], [1, 2]], [[1]]]
    padded = prefill.right_padded(groups[0], pad_id=0)
    assert padded["input_ids"].tolist() == [[1, 2, 3], [1, 2, 0]]
    assert padded["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]


def test_every_system_computes_the_last_token_logits_of_the_torch_model(prefill, llama, tmp_path, monkeypatch):  # noqa: F811
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(prefill, "load_passages", lambda path, limit: [
        ("Normans", "The Normans were a people of Normandy in France and they gave their name to it."),
        ("Warsaw", "Warsaw is the capital of Poland."),
        ("Broncos", "The Broncos defeated the Panthers to win the title in the fiftieth game."),
    ][:limit])
    result = prefill.main(["--generator", str(llama), "--limit", "3", "--batch-size", "2", "--threads", "1",
                           "--repeat", "5", "--out", str(tmp_path / "r.json")])
    torch.set_num_threads(before)
    systems = result["systems"]
    assert set(systems) == {"torch", "llamacpp-int8", "llamacpp-float32", "onnx-fp32", "onnx-int8",
                            "onnx-int8-fp32-down"}
    assert result["prompts"] == 3 and (tmp_path / "r.json").exists()
    # float32 paths: the same logits up to float32 rounding over two layers
    for name in ("onnx-fp32", "llamacpp-float32"):
        assert systems[name]["top1"] == 1.0, name
        assert systems[name]["max_abs_dlogit"] < 1e-3, name
    for name, row in systems.items():
        assert len(row["tokens_per_s"]) == 5 and min(row["tokens_per_s"]) > 0, name
        assert row["kl"] < 0.05, name  # reduced precision moves the distribution a little, not to another one
