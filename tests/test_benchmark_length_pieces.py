"""benchmarks/length_pieces.py (the dense step), length_pieces_classifier.py (the classifier's) and
length_pieces_pretraining.py (coCondenser's) on a tiny random BERT: every system steps the same
batches, the pieces encode fewer padded tokens than the whole batches and give the whole batch's
vectors, logits or loss."""
import torch

from tests.benchmark_scripts import benchmark_script
from tests.tiny_models import save_tiny_checkpoint


def test_the_pieces_pad_less_and_give_the_whole_batchs_vectors(shared_data, tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", max_positions=256)   # whole 100-word passages
    threads = torch.get_num_threads()
    try:
        with benchmark_script("length_pieces") as length_pieces:
            result = length_pieces.main([
                "--model", str(checkpoint), "--squad", str(shared_data / "squad" / "dev-v1.1-partial.json"),
                "--batch-size", "4", "--hard-negatives", "1", "--pieces", "2", "--repeat", "5",
                "--steps-per-repeat", "1", "--passage-length", "256", "--query-length", "16", "--threads", "1",
                "--bf16", "off", "--out", str(tmp_path / "report.md")])
    finally:
        torch.set_num_threads(threads)
    systems = {"whole batches", "pieces of 2"}
    assert set(result["seconds"]) == set(result["losses"]) == systems
    assert all(len(v) == 5 for v in result["seconds"].values()) and all(len(v) == 6 for v in result["losses"].values())
    padding = result["padding"]
    assert padding["pieces of 2"]["passage_padding_share"] < padding["whole batches"]["passage_padding_share"]
    assert padding["pieces of 2"]["passage_tokens_real"] == padding["whole batches"]["passage_tokens_real"]
    assert result["max_abs_diff"]["pieces of 2"] < 1e-5
    assert "pieces of 2" in (tmp_path / "report.md").read_text() and (tmp_path / "report.json").is_file()


def test_the_classifiers_pieces_pad_less_and_give_the_whole_batchs_logits(shared_data, tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", max_positions=256)
    threads = torch.get_num_threads()
    try:
        with benchmark_script("length_pieces_classifier") as classifier:
            result = classifier.main([
                "--model", str(checkpoint), "--squad", str(shared_data / "squad" / "dev-v1.1-partial.json"),
                "--batch-size", "6", "--pieces", "2", "--repeat", "5", "--steps-per-repeat", "1",
                "--passage-length", "256", "--threads", "1", "--bf16", "off"])
    finally:
        torch.set_num_threads(threads)
    assert set(result["seconds"]) == {"whole batches", "pieces of 2"}
    assert all(len(v) == 6 for v in result["losses"].values())
    assert result["padding"]["pieces of 2"] < result["padding"]["whole batches"]
    assert result["max_abs_diff"]["pieces of 2"] < 1e-5


def test_the_pretraining_pieces_pad_less_and_give_the_whole_batchs_loss(shared_data, tmp_path):
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", max_positions=256)
    threads = torch.get_num_threads()
    try:
        with benchmark_script("length_pieces_pretraining") as pretraining:
            result = pretraining.main([
                "--model", str(checkpoint), "--squad", str(shared_data / "squad" / "dev-v1.1-partial.json"),
                "--batch-size", "5", "--pieces", "2", "--repeat", "5", "--steps-per-repeat", "1",
                "--passage-length", "144", "--query-length", "16", "--threads", "1", "--bf16", "off"])
    finally:
        torch.set_num_threads(threads)
    assert set(result["seconds"]) == {"whole batches", "pieces of 2"}
    whole, pieces = result["losses"]["whole batches"], result["losses"]["pieces of 2"]
    assert len(whole) == len(pieces) == 6 and all(0 < x < 100 for x in whole + pieces)
    assert result["padding"]["pieces of 2"]["passage_padding_share"] < result["padding"]["whole batches"]["passage_padding_share"]
    assert result["max_abs_diff"]["pieces of 2"] < 1e-5
