"""models.export: exported towers load in sentence-transformers and plain transformers and give
the BiEncoder's embeddings (tiny random BERTs, seconds on CPU)."""
import json
import os

import pytest
import torch
import torch.nn.functional as F

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModel, AutoTokenizer  # noqa: E402

from models import BiEncoder, BiEncoderConfig, pool  # noqa: E402
from models.export import export_bi_encoder, export_encoder  # noqa: E402
from tests.tiny_models import tiny_bert  # noqa: E402

QUERIES = ["what is the capital of france", "where does the seine flow", "who"]
PASSAGES = ["paris is the capital city of france", "the river seine flow through paris",
            "largest city"]


def make(tokenizer, shared, pooling, projection_dim, normalize):
    torch.manual_seed(3)
    q = tiny_bert(0)
    p = None if shared else tiny_bert(1)
    model = BiEncoder(q, p, BiEncoderConfig(shared=shared, pooling=pooling, projection_dim=projection_dim,
                                            normalize=normalize, similarity_scale=20.0),
                      tokenizer=tokenizer)
    if projection_dim is not None and not shared:
        torch.nn.init.normal_(model.passage_projection.weight)  # make the towers' heads differ
    return model.eval()


def ours(model, tokenizer, texts, side):
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        fn = model.encode_query if side == "query" else model.encode_passage
        return fn(batch)


def by_hand(path, texts):
    """AutoModel + the pooling / Dense / Normalize described by the folder's module files."""
    tok = AutoTokenizer.from_pretrained(str(path))
    enc = AutoModel.from_pretrained(str(path)).eval()
    pooling_cfg = json.loads((path / "1_Pooling" / "config.json").read_text())
    mode = "cls" if pooling_cfg["pooling_mode_cls_token"] else "mean"
    batch = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        emb = pool(enc(**batch).last_hidden_state, batch["attention_mask"], mode)
    if (path / "2_Dense").is_dir():
        w = load_file(str(path / "2_Dense" / "model.safetensors"))
        emb = emb @ w["linear.weight"].T + w["linear.bias"]
    modules = json.loads((path / "modules.json").read_text())
    if any(m["type"].endswith("Normalize") for m in modules):
        emb = F.normalize(emb, dim=-1)
    return emb


@pytest.mark.parametrize("shared", [True, False], ids=["shared", "separate"])
@pytest.mark.parametrize("pooling", ["cls", "mean"])
@pytest.mark.parametrize("projection_dim,normalize", [(None, False), (None, True), (8, False), (8, True)],
                         ids=["plain", "norm", "proj", "proj+norm"])
def test_export_matches_bi_encoder(tmp_path, tokenizer, shared, pooling, projection_dim, normalize):
    from sentence_transformers import SentenceTransformer

    model = make(tokenizer, shared, pooling, projection_dim, normalize)
    paths = export_bi_encoder(model, tmp_path / "export")
    if shared:
        assert paths["query"] == paths["passage"] == tmp_path / "export"
    else:
        assert paths == {"query": tmp_path / "export" / "query_encoder",
                         "passage": tmp_path / "export" / "passage_encoder"}
    dim = projection_dim or 32
    for side, texts in (("query", QUERIES), ("passage", PASSAGES)):
        path = paths[side]
        expected = ours(model, tokenizer, texts, side)
        assert expected.shape == (len(texts), dim)
        st = SentenceTransformer(str(path), device="cpu")
        got = st.encode(texts, convert_to_tensor=True, batch_size=2)
        torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(by_hand(path, texts), expected, atol=1e-5, rtol=1e-5)
        cfg = json.loads((path / "config_sentence_transformers.json").read_text())
        assert cfg["similarity_fn_name"] == ("cosine" if normalize else "dot")
        assert (path / "2_Dense").is_dir() == (projection_dim is not None)
        get_dim = getattr(st, "get_embedding_dimension", None) or st.get_sentence_embedding_dimension
        assert get_dim() == dim
    if not shared:  # the two folders really hold different towers
        q = ours(model, tokenizer, QUERIES, "query")
        p = ours(model, tokenizer, QUERIES, "passage")
        assert not torch.allclose(q, p)


def test_export_encoder_files_and_errors(tmp_path, tokenizer):
    model = make(tokenizer, shared=True, pooling="mean", projection_dim=None, normalize=True)
    out = export_encoder(model, tmp_path / "m", side="passage", max_seq_length=48)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "modules.json",
                 "sentence_bert_config.json", "config_sentence_transformers.json", "1_Pooling/config.json"):
        assert (out / name).is_file(), name
    assert json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"] == 48
    types = [m["type"].rsplit(".", 1)[1] for m in json.loads((out / "modules.json").read_text())]
    assert types == ["Transformer", "Pooling", "Normalize"]
    info = json.loads((out / "passage_forge_export.json").read_text())
    assert info["similarity_scale"] == 20.0 and info["side"] == "shared"
    with pytest.raises(ValueError):
        export_encoder(model, tmp_path / "x", side="document")
    model.tokenizer = None
    with pytest.raises(ValueError):
        export_encoder(model, tmp_path / "y")
