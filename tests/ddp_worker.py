"""Trains tiny bi-encoders for a few steps through the real `train_bi_encoder`, under torchrun or
in one process, and saves what tests/test_ddp.py compares:

    torchrun --nproc_per_node 2 -m tests.ddp_worker CHECKPOINT OUT_DIR GLOBAL_BATCH

OUT_DIR/<loss>-rank<R>.pt holds the initial and final weights, the gradients of step 1, the torch
thread count step 1 ran with and the history; each run writes to OUT_DIR/<loss>/rank<R>/ (only
rank 0 may write anything there). In one process, `main(..., perturb=(size, seed))` first moves
every weight by a random relative amount of at most `size` (tests/test_ddp.py measures how far
float32 rounding can move the gradients).
Under torchrun it then builds a toy training stage through flows/ddp.py (`build_stage_twice`).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

from tasks.training.callbacks import TrainerCallback

STEPS = 3
RUNS = {  # loss -> (loss options, shared tower, hard negatives, weighted examples)
    "dpr": ({}, True, 1, False),
    "weighted": ({}, True, 0, True),
    "xmoco": ({"queue_size": 64, "momentum": 0.5}, False, 1, False),
    # masks are drawn per batch shape, so only unmasked spans compare with one process: L_co alone
    "cocondenser": ({}, True, 0, False),
}


class FirstStepGradients(TrainerCallback):
    """Keeps the model's gradients of step 1 (after DDP's averaging, before the next zero_grad)."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}
        self.threads = 0

    def on_step_end(self, step, model, optimizer) -> None:
        if step == 1:
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            self.threads = torch.get_num_threads()


def train(loss_name: str, checkpoint: str, out_dir: Path, batch_size: int, rank: int,
          perturb: tuple[float, int] | None = None, steps: int = STEPS) -> None:
    from models import BiEncoder
    from models.losses import build_loss
    from models.pretraining import PRETRAINING_LOSSES, build_pretraining_loss
    from tasks.training import TrainerArgs, train_bi_encoder
    from tests.test_training import make_examples

    options, shared, hard_negatives, weighted = RUNS[loss_name]
    torch.manual_seed(rank)  # ranks start apart (their projections): DDP must start them from rank 0's
    model = BiEncoder.from_pretrained(checkpoint, projection_dim=16, shared=shared)
    for module in model.modules():  # no dropout: one process and two ranks compute the same function
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    if perturb is not None:
        size, seed = perturb
        draws = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1 + size * (2 * torch.rand(parameter.shape, generator=draws) - 1))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    examples = make_examples(n=4 * batch_size, pool=2, seed=0)
    if weighted:
        for i, example in enumerate(examples):
            example.weight = 0.25 + (i % 4) / 4
    recorder = FirstStepGradients()
    args = TrainerArgs(lr=1e-3, batch_size=batch_size, max_steps=steps, warmup_ratio=0.0, hard_negatives=hard_negatives,
                       query_max_len=16, passage_max_len=24, seed=0, max_grad_norm=None)
    if loss_name in PRETRAINING_LOSSES:
        from models.pretraining.masking import IGNORE

        loss = build_pretraining_loss(loss_name, model, **options)
        loss.mask = lambda batch, rate, stream: (batch["input_ids"], torch.full_like(batch["input_ids"], IGNORE))
    else:
        loss = build_loss(loss_name, model, **options)
    result = train_bi_encoder(model, loss, examples, args,
                              out_dir / loss_name / f"rank{rank}", progress=False, device="cpu", callbacks=[recorder])
    torch.save({"initial": initial, "final": model.state_dict(), "grads": recorder.grads, "threads": recorder.threads,
                "history": result["history"]}, out_dir / f"{loss_name}-rank{rank}.pt")


def build_stage_twice(out_dir: Path, ranks) -> None:
    """flows/ddp.py's lead and follow on a toy plan (source -> train:toy) in a store under
    OUT_DIR/store: a build, then a cache hit. OUT_DIR/stage-rank<R>.json: what each rank built."""
    import json

    import pyarrow as pa
    import torch.distributed as dist

    from flows.ddp import follow, lead
    from storage import ArtifactStore
    from storage.parquet import write_table
    from tasks.engine import NoParams, Plan, Stage, run_stage
    from tasks.training.distributed import is_main_process

    built = []

    def source(params, inputs, out):
        write_table(out, pa.table({"x": [1, 2]}))

    def toy_train(params, inputs, out):
        ranks_here = torch.ones(())
        dist.all_reduce(ranks_here)  # every rank builds together, or this waits for ever
        built.append({"input": str(inputs["source"].path), "out": str(out), "ranks": int(ranks_here)})
        if is_main_process():
            write_table(out, pa.table({"ranks": [int(ranks_here)]}))

    plan = Plan([Stage("source", "source", "1", (), NoParams(), source),
                 Stage("train:toy", "toy_model", "1", ("source",), NoParams(), toy_train)])
    root = out_dir / "store"
    if ranks.main:
        run_stage(ArtifactStore(root), plan["source"], {})
    for _ in range(2):  # the second time, a cache hit: nobody builds
        if ranks.main:
            lead(plan, "train:toy", str(root), ranks)
        else:
            follow(plan["train:toy"], ranks)
    (out_dir / f"stage-rank{ranks.rank}.json").write_text(json.dumps(built))


def main(checkpoint: str, out_dir: str, batch_size: int, losses=tuple(RUNS), perturb=None, steps: int = STEPS) -> None:
    from tasks.training.distributed import process_group

    torch.set_flush_denormal(True)  # tiny random BERTs: subnormals make CPU steps slow
    # One process group for all runs (run_training uses a caller's group, as flows/ddp.py's)
    with process_group(torch.device("cpu")) as ranks:
        for name in losses:
            train(name, checkpoint, Path(out_dir), batch_size, ranks.rank, perturb, steps)
        if ranks.distributed:
            build_stage_twice(Path(out_dir), ranks)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
