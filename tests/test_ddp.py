"""Training under torchrun (DDP, gloo on CPU): two ranks train tiny bi-encoders through the real
train_bi_encoder (tests/ddp_worker.py). Their weights must agree; and since every rank trains on its
half of each global batch with the global batch's in-batch negatives, 2 ranks x batch 4 must give
the loss and gradients of 1 process x batch 8."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.losses.distributed import gather_rows
from tests import ddp_worker
from tests.tiny_models import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 8
LOSSES = tuple(ddp_worker.RUNS)

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{loss: (rank 0, rank 1, one process, the ranks' output folder)}: what tests/ddp_worker.py saved."""
    checkpoint = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_bert"))
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    # --standalone: a local rendezvous on a free port
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "tests.ddp_worker", str(checkpoint), str(out / "two"), str(GLOBAL_BATCH)]
    (out / "two").mkdir()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    (out / "one").mkdir()
    ddp_worker.main(str(checkpoint), str(out / "one"), GLOBAL_BATCH)  # no torchrun here: one process
    saved = (("two", 0), ("two", 1), ("one", 0))
    return {name: (*(torch.load(out / folder / f"{name}-rank{rank}.pt") for folder, rank in saved), out / "two" / name)
            for name in LOSSES}


@pytest.mark.parametrize("loss", LOSSES)
def test_two_ranks_train_the_same_weights(runs, loss):
    rank0, rank1, _, _ = runs[loss]
    # the ranks started apart, so agreeing means DDP started them from rank 0's weights ...
    assert any(not torch.equal(a, rank1["initial"][k]) for k, a in rank0["initial"].items())
    # ... and kept them together: the same averaged gradients every step
    assert rank0["final"].keys() == rank1["final"].keys()
    for key, tensor in rank0["final"].items():
        assert torch.equal(tensor, rank1["final"][key]), key
    moved = [k for k, t in rank0["final"].items() if not torch.allclose(t, rank0["initial"][k])]
    assert len(moved) > len(rank0["final"]) // 2, "training did not change the weights"
    assert [h["loss"] for h in rank0["history"]] == [h["loss"] for h in rank1["history"]]
    assert len(rank0["history"]) == ddp_worker.STEPS


@pytest.mark.parametrize("loss", LOSSES)
def test_two_ranks_of_half_batches_are_one_process_of_the_global_batch(runs, loss):
    rank0, _, one, _ = runs[loss]
    # step 1 starts from the same weights (rank 0's seed), so loss and gradients must match
    assert rank0["history"][0]["loss"] == pytest.approx(one["history"][0]["loss"], rel=1e-5, abs=1e-6)
    assert rank0["grads"].keys() == one["grads"].keys() and rank0["grads"]
    names = sorted(one["grads"])
    two_ranks, one_process = (torch.cat([run["grads"][n].flatten() for n in names]) for run in (rank0, one))
    # float32 noise only (padding to 4 or to 8 rows changes the sums' order): ~1e-5 of the norm
    assert (two_ranks - one_process).norm() <= 1e-4 * one_process.norm()
    torch.testing.assert_close(two_ranks, one_process, rtol=1e-3, atol=1e-4 * float(one_process.abs().max()))


def test_only_rank_zero_writes(runs):
    *_, folder = runs["dpr"]
    assert (folder / "rank0" / "final").is_dir() and (folder / "rank0" / "history.json").is_file()
    assert not (folder / "rank1").exists() or not any((folder / "rank1").iterdir())


def test_only_rank_zero_commits_the_stage(runs):
    """flows/ddp.py: both ranks build train:toy together; rank 1 in a scratch folder; the store
    holds rank 0's build only; the second request is a cache hit on which nobody builds."""
    import json

    import pyarrow.parquet as pq

    from storage import ArtifactStore

    out = runs["dpr"][3].parent
    built = [json.loads((out / f"stage-rank{r}.json").read_text()) for r in range(2)]
    assert [len(b) for b in built] == [1, 1]  # once each: the second time was a cache hit
    assert built[0][0]["input"] == built[1][0]["input"] and built[0][0]["ranks"] == 2
    store = ArtifactStore(out / "store")
    artifacts = store.list_artifacts("toy_model")
    assert len(artifacts) == 1
    committed = store.latest("toy_model")
    assert pq.read_table(committed.data_dir).column("ranks").to_pylist() == [2]
    assert not Path(built[1][0]["out"]).is_relative_to(out / "store")


def test_gather_rows_is_the_identity_in_one_process():
    x = torch.randn(3, 4, requires_grad=True)
    assert gather_rows(x) is x and gather_rows(None) is None
