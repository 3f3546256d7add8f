import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("OPENAI_API_KEY", "unused-dummy")
# Tests call stages' builds outside a flow run, where Prefect's API log handler (on the
# passage_forge logger, PREFECT_LOGGING_EXTRA_LOGGERS) has no run to attach a record to and warns
# once per record; a pipeline run always logs inside its flow.
os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = PROJECT_ROOT.parent / "shared" / "data"


def running_in_ci() -> bool:
    """CI services set CI=true (GitHub Actions, GitLab CI, ...); .ci/run is what CI runs."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data, which the end-to-end tests need. Locally they skip without it; in CI a
    missing folder fails them instead, so the CI run cannot pass while silently skipping them."""
    if not SHARED_DATA.exists():
        if running_in_ci():
            pytest.fail(f"{SHARED_DATA} is absent and CI={os.environ['CI']}: the end-to-end tests "
                        "must run in CI, not skip", pytrace=False)
        pytest.skip(f"{SHARED_DATA} is absent")
    return SHARED_DATA


@pytest.fixture(scope="module")
def flush_denormals():
    """Tiny random BERTs produce subnormal floats that make CPU steps ~20x slower."""
    import torch

    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def prefect_harness():
    from prefect.testing.utilities import prefect_test_harness

    # generous: a loaded machine (a study beside the suite) starts the server in minutes, not seconds
    with prefect_test_harness(server_startup_timeout=600):
        yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random BERT and its toy WordPiece tokenizer, saved as a local checkpoint folder."""
    from tests.tiny_models import save_tiny_checkpoint

    return save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="module")
def tokenizer(checkpoint):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(checkpoint))


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A tiny random BERT with MiniLM's real vocabulary (real text tokenises sensibly), saved as a
    local checkpoint folder: the flow tests' dense and cross-encoder base."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from models.checkpoints import resolve_checkpoint

    folder = tmp_path_factory.mktemp("tiny_minilm_vocab")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=192)).save_pretrained(folder)
    shutil.copy(resolve_checkpoint("minilm") + "/vocab.txt", folder / "vocab.txt")
    BertTokenizerFast.from_pretrained(str(folder)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_generator(tmp_path_factory, shared_data):
    """A tiny random GPT-2 with a word-level tokenizer trained on three SQuAD articles: the
    question generator of the flow tests."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    from tasks.readers.squad import iter_squad_documents

    texts = [d["text"] for _, d in zip(range(3), iter_squad_documents(shared_data / "squad" / "dev-v1.1-partial.json"))]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts + ["Passage: Question: what who when ?"],
                            trainers.WordLevelTrainer(special_tokens=["<pad>", "</s>", "<unk>"], vocab_size=2000))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")
    folder = tmp_path_factory.mktemp("tiny_gpt2")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=32, n_layer=1, n_head=2,
                               bos_token_id=1, eos_token_id=1)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(autouse=True, scope="session")
def _cpu_without_bf16_units(tmp_path_factory):
    """Every machine runs the suite's pipelines on the same paths: `auto` resolves as on an AVX2 CPU
    (torch fp32), subprocesses included. Where the CPU has bf16 units, auto picks OpenVINO at bf16:
    tests/test_cpu_features.py and tests/test_encoder_runtimes.py check that choice and that path."""
    from models import cpu_features

    path = tmp_path_factory.mktemp("cpu") / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    patch = pytest.MonkeyPatch()
    patch.setenv(cpu_features.CPUINFO_ENV, str(path))
    cpu_features.cpu_flags.cache_clear()
    yield
    patch.undo()
    cpu_features.cpu_flags.cache_clear()


@pytest.fixture
def cpuinfo(tmp_path, monkeypatch):
    """`cpuinfo(text)` makes the processor read as `text` (a /proc/cpuinfo excerpt) for this test:
    the per-CPU choices (bf16 units, llama.cpp's bf16) have tests of their own."""
    from models import cpu_features

    def use(text):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        monkeypatch.setenv(cpu_features.CPUINFO_ENV, str(path))
        cpu_features.cpu_flags.cache_clear()
    yield use
    cpu_features.cpu_flags.cache_clear()


@pytest.fixture(autouse=True, scope="session")
def _runtime_cache(tmp_path_factory):
    """Converted models (models/runtime_cache.py) go to a folder of this run, not ~/.cache."""
    patch = pytest.MonkeyPatch()
    patch.setenv("PFORGE_RUNTIME_CACHE", str(tmp_path_factory.mktemp("runtime_cache")))
    yield
    patch.undo()
