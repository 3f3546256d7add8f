"""The ranks of a data-parallel run whose Prefect server dies, for tests/test_server_death.py:

    torchrun --nproc_per_node 2 -m tests.ddp_server_death OUT_DIR

Rank 0 starts a stand-in for its ephemeral Prefect server (a child whose command line names
Prefect's server app, which is what the watchdog looks for), watches it as flows/ddp.py's main
does, sends rank 1 its inputs and kills the stand-in; rank 1 follows (flows/ddp.py `follow`) into a
build that waits on rank 0, as a training step waits on the other ranks. Neither returns: the
watchdog ends the run. OUT_DIR/rank<R>.json holds each rank's pid, torchrun's, rank 0's stand-in
and rank 1's scratch folder (and when rank 0 killed the stand-in).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import torch
import torch.distributed as dist

from flows.ddp import follow, watching_the_server
from flows.server_watchdog import POLL_S, SERVER_APP
from tasks.training.distributed import process_group

NEVER_S = 600  # longer than any test waits


def main(out_dir: Path) -> None:
    with process_group(torch.device("cpu")) as ranks, watching_the_server(ranks):
        record = {"pid": os.getpid(), "torchrun": os.getppid()}
        if ranks.main:
            server = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({NEVER_S})", SERVER_APP])
            record["server"] = server.pid
            (out_dir / "rank0.json").write_text(json.dumps(record))
            ranks.broadcast({"passages": "rank 0's"})
            time.sleep(4 * POLL_S)  # seen alive by the watchdog
            server.kill()
            (out_dir / "rank0.json").write_text(json.dumps({**record, "killed_at": time.time()}))
            time.sleep(NEVER_S)
        else:
            def waits_on_rank_zero(params, inputs, out):
                (out_dir / "rank1.json").write_text(json.dumps({**record, "scratch": str(out.parent)}))
                dist.barrier()  # rank 0 never comes
            follow(types.SimpleNamespace(params=None, resumable=False, build=waits_on_rank_zero), ranks)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
