"""benchmarks/roofline.py: the encoder FLOP count that the runtime benchmark's efficiency column rests on."""
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers import BertConfig, BertModel

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "roofline.py"
_spec = importlib.util.spec_from_file_location("benchmark_roofline", _PATH)
roofline = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("benchmark_roofline", roofline)
_spec.loader.exec_module(roofline)


def test_encoder_flops_match_torchs_count_of_a_bert_forward_over_unpadded_sequences():
    config = BertConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        vocab_size=100, attn_implementation="eager")  # eager: its attention is counted matmuls
    model = BertModel(config, add_pooling_layer=False).eval()
    lengths = [7, 19, 3]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        for t in lengths:  # one sequence per call: no padding, as the count assumes
            model(input_ids=torch.randint(0, 100, (1, t)))
    assert roofline.encoder_flops(32, 64, 2, lengths) == counter.get_total_flops()


def test_attention_term_grows_with_the_square_of_the_length():
    base = roofline.encoder_flops(8, 16, 1, [10])
    dense_only = 2 * (4 * 8 * 8 + 2 * 8 * 16) * 10
    assert base - dense_only == 4 * 10 * 10 * 8
    assert roofline.encoder_flops(8, 16, 1, [10, 10]) == pytest.approx(2 * base)


def test_measured_peaks_are_positive_rates_and_leave_torchs_thread_count_alone():
    before = torch.get_num_threads()
    assert roofline.sgemm_gflops(before + 1, n=64, repeat=1) > 0
    assert torch.get_num_threads() == before
    assert roofline.int8_gemm_gops(1, n=64, repeat=1) > 0


def test_decoder_prefill_flops_match_torchs_count_of_a_llama_prompt_pass():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    model = LlamaForCausalLM(config).eval()
    lengths = [5, 12]
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        for t in lengths:  # each prompt alone, the last token's logits only
            model(input_ids=torch.randint(0, 50, (1, t)), use_cache=False, logits_to_keep=1)
    kv_dim = 2 * 32 // 4  # two key/value heads of head size 8
    assert roofline.decoder_prefill_flops(32, 48, 2, kv_dim, 50, lengths) == counter.get_total_flops()
