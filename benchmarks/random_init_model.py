"""Save a randomly initialised model (seeded) from a folder holding only config.json and the
tokenizer files: the architecture of a checkpoint whose weights are too big to travel (the lent
GPU machine takes 64 MiB per call). A step's or an encoding's cost does not depend on the values.

    python benchmarks/random_init_model.py --config-dir .devcarry/mpnet-config --out /tmp/mpnet
"""
from __future__ import annotations

import argparse


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config-dir", required=True, help="config.json and tokenizer files")
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, help="fewer layers (a quick check on a CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--causal-lm", action="store_true", help="with its language-model head (a question generator)")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(args.config_dir)
    if args.layers:
        config.num_hidden_layers = args.layers
    torch.manual_seed(args.seed)
    (AutoModelForCausalLM if args.causal_lm else AutoModel).from_config(config).save_pretrained(args.out)
    AutoTokenizer.from_pretrained(args.config_dir).save_pretrained(args.out)
    print(f"{args.out}: {config.model_type}, {config.num_hidden_layers} layers, hidden {config.hidden_size}, random init (seed {args.seed})")


if __name__ == "__main__":
    main()
