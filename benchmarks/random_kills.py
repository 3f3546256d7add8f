"""Crash consistency at many seeded random moments: tests/test_random_kills.py's checks (in
tests/crash_consistency.py) at --moments of them instead of three.

    .venv/bin/python benchmarks/random_kills.py [--moments 20] [--seed 0] [--config configs/tiny.yaml]

A clean run builds the reference store and measures its stage time (first stage started to last
stage built); each moment, drawn with random.Random(--seed) within its own --moments-th of that
time, starts the same run in a fresh root, SIGKILLs its whole session that long after its first
stage started, checks that only complete versions are listed, reruns it to the end and compares
the store with the reference (what two clean runs write differently left out: the test's
docstring), then runs `pforge verify`. Prints each moment and its outcome, then a summary; exits 1
if any moment left the store inconsistent. About a minute per moment for tiny on 2 busy cores.

The left-out differences were measured for configs/tiny.yaml. For another config, --check-reference
first builds a second clean store and prints what differs from the reference beyond them: anything
listed there is a legitimate difference that the comparison would report at every moment.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import _bootstrap  # noqa: E402,F401  (puts the project on sys.path)
import reporting  # noqa: E402
from tests.crash_consistency import differences, draw_moments, kill_and_resume, run_clean, snapshot  # noqa: E402
from tests.lifecycle import TINY, pforge_env  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moments", type=int, default=20, help="kills, one per moment (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="the moments' random.Random seed (default 0)")
    parser.add_argument("--config", type=Path, default=TINY, help="the pipeline config (default configs/tiny.yaml)")
    parser.add_argument("--check-reference", action="store_true",
                        help="first compare a second clean run with the reference (for a config other than tiny)")
    parser.add_argument("--keep", type=Path, metavar="DIR",
                        help="work in DIR and keep it (default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    if args.moments < 1:
        parser.error("--moments must be at least 1")
    args.config = args.config.resolve()   # the runs start in the project's folder
    return args


def check_reference(reference: dict, work: Path, env: dict, config: Path) -> list[str]:
    second = run_clean(work / "second-clean", work / "second-clean.log", env, config)
    return differences(reference, snapshot(second.root))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = args.keep or Path(tempfile.mkdtemp(prefix="pforge-random-kills-"))
    work.mkdir(parents=True, exist_ok=True)
    env = pforge_env(work)   # one PREFECT_HOME: its database is migrated once
    print(reporting.header(f"Crash consistency at {args.moments} random moments", __file__, argv), flush=True)
    try:
        clean = run_clean(work / "reference", work / "reference.log", env, args.config)
        reference = snapshot(clean.root)
        print(f"reference: {args.config.name}, {clean.seconds:.1f} s, stages {clean.stages_s:.1f} s, "
              f"{len(reference)} versions", flush=True)
        if args.check_reference:
            extra = check_reference(reference, work, env, args.config)
            print(f"a second clean run differs beyond the left-out fields in {len(extra)} places", *extra, sep="\n  ")
        outcomes = Counter()
        places = Counter()
        for i, moment in enumerate(draw_moments(args.seed, args.moments, clean.stages_s), 1):
            started = time.monotonic()
            killed, problems = kill_and_resume(reference, moment, work / f"moment-{i:02d}", env, args.config)
            outcome = "consistent" if not problems else f"INCONSISTENT ({len(problems)} problems)"
            outcomes[not problems] += 1
            places[killed.where] += 1
            left = f"; left running: {killed.left}" if killed.left else ""
            print(f"moment {i}/{args.moments}: {moment:.2f} s into the stages, killed {killed.where}{left}: "
                  f"{outcome} ({time.monotonic() - started:.0f} s)", *problems, sep="\n    ", flush=True)
        print(f"summary: {args.moments} moments (seed {args.seed}), {outcomes[True]} consistent, "
              f"{outcomes[False]} inconsistent; killed {dict(places)}")
        return 0 if not outcomes[False] else 1
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
