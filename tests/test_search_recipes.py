"""A runs artifact's manifest read once into a typed recipe (flows/recipes.py): every field a
ranker needs, and an error naming the manifest file when one is missing."""
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.recipes import Bm25Recipe, DenseRecipe, FusionRecipe, InputRef, recipe_of
from storage import Artifact
from tasks.compute.encode import EncodeSettings
from tasks.compute.origin import Origin

MODEL = {"base": "minilm", "shared": True, "pooling": "mean", "projection_dim": None, "normalize": True, "scale": 20.0}
SETTINGS = {"batch_size": 8, "passage_max_len": 64, "query_max_len": 16, "dtype": "float32", "bf16": False,
            "int8": False, "runtime": "torch"}


def _runs(tmp_path: Path, stage: str, manifest: dict) -> Artifact:
    return Artifact(stage, "v1", tmp_path / stage / "v1", manifest)


def _bm25(tmp_path):
    return _runs(tmp_path, "bm25_runs", {
        "variant": {"system": "bm25"}, "parameters": {"k1": 0.9, "b": 0.4, "k": 100, "threads": 2},
        "inputs": {"bm25_index": {"stage": "bm25_index", "version": "i1"},
                   "ingest_questions": {"stage": "questions", "version": "q1"}}})


def _dense(tmp_path, **origin):
    return _runs(tmp_path, "dense_runs", {
        "variant": {"system": "served"},
        "parameters": {"system": "served", "origin": {"model": MODEL, "model_input": "init", **origin},
                       "settings": SETTINGS, "k": 50},
        "inputs": {"encode:served": {"stage": "embeddings", "version": "e1"},
                   "index:served": {"stage": "faiss_index", "version": "f1"},
                   "init": {"stage": "dense_model", "version": "m1"}}})


def _fusion(tmp_path, method="linear"):
    return _runs(tmp_path, "hybrid_runs", {
        "variant": {"system": "hybrid(served)"},
        "parameters": {"system": "hybrid(served)", "method": method, "runs": ["search:served", "bm25_search"],
                       "rrf_k": 60, "k": 100},
        "stats": {"weights": [["bm25_search", 0.3], ["search:served", 1.0]]},  # not in fusion order
        "inputs": {"search:served": {"stage": "dense_runs", "version": "d1"},
                   "bm25_search": {"stage": "bm25_runs", "version": "b1"}}})


def test_bm25_runs_give_their_index_and_parameters(tmp_path):
    runs = _bm25(tmp_path)
    assert recipe_of(runs, {}) == Bm25Recipe(source=runs.path, system="bm25", depth=100, k1=0.9, b=0.4,
                                             index=InputRef("bm25_index", "bm25_index", "i1", runs.path))


def test_dense_runs_give_a_typed_encoder_and_settings(tmp_path):
    runs = _dense(tmp_path)
    recipe = recipe_of(runs, {})
    assert isinstance(recipe, DenseRecipe) and (recipe.system, recipe.depth, recipe.device) == ("served", 50, "auto")
    assert recipe.origin == Origin(model=MODEL, model_input="init") and recipe.settings == EncodeSettings(**SETTINGS)
    assert (recipe.index.stage, recipe.embeddings.stage, recipe.model) == (
        "faiss_index", "embeddings", InputRef("init", "dense_model", "m1", runs.path))


def test_the_config_that_ran_dense_runs_gives_their_device_and_model_folder(tmp_path):
    runs = _dense(tmp_path, model_input=None, init_hash="abc")
    with pytest.raises(RuntimeError, match="came from a model folder .* pass --config"):
        recipe_of(runs, {})
    origin = Origin(model=MODEL, init_path=str(tmp_path), init_hash="abc")
    stage = SimpleNamespace(params=SimpleNamespace(origin=origin, device="cpu"))
    recipe = recipe_of(runs, {("dense_runs", "v1"): stage})
    assert (recipe.origin, recipe.device, recipe.model) == (origin, "cpu", None)


def test_a_linear_fusion_gives_its_weights_in_fusion_order(tmp_path):
    recipe = recipe_of(_fusion(tmp_path), {})
    assert isinstance(recipe, FusionRecipe) and recipe.method == "linear" and recipe.weights == (1.0, 0.3)
    assert [part.key for part in recipe.parts] == ["search:served", "bm25_search"]
    rrf = recipe_of(_fusion(tmp_path, "rrf"), {})
    assert (rrf.rrf_k, rrf.weights, rrf.depth) == (60, None, 100)


def test_an_embedding_fusion_and_a_non_runs_artifact_are_refused(tmp_path):
    embedding = _runs(tmp_path, "hybrid_runs", {"variant": {"system": "emb"}, "parameters": {"systems": ["a", "b"]}})
    with pytest.raises(ValueError, match="emb is an embedding fusion"):
        recipe_of(embedding, {})
    with pytest.raises(ValueError, match="passages is not a runs artifact"):
        recipe_of(_runs(tmp_path, "passages", {}), {})


def _without(artifact: Artifact, section: str, name: str) -> Artifact:
    del artifact.manifest[section][name]
    return artifact


@pytest.mark.parametrize("make,section,name,named", [
    (_bm25, "parameters", "k1", "parameters.k1"),
    (_bm25, "inputs", "bm25_index", "input 'bm25_index'"),
    (_dense, "parameters", "settings", "parameters.settings"),
    (_dense, "parameters", "origin", "parameters.origin"),
    (_dense, "inputs", "init", "input 'init'"),
    (_fusion, "parameters", "method", "parameters.method"),
    (_fusion, "stats", "weights", "stats.weights"),
])
def test_a_missing_field_names_the_manifest_file_and_the_field(tmp_path, make, section, name, named):
    runs = _without(make(tmp_path), section, name)
    with pytest.raises(RuntimeError) as caught:
        recipe_of(runs, {})
    assert str(caught.value).startswith(f"{runs.path / 'manifest.json'}: {runs.stage} v1 records no {named},")


def test_a_malformed_field_names_the_manifest_file(tmp_path):
    runs = _dense(tmp_path)
    runs.manifest["parameters"]["settings"] = {**SETTINGS, "runtime": "tpu"}
    with pytest.raises(RuntimeError, match=rf"^{runs.path / 'manifest.json'}: parameters.settings: "):
        recipe_of(runs, {})
    fused = _fusion(tmp_path)
    fused.manifest["stats"]["weights"] = [["bm25_search", 0.3]]
    with pytest.raises(RuntimeError, match="records no stats.weights of search:served"):
        recipe_of(fused, {})
