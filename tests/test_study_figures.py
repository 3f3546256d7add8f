"""The study's figures (flows/study/figures.py) from its records alone: the top-k curves of the
main rows, the reproduction table's comparisons as a forest plot, the classifier's dev AUC when its
record keeps the curve (and the runner putting it there); byte-stable SVGs; and the site drawing
them at build time (docs/hooks.py) into the Results page."""
import json
import re
import shutil
import xml.etree.ElementTree as ET

import pytest

from flows.study import figures
from flows.study.records import NDCG_AT_10, RANK, write_questions, write_record
from flows.study.tables import Results, compare, study_tables
from tasks.config import PROJECT_ROOT
from tasks.evaluation.figures import CURVE_K
from tests.docs_scripts import build_site, docs_script
from tests.test_study import _runs_record, _study_folder

ROWS = [{"name": n, "stage": "bm25_search", "priority": 1}
        for n in ("bm25", "gold-s1", "gold-s2", "rnd-s1", "nf", "unmeasured")]
ROWS.append({"name": "classifier", "kind": "classifier", "stage": "cross_encoder", "priority": 1})
CLAIMS = [{"paper": "001 table 2", "claim": "the classifier beats the dual encoder", "row": "classifier"},
          {"paper": "P1", "claim": "gold beats rnd", "a": "gold-s1", "b": "rnd-s1", "k": 1},
          {"paper": "P1", "claim": "gold beats rnd at top-20", "a": "gold-s1", "b": "rnd-s1", "k": 20},
          {"paper": "P2", "claim": "bm25 beats gold", "a": "bm25", "b": "gold-s1", "k": 1},
          {"paper": "P3", "claim": "unmeasured beats bm25", "a": "unmeasured", "b": "bm25", "k": 1}]
CURVE = [[100, 0.81], [200, 0.9], [300, 0.94], [400, 0.93]]


def _classifier_record(study, dev_curve=None):
    details = {"best_step": 300, "report": []}
    if dev_curve is not None:
        details["dev_curve"] = dev_curve
    return write_record(study.folder, {"row": "classifier", "kind": "classifier", "system": "classifier",
                                       "stage": "cross_encoder", "commit": None, "machine": {}, "stages": [],
                                       "versions": {}, "details": details})


@pytest.fixture
def study(tmp_path):
    """Rows measured on 40 test questions: bm25, gold at two seeds, rnd, and one judged by qrels."""
    study = _study_folder(tmp_path, ROWS, claims=CLAIMS)
    _runs_record(study, "bm25", [1] * 20 + [30] * 10 + [None] * 10)
    _runs_record(study, "gold-s1", [1] * 25 + [5] * 10 + [None] * 5)
    _runs_record(study, "gold-s2", [1] * 24 + [5] * 11 + [None] * 5)
    _runs_record(study, "rnd-s1", [1] * 15 + [2] * 5 + [10] * 10 + [None] * 10)
    digest = write_questions(study.folder, {"test": [f"n{i}" for i in range(4)]})
    write_record(study.folder, {"row": "nf", "kind": "runs", "system": "nf", "commit": None, "machine": {},
                                "outcomes": {"measure": NDCG_AT_10, "questions": digest,
                                             "splits": {"test": [0.5, 0.25, 0.0, 1.0]}},
                                "metrics": [], "stages": [], "versions": {}})
    return study


def _svg_texts(svg: bytes) -> list[str]:
    """The texts matplotlib drew (each glyph run as paths, its text in a comment before it)."""
    return re.findall(r"<!-- (.*?) -->", svg.decode("utf-8"))


def test_the_curve_is_the_share_of_questions_answered_within_k(tmp_path):
    study = _study_folder(tmp_path, [{"name": "a", "stage": "bm25_search", "priority": 1}])
    digest = write_questions(study.folder, {"test": ["q1", "q2", "q3"]})
    write_record(study.folder, {"row": "a", "kind": "runs", "system": "a", "commit": None, "machine": {},
                                "outcomes": {"measure": RANK, "questions": digest, "splits": {"test": [1, 3, None]}},
                                "metrics": [], "stages": [], "versions": {}})
    curve = figures.topk_curves(Results(study))["a"]
    assert len(curve) == CURVE_K
    assert curve[0] == pytest.approx(1 / 3) and curve[1] == pytest.approx(1 / 3)   # top-1, top-2
    assert curve[2] == pytest.approx(2 / 3) and curve[-1] == pytest.approx(2 / 3)  # top-3 on: the third never hits


def test_the_curves_are_each_systems_first_seed_scored_by_answer_match(study):
    results = Results(study)
    assert figures.curve_rows(results) == ["bm25", "gold-s1", "rnd-s1"]   # not gold-s2, nf (qrels) or unmeasured
    curves = figures.topk_curves(results)
    assert set(curves) == {"bm25", "gold-s1", "rnd-s1"}
    for name, curve in curves.items():   # the systems table's top-k columns are points of the curve
        assert [100 * curve[k - 1] for k in (1, 5, 20, 100)] == pytest.approx([results.score(name, k)
                                                                               for k in (1, 5, 20, 100)])


def test_the_forest_plot_has_one_row_per_measured_claim_with_the_tables_interval(study):
    results = Results(study)
    rows = figures.comparison_rows(results, samples=400)
    assert [(r["system_a"], r["system_b"], r["k"]) for r in rows] == [("gold-s1", "rnd-s1", 1), ("gold-s1", "rnd-s1", 20),
                                                                     ("bm25", "gold-s1", 1)]
    for r in rows:
        expected = compare(results, r["system_a"], r["system_b"], r["k"], 400)
        assert (r["difference"], r["low"], r["high"]) == (expected["difference"], expected["low"], expected["high"])
    assert figures.SAMPLES == 10_000   # the table's resamples: the plot's intervals are the committed table's
    table = study_tables(study, samples=400)
    svg = figures.study_figures(study, samples=400)[figures.COMPARISONS]
    texts = _svg_texts(svg)
    for r in rows:
        interval = f"[{100 * r['low']:+.1f}, {100 * r['high']:+.1f}]"
        assert f"{r['system_a']} \u2212 {r['system_b']}, top-{r['k']}" in texts
        assert f"{100 * r['difference']:+.1f} {interval}" in texts
        assert f"| {interval} |" in table   # the reproduction table shows the same interval
    assert not any("unmeasured" in t for t in texts)


def test_a_classifier_record_without_a_dev_curve_gives_no_figure(study):
    _classifier_record(study)
    drawn = figures.study_figures(study, samples=200)
    assert set(drawn) == {figures.TOPK, figures.COMPARISONS}
    _classifier_record(study, CURVE)
    drawn = figures.study_figures(study, samples=200)
    assert set(drawn) == set(figures.FIGURES)
    texts = _svg_texts(drawn[figures.CLASSIFIER])
    assert "kept: step 300" in texts and "dev AUC" in texts


def test_the_curve_reads_pairs_and_the_manifests_evaluations():
    assert figures.classifier_curve({"details": {"dev_curve": CURVE}}) == [tuple(e) for e in CURVE]
    manifest_form = [{"step": 10, "auc": 0.7, "log_loss": 0.6}, {"step": 20, "auc": 0.8, "log_loss": 0.5}]
    assert figures.classifier_curve({"details": {"dev_curve": manifest_form}}) == [(10, 0.7), (20, 0.8)]
    assert figures.classifier_curve({"details": {}}) == [] and figures.classifier_curve(None) == []


def test_no_measured_row_draws_nothing(tmp_path):
    study = _study_folder(tmp_path, ROWS, claims=CLAIMS)
    assert figures.study_figures(study) == {}


def test_the_svgs_are_valid_xml_and_the_same_bytes_each_time(study):
    _classifier_record(study, CURVE)
    first, second = figures.study_figures(study, samples=200), figures.study_figures(study, samples=200)
    assert set(first) == set(figures.FIGURES)
    for name, svg in first.items():
        root = ET.fromstring(svg)
        assert root.tag == "{http://www.w3.org/2000/svg}svg", name
        assert svg == second[name], name
        assert b"<dc:date>" not in svg, name


# ------------------------------------------------------------------- the runner records the curve
class _Artifact:
    def __init__(self, path, stats):
        self.path, self.stage, self.version, self.manifest = path, "cross_encoder", "v1", {"stats": stats}


def _history(folder, entries, dev_curve=()):
    (folder / "training").mkdir(parents=True)
    (folder / "training" / "history.json").write_text(json.dumps({"history": entries, "dev_curve": list(dev_curve)}))


def test_a_classifier_row_records_its_dev_auc_curve_from_the_training_history(tmp_path, monkeypatch):
    from flows.study import measure

    study = _study_folder(tmp_path, ROWS, claims=CLAIMS)
    row = study.row("classifier")
    # as the trainer writes it: every step's loss, the evaluated steps with every dev metric
    entries = [{"step": s, "loss": 0.7 - s / 1000} for s in range(1, 301)]
    for entry in entries:
        if entry["step"] % 100 == 0:
            entry.update(dev_metric=0.6, dev_metrics={"auc": 0.8 + entry["step"] / 10_000, "log_loss": 0.6, "accuracy": 0.7})
    _history(tmp_path / "artifact", entries, dev_curve=[[100, 0.6], [200, 0.6], [300, 0.6]])
    stats = {"best_step": 300, "dev_auc": 0.83, "selected_by": "log_loss", "dev_curve": [{"step": 100, "auc": 0.81}]}
    artifact = _Artifact(tmp_path / "artifact", stats)
    monkeypatch.setattr(measure, "row_artifact", lambda plan, store, r: artifact)
    monkeypatch.setattr(measure, "planned_steps", lambda plan, r: [])
    monkeypatch.setattr(measure, "steps_run_here", lambda plan, store, r: [])
    record = measure.measure_row(study, row, None, None)
    assert record["details"]["dev_curve"] == [[100, 0.81], [200, 0.82], [300, 0.83]]   # AUC, not the picking log loss
    assert record["details"]["dev_auc"] == 0.83 and stats["dev_curve"] == [{"step": 100, "auc": 0.81}]  # manifest untouched
    assert figures.classifier_curve(record) == [(100, 0.81), (200, 0.82), (300, 0.83)]


def test_the_dev_curve_falls_back_to_the_trainers_when_auc_picked_and_is_none_without_a_history(tmp_path):
    from flows.study.measure import classifier_dev_curve

    assert classifier_dev_curve(tmp_path / "nothing") is None
    _history(tmp_path / "old", [{"step": 1, "loss": 0.7}], dev_curve=[[50, 0.812345], [100, 0.9]])
    assert classifier_dev_curve(tmp_path / "old", "auc") == [[50, 0.8123], [100, 0.9]]
    assert classifier_dev_curve(tmp_path / "old", "log_loss") is None   # that curve is log loss, not AUC


# ------------------------------------------------------------------------------------ the site
def test_a_figure_the_records_do_not_give_leaves_the_page_saying_why():
    from mkdocs.structure.files import Files

    hooks = docs_script("hooks")
    page = ("Intro.\n\nIts dev AUC, drawn from the record:\n"
            f"![The classifier's dev AUC]({hooks.FOLDER}/{figures.CLASSIFIER})\n\nAfter.\n")
    assert hooks.on_page_markdown(page, None, None, Files([])) == f"Intro.\n\n{figures.MISSING[figures.CLASSIFIER]}\n\nAfter.\n"


def test_the_site_draws_the_three_figures_into_results_from_the_records(tmp_path):
    """A strict build of a copy of the project whose classifier record keeps a dev curve: the three
    SVGs are in the site, drawn from the records (none is committed), and Results shows each."""
    from tests.test_docs_site import BUILD_INPUTS

    assert not (PROJECT_ROOT / "docs" / figures_folder()).exists()   # nothing drawn is committed
    project = tmp_path / "project"
    shutil.copytree(PROJECT_ROOT / "docs", project / "docs")
    shutil.copy(PROJECT_ROOT / "mkdocs.yml", project / "mkdocs.yml")
    for name in BUILD_INPUTS:
        (project / name).symlink_to(PROJECT_ROOT / name)
    source = PROJECT_ROOT / "studies" / "squad-open"
    study = project / "studies" / "squad-open"
    study.mkdir(parents=True)
    for part in ("study.yaml", "records", "questions"):
        (shutil.copytree if (source / part).is_dir() else shutil.copy)(source / part, study / part)
    classifier = study / "records" / "classifier.json"
    record = json.loads(classifier.read_text(encoding="utf-8"))
    record["details"]["dev_curve"] = CURVE
    classifier.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")

    code, log = build_site(project, tmp_path / "site")
    assert code == 0 and "WARNING" not in log, log[-5000:]
    page = (tmp_path / "site" / "results" / "index.html").read_text(encoding="utf-8")
    for name in figures.FIGURES:
        svg = tmp_path / "site" / figures_folder() / name
        assert svg.is_file(), name
        ET.fromstring(svg.read_bytes())
        assert f'src="../{figures_folder()}/{name}"' in page, name
    assert not any(text in page for text in figures.MISSING.values())


def figures_folder() -> str:
    return docs_script("hooks").FOLDER
