import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("OPENAI_API_KEY", "unused-dummy")

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

    with prefect_test_harness(server_startup_timeout=120):
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
