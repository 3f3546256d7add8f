"""`pforge study status|run|tables [STUDY]`: the study's command line (flows/cli.py adds it)."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration(text: str) -> float:
    """'150m', '2h', '2h30m', '90s' -> seconds."""
    match = DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"{text!r}: a duration such as 150m, 2h, 2h30m or 90s")
    hours, minutes, seconds = (float(g or 0) for g in match.groups())
    total = 3600 * hours + 60 * minutes + seconds
    if total <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a budget must be above 0")
    return total


def add_parser(sub) -> argparse.ArgumentParser:
    study = sub.add_parser("study", help="the corpus-scale study: where each row stands, build rows within a "
                                         "budget, the tables from the committed records")
    actions = study.add_subparsers(dest="study_command", required=True)
    status = actions.add_parser("status", help="every row: measured (when, CPU, commit), resumable here, or not "
                                               "started, with its price on this machine")
    run = actions.add_parser("run", help="build the next rows in priority order that fit the budget; write and "
                                         "commit each row's record as it lands")
    run.add_argument("--budget", type=parse_duration, required=True, help="wall time to spend, e.g. 150m or 2h30m")
    run.add_argument("--row", action="append", help="only this row (repeatable)")
    run.add_argument("--again", action="append", dest="row", type=_again, metavar="ROW",
                     help="this row too, measured again here where its record is at other versions than this "
                          "plan gives (another CPU's precision, older code); its record is replaced (repeatable, "
                          "in order with --row)")
    run.add_argument("--background", action="store_true", help="detach: print the pid and the log's path, return")
    run.add_argument("--no-commit", action="store_true", help="write the records, commit nothing")
    tables = actions.add_parser("tables", help="every table of the study from its records alone (Markdown)")
    tables.add_argument("--samples", type=int, default=10_000, help="paired bootstrap resamples (default 10,000)")
    for action in (status, run, tables):
        action.add_argument("study", nargs="?", default="squad-open", help="a folder under studies/ (default squad-open)")
        action.add_argument("--records-into", type=Path, metavar="REPO",
                            help="the checkout whose studies/ folder holds the records (default: this code's); "
                                 "a run from a worktree snapshot writes and commits them into the main checkout")
        action.add_argument("--threads", type=int, help="torch threads (default $PFORGE_THREADS, else all cores)")
        action.add_argument("--root", default=argparse.SUPPRESS, help=argparse.SUPPRESS)   # before or after the action
        action.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return study


def _again(name: str):
    from flows.study.runner import Again

    return Again(name)


def study_root(cli_root: str | None, study) -> Path:
    """--root, else $PFORGE_HOME, else the study's own root (outside the work tree)."""
    import os

    from storage.paths import ENV_HOME

    return Path(cli_root or os.environ.get(ENV_HOME) or study.root).expanduser().resolve()


def _study(args):
    from flows.study.definition import load_study

    if args.records_into is None:
        return load_study(args.study)
    return load_study(args.records_into.expanduser().resolve() / "studies" / args.study / "study.yaml")


def background_argv(args, root: Path, study, threads: int) -> list[str]:
    """The detached runner's own command line: this one's, its rows (and `--again` rows) in order."""
    from flows.study.runner import Again

    argv = ["--root", str(root), "study", "run", args.study, "--budget", f"{args.budget:.0f}s",
            "--threads", str(threads), "--records-into", str(study.folder.parents[1])]
    argv += [f"--{'again' if isinstance(name, Again) else 'row'}={name}" for name in args.row or []]
    return argv + (["--no-commit"] if args.no_commit else [])


def _threads(args) -> int:
    from models.threads import resolve_threads

    threads = resolve_threads(args.threads)
    if threads < 1:
        raise ValueError(f"--threads {threads}: one thread or more")
    return threads


def study_command(args) -> int:
    from flows.study.machine import this_machine
    from flows.study.records import read_records

    study = _study(args)
    if args.study_command == "tables":
        from flows.study.tables import study_tables

        if args.samples < 100:
            raise ValueError(f"--samples {args.samples}: at least 100 resamples")
        sys.stdout.write(study_tables(study, samples=args.samples))
        return 0
    root = study_root(getattr(args, "root", None), study)
    if args.study_command == "status":
        from flows.study.status import status_text, study_status

        from flows.study.estimate import with_best_probe

        machine, records = this_machine(_threads(args)), read_records(study.folder)
        sys.stdout.write(status_text(study, root, study_status(study, root, records, machine),
                                     with_best_probe(machine, records)))
        return 0
    if args.background:
        from flows.study.runner import background
        from flows.study.status import log_dir

        argv = background_argv(args, root, study, _threads(args))
        log = log_dir(root) / "runner.log"
        pid = background(argv, log)
        print(f"study {study.name}: running in the background (pid {pid}); log {log}")
        return 0
    from flows.study.runner import run_study

    repo = None if args.no_commit else study.folder.parents[1]
    recorded = run_study(study, root, args.budget, this_machine(_threads(args)), repo=repo, rows=args.row)
    print(f"study {study.name}: {len(recorded)} row(s) recorded" + (f": {', '.join(recorded)}" if recorded else ""))
    return 0
