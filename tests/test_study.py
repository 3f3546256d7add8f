"""The study in pieces (flows/study/): its definition, the records a finished row leaves in the
repository, the tables built from those records alone, the prices of rows on this machine, and a
runner that builds rows within a budget and commits each record as it lands."""
import json
import subprocess
import sys

import pytest

from flows.study.cli import parse_duration
from flows.study.definition import load_study
from flows.study.estimate import measured_steps, price_step, seed_twins
from flows.study.records import RANK, read_records, write_questions, write_record
from flows.study.tables import Results, compare, study_tables
from tasks.config import PROJECT_ROOT

TEST_QIDS = [f"q{i:03d}" for i in range(40)]
ZEN3 = {"key": "AMD EPYC (family 25 model 1)", "threads": 2, "sgemm_gflops": 100.0}
ZEN5 = {"key": "AMD EPYC (family 26 model 2)", "threads": 2, "sgemm_gflops": 200.0}


def _study_folder(tmp_path, rows, claims=(), bars=(), config="configs/tiny.yaml", tables_file=None, shared=()):
    folder = tmp_path / "studies" / "mini"
    folder.mkdir(parents=True)
    lines = ["name: mini", f"default_config: {config}"] + ([f"tables_file: {tables_file}"] if tables_file else [])
    lines += ([f"shared: {json.dumps(list(shared))}"] if shared else []) + ["rows:"]
    lines += [f"  - {json.dumps(r)}" for r in rows]
    if claims:
        lines += ["claims:"] + [f"  - {json.dumps(c)}" for c in claims]
    if bars:
        lines += ["bars:"] + [f"  - {json.dumps(b)}" for b in bars]
    (folder / "study.yaml").write_text("\n".join(lines) + "\n")
    return load_study(folder / "study.yaml")


def _runs_record(study, row, ranks, machine=ZEN3, stages=()):
    digest = write_questions(study.folder, {"test": TEST_QIDS})
    return write_record(study.folder, {
        "row": row, "kind": "runs", "system": row, "stage": f"search:{row}", "commit": "c" * 40, "dirty": False,
        "machine": machine, "outcomes": {"measure": RANK, "questions": digest, "splits": {"test": list(ranks)}},
        "metrics": [], "stages": list(stages), "versions": {}})


def test_the_shipped_study_loads_and_names_real_rows():
    study = load_study("squad-open")
    names = [r.name for r in study.rows]
    assert len(names) == len(set(names))
    assert [r.priority for r in study.ordered()] == sorted(r.priority for r in study.rows)
    first = [r.name for r in study.ordered() if r.priority == 1]
    assert {"gold-s1", "stage1-s1", "two-stage-s1", "classifier", "generation", "hybrid-gold-s1-rerank"} <= set(first)
    claimed = {n for c in study.claims for n in (c.a, c.b, c.row) if n}
    assert claimed <= set(names)


def test_every_row_of_the_shipped_study_is_a_step_of_its_configs_plan(shared_data):
    from flows.study.status import Plans

    study = load_study("squad-open")
    plans = Plans(study)
    for row in study.rows:
        plan = plans(row)
        assert plan.resolve_name(row.stage) in plan, row.name
    for config, step in study.shared_steps():   # NFCorpus's generated queries too (CONFIG.yaml:STEP)
        assert plans.of(config).resolve_name(step) in plans.of(config), (config, step)
    assert (PROJECT_ROOT / "configs" / "nfcorpus-adapt-ablations.yaml", "pairs:silver") in study.shared_steps()


def test_a_shared_step_is_the_default_configs_or_names_its_config(tmp_path):
    study = _study_folder(tmp_path, [{"name": "bm25", "stage": "bm25_search", "priority": 1}],
                          shared=["pairs:silver", "configs/nfcorpus-adapt.yaml:pairs:silver"])
    assert study.shared_steps() == [(PROJECT_ROOT / "configs/tiny.yaml", "pairs:silver"),
                                    (PROJECT_ROOT / "configs/nfcorpus-adapt.yaml", "pairs:silver")]


def test_a_study_that_names_a_missing_row_or_a_row_twice_is_refused(tmp_path):
    with pytest.raises(ValueError, match="claims or bars name rows the study lacks: nowhere"):
        _study_folder(tmp_path, [{"name": "a", "stage": "bm25_search", "priority": 1}],
                      claims=[{"paper": "p", "claim": "c", "a": "a", "b": "nowhere", "k": 1}])
    with pytest.raises(ValueError, match="claims or bars name rows the study lacks: nowhere"):
        _study_folder(tmp_path / "b", [{"name": "a", "stage": "bm25_search", "priority": 1}],
                      bars=[{"bar": "a beats nowhere", "beats": [["a", "nowhere"]], "k": 1}])
    with pytest.raises(ValueError, match="bars.0: .*`beats` takes no row, rows or at_least"):
        _study_folder(tmp_path / "c", [{"name": "a", "stage": "bm25_search", "priority": 1}],
                      bars=[{"bar": "both", "beats": [["a", "a"]], "rows": ["a"], "k": 1, "at_least": 1}])
    with pytest.raises(ValueError, match="bars.0: .*give `beats`, or `row` or `rows` with `at_least`"):
        _study_folder(tmp_path / "d", [{"name": "a", "stage": "bm25_search", "priority": 1}],
                      bars=[{"bar": "no threshold", "rows": ["a"], "k": 1}])
    with pytest.raises(ValueError, match="rows named twice: a"):
        _study_folder(tmp_path / "x", [{"name": "a", "stage": "s", "priority": 1}, {"name": "a", "stage": "t", "priority": 2}])
    with pytest.raises(ValueError, match="no such study"):
        load_study("no-such-study")


def test_tables_come_from_the_records_alone(tmp_path, monkeypatch):
    """No artifact root anywhere: the records and their question list give the metrics, the
    paired bootstrap interval and the bars."""
    import tasks.evaluation.bootstrap as bootstrap

    resampled = []
    real = bootstrap.paired_bootstrap
    monkeypatch.setattr(bootstrap, "paired_bootstrap", lambda *a, **kw: resampled.append(1) or real(*a, **kw))
    study = _study_folder(
        tmp_path, [{"name": "a", "stage": "bm25_search", "priority": 1}, {"name": "b", "stage": "bm25_search", "priority": 1},
                   {"name": "c", "stage": "bm25_search", "priority": 2}, {"name": "d", "stage": "bm25_search", "priority": 2}],
        claims=[{"paper": "P1", "claim": "a beats b", "a": "a", "b": "b", "k": 1, "setting": "batch 16 (paper: 2,048)"},
                {"paper": "P2", "claim": "a beats c", "a": "a", "b": "c", "k": 1},
                {"paper": "P3", "claim": "b beats a", "a": "b", "b": "a", "k": 1},
                {"paper": "P4", "claim": "d beats a", "a": "d", "b": "a", "k": 1}],
        bars=[{"bar": "top-1 >= 60", "rows": ["a", "b"], "k": 1, "at_least": 60},
              {"bar": "a and d beat b", "beats": [["a", "b"], ["d", "b"]], "k": 1},
              {"bar": "a beats b and d", "beats": [["a", "b"], ["a", "d"]], "k": 1},
              {"bar": "a beats b and c", "beats": [["a", "b"], ["a", "c"]], "k": 1},
              {"bar": "b and c beat a", "beats": [["b", "a"], ["c", "a"]], "k": 1}])
    # a: 30 of 40 at rank 1; b: 10 of 40 at rank 1, 20 more at rank 5, the rest missed.
    _runs_record(study, "a", [1] * 30 + [3] * 10)
    _runs_record(study, "b", [1] * 10 + [5] * 20 + [None] * 10)
    _runs_record(study, "d", [1] * 30 + [3] * 10)   # a's outcomes: every resample's difference is 0
    results = Results(study)
    assert results.score("a", 1) == 75.0 and results.score("b", 1) == 25.0 and results.score("b", 5) == 75.0
    r = compare(results, "a", "b", 1, samples=2000)
    assert r["difference"] == pytest.approx(0.5) and 0 < r["low"] < 0.5 < r["high"]
    resampled.clear()
    text = study_tables(study, samples=2000)
    assert len(resampled) == 5   # a-b, b-a, d-a, d-b, a-d: a pair a bar shares with a claim is resampled once
    assert "| P1 | a beats b | top-1 75.0 vs 25.0 (a vs b) | [+" in text and "| yes | batch 16 (paper: 2,048) |" in text
    assert "| P2 | a beats c | not measured: c | - | - | - |" in text   # no setting given
    assert "| P3 | b beats a | top-1 25.0 vs 75.0 (b vs a) | [-" in text and "| no: B is better |" in text
    assert "| P4 | d beats a | top-1 75.0 vs 75.0 (d vs a) | [+0.0, +0.0] | not reproduced (the interval holds 0) |" in text
    assert "| top-1 >= 60 | a: top-1 75.0 (best of 2 of 2 rows measured) | met |" in text
    a_vs_b = text.split("(a vs b) | ")[1].split(" |")[0]   # a bar's interval is the reproduction table's
    assert f"| a and d beat b | a vs b: top-1 75.0 vs 25.0, {a_vs_b}; d vs b: top-1 75.0 vs 25.0, [+" in text
    assert text.split("| a and d beat b |")[1].split("\n")[0].endswith("| met |")
    assert "| a beats b and d | a vs b: top-1 75.0 vs 25.0, " in text and "; a vs d: top-1 75.0 vs 75.0, [+0.0, +0.0] | not met |" in text
    assert f"| a beats b and c | a vs b: top-1 75.0 vs 25.0, {a_vs_b}; not measured: c | - |" in text   # undecided
    assert "| b and c beat a | b vs a: top-1 25.0 vs 75.0, [-" in text and "; not measured: c | not met |" in text
    assert "| a | 40 | 75.0 | 100.0 | 100.0 | 100.0 | - | AMD EPYC (family 25 model 1), 2 threads; commit cccccccccc |" in text
    assert study_tables(study, samples=2000) == text   # the same records give the same tables


def test_a_row_measured_again_is_set_beside_its_replaced_record(tmp_path):
    """a's record replaced one of another CPU (kept): before -> now and the paired interval; b's
    replaced record was not kept: its line says so, with no figures."""
    from flows.study.records import keep_replaced

    study = _study_folder(tmp_path, [{"name": "a", "stage": "bm25_search", "priority": 1},
                                     {"name": "b", "stage": "bm25_search", "priority": 1},
                                     {"name": "c", "stage": "bm25_search", "priority": 1}])
    old = json.loads(_runs_record(study, "a", [1] * 20 + [3] * 20).read_text())
    keep_replaced(study.folder, {**old, "version": "0" * 16})
    replaces = {"recorded_at": old["recorded_at"], "commit": "c" * 40, "machine": ZEN3["key"], "version": "0" * 16}
    a = json.loads(_runs_record(study, "a", [1] * 30 + [3] * 10, machine=ZEN5).read_text())
    write_record(study.folder, {**a, "replaces": replaces})
    b = json.loads(_runs_record(study, "b", [1] * 40).read_text())
    write_record(study.folder, {**b, "replaces": {**replaces, "version": "1" * 16}})
    _runs_record(study, "c", [1] * 40)   # never measured again: not in the table
    assert sorted(read_records(study.folder)) == ["a", "b", "c"]
    text = study_tables(study, samples=2000)
    lines = text.split("<!-- --8<-- [start:measured-again] -->")[1].split("<!-- --8<-- [end:measured-again] -->")[0]
    rows = [line for line in lines.strip().splitlines()[2:]]
    assert len(rows) == 2
    assert rows[0].startswith(f"| a | {ZEN3['key']}, 2 threads; commit cccccccccc | {ZEN5['key']}, 2 threads; "
                              "commit cccccccccc | top-1 50.0 -> 75.0; top-20 100.0 -> 100.0 | top-1 +25.0 [+")
    assert rows[0].endswith("; top-20 +0.0 [+0.0, +0.0] |")
    assert rows[1] == (f"| b | {ZEN3['key']}; commit cccccccccc (its record is not kept under records/replaced/) | "
                       f"{ZEN3['key']}, 2 threads; commit cccccccccc | - | - |")


def test_the_claims_across_seeds_table_sets_each_claims_seeds_side_by_side(tmp_path):
    from flows.study.definition import seed_groups
    from flows.study.tables import verdicts_table

    names = ["a-s1", "b-s1", "a-s2", "b-s2", "c-s1", "nf:adapt", "nf:adapt-s2", "nf:zero"]
    study = _study_folder(
        tmp_path, [{"name": n, "stage": "bm25_search", "priority": 1} for n in names],
        claims=[{"paper": "P1", "claim": "a beats b", "a": "a-s1", "b": "b-s1", "k": 1},
                {"paper": "P1", "claim": "a beats b at top-5", "a": "a-s1", "b": "b-s1", "k": 5},
                {"paper": "P1", "claim": "a beats b (seed 2)", "a": "a-s2", "b": "b-s2", "k": 1},
                {"paper": "P2", "claim": "adapting beats zero-shot", "a": "nf:adapt", "b": "nf:zero", "k": 1},
                {"paper": "P2", "claim": "adapting beats zero-shot (seed 2)", "a": "nf:adapt-s2", "b": "nf:zero", "k": 1},
                {"paper": "P3", "claim": "c beats b", "a": "c-s1", "b": "b-s1", "k": 1}])
    groups = seed_groups(study.claims)
    assert [{seed: c.claim for seed, c in g.items()} for g in groups] == [
        {1: "a beats b", 2: "a beats b (seed 2)"}, {1: "a beats b at top-5"},
        {1: "adapting beats zero-shot", 2: "adapting beats zero-shot (seed 2)"}, {1: "c beats b"}]
    _runs_record(study, "a-s1", [1] * 30 + [3] * 10)
    _runs_record(study, "b-s1", [1] * 10 + [5] * 20 + [None] * 10)
    _runs_record(study, "a-s2", [1] * 30 + [3] * 10)
    _runs_record(study, "b-s2", [1] * 30 + [3] * 10)   # seed 2: no difference at all
    _runs_record(study, "nf:zero", [1] * 30 + [3] * 10)
    _runs_record(study, "nf:adapt", [1] * 10 + [5] * 30)
    _runs_record(study, "nf:adapt-s2", [1] * 12 + [5] * 28)
    lines = verdicts_table(Results(study), samples=2000)
    assert lines[0] == "| paper | claim | seed 1 | seed 2 | across seeds |"
    by_claim = {line.split(" | ")[1]: line for line in lines[2:]}
    assert by_claim["a beats b"].startswith("| P1 | a beats b | top-1 +50.0 [+")
    assert "| top-1 +0.0 [+0.0, +0.0] | reproduced at 1 of 2 seeds |" in by_claim["a beats b"]
    assert "| top-5 +25.0 [+" in by_claim["a beats b at top-5"]   # a: 40 of 40 in the top 5; b: 30
    assert by_claim["a beats b at top-5"].endswith("| (one seed) | reproduced (one seed) |")
    assert by_claim["adapting beats zero-shot"].endswith("| no: B is better at both seeds |")
    assert by_claim["c beats b"] == "| P3 | c beats b | not measured: c-s1 | (one seed) | - |"
    _runs_record(study, "b-s2", [1] * 10 + [5] * 20 + [None] * 10)
    again = {line.split(" | ")[1]: line for line in verdicts_table(Results(study), samples=2000)[2:]}
    assert again["a beats b"].endswith("| reproduced at both seeds |")
    assert "bf16" not in "\n".join(again.values())   # no model steps in these records: no precision to tell
    # A trained on a CPU with bf16 units, B on one without: `auto` ran them at different precisions.
    trained = [{"step": "train:x", "version": "v", "build_s": 60.0}]
    _runs_record(study, "a-s2", [1] * 30 + [3] * 10, machine={**ZEN5, "flags": ["avx2", "avx512_bf16"]}, stages=trained)
    _runs_record(study, "b-s2", [1] * 10 + [5] * 20 + [None] * 10, machine={**ZEN3, "flags": ["avx2"]}, stages=trained)
    text = study_tables(study, samples=500)
    assert "| top-1 +50.0 [+" in text and "], bf16 vs fp32 | reproduced at both seeds |" in text
    assert "(a-s2 vs b-s2, bf16 vs fp32) |" in text
    assert "| a-s2 | 40 | 75.0 | 100.0 | 100.0 | 100.0 | - | AMD EPYC (family 26 model 2), 2 threads, bf16; commit " in text
    from flows.study.tables import _across
    assert _across({1: ("", "yes"), 2: ("", "no, B is")}) == "reproduced at 1 of 2 seeds; B better at 1 of 2"
    assert _across({1: ("", "not shown"), 2: ("", "no, B is"), 3: ("", "not shown")}) == "B better at 1 of 3"
    assert _across({1: ("", "not shown"), 2: ("", "not shown"), 3: ("", "not shown")}) == "reproduced at none of 3 seeds"


def test_the_stage_times_table_names_another_configs_step_by_its_config(tmp_path):
    from flows.study.tables import stage_times_table

    study = _study_folder(tmp_path, [{"name": "a", "stage": "bm25_search", "priority": 1}])
    _runs_record(study, "a", [1] * 40, stages=[
        {"step": "qgen_model", "version": "g1", "build_s": 4000.0, "rows": 0},
        {"step": "qgen_model", "version": "g2", "build_s": 300.0, "rows": 0, "config": "configs/squad-open.yaml"}])
    steps = [line.split(" | ")[0].lstrip("| ") for line in stage_times_table(Results(study))[2:]]
    assert steps == ["qgen_model", "squad-open.yaml:qgen_model"]


def test_each_paper_gets_its_own_reproduction_table_to_include_and_a_joint_claim_is_in_both(tmp_path):
    study = _study_folder(
        tmp_path, [{"name": "a", "stage": "bm25_search", "priority": 1}, {"name": "b", "stage": "bm25_search", "priority": 1}],
        claims=[{"paper": "001 table 2", "claim": "a beats b", "a": "a", "b": "b", "k": 1},
                {"paper": "003 sec. 4.1", "claim": "b beats a", "a": "b", "b": "a", "k": 1},
                {"paper": "001 + 003 (NFCorpus)", "claim": "a beats b again", "a": "a", "b": "b", "k": 1}])
    text = study_tables(study, samples=200)
    sections = {name: text.split(f"[start:paper-{name}] -->")[1].split(f"<!-- --8<-- [end:paper-{name}]")[0]
                for name in ("001", "003")}
    assert "a beats b |" in sections["001"] and "a beats b again" in sections["001"] and "b beats a" not in sections["001"]
    assert "b beats a" in sections["003"] and "a beats b again" in sections["003"] and "a beats b |" not in sections["003"]
    assert all(body.count("| paper | claim |") == 1 for body in sections.values())   # each a whole table
    seeds = text.split("[start:paper-003-seeds] -->")[1].split("<!-- --8<-- [end:paper-003-seeds]")[0]
    assert "b beats a" in seeds and "a beats b again" in seeds and "a beats b |" not in seeds
    assert "[start:paper-P" not in text


def test_a_record_whose_outcomes_do_not_match_its_question_list_is_refused(tmp_path):
    study = _study_folder(tmp_path, [{"name": "a", "stage": "bm25_search", "priority": 1}])
    _runs_record(study, "a", [1, 2, 3])
    with pytest.raises(ValueError, match="3 outcomes on test, its question list has 40"):
        Results(study)
    (study.folder / "records" / "a.json").write_text("{not json")
    with pytest.raises(ValueError, match="a.json: not a record"):
        read_records(study.folder)


def test_the_committed_study_tables_are_what_the_records_give_now():
    """benchmarks/results/study_cpu.md is generated from studies/squad-open/records, never typed."""
    expected = study_tables(load_study("squad-open"))
    committed = (PROJECT_ROOT / "benchmarks" / "results" / "study_cpu.md").read_text(encoding="utf-8")
    assert committed == expected, "regenerate: pforge study tables > benchmarks/results/study_cpu.md"


def test_a_step_is_priced_from_this_cpu_then_another_cpu_scaled_then_its_first_seed_twin():
    records = {"r1": {"recorded_at": "2026-12-01T00:00:00+00:00", "machine": ZEN5,
                      "stages": [{"step": "train:gold-s1", "version": "v", "build_s": 1000.0}]},
               "r2": {"recorded_at": "2026-11-01T00:00:00+00:00", "machine": ZEN3,
                      "stages": [{"step": "encode:gold-s1", "version": "v", "build_s": 300.0}]}}
    measured = measured_steps(records)
    here = price_step("encode:gold-s1", measured, ZEN3)
    assert (here.seconds, here.basis) == (300.0, "this CPU")
    scaled = price_step("train:gold-s1", measured, ZEN3)   # the Zen 5's probe is twice this machine's
    assert scaled.seconds == pytest.approx(2000.0) and "scaled from AMD EPYC (family 26 model 2)" in scaled.basis
    twin = price_step("train:gold-s2", measured, ZEN3)
    assert twin.seconds == pytest.approx(2000.0) and twin.basis.startswith("as train:gold-s1")
    assert price_step("train:xmoco-s1", measured, ZEN3).seconds is None
    records["r3"] = {"recorded_at": "2026-11-02T00:00:00+00:00", "machine": ZEN3,
                     "stages": [{"step": "train:adapt-dpr", "version": "v", "build_s": 500.0}]}
    recipe = price_step("train:adapt-dpr-s2", measured_steps(records), ZEN3)   # the recipe's own seed
    assert (recipe.seconds, recipe.basis) == (500.0, "as train:adapt-dpr")
    records["r4"] = {"recorded_at": "2026-11-03T00:00:00+00:00", "machine": ZEN3,
                     "stages": [{"step": "train:silver", "version": "v", "build_s": 700.0}]}
    assert price_step("train:silver-s1", measured_steps(records), ZEN3).seconds is None   # a first seed has no twin


def test_only_a_later_seed_has_twins():
    assert seed_twins("train:gold-s2") == ["train:gold-s1", "train:gold"]
    assert seed_twins("negatives:mined-cocondenser-s12") == ["negatives:mined-cocondenser-s1", "negatives:mined-cocondenser"]
    assert seed_twins("train:gold-s1") == seed_twins("encode:zero-shot") == seed_twins("train:fine512") == []


def test_a_probe_lowered_by_busy_cores_prices_at_the_best_this_cpu_measured(repo):
    """A Zen 3 probing at 25 GFLOP/s beside the study, whose own record measured 100 quietly: a
    step timed on the Zen 5 (200) is priced at twice its time there, not eight times."""
    from flows.study.estimate import with_best_probe
    from flows.study.status import Plans, row_status, status_text

    _, study = repo
    busy = {**ZEN3, "sgemm_gflops": 25.0}
    steps = ["ingest_documents", "ingest_questions", "chunk", "link_gold", "bm25_index", "bm25_search"]
    records = {"zen5": {"recorded_at": "2026-12-01T00:00:00+00:00", "machine": ZEN5,
                        "stages": [{"step": s, "version": "v", "build_s": 60.0} for s in steps]},
               "zen3": {"recorded_at": "2026-11-01T00:00:00+00:00", "machine": ZEN3, "stages": []},
               "zen3-one-thread": {"machine": {**ZEN3, "threads": 1, "sgemm_gflops": 400.0}, "stages": []}}
    priced = with_best_probe(busy, records)
    assert (priced["sgemm_gflops"], priced["sgemm_gflops_now"]) == (100.0, 25.0)
    assert with_best_probe(ZEN5, records) is ZEN5 and with_best_probe(busy, {}) is busy
    status = row_status(study.row("bm25"), Plans(study), None, records, busy)
    assert [p.seconds for p in status.left] == [pytest.approx(120.0)] * 6
    assert "fp32 probe 100.0 GFLOP/s (the best measured on this CPU; 25.0 now)" in status_text(study, study.folder,
                                                                                                 [status], priced)


def test_the_status_columns_line_up_past_a_long_row_name(repo):
    from flows.study.definition import Row
    from flows.study.status import NOT_STARTED, RowStatus, status_text

    _, study = repo
    rows = [Row(name=name, stage="bm25_search", priority=3) for name in ("bm25", "nfcorpus:adapt-mmse-tuned-teacher-s2")]
    text = status_text(study, study.folder, [RowStatus(row, NOT_STARTED, "6 steps", []) for row in rows], ZEN3)
    table = text.splitlines()[4:]
    assert len(table) == 3 and len({line.index("not started") for line in table[1:]}) == 1
    assert table[0].index("state") == table[1].index("not started")


class _NoPlans:
    """Plans for a runner whose measuring is replaced: no plan, no references."""

    def __call__(self, row):
        return None

    def references(self, row):
        return []


def test_a_record_rewrites_the_tables_from_study_yaml_as_it_is_now(tmp_path, monkeypatch):
    """A row added to study.yaml while the runner runs is in the tables its next record writes; a
    study.yaml that does not load leaves the definition the run began with."""
    import flows.study.runner as runner

    study = _study_folder(tmp_path, [{"name": "bm25", "stage": "bm25_search", "priority": 1}], tables_file="mini.md")
    digest = write_questions(study.folder, {"test": TEST_QIDS})
    monkeypatch.setattr(runner, "measure_row", lambda *args: {
        "row": "bm25", "kind": "runs", "system": "bm25", "stage": "bm25_search", "metrics": [], "stages": [],
        "versions": {}, "outcomes": {"measure": RANK, "questions": digest, "splits": {"test": [1] * 40}}})
    monkeypatch.setattr(runner, "export_shared", lambda *args: [])   # this study shares no step
    definition = study.folder / "study.yaml"
    definition.write_text(definition.read_text() + '  - {"name": "bm25-added", "stage": "bm25_search", "priority": 2}\n')
    commit = {"commit": "c" * 40, "dirty": False}
    plans = _NoPlans()
    runner.record_row(study, study.row("bm25"), plans, tmp_path / "no-root", ZEN3, commit, repo=None)
    assert "1 of 2 rows measured" in (tmp_path / "mini.md").read_text()
    definition.write_text("rows: [\n")
    runner.record_row(study, study.row("bm25"), plans, tmp_path / "no-root", ZEN3, commit, repo=None)
    assert "1 of 1 rows measured" in (tmp_path / "mini.md").read_text()


def test_durations():
    assert [parse_duration(t) for t in ("150m", "2h", "2h30m", "90s")] == [9000, 7200, 9000, 90]
    for bad in ("", "soon", "0m", "5"):
        with pytest.raises(Exception):
            parse_duration(bad)


# ------------------------------------------------------------------ the runner, on the tiny config
@pytest.fixture
def repo(tmp_path):
    """A git checkout holding a study of two rows on configs/tiny.yaml (BM25 and nothing else)."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for key, value in (("user.email", "study@example.org"), ("user.name", "study")):
        subprocess.run(["git", "-C", str(tmp_path), "config", key, value], check=True)
    study = _study_folder(tmp_path, [{"name": "bm25", "stage": "bm25_search", "priority": 1},
                                     {"name": "bm25-second", "system": "bm25", "stage": "bm25_search", "priority": 2}],
                          config=str(PROJECT_ROOT / "configs" / "tiny.yaml"), tables_file="results/mini.md",
                          shared=["bm25_search"])
    subprocess.run(["git", "-C", str(tmp_path), "add", "."], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "commit", "-q", "-m", "study"], check=True)
    return tmp_path, study


def test_the_runner_builds_a_row_records_it_and_commits_only_the_record(repo, shared_data, tmp_path_factory):
    from flows.study.machine import describe_cpu
    from flows.study.runner import run_study
    from flows.study.status import MEASURED, study_status

    checkout, study = repo
    (checkout / "unrelated.txt").write_text("staged, not the study's\n")
    subprocess.run(["git", "-C", str(checkout), "add", "unrelated.txt"], check=True)
    root = tmp_path_factory.mktemp("root")
    machine = {**describe_cpu(), "threads": 1, "sgemm_gflops": 50.0}
    said = []
    recorded = run_study(study, root, 1800, machine, repo=checkout, say=said.append)
    assert recorded == ["bm25", "bm25-second"]   # the second is the same artifact: measured, not rebuilt
    records = read_records(study.folder)
    record = records["bm25"]
    assert record["machine"]["key"] == machine["key"] and record["commit"] and record["version"]
    assert {s["step"] for s in record["stages"]} == {"ingest_documents", "ingest_questions", "chunk", "link_gold",
                                                     "bm25_index", "bm25_search"}   # scoring's inputs too
    assert all(s["build_s"] is not None for s in record["stages"])
    assert set(record["outcomes"]["splits"]) == {"dev", "test"}   # not the train split: rows are compared on these
    test_ranks = record["outcomes"]["splits"]["test"]
    top1 = [m for m in record["metrics"] if m["metric"] == "top_k_accuracy" and m["k"] == 1 and m["split"] == "test"]
    assert top1[0]["value"] == pytest.approx(sum(r == 1 for r in test_ranks) / len(test_ranks))
    log = subprocess.run(["git", "-C", str(checkout), "log", "--name-only", "--format=%s"], capture_output=True,
                         text=True, check=True).stdout
    assert "Study record: bm25 (mini;" in log and "studies/mini/records/bm25.json" in log
    assert "unrelated.txt" not in log and "results/mini.md" in log
    assert (checkout / "results" / "mini.md").read_text() == study_tables(study)   # the tables follow the records
    staged = subprocess.run(["git", "-C", str(checkout), "diff", "--cached", "--name-only"], capture_output=True,
                            text=True, check=True).stdout
    assert staged.split() == ["unrelated.txt"]
    statuses = study_status(study, root, records, machine)
    assert all(s.state == MEASURED for s in statuses)
    assert "other versions" not in statuses[0].detail
    changed = {**record, "versions": {**record["versions"], "chunk": "0" * 16, "a-step-gone": "1" * 16}}
    detail = study_status(study, root, {**records, "bm25": changed}, machine)[0].detail
    assert detail.endswith(f"; 2 of {len(changed['versions'])} steps at other versions than this plan gives "
                           "(chunk, a-step-gone; `--again` measures it here)")
    assert "top-1" in study_tables(study, samples=200)
    # The shared step travels with the repository: exported, committed, and imported by a new machine.
    assert f"studies/mini/shared/bm25_runs-{record['version']}.tar.gz" in log
    fresh = tmp_path_factory.mktemp("fresh-root")
    said.clear()
    assert run_study(study, fresh, 1800, machine, repo=checkout, say=said.append) == []
    assert f"study: imported bm25_runs {record['version']} from bm25_runs-{record['version']}.json" in said
    from storage import ArtifactStore

    assert ArtifactStore(fresh).get("bm25_runs", record["version"]) is not None
    # Recorded again on that machine: its imported runs' producers were never built there.
    for name in ("bm25", "bm25-second"):
        (study.folder / "records" / f"{name}.json").unlink()
    assert run_study(study, fresh, 1800, machine, repo=None, say=said.append) == ["bm25", "bm25-second"]
    again = read_records(study.folder)["bm25"]
    assert "bm25_index" in again["versions"] and "bm25_index" not in {s["step"] for s in again["stages"]}
    assert "bm25_search" not in {s["step"] for s in again["stages"]}   # imported: built, and timed, elsewhere
    assert again["outcomes"] == record["outcomes"]
    # --again: a record at other versions than this plan gives is measured here once more and replaced.
    from flows.study.runner import Again

    write_record(study.folder, {**again, "versions": {**again["versions"], "chunk": "0" * 16},
                                "machine": ZEN3, "recorded_at": "2026-01-01T00:00:00+00:00"})
    said.clear()
    assert run_study(study, fresh, 1800, machine, repo=None, say=said.append) == []   # without --again: it stands
    assert run_study(study, fresh, 1800, machine, repo=checkout, rows=[Again("bm25"), "bm25-second"],
                     say=said.append) == ["bm25"]
    assert f"study: bm25: measured again here: 1 of {len(again['versions'])} steps of its record are at other " \
           "versions than this plan gives" in said
    replaced = read_records(study.folder)["bm25"]
    assert replaced["versions"] == again["versions"] and replaced["machine"]["key"] == machine["key"]
    assert replaced["replaces"]["machine"] == ZEN3["key"] and replaced["replaces"]["recorded_at"].startswith("2026-01-01")
    last = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--name-only", "--format=%s"],
                          capture_output=True, text=True, check=True).stdout
    assert "Study record: bm25 (measured again) (mini;" in last
    # the replaced record is kept, committed with the new one, and the tables set the two side by side
    kept = f"studies/mini/records/replaced/bm25@{again['version']}.json"
    assert kept in last.split()
    assert json.loads((checkout / kept).read_text())["machine"] == ZEN3
    assert sorted(read_records(study.folder)) == ["bm25", "bm25-second"]   # the kept one is no row's record
    again_lines = [line for line in study_tables(study, samples=200).splitlines() if line.startswith("| bm25 |")]
    top1 = 100 * sum(r == 1 for r in test_ranks) / len(test_ranks)
    assert any(f"| {ZEN3['key']}, 2 threads; commit " in line and f"top-1 {top1:.1f} -> {top1:.1f}" in line
               and "top-1 +0.0 [+0.0, +0.0]" in line for line in again_lines)
    said.clear()
    assert run_study(study, fresh, 1800, machine, repo=None, rows=[Again("bm25")], say=said.append) == []
    assert "study: bm25: its record is at this plan's versions; not measured again" in said


def test_a_shared_step_built_by_a_row_the_budget_stopped_is_exported_and_committed(repo, shared_data,
                                                                                    tmp_path_factory, monkeypatch):
    from flows.study import runner
    from flows.study.machine import describe_cpu

    checkout, study = repo
    built = runner.run_pipeline

    def stopped_after_building(argv, log, timeout_s, threads):
        assert built(argv, log, timeout_s, threads) == 0   # the shared step is built, then the budget "ends"
        return None

    monkeypatch.setattr(runner, "run_pipeline", stopped_after_building)
    said = []
    root = tmp_path_factory.mktemp("root")
    machine = {**describe_cpu(), "threads": 1, "sgemm_gflops": 50.0}
    assert runner.run_study(study, root, 1800, machine, repo=checkout, say=said.append) == []
    assert read_records(study.folder) == {}   # the row itself is not recorded
    exported = sorted(p.name for p in study.shared_dir.iterdir())
    assert len(exported) == 2 and exported[0].startswith("bm25_runs-") and exported[1].endswith(".tar.gz")
    log = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--name-only", "--format=%s"], capture_output=True,
                         text=True, check=True).stdout
    assert log.startswith("Study shared inputs: bm25_runs-") and f"studies/mini/shared/{exported[1]}" in log
    assert any(line.startswith("study: exported bm25_runs-") for line in said)


def test_a_built_row_that_cannot_be_recorded_is_shown_in_the_status_and_the_runner_goes_on(repo, shared_data,
                                                                                         tmp_path_factory, monkeypatch):
    from flows.study import runner
    from flows.study.machine import describe_cpu
    from flows.study.status import BUILT, MEASURED, study_status

    checkout, study = repo
    real = runner.record_row

    def refusing_bm25(study, row, *args):
        if row.name == "bm25":
            raise RuntimeError("the disk is full")
        return real(study, row, *args)

    monkeypatch.setattr(runner, "record_row", refusing_bm25)
    said, root = [], tmp_path_factory.mktemp("root")
    machine = {**describe_cpu(), "threads": 1, "sgemm_gflops": 50.0}
    assert runner.run_study(study, root, 1800, machine, repo=None, say=said.append) == ["bm25-second"]
    assert "study: bm25: built, but not recorded (RuntimeError: the disk is full); next row" in said
    first = study_status(study, root, read_records(study.folder), machine)[0]
    assert (first.row.name, first.state) == ("bm25", BUILT)
    assert first.detail.endswith("recording it failed: RuntimeError: the disk is full")

    monkeypatch.setattr(runner, "record_row", real)   # mended: the next run records it, and the note goes
    assert runner.run_study(study, root, 1800, machine, repo=None, say=said.append) == ["bm25"]
    assert all(s.state == MEASURED for s in study_status(study, root, read_records(study.folder), machine))
    assert not list(root.glob(".study-logs/*.not-recorded"))


def _every_bm25_step_took_an_hour(study):
    """A record elsewhere that prices each of the BM25 row's six steps at an hour on ZEN3."""
    steps = ["ingest_documents", "ingest_questions", "chunk", "link_gold", "bm25_index", "bm25_search"]
    write_record(study.folder, {"row": "elsewhere", "kind": "runs", "machine": ZEN3, "commit": None,
                                "stages": [{"step": s, "version": "v", "build_s": 3600.0} for s in steps]})


def test_the_runner_passes_over_a_row_priced_above_the_budget(repo, tmp_path_factory):
    from flows.study.runner import run_study

    checkout, study = repo
    machine = {**ZEN3, "threads": 1}
    _every_bm25_step_took_an_hour(study)
    said = []
    recorded = run_study(study, tmp_path_factory.mktemp("root"), 60, machine, repo=None, say=said.append)
    assert recorded == []
    assert any("bm25: priced 6.0 h, 1 min left: passed over" in line for line in said)


def test_an_unpriced_row_is_not_started_in_the_budgets_last_minutes(repo, tmp_path_factory, monkeypatch):
    """No record prices the BM25 rows here: with less than ADVANCE_MIN_S left, neither is started."""
    from flows.study import runner

    checkout, study = repo
    runs = []
    monkeypatch.setattr(runner, "run_pipeline", lambda argv, log, timeout_s, threads: runs.append(argv))
    said = []
    budget = runner.ADVANCE_MIN_S - 60
    assert runner.run_study(study, tmp_path_factory.mktemp("root"), budget, {**ZEN3, "threads": 1},
                            repo=None, say=said.append) == []
    assert runs == []
    assert [line for line in said if "passed over" in line] == [
        "study: bm25: priced unknown, 9 min left: passed over",
        "study: bm25-second: priced unknown, 9 min left: passed over"]


def test_the_hours_left_count_a_step_two_rows_share_once(repo, tmp_path_factory):
    """The two rows build the same six artifacts: each is priced at six hours, the study at six."""
    from flows.study.status import status_text, study_status

    _, study = repo
    _every_bm25_step_took_an_hour(study)
    root = tmp_path_factory.mktemp("root")
    statuses = study_status(study, root, read_records(study.folder), ZEN3)
    assert [s.left_text() for s in statuses] == ["6.0 h", "6.0 h"]
    assert "left here: 6.0 h of priced work" in status_text(study, root, statuses, ZEN3)


def test_rows_passed_over_are_advanced_in_order_once_nothing_fits(repo, tmp_path_factory, monkeypatch):
    from flows.study import runner

    checkout, study = repo
    machine = {**ZEN3, "threads": 1}
    _every_bm25_step_took_an_hour(study)
    runs = []

    def budget_ends(argv, log, timeout_s, threads):
        runs.append((argv[argv.index("--upto") + 1], timeout_s))
        return None   # the budget ended in the row: its checkpoints carry it to the next run

    monkeypatch.setattr(runner, "run_pipeline", budget_ends)
    said = []
    budget = runner.ADVANCE_MIN_S + 60
    assert runner.run_study(study, tmp_path_factory.mktemp("root"), budget, machine, repo=None, say=said.append) == []
    assert [line.split(":")[1].strip() for line in said if "passed over" in line] == ["bm25", "bm25-second"]
    assert len(runs) == 1 and runs[0][0].startswith("bm25_search") and runs[0][1] <= budget
    assert any(line.startswith("study: bm25: nothing else fits; advancing it") for line in said)


def test_a_row_reading_another_configs_model_has_that_config_run_first(shared_data, tmp_path, monkeypatch):
    """b.yaml's system starts from a.yaml's trained model, which the root lacks: the status counts
    a.yaml's steps into the row and the runner builds them first; when they fail, the row is not run."""
    from flows.study import runner
    from flows.study.status import study_status

    (tmp_path / "a.yaml").write_text(f"extends: {PROJECT_ROOT / 'configs' / 'squad-open.yaml'}\n")
    (tmp_path / "b.yaml").write_text(
        f"extends: {PROJECT_ROOT / 'configs' / 'nfcorpus-dense.yaml'}\n"
        "dense:\n  systems:\n    - name: transfer\n      init_from: a.yaml:minilm-dpr\n  hybrid: null\n")
    study = _study_folder(tmp_path, [{"name": "transfer", "stage": "search:transfer", "priority": 1,
                                      "config": str(tmp_path / "b.yaml")}])
    root = tmp_path / "root"
    status = study_status(study, root, {}, ZEN3)[0]
    assert [(r.config.name, r.stage, r.artifact) for r in status.first] == [("a.yaml", "train:minilm-dpr", "dense_model")]
    assert status.detail.endswith("; first a.yaml:minilm-dpr")
    priced = {p.work for p in status.left}
    assert len(priced) == len(status.left) and any(w.startswith("dense_model@") for w in priced)   # a.yaml's training
    runs = []

    def pipeline_exits(*codes):
        def run(argv, log, timeout_s, threads):
            runs.append((argv[argv.index("run") + 1], argv[argv.index("--upto") + 1]))
            return codes[len(runs) - 1]
        return run

    monkeypatch.setattr(runner, "run_pipeline", pipeline_exits(1))
    assert runner.run_study(study, root, 1800, ZEN3, repo=None, say=lambda line: None) == []
    assert runs == [(str(tmp_path / "a.yaml"), "train:minilm-dpr")]   # it failed: the row's own run would stop too
    runs.clear()
    monkeypatch.setattr(runner, "run_pipeline", pipeline_exits(0, 1))   # a.yaml's builds; the row's fails
    runner.run_study(study, root, 1800, ZEN3, repo=None, say=lambda line: None)
    assert [config for config, _ in runs] == [str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")]
    assert runs[1][1].startswith("search:transfer")


def test_study_status_and_tables_from_the_command_line(repo, tmp_path):
    checkout, study = repo
    _runs_record(study, "bm25", [1] * 40)
    env_root = tmp_path / "no-root-here"
    status = subprocess.run([sys.executable, "-m", "flows.cli", "--root", str(env_root), "study", "status", "mini",
                             "--records-into", str(checkout), "--threads", "1"],
                            capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert status.returncode == 0, status.stderr
    assert "study mini: 1 of 2 rows measured" in status.stdout
    assert "bm25-second" in status.stdout and "not started" in status.stdout
    tables = subprocess.run([sys.executable, "-m", "flows.cli", "study", "tables", "mini", "--records-into",
                             str(checkout), "--samples", "200"], capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert tables.returncode == 0, tables.stderr
    assert "| bm25 | 40 | 100.0 |" in tables.stdout
    bad = subprocess.run([sys.executable, "-m", "flows.cli", "study", "run", "--budget", "soon"], capture_output=True,
                         text=True, cwd=PROJECT_ROOT)
    assert bad.returncode == 2 and "a duration such as 150m" in bad.stderr


def test_again_rows_keep_their_place_among_the_rows_and_reach_the_background_runner(tmp_path):
    import argparse

    from flows.study.cli import add_parser, background_argv
    from flows.study.runner import Again

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["study", "run", "--budget", "10m", "--row", "a", "--again", "nf:b", "--row", "c"])
    assert args.row == ["a", "nf:b", "c"] and [isinstance(n, Again) for n in args.row] == [False, True, False]
    study = _study_folder(tmp_path, [{"name": n, "stage": "bm25_search", "priority": 1} for n in ("a", "nf:b", "c")])
    argv = background_argv(args, tmp_path / "root", study, 2)
    assert argv[-3:] == ["--row=a", "--again=nf:b", "--row=c"]
    assert parser.parse_args(argv[argv.index("study"):]).row == args.row


def test_counts_print_in_full_and_ratios_to_four_digits():
    from flows.study.tables import count_or_ratio

    assert count_or_ratio(13886) == "13,886" and count_or_ratio(13886.4) == "13,886"
    assert count_or_ratio(1.998) == "1.998" and count_or_ratio(0.60417) == "0.6042" and count_or_ratio(2) == "2"


def test_a_resumed_trainers_build_time_counts_the_attempts_before_it():
    from flows.study.measure import build_seconds

    resumed = {"timings": {"build_s": 100.0}, "stats": {"seconds": 90.0, "seconds_all_attempts": 250.0}}
    assert build_seconds(resumed) == pytest.approx(260.0)
    assert build_seconds({"timings": {"build_s": 100.0}, "stats": {"seconds": 90.0, "seconds_all_attempts": 90.0}}) == 100.0
    assert build_seconds({"timings": {"build_s": 4.0}, "stats": {"rows": 3}}) == 4.0
    assert build_seconds({"stats": {}}) is None


def test_a_part_built_step_is_priced_at_what_its_latest_checkpoint_leaves(repo, tmp_path_factory):
    import torch

    from flows.study.status import RESUMABLE, Plans, open_store, row_status
    from storage.paths import work_dir
    from tasks.training.checkpoints import training_progress

    checkout, study = repo
    steps = ["ingest_documents", "ingest_questions", "chunk", "link_gold", "bm25_index", "bm25_search"]
    records = {"r": {"recorded_at": "2026-12-01T00:00:00+00:00", "machine": ZEN3,
                     "stages": [{"step": s, "version": "v", "build_s": 600.0} for s in steps]}}
    root = tmp_path_factory.mktemp("root")
    plan = Plans(study)(study.row("bm25"))
    stage = plan["bm25_search"]
    work = work_dir(root, stage.artifact, plan.planned_version("bm25_search"))
    checkpoint = work / "training" / "checkpoints" / "step-0000030"
    checkpoint.mkdir(parents=True)
    assert training_progress(work) is None   # a folder without its state is no checkpoint
    torch.save({"step": 30, "total_steps": 40}, checkpoint / "trainer_state.pt")   # an older one: no time
    assert training_progress(work) == (30, 40, None)
    status = row_status(study.row("bm25"), Plans(study), open_store(root), records, ZEN3)
    assert status.state == RESUMABLE and "bm25_search (step 30 of 40) part-built" in status.detail
    left = {price.step: price for price in status.left}
    assert left["bm25_search"].seconds == pytest.approx(150.0) and "from step 30 of 40" in left["bm25_search"].basis
    assert left["chunk"].seconds == pytest.approx(600.0)   # a step with no work folder: its whole price
    # A checkpoint that says its own time prices the rest at its own rate, before any record's.
    torch.save({"step": 30, "total_steps": 40, "seconds_so_far": 90.0}, checkpoint / "trainer_state.pt")
    for known in ({}, records):   # and prices it where no record has the step
        left = {p.step: p for p in row_status(study.row("bm25"), Plans(study), open_store(root), known, ZEN3).left}
        assert left["bm25_search"].seconds == pytest.approx(30.0)
        assert left["bm25_search"].basis == "its own 3.0 s a step here, from step 30 of 40"


def test_a_step_is_priced_only_from_records_over_the_same_passages(repo):
    from flows.study.status import Plans, passages_of, row_status

    _, study = repo
    plans = Plans(study)
    passages = passages_of(plans(study.row("bm25")))
    steps = ["ingest_documents", "ingest_questions", "chunk", "link_gold", "bm25_index", "bm25_search"]

    def priced_from(versions: dict) -> list:
        record = {"recorded_at": "2026-12-01T00:00:00+00:00", "machine": ZEN3, "versions": versions,
                  "stages": [{"step": s, "version": "v", "build_s": 60.0} for s in steps]}
        return [p.seconds for p in row_status(study.row("bm25"), plans, None, {"r": record}, ZEN3).left]

    assert passages and priced_from({"chunk": passages}) == [60.0] * 6
    assert priced_from({"chunk": "another-corpus"}) == [None] * 6   # same names, other work
    assert priced_from({}) == [60.0] * 6   # a record that names no passages: its config's (the default)


def test_a_row_with_an_unpriced_step_shows_its_priced_part(repo, tmp_path_factory):
    from flows.study.estimate import StepPrice
    from flows.study.status import MEASURED, NOT_STARTED, RowStatus

    _, study = repo
    row = study.row("bm25")
    priced, unpriced = StepPrice("chunk", 5400.0, "this CPU"), StepPrice("bm25_search", None, "unknown")
    assert RowStatus(row, NOT_STARTED, "", [priced, unpriced]).left_text() == "1.5 h + ?"
    assert RowStatus(row, NOT_STARTED, "", [priced]).left_text() == "1.5 h"
    assert RowStatus(row, NOT_STARTED, "", [unpriced]).left_text() == "unknown"
    assert RowStatus(row, MEASURED, "", []).left_text() == "-"
