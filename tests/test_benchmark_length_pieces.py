"""benchmarks/length_pieces.py (the dense step), length_pieces_classifier.py (the classifier's) and
length_pieces_pretraining.py (coCondenser's) on a tiny random BERT: every system steps the same
batches, the pieces encode fewer padded tokens than the whole batches and give the whole batch's
vectors, logits or loss."""
import torch

from tests.benchmark_scripts import benchmark_script
from tests.tiny_models import save_tiny_checkpoint


def _run(script, shared_data, tmp_path, *options):
    """`script`'s main on a tiny BERT that reads whole 100-word passages: pieces of 2 against whole
    batches, 5 repeats of one step, one thread, fp32; `options` the script's own."""
    checkpoint = save_tiny_checkpoint(tmp_path / "tiny", max_positions=256)
    threads = torch.get_num_threads()
    try:
        with benchmark_script(script) as module:
            result = module.main([
                "--model", str(checkpoint), "--squad", str(shared_data / "squad" / "dev-v1.1-partial.json"),
                "--pieces", "2", "--repeat", "5", "--steps-per-repeat", "1", "--threads", "1", "--bf16", "off",
                *options])
    finally:
        torch.set_num_threads(threads)
    assert set(result["seconds"]) == {"whole batches", "pieces of 2"}
    assert all(len(v) == 5 for v in result["seconds"].values()) and all(len(v) == 6 for v in result["losses"].values())
    assert result["max_abs_diff"]["pieces of 2"] < 1e-5
    return result


def test_the_pieces_pad_less_and_give_the_whole_batchs_vectors(shared_data, tmp_path):
    result = _run("length_pieces", shared_data, tmp_path, "--batch-size", "4", "--hard-negatives", "1",
                  "--passage-length", "256", "--query-length", "16", "--out", str(tmp_path / "report.md"))
    assert set(result["losses"]) == {"whole batches", "pieces of 2"}
    padding = result["padding"]
    assert padding["pieces of 2"]["passage_padding_share"] < padding["whole batches"]["passage_padding_share"]
    assert padding["pieces of 2"]["passage_tokens_real"] == padding["whole batches"]["passage_tokens_real"]
    assert "pieces of 2" in (tmp_path / "report.md").read_text() and (tmp_path / "report.json").is_file()


def test_the_classifiers_pieces_pad_less_and_give_the_whole_batchs_logits(shared_data, tmp_path):
    result = _run("length_pieces_classifier", shared_data, tmp_path, "--batch-size", "6", "--passage-length", "256")
    assert result["padding"]["pieces of 2"] < result["padding"]["whole batches"]


def test_the_pretraining_pieces_pad_less_and_give_the_whole_batchs_loss(shared_data, tmp_path):
    result = _run("length_pieces_pretraining", shared_data, tmp_path, "--batch-size", "5", "--passage-length", "144",
                  "--query-length", "16")
    whole, pieces = result["losses"]["whole batches"], result["losses"]["pieces of 2"]
    assert all(0 < x < 100 for x in whole + pieces)
    assert result["padding"]["pieces of 2"]["passage_padding_share"] < result["padding"]["whole batches"]["passage_padding_share"]
