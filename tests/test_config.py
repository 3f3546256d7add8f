from pathlib import Path

import pytest

from tasks.config import ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("name", ["squad-open", "demo", "tiny", "nfcorpus", "nfcorpus-dense", "bm25", "zero-shot", "dpr",
                                  "bidirectional", "paper-scale", "nfcorpus-transfer"])
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


def test_recipes_extend_the_default_and_follow_their_papers():
    default = load_config(CONFIGS / "squad-open.yaml")
    assert [s.name for s in default.dense.systems] == ["zero-shot", "minilm-dpr", "stage1", "two-stage"]
    assert default.dense.hybrid and not default.dense.systems[2].evaluate
    # paper 002 section 3.1 sampling; stage 2 starts from stage 1 (paper 003 section 4.1)
    g = default.qgen.generate
    assert (g.top_p, g.top_k) == (0.95, 25) and default.dense.systems[3].init_from == "stage1"
    assert default.dense.systems[2].train.pairs == ["synthetic"] and default.dense.systems[2].train.negatives == ["context"]
    full = load_config(CONFIGS / "two-stage-full.yaml").qgen
    assert full.generate.max_passages is None and full.generate.queries_per_passage == 5 and full.finetune.max_pairs is None
    assert load_config(CONFIGS / "bm25.yaml").dense is None and load_config(CONFIGS / "bm25.yaml").qgen is None
    dpr = load_config(CONFIGS / "dpr.yaml")
    assert dpr.data == default.data and dpr.split == default.split  # inherited, not copied
    (system,) = dpr.dense.systems
    assert (system.model.shared, system.model.pooling, system.train.loss, system.train.schedule.hard_negatives) == (False, "cls", "dpr", 1)
    (bidi,) = load_config(CONFIGS / "bidirectional.yaml").dense.systems
    assert (bidi.model.shared, bidi.model.pooling, bidi.model.projection_dim, bidi.train.loss) == (True, "cls", 384, "bidirectional")
    paper = {s.name: s.train.schedule for s in load_config(CONFIGS / "paper-scale.yaml").dense.systems if s.train}
    assert {(t.batch_size, t.epochs, t.lr) for t in paper.values()} == {(128, 40, 3e-5)}


def test_extends_merges_mappings_and_replaces_lists(tmp_path):
    (tmp_path / "base.yaml").write_text(
        "name: base\ndata: {squad: {path: a.json}}\nbm25: {k1: 1.2, k: 50}\nevaluation: {ks: [1, 5, 20]}\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nname: child\nbm25: {k: 10}\nevaluation: {ks: [3]}\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert (cfg.name, cfg.bm25.k1, cfg.bm25.k, cfg.evaluation.ks) == ("child", 1.2, 10, [3])
    assert cfg.data.squad.path == "a.json"


@pytest.mark.parametrize("files, load, error", [
    ({"a.yaml": "extends: b.yaml\nname: a\n", "b.yaml": "extends: a.yaml\nname: b\n"}, "a.yaml",
     r"b\.yaml: extends: a\.yaml makes a cycle"),
    ({"c.yaml": "extends: missing.yaml\n"}, "c.yaml", r"c\.yaml: extends: no config file .*missing\.yaml"),
    ({"c.yaml": "extends: 3\n", "d.yaml": "extends: c.yaml\n"}, "d.yaml", r"c\.yaml: extends: expected a config path"),
    ({"e.yaml": "- a list\n"}, "e.yaml", r"e\.yaml: a config is a mapping"),
])
def test_extends_errors_name_the_file(tmp_path, files, load, error):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=error):
        load_config(tmp_path / load)


@pytest.mark.parametrize("text,field", [
    ("name: tiny v1.2\n", "name"),                # a folder, a Prefect artifact key and a deployment name
    ("name: x\nchunk: {words: -5}\n", "chunk.words"),  # 0 means whole documents; negative means nothing
    ("name: x\ndense: {systems: [{name: a, train: {loss: nope}}]}\n", "loss"),
    ("name: x\ndense: {systems: [{name: a, init_from: b}]}\n", "init_from"),
    ("name: x\ndense: {systems: [{name: a, evaluate: false}]}\n", "evaluate"),  # nothing to do
    ("name: x\ndense: {systems: [{name: a, train: {negatives: [coarse]}}]}\n", "negatives"),  # undefined strategy
    ("name: x\nnegatives: {dense: {coarse: {system: nope}}}\ndense: {systems: [{name: a}]}\n", "coarse"),
    ("name: x\nnegatives: {dense: {bm25: {system: a}}}\ndense: {systems: [{name: a}]}\n", "bm25"),  # built-in name
    ("name: x\ndense: {systems: [{name: a, train: {negatives: [mixed]}}]}\n", "mixed"),  # coarse, fine undefined
    ("name: x\ndense: {systems: [{name: a, evaluate: false, train: {}}], hybrid: {system: a}}\n", "evaluate"),
])
def test_meaningless_values_are_refused_at_load(tmp_path, text, field):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"c\.yaml.*{field}"):
        load_config(path)


def test_the_demo_runs_every_stage_of_the_embedded_default_on_less_work():
    """`make demo` (configs/demo.yaml) is squad-open.yaml's chain, every stage, at a smaller size."""
    from flows.registry import plan_for

    default, demo = load_config(CONFIGS / "squad-open.yaml"), load_config(CONFIGS / "demo.yaml")
    assert set(plan_for(demo).stages) == set(plan_for(default).stages)
    assert demo.data.squad.max_articles < 48 and demo.data.wikipedia_max_pages is not None
    assert demo.qgen.generate.max_passages < default.qgen.generate.max_passages
    assert demo.qgen.finetune.max_pairs < default.qgen.finetune.max_pairs
    for small, full in zip(demo.dense.systems, default.dense.systems, strict=True):
        assert small.model_dump(exclude={"train"}) == full.model_dump(exclude={"train"})
        if full.train is not None:
            assert small.train.schedule.max_steps < full.train.schedule.max_steps
            assert small.train.model_dump(exclude={"schedule": {"max_steps"}}) == \
                full.train.model_dump(exclude={"schedule": {"max_steps"}})
    assert "configs/demo.yaml" in (CONFIGS.parent / "Makefile").read_text()


def test_whole_documents_have_one_spelling():
    # words: 0 is the only way to say "whole documents", so one output has one version.
    assert load_config(CONFIGS / "nfcorpus.yaml").chunk.words == 0


def test_a_train_only_system_trains_and_is_not_searched(tmp_path):
    from flows.registry import plan_for

    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndense: {systems: [{name: s1, evaluate: false, train: {}},"
                    " {name: s2, init_from: s1, train: {}}]}\n")
    names = set(plan_for(load_config(path)).stages)
    assert {"train:s1", "train:s2", "encode:s2", "search:s2"} <= names
    assert not {n for n in names if n.endswith(":s1") and not n.startswith("train:")}


# Every reference and range is checked when the config loads, not after the pipeline started.
CE = "cross_encoder: {}\n"


@pytest.mark.parametrize("text,message", [
    ("name: x\nqgen: {generator: no-such-model}\n", r"qgen\.generator: 'no-such-model' is a hub name, but the hub is offline"),
    ("name: x\nqgen: {generator: 'no such model'}\n", r"qgen\.generator: 'no such model' is not a model"),
    ("name: x\nqgen: {generator: ./no/such/folder}\n", r"qgen\.generator: './no/such/folder' is not a model"),
    ("name: x\ndense: {systems: [{name: a, model: {base: nosuch}}]}\n", r"dense\.systems\.a\.model\.base: 'nosuch'"),
    ("name: x\n" + CE.replace("{}", "{base: nosuch}"), r"cross_encoder\.base: 'nosuch'"),
    ("name: x\npretrain: [{name: p, form: passage-passage, base: nosuch}]\n", r"pretrain\.p\.base: 'nosuch'"),
    ("name: x\n" + CE + "rerank: [{run: nosuchsystem}]\n", r"rerank run 'nosuchsystem' names no system.*'bm25'"),
    ("name: x\ndense: {systems: [{name: a}]}\n" + CE + "rerank: [{run: a}, {run: a}]\n", r"rerank systems \['a-rerank'\]"),
    ("name: x\ndense: {systems: [{name: a}]}\n" + CE + "rerank: [{run: bm25, name: a}]\n", r"rerank systems \['a'\]"),
    ("name: x\n" + CE + "rerank: [{run: bm25, name: r, mix: {name: r}}]\n", r"rerank systems \['r'\]"),
    ("name: x\n" + CE + "rerank: [{run: bm25, splits: [test], mix: {}}]\n",
     r"mix\.tune_split 'dev' is not reranked \(splits: \['test'\]\)"),
    ("name: x\n" + CE + "rerank: [{run: bm25, depth: 5, mix: {tune_k: 5}}]\n", r"mix\.tune_k 5 must be below depth 5"),
    ("name: x\n" + CE + "rerank: [{run: bm25, mix: {alphas: [0.5, 1.5]}}]\n", r"every alpha must be in \[0, 1\]"),
    ("name: x\nfusion: [{name: f, runs: [bm25, nope]}]\n", r"fusion 'f': runs \['nope'\] name no system"),
    ("name: x\ndense: {systems: [{name: a}]}\nfusion: [{name: f, runs: [bm25, g]}, {name: g, runs: [bm25, a]}]\n",
     r"fusion 'f': runs \['g'\]"),  # a fusion fuses earlier systems only
    ("name: x\ndense: {systems: [{name: a}]}\nfusion: [{name: a, runs: [bm25, a]}]\n", r"fusion 'a': the name is already"),
    ("name: x\nsilver: {retriever: nope}\n", r"silver\.retriever 'nope'"),
    ("name: x\nevaluation: {ks: [0]}\n", r"evaluation\.ks\.0: .*greater than or equal to 1"),
    ("name: x\nevaluation: {ks: [5, -1]}\n", r"evaluation\.ks\.1"),
    ("name: x\nevaluation: {ks: []}\n", r"evaluation\.ks"),
])
def test_references_and_ranges_are_checked_at_load(tmp_path, text, message, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as here and in CI: an uncached hub name is refused at load
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"c\.yaml: invalid config: .*{message}") as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_model_references_that_exist_are_accepted(tmp_path, monkeypatch):
    folder = tmp_path / "my-generator"
    folder.mkdir()
    for generator in ("smollm2", "SmolLM2", str(folder)):
        path = tmp_path / "c.yaml"
        path.write_text(f"name: x\nqgen: {{generator: '{generator}'}}\n")
        assert load_config(path).qgen.generator == generator
    # A hub name: refused offline unless the local hub cache holds it; accepted online (it may download).
    cache = tmp_path / "hub"
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    path.write_text("name: x\nqgen: {generator: some-org/t5-doc2query}\n")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"qgen\.generator: 'some-org/t5-doc2query' is a hub name, but the hub is offline"):
        load_config(path)
    (cache / "models--some-org--t5-doc2query" / "snapshots" / "abc123").mkdir(parents=True)
    assert load_config(path).qgen.generator == "some-org/t5-doc2query"
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    for name in ("other-org/uncached", "bert-base-uncased"):  # online: a legacy bare hub name is one too
        path.write_text(f"name: x\nqgen: {{generator: {name}}}\n")
        assert load_config(path).qgen.generator == name


def test_systems_a_config_produces_can_be_fused_and_reranked(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndense: {systems: [{name: a}], hybrid: {system: a}}\n" + CE +
                    "fusion: [{name: f, runs: [bm25, 'hybrid(a)']}, {name: g, method: rrf, runs: [f, a]}]\n"
                    "rerank: [{run: g}, {run: 'hybrid(a)'}, {run: bm25}]\nsilver: {retriever: a}\n")
    cfg = load_config(path)
    assert [r.system for r in cfg.rerank] == ["g-rerank", "hybrid-a-rerank", "bm25-rerank"]
    path.write_text("name: x\n" + CE + "rerank: [{run: bm25, mix: {}}, {run: bm25, name: r2, mix: {name: m2}}]\n")
    assert [r.systems for r in load_config(path).rerank] == [["bm25-rerank", "bm25-rerank-mix"], ["r2", "m2"]]



def test_every_tuned_system_shares_the_tuning_settings_with_its_own_defaults(tmp_path):
    """A hybrid, a fusion and a rerank's mix tune their weights with the same three settings; the
    mix's cut-off defaults to 1 (only the head's order is tuned), the others' to 20."""
    path = tmp_path / "c.yaml"
    path.write_text("name: x\ndense: {systems: [{name: a}], hybrid: {system: a, tune_metric: ndcg}}\n" + CE +
                    "fusion: [{name: f, runs: [bm25, a], tune_split: test}]\n"
                    "rerank: [{run: bm25, mix: {}}]\n")
    cfg = load_config(path)
    assert cfg.dense.hybrid.tuning() == {"tune_split": "dev", "tune_k": 20, "tune_metric": "ndcg"}
    assert cfg.fusion[0].tuning() == {"tune_split": "test", "tune_k": 20, "tune_metric": "auto"}
    assert cfg.rerank[0].mix.tuning() == {"tune_split": "dev", "tune_k": 1, "tune_metric": "auto"}
    path.write_text("name: x\n" + CE + "rerank: [{run: bm25, mix: {tune_metric: mrr}}]\n")
    with pytest.raises(ConfigError, match="tune_metric"):
        load_config(path)

@pytest.mark.parametrize("ratios, needle", [
    ("{train: -1, dev: 1, test: 1}", "train: -1.0"),
    ("{train: -1, dev: -1, test: -1}", "split.ratios"),
    ("{train: 0, dev: 0, test: 0}", "sum to a positive number"),
])
def test_split_shares_below_zero_or_summing_to_nothing_are_refused_at_load(tmp_path, ratios, needle):
    bad = tmp_path / "split.yaml"
    bad.write_text(f"name: x\ndata: {{squad: {{path: a.json}}}}\nsplit: {{ratios: {ratios}}}\n")
    with pytest.raises(ConfigError, match=r"split\.yaml") as error:
        load_config(bad)
    assert needle in str(error.value) and "split.ratios" in str(error.value)
