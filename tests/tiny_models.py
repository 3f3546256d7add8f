"""Tiny random BERTs with a toy WordPiece vocabulary, for the model, training, export and
encoding tests (the `checkpoint` and `tokenizer` fixtures in conftest.py use them)."""
from pathlib import Path

import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

WORDS = ("the of what is who capital france paris city river title passage text "
         "where does flow through seine largest").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [chr(c) for c in range(97, 123)]


def tiny_bert(seed=0, max_positions=64):
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=max_positions)
    return BertModel(cfg).eval()


def save_tiny_checkpoint(d: Path, max_positions=64) -> Path:
    """A tiny BertModel and a WordPiece tokenizer saved as a local checkpoint folder."""
    tiny_bert(max_positions=max_positions).save_pretrained(d)
    (d / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    # transformers 5 ignores BertTokenizer(vocab_file=...); load the folder instead
    BertTokenizerFast.from_pretrained(str(d)).save_pretrained(d)
    return d
