from tasks.chunking import chunk_document


def _doc(n_words, text=None):
    return {"doc_id": "d", "title": "T", "text": text or " ".join(f"w{i}" for i in range(n_words))}


def test_hundred_word_disjoint_chunks_cover_the_document():
    passages = list(chunk_document(_doc(250)))
    assert [p["n_words"] for p in passages] == [100, 100, 50]
    assert [p["chunk_index"] for p in passages] == [0, 1, 2]
    words = " ".join(p["text"] for p in passages).split()
    assert words == [f"w{i}" for i in range(250)]
    assert all(p["title"] == "T" and p["doc_id"] == "d" for p in passages)
    assert passages[1]["pid"] == "d#1"


def test_short_document_is_one_passage():
    passages = list(chunk_document(_doc(7)))
    assert len(passages) == 1 and passages[0]["n_words"] == 7


def test_char_offsets_locate_chunk_in_document():
    text = "alpha  beta\n\ngamma delta epsilon"
    passages = list(chunk_document(_doc(0, text), words=2))
    assert [p["text"] for p in passages] == ["alpha beta", "gamma delta", "epsilon"]
    for p in passages:
        assert text[p["char_start"]:p["char_end"]].split() == p["text"].split()


def test_stride_gives_overlap_and_zero_words_keeps_whole_document():
    passages = list(chunk_document(_doc(10), words=4, stride=3))
    assert [p["text"].split()[0] for p in passages] == ["w0", "w3", "w6"]
    assert passages[-1]["text"].split()[-1] == "w9"
    whole = list(chunk_document(_doc(300), words=0))
    assert len(whole) == 1 and whole[0]["n_words"] == 300


def test_empty_text_gives_no_passage():
    assert list(chunk_document(_doc(0, "   \n "))) == []
