"""A transformers Llama-family causal model folder written as one GGUF file that llama.cpp runs
(models/llamacpp_generator.py): the weights (q8_0 or f32), the hyper-parameters, and a vocabulary
table. Only the weights and shapes matter to us: prompts travel to llama.cpp as token ids made by
the transformers tokenizer and samples come back as ids, so llama.cpp's own tokenizer is never
used; its tables are still written (llama.cpp refuses a file without them).

The names and the rotary permutation of the query and key projections are llama.cpp's layout for
the Llama architecture (its GGUF spec, `LLM_ARCH_LLAMA`); tests/test_llamacpp_generator.py holds
the written file's logits to the torch model's.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

#: bumped whenever what this module writes changes: part of the cached file's key (models/llamacpp_generator.py)
WRITER_VERSION = 2

#: qgen.generate.compute_type -> the GGUF tensor type of every matrix (norms stay f32)
TENSOR_TYPES = {"int8": "Q8_0", "float32": "F32", "bfloat16": "BF16"}
#: ... and the file type the header declares
FILE_TYPES = {"int8": "MOSTLY_Q8_0", "float32": "ALL_F32", "bfloat16": "MOSTLY_BF16"}

#: transformers parameter name (after "model.layers.N.") -> llama.cpp tensor name (after "blk.N.")
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                 "lm_head.weight": "output.weight"}

# llama.cpp's token types (llama_token_type in its GGUF vocabulary)
_NORMAL, _CONTROL, _USER_DEFINED, _UNUSED = 1, 3, 4, 5


def rope_permuted(weight: np.ndarray, heads: int) -> np.ndarray:
    """transformers' q/k rows (each head's rotary halves: first half, second half) reordered into
    llama.cpp's interleaved pairs (dimension 2i beside 2i + 1), head by head."""
    rows, cols = weight.shape
    return weight.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def llama_hparams(config: dict, where: Path) -> dict:
    """The hyper-parameters llama.cpp reads, from a transformers config.json; refuses what its
    Llama graph would compute differently (rotary scaling, biases)."""
    if config.get("model_type") != "llama":
        raise ValueError(f"{where}: model_type {config.get('model_type')!r}; the llamacpp runtime writes Llama-family "
                         "causal models only (set qgen.generate.runtime: torch)")
    # transformers 5 keeps the rotary settings in rope_parameters, earlier ones at the top level
    rope = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    unsupported = {"rope_type": rope_type if rope_type != "default" else None,
                   "hidden_act": config.get("hidden_act") if config.get("hidden_act", "silu") != "silu" else None,
                   "attention_bias": config.get("attention_bias"), "mlp_bias": config.get("mlp_bias")}
    for key, value in unsupported.items():
        if value:
            raise ValueError(f"{where}: {key} = {value!r} is not supported by the llamacpp export "
                             "(set qgen.generate.runtime: torch)")
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    if head_dim * heads != config["hidden_size"]:
        raise ValueError(f"{where}: head_dim {head_dim} x {heads} heads != hidden_size {config['hidden_size']}")
    return {"vocab": config["vocab_size"], "hidden": config["hidden_size"], "layers": config["num_hidden_layers"],
            "ffn": config["intermediate_size"], "heads": heads, "kv_heads": config.get("num_key_value_heads") or heads,
            "head_dim": head_dim, "context": config.get("max_position_embeddings", 2048),
            "rope_theta": float(rope.get("rope_theta", config.get("rope_theta", 10000.0))), "eps": float(config.get("rms_norm_eps", 1e-6)),
            "tied": bool(config.get("tie_word_embeddings", False))}


def vocabulary(source: Path, size: int) -> tuple[list[str], list[int], list[str]]:
    """(token strings by id, their llama.cpp types, BPE merges) from the folder's tokenizer, padded
    to the embedding's `size` rows with unused placeholders."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    if len(tok) > size:
        raise ValueError(f"{source}: the tokenizer has {len(tok)} tokens, the embedding {size} rows")
    tokens = [t if t is not None else f"[UNK{i}]" for i, t in enumerate(tok.convert_ids_to_tokens(list(range(len(tok)))))]
    types = [_NORMAL] * len(tokens)
    for i, added in getattr(tok, "added_tokens_decoder", {}).items():  # special added tokens are control tokens
        types[i] = _CONTROL if added.special else _USER_DEFINED
    for i in tok.all_special_ids:
        types[i] = _CONTROL
    tokens += [f"[PAD{i}]" for i in range(len(tokens), size)]
    types += [_UNUSED] * (size - len(types))
    merges: list[str] = []
    tokenizer_json = source / "tokenizer.json"
    if tokenizer_json.is_file():
        model = json.loads(tokenizer_json.read_text()).get("model", {})
        if model.get("type") == "BPE":
            merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, types, merges


def _state_dict(source: Path) -> dict[str, np.ndarray]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32)
    return {name: t.detach().cpu().numpy() for name, t in model.state_dict().items()}


def gguf_tensors(weights: dict[str, np.ndarray], hp: dict) -> dict[str, np.ndarray]:
    """llama.cpp's tensor names -> float32 arrays (q and k rope-permuted), for every weight the
    graph reads; an unknown or missing weight is an error rather than a silently wrong file."""
    out: dict[str, np.ndarray] = {}
    for name, array in weights.items():
        if name in _GLOBAL_NAMES:
            if name == "lm_head.weight" and hp["tied"]:
                continue  # tied: llama.cpp reads the embedding when output.weight is absent
            out[_GLOBAL_NAMES[name]] = array
            continue
        parts = name.split(".", 3)  # model, layers, N, rest
        if len(parts) != 4 or parts[:2] != ["model", "layers"] or parts[3] not in _LAYER_NAMES:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # a buffer computed from rope_theta
            raise ValueError(f"weight {name!r} has no llama.cpp counterpart in the Llama layout")
        target = f"blk.{parts[2]}.{_LAYER_NAMES[parts[3]]}"
        if parts[3] == "self_attn.q_proj.weight":
            array = rope_permuted(array, hp["heads"])
        elif parts[3] == "self_attn.k_proj.weight":
            array = rope_permuted(array, hp["kv_heads"])
        out[target] = array
    expected = {"token_embd.weight", "output_norm.weight"} | {
        f"blk.{i}.{n}" for i in range(hp["layers"]) for n in _LAYER_NAMES.values()}
    if not hp["tied"]:
        expected.add("output.weight")
    if missing := sorted(expected - set(out)):
        raise ValueError(f"weights missing for llama.cpp: {missing[:5]}")
    return out


def write_llama_gguf(source: str | Path, target: str | Path, compute_type: str) -> Path:
    """Write the transformers folder `source` as the GGUF file `target`: every matrix at
    `compute_type` (int8: q8_0, llama.cpp's 8-bit blocks of 32 with one scale each; float32: f32;
    bfloat16: bf16, which llama.cpp multiplies with AVX-512's bf16 dot product where the CPU has it),
    norms in f32."""
    import gguf

    source, target = Path(source), Path(target)
    if compute_type not in TENSOR_TYPES:
        raise ValueError(f"compute_type must be one of {sorted(TENSOR_TYPES)}, got {compute_type!r}")
    config_file = source / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{source}: no config.json (the llamacpp runtime converts a local transformers model folder)")
    hp = llama_hparams(json.loads(config_file.read_text()), config_file)
    tensors = gguf_tensors(_state_dict(source), hp)
    tokens, types, merges = vocabulary(source, hp["vocab"])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(source))
    quantized = getattr(gguf.GGMLQuantizationType, TENSOR_TYPES[compute_type])

    writer = gguf.GGUFWriter(str(target), "llama")
    writer.add_name(source.name)
    writer.add_context_length(hp["context"])
    writer.add_embedding_length(hp["hidden"])
    writer.add_block_count(hp["layers"])
    writer.add_feed_forward_length(hp["ffn"])
    writer.add_head_count(hp["heads"])
    writer.add_head_count_kv(hp["kv_heads"])
    writer.add_rope_dimension_count(hp["head_dim"])
    writer.add_rope_freq_base(hp["rope_theta"])
    writer.add_layer_norm_rms_eps(hp["eps"])
    writer.add_vocab_size(hp["vocab"])
    writer.add_file_type(getattr(gguf.LlamaFileType, FILE_TYPES[compute_type]))
    # the vocabulary is written for llama.cpp's loader only ("default" pre-tokenizer: never used)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    # llama.cpp's loader requires merges; a tokenizer without BPE merges (word-level) gets a placeholder
    writer.add_token_merges(merges or ["<unused> <merge>"])
    for add, token_id in ((writer.add_eos_token_id, tok.eos_token_id), (writer.add_bos_token_id, tok.bos_token_id),
                          (writer.add_pad_token_id, tok.pad_token_id), (writer.add_unk_token_id, tok.unk_token_id)):
        if token_id is not None:
            add(int(token_id))
    writer.add_add_bos_token(False)
    for name, array in tensors.items():
        array = np.ascontiguousarray(array, dtype=np.float32)
        # matrices whose rows split into q8_0's blocks of 32 are quantised (or rounded to bf16); norms (1-D) stay f32
        if array.ndim == 2 and quantized != gguf.GGMLQuantizationType.F32 and array.shape[1] % 32 == 0:
            writer.add_tensor(name, gguf.quants.quantize(array, quantized), raw_dtype=quantized)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
