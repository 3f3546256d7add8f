"""File digest cost: SHA-256 (what the store records at commit and `pforge verify` checks) against
BLAKE2b (the peer: hashlib's fastest other cryptographic hash) on one file, read in 1 MiB blocks.

    .venv/bin/python benchmarks/file_digest.py [--mb 200] [--repeat 5]

Timing (benchmarks/timing.py): each hash reads the file once untimed (warm-up: the file is then in
the page cache, as a freshly written artifact is at commit), then --repeat times, alternated with
the order swapped each repeat. GB/s per repeat as median (min-max), the ratio of medians with its
range ("parity" where the ranges overlap), and seconds per GB of each hash, wall and CPU (this
process's CPU time: on a shared machine the wall clock also counts the other jobs' turns), on the
CPU named.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import tempfile
import time
from pathlib import Path

import _bootstrap  # noqa: E402,F401  (puts the project on sys.path)
import reporting  # noqa: E402
import timing  # noqa: E402

BLOCK = 1 << 20


def digest_file(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    return digest.hexdigest()


def write_random_file(path: Path, megabytes: int) -> None:
    with open(path, "wb") as f:
        for _ in range(megabytes):
            f.write(os.urandom(BLOCK))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=200, help="size of the file hashed, in MiB (default 200)")
    timing.add_repeat_argument(parser, what="timed reads of the file per hash")
    args = parser.parse_args(argv)
    hashes = ["sha256", "blake2b"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "blob.bin"
        write_random_file(path, args.mb)
        gigabytes = path.stat().st_size / 1e9
        for name in hashes:
            digest_file(path, name)  # warm-up, untimed
        cpu: dict[str, list[float]] = {name: [] for name in hashes}

        def timed(name: str):
            def run(_repeat: int) -> None:
                start = time.process_time()
                digest_file(path, name)
                cpu[name].append(time.process_time() - start)
            return run

        seconds, _ = timing.alternate({name: timed(name) for name in hashes}, args.repeat)
    summaries = {name: timing.summarize(timing.rates(gigabytes, s)) for name, s in seconds.items()}
    print(reporting.header("File digest: SHA-256 vs BLAKE2b", __file__, argv))
    print(f"{args.mb} MiB file from the page cache, {BLOCK >> 20} MiB reads")
    print(timing.protocol_line(args.repeat, hashes))
    print(reporting.markdown_table(["hash", "GB/s", "vs sha256 (x faster)"],
                                timing.comparison_rows(summaries, "sha256", spec=".2f")))
    for name in hashes:
        wall = timing.summarize([s / gigabytes for s in seconds[name]])
        used = timing.summarize([s / gigabytes for s in cpu[name]])
        print(f"{name}: {timing.fmt_summary(wall, '.2f')} s per GB wall, {timing.fmt_summary(used, '.2f')} s per GB CPU")
    return {"summaries": summaries, "cpu": reporting.cpu_name()}


if __name__ == "__main__":
    main()
