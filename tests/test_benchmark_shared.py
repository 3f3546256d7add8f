"""benchmarks/_shared.py: the benchmarks' SQuAD input, read through tasks.readers.squad, is the file's
articles, paragraphs and questions in file order, as the scripts parsed them by hand before."""
import json

import pytest

from tests.benchmark_scripts import benchmark_script


@pytest.fixture(scope="module")
def shared():
    with benchmark_script("_shared") as module:
        yield module


def _squad(tmp_path, data):
    path = tmp_path / "squad.json"
    path.write_text(json.dumps({"data": data}), encoding="utf-8")
    return path


def _qa(qid, question, context, answer):
    return {"id": qid, "question": question, "answers": [{"text": answer, "answer_start": context.index(answer)}]}


def test_articles_hold_their_paragraphs_and_each_paragraphs_own_questions(shared, tmp_path):
    first, second, third = "Paris is in France.\nIt is big.", "No questions here.", "The Seine runs through Paris."
    path = _squad(tmp_path, [
        {"title": "Paris_city", "paragraphs": [
            {"context": first, "qas": [_qa("q1", "Where is Paris?", first, "France"),
                                       _qa("q2", "Is it big?", first, "big")]},
            {"context": second, "qas": []},
            {"context": third, "qas": [_qa("q3", "What river?", third, "Seine")]}]},
        {"title": "Other", "paragraphs": [{"context": "One more.", "qas": [_qa("q4", "How many?", "One more.", "One")]}]},
    ])
    articles = shared.squad_articles(path)
    assert [(a.doc_id, a.title) for a in articles] == [("squad:Paris_city", "Paris city"), ("squad:Other", "Other")]
    assert [p.context for p in articles[0].paragraphs] == [first, second, third]
    assert [[q["qid"] for q in p.questions] for p in articles[0].paragraphs] == [["q1", "q2"], [], ["q3"]]
    assert articles[0].paragraphs[0].questions[0]["answers"] == ["France"]
    assert [q["question"] for q in articles[1].paragraphs[0].questions] == ["How many?"]


def test_a_file_the_reader_rejects_is_an_error(shared, tmp_path):
    path = _squad(tmp_path, [{"title": "a", "paragraphs": [{"context": "a 0", "qas": [{"question": "q"}]}]}])
    with pytest.raises(Exception, match="id"):
        shared.squad_articles(path)


def test_the_answer_matcher_is_the_projects(shared):
    from tasks.evaluation.has_answer import has_answer

    matcher, source = shared.load_has_answer()
    assert matcher is has_answer and "FALLBACK" not in source
