from pathlib import Path

import pytest

from tasks.config import ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", ["squad-open", "tiny", "nfcorpus", "squad-open-dense"])
def test_shipped_configs_validate(name):
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert cfg.name == name
    assert cfg.bm25.k1 == 0.9 and cfg.bm25.b == 0.4


def test_defaults_follow_the_papers():
    cfg = load_config(CONFIGS / "squad-open.yaml")
    assert cfg.chunk.words == 100 and cfg.chunk.stride is None


def test_bad_config_names_file_and_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndata: {squad: {path: a.json}}\nbm25: {k1: -1}\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*bm25\.k1"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("name: x\ndata: {squad: {path: a.json}}\nchunk: {wordz: 5}\n")
    with pytest.raises(ConfigError, match=r"chunk\.wordz"):
        load_config(typo)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="broken.yaml"):
        load_config(broken)
