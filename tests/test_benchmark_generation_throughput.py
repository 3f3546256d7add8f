"""benchmarks/generation_throughput.py's quality table: every system at --quality-seeds seeds with
each one's spread (--quality-only: no timing)."""
import pytest
import torch

from tests.benchmark_scripts import benchmark_script
from tests.test_ctranslate2_generator import llama  # noqa: F401  (fixture)


def test_quality_seeds_score_every_system_at_each_seed(llama, shared_data, capsys):  # noqa: F811
    pytest.importorskip("llama_cpp")
    threads = torch.get_num_threads()
    try:
        with benchmark_script("generation_throughput") as script:
            result = script.main(["--generator", str(llama), "--limit", "2", "--queries-per-passage", "2",
                                  "--max-new-tokens", "3", "--batch-size", "2", "--threads", "1", "--seed", "3",
                                  "--ct2", "", "--llamacpp", "float32", "--quality", "3", "--quality-seeds", "2",
                                  "--quality-only"])
    finally:
        torch.set_num_threads(threads)
    assert set(result["quality"]) == {"torch seed 3", "torch seed 4", "llama.cpp float32 seed 3", "llama.cpp float32 seed 4"}
    assert all(s["questions"] > 0 for s in result["quality"].values())
    out = capsys.readouterr().out
    assert "Over seeds 3-4" in out and "passages/s" not in out  # the summary, and no timing table
    summary = out[out.index("Over seeds 3-4"):]
    assert "| torch |" in summary and "| llama.cpp float32 |" in summary
