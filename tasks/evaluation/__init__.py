"""Evaluation (DESIGN.md section 6): DPR answer matching, QA accuracy, qrels metrics, reports."""
from .has_answer import SimpleTokenizer, has_answer, normalize
from .ir_metrics import ir_metrics
from .qa_metrics import answer_precision_at, first_hit_ranks, qa_accuracy_metrics
from .report import metrics_markdown, write_report

__all__ = ["SimpleTokenizer", "has_answer", "normalize", "ir_metrics", "answer_precision_at",
           "first_hit_ranks", "qa_accuracy_metrics", "metrics_markdown", "write_report"]
