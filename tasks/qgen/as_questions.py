"""The generated queries in the shape of question rows, for the stages that take either (mining
negatives for them, training the classifier on them)."""
import pyarrow as pa


def synthetic_queries_as_questions(pairs: pa.Table) -> pa.Table:
    """pairs:synthetic as question rows (qid, question, answers, split, pid): no answer strings
    (nothing to filter by answer); the passage each was written from is its gold."""
    n = pairs.num_rows
    return pa.table({"qid": pairs.column("qid"), "question": pairs.column("query"),
                     "answers": pa.array([[]] * n, pa.list_(pa.string())), "split": pa.array(["synthetic"] * n),
                     "pid": pairs.column("pid")})
