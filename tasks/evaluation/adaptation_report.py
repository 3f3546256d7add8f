"""The evaluation report's account of an adaptation run (issue 25): where the teacher came from,
how many generated queries the round-trip filter kept, and the teacher's scores of the pairs each
distilled student trained on (a teacher that cannot tell the positives apart shows here)."""
from __future__ import annotations


def _number(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def teacher_origin_line(cross_encoder: dict) -> str:
    """One sentence: the classifier was trained here, or imported from another run (with its dev AUC there)."""
    source = cross_encoder.get("imported_from")
    if not source:
        return ""
    trained = cross_encoder.get("trained_by_source", {})
    auc = trained.get("dev_auc")
    where = f" (trained there on {trained['training_pairs']:,} pairs, dev AUC {100 * auc:.1f})" \
        if auc is not None and trained.get("training_pairs") else ""
    return f"The teacher is the classifier `{source}`{where}; nothing of this corpus trained it."


def round_trip_line(pairs: dict) -> str:
    queries, kept = pairs.get("queries", 0), pairs.get("pairs", 0)
    if kept == queries:
        return f"{queries:,} generated queries became training pairs (no round-trip filter)."
    return (f"{queries:,} generated queries; the round-trip filter (BM25 ranks the query's own passage high) kept "
            f"{kept:,} ({100 * pairs.get('round_trip_kept', 0):.1f}%).")


def teacher_table(students: dict[str, dict]) -> list[str]:
    """Per distilled student: quantiles of the teacher's logits for positives and negatives."""
    if not students:
        return []
    lines = ["", "Teacher logits of the pairs each distilled student trained on (5th / 50th / 95th percentile):", "",
             "| student | pairs scored | positives | negatives | mean margin | positive above all its negatives |",
             "|---|---:|---|---|---:|---:|"]
    for name, t in students.items():
        spread = {side: " / ".join(_number(t.get(side, {}).get(q)) for q in ("p5", "p50", "p95"))
                  for side in ("positive", "negative")}
        above = t.get("positive_above_all_negatives")
        lines.append(f"| {name} | {t.get('pairs_scored', 0):,} | {spread['positive']} | {spread['negative']} | "
                     f"{_number(t.get('mean_margin'))} | {'-' if above is None else f'{100 * above:.1f}%'} |")
    return lines


def adaptation_section(cross_encoder: dict, synthetic_pairs: dict, students: dict[str, dict]) -> str:
    """Markdown: the teacher's origin, the round trip, and the teacher table (empty parts left out)."""
    lines = ["", "## Generated queries and the teacher", ""]
    origin = teacher_origin_line(cross_encoder)
    if origin:
        lines.append(origin)
    if synthetic_pairs:
        lines.append(round_trip_line(synthetic_pairs))
    lines += teacher_table(students)
    return "\n".join(lines) + "\n" if len(lines) > 3 else ""
