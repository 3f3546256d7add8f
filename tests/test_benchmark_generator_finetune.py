"""benchmarks/generator_finetune.py: its systems train the same batches; ours-bf16 is ours under the
CPU's bf16 autocast (it moves the dev loss, ours does not), and --systems picks them."""
import math

import pytest
import torch

from tests.benchmark_scripts import benchmark_script
from tests.test_ctranslate2_generator import llama  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def generator_finetune():
    with benchmark_script("generator_finetune") as module:
        yield module


def test_bf16_system_trains_under_autocast_beside_the_fp32_ones(generator_finetune, llama, shared_data):  # noqa: F811
    threads = torch.get_num_threads()
    try:
        result = generator_finetune.main(["--generator", str(llama), "--squad", str(shared_data / "squad" / "dev-v1.1-partial.json"),
                                          "--batch-size", "2", "--steps-per-repeat", "1", "--repeat", "5",
                                          "--threads", "1", "--systems", "ours,ours-bf16"])
    finally:
        torch.set_num_threads(threads)
    after, losses = result["dev_loss_after"], result["train_losses"]
    assert set(after) == set(losses) == set(result["seconds_per_step"]) == {"model-loss", "ours", "ours-bf16"}
    assert all(math.isfinite(v) for v in after.values()) and all(len(v) == 6 for v in losses.values())
    # the first step: the same weights and batch for all; ours computes the peer's loss (float32 sums
    # in another order), bf16's 8-bit mantissas move it by more than float32 rounding, less than 2%
    first = {name: values[0] for name, values in losses.items()}
    assert first["ours"] == pytest.approx(first["model-loss"], rel=1e-5)
    assert first["ours-bf16"] != pytest.approx(first["ours"], rel=1e-5)
    assert first["ours-bf16"] == pytest.approx(first["ours"], rel=2e-2)
