"""Training under torchrun (DDP, gloo on CPU): two ranks train tiny bi-encoders through the real
train_bi_encoder (tests/ddp_worker.py). Their weights must agree; and since every rank trains on its
half of each global batch with the global batch's in-batch negatives, 2 ranks x batch 4 must give
the loss and gradients of 1 process x batch 8, up to float32 rounding (every path computing with
one pinned torch thread count)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from models.losses.distributed import gather_rows
from models.threads import ENV as THREADS_ENV
from tests import ddp_worker
from tests.tiny_models import save_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[1]
GLOBAL_BATCH = 8
LOSSES = tuple(ddp_worker.RUNS)
LONGEST_SUM = 64  # terms of the tiny BERT's longest dot product (its intermediate size)

pytestmark = pytest.mark.usefixtures("flush_denormals")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{loss: (rank 0, rank 1, one process, the ranks' output folder)}: what tests/ddp_worker.py saved."""
    checkpoint = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_bert"))
    out = tmp_path_factory.mktemp("ddp")
    # the ranks would compute with 2 threads each (OMP_NUM_THREADS): process_group pins them to
    # $PFORGE_THREADS, the count the one-process run below computes with too
    env = {**os.environ, "OMP_NUM_THREADS": "2", THREADS_ENV: "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    # --standalone: a local rendezvous on a free port
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "tests.ddp_worker", str(checkpoint), str(out / "two"), str(GLOBAL_BATCH)]
    (out / "two").mkdir()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    (out / "one").mkdir()
    with pytest.MonkeyPatch.context() as env_here:
        env_here.setenv(THREADS_ENV, "1")
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


@pytest.fixture(scope="module")
def moved_by_rounding(tmp_path_factory):
    """{loss: [step-1 gradients of one process whose weights moved by one float32 eps, per draw]}:
    how far this model's gradients move when float32 rounding moves its weights."""
    checkpoint = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny_bert"))  # the `runs` weights (seed 0)
    out = tmp_path_factory.mktemp("moved")
    moved = {name: [] for name in LOSSES}
    with pytest.MonkeyPatch.context() as env_here:
        env_here.setenv(THREADS_ENV, "1")
        for seed in (1, 2):
            (out / str(seed)).mkdir()
            ddp_worker.main(str(checkpoint), str(out / str(seed)), GLOBAL_BATCH,
                            perturb=(torch.finfo(torch.float32).eps, seed), steps=1)
            for name in LOSSES:
                moved[name].append(torch.load(out / str(seed) / f"{name}-rank0.pt")["grads"])
    return moved


def _flat(grads: dict, names: list[str]) -> torch.Tensor:
    return torch.cat([grads[n].flatten() for n in names])


@pytest.mark.parametrize("loss", LOSSES)
def test_two_ranks_of_half_batches_are_one_process_of_the_global_batch(runs, moved_by_rounding, loss):
    rank0, rank1, one, _ = runs[loss]
    assert rank0["threads"] == rank1["threads"] == one["threads"] == 1  # pinned, not OMP_NUM_THREADS' 2
    # step 1 starts from the same weights (rank 0's seed): the loss (a mean of 8 log-softmaxes
    # over 8 scores) matches to float32 rounding, ~n*eps = 1e-5 relative at most
    assert rank0["history"][0]["loss"] == pytest.approx(one["history"][0]["loss"], rel=1e-5, abs=1e-6)
    assert rank0["grads"].keys() == one["grads"].keys() and rank0["grads"]
    names = sorted(one["grads"])
    two_ranks, one_process = _flat(rank0["grads"], names), _flat(one["grads"], names)
    moves = [_flat(grads, names) - one_process for grads in moved_by_rounding[loss]]
    # Padding 4 or 8 rows reorders the float32 sums. Backward error: each path is the exact gradient at weights moved by
    # <= sqrt(n)*eps relative (n = LONGEST_SUM terms, random-walk rounding), so |diff| <= sqrt(n) x the measured eps move.
    bound = LONGEST_SUM ** 0.5
    assert (two_ranks - one_process).norm() <= bound * max(m.norm() for m in moves)
    assert (two_ranks - one_process).abs().max() <= bound * max(m.abs().max() for m in moves)
    # a rounding-sized difference, not a wrong gather (which moves the gradient by its own size)
    assert max(m.norm() for m in moves) < 0.01 * one_process.norm()


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


def test_a_data_parallel_stage_is_a_prefect_flow_run_with_the_stage_artifacts(prefect_harness, shared_data, tmp_path):
    """`python -m flows.ddp` (what `pforge run --nproc` launches): rank 0's build is a flow run on
    the configured Prefect API, with the stage's progress and summary artifacts."""
    import yaml
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterName
    from prefect.settings import PREFECT_API_URL

    from flows.pipeline import pipeline
    from flows.registry import plan_for
    from flows.ui_artifacts import artifact_key
    from storage import ArtifactStore
    from tasks.config import load_config

    checkpoint = save_tiny_checkpoint(tmp_path / "tiny_bert")
    raw = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    raw["name"] = "tiny-ddp"
    raw["data"]["data_root"] = str(shared_data)
    raw["dense"] = {"systems": [{"name": "ddp", "model": {"base": str(checkpoint), "pooling": "mean", "scale": 20.0},
                                 "train": {"loss": "dpr", "batch_size": 4, "max_steps": 2, "select_on_dev": False,
                                           "hard_negatives": 0, "negatives": [], "passage_max_len": 64}}]}
    config = tmp_path / "tiny-ddp.yaml"
    config.write_text(yaml.safe_dump(raw))
    upstream = load_config(config)
    for stage in plan_for(upstream):  # the stages before train:ddp, each on the last one's outputs
        if stage.name == "train:ddp":
            break
        pipeline(config=upstream, stage=stage.name, root=str(tmp_path / "store"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
           "PREFECT_API_URL": PREFECT_API_URL.value()}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "-m", "flows.ddp", str(config), "--stage", "train:ddp", "--root", str(tmp_path / "store")]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    version = done.stdout.split()[-1]
    assert (ArtifactStore(tmp_path / "store").get("dense_model", version).path / "model").is_dir()
    key = artifact_key("tiny-ddp", "train:ddp")
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=["tiny-ddp train:ddp"])))
        assert [r.state.type.value for r in runs] == ["COMPLETED"]
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[f"{key}-progress", f"{key}-summary"])))
    by_key = {a.key: a for a in found}
    assert set(by_key) == {f"{key}-progress", f"{key}-summary"}
    assert by_key[f"{key}-progress"].data == 100 and version in by_key[f"{key}-summary"].data
    assert {a.flow_run_id for a in found} == {runs[0].id}
