"""`pforge`: the command line over the flows and the artifact store."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from tasks.config import ConfigError, load_config
from tasks.errors import InputError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pforge", description="Passage Forge: dense passage retrieval pipelines")
    parser.add_argument("--root", help="artifact root (default: $PFORGE_HOME, else ./artifacts)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on the terminal too")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline (a Prefect flow) on a config")
    run.add_argument("config", type=Path)
    run.add_argument("--stage", help="rerun only this stage on its latest upstream artifacts")
    arts = sub.add_parser("artifacts", help="list artifacts, or one artifact's lineage")
    arts.add_argument("--stage", help="only this stage")
    arts.add_argument("--lineage", metavar="STAGE[:VERSION]", help="the chain of artifacts behind one artifact")
    sql = sub.add_parser("sql", help="query the catalog's DuckDB views")
    sql.add_argument("query")
    sql.add_argument("--param", action="append", default=[], help="a bound query parameter ($1, $2, ...)")
    serve = sub.add_parser("serve", help="register deployments on a Prefect server and serve them")
    serve.add_argument("configs", nargs="*", type=Path, default=[CONFIGS / "squad-open.yaml", CONFIGS / "tiny.yaml", CONFIGS / "nfcorpus.yaml"])
    serve.add_argument("--cron", help="schedule the full pipelines (corpus refresh), e.g. '0 3 * * 0'")
    for command in (run, arts, sql, serve):  # --root and --debug are accepted before or after the command
        command.add_argument("--root", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Prefect API call otherwise
    if not args.debug:
        quiet_prefect_tracebacks()
    try:
        return COMMANDS[args.command](args)
    except (InputError, ConfigError, ValueError, RuntimeError, OSError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"pforge: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line
        return 2


class _NoFailureReports(logging.Filter):
    """Drops Prefect's own reports of a failed task or flow (each a traceback) from the terminal:
    the CLI prints the one clear error line; the Prefect run log (API handler) keeps them."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prefect"):
            return True
        return record.levelno < logging.ERROR and not record.getMessage().startswith("Finished in state Failed")


def quiet_prefect_tracebacks() -> None:
    from prefect.logging.loggers import get_logger

    get_logger()  # sets up Prefect's logging configuration, so its handlers exist
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    for handler in {id(h): h for lg in loggers for h in getattr(lg, "handlers", [])}.values():
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.addFilter(_NoFailureReports())  # the terminal only: the API handler keeps the report


def _run(args) -> int:
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "passage_forge")
    cfg = load_config(args.config)
    from flows.pipeline import pipeline
    from storage import ArtifactStore, resolve_root

    versions = pipeline(config=cfg, stage=args.stage, root=args.root)
    store = ArtifactStore(resolve_root(args.root))
    for stage, version in versions.items():
        print(f"{stage:18s} {version}")
    if "evaluate" in versions:
        evaluation = store.get("evaluation", versions["evaluate"])
        print()
        print((evaluation.path / "report.md").read_text(encoding="utf-8"))
        print(f"report: {evaluation.path / 'report.md'}")
    return 0


def _artifacts(args) -> int:
    from storage import ArtifactStore, resolve_root

    store = ArtifactStore(resolve_root(args.root))
    if args.lineage:
        stage, _, version = args.lineage.partition(":")
        artifact = store.get(stage, version) if version else store.latest(stage)
        if artifact is None:
            raise ValueError(f"no artifact {args.lineage!r}")
        for row in store.lineage(artifact.stage, artifact.version):
            print(f"{'  ' * row['depth']}{row['stage']} {row['version']} {json.dumps(row['parameters'], sort_keys=True)[:160]}")
        return 0
    rows = store.list_artifacts(args.stage)
    print(f"{'stage':14s} {'version':16s} {'rows':>10s} {'bytes':>12s} {'created_at':26s} inputs")
    for row in rows:
        inputs = row["inputs"] if isinstance(row["inputs"], dict) else json.loads(row["inputs"] or "{}")
        upstream = ", ".join(f"{v['stage']}:{v['version']}" for v in inputs.values())
        print(f"{row['stage']:14s} {row['version']:16s} {row['rows'] or 0:>10,} {row['bytes'] or 0:>12,} {str(row['created_at']):26s} {upstream}")
    return 0


def _sql(args) -> int:
    from storage import ArtifactStore, resolve_root

    table = ArtifactStore(resolve_root(args.root)).sql(args.query, args.param or None)  # CatalogError: one line
    print(table.to_pandas().to_string(index=False) if table.num_rows else "(no rows)")
    return 0


def _serve(args) -> int:
    from flows.serve import serve_pipeline

    serve_pipeline(args.configs, root=args.root, cron=args.cron)
    return 0


COMMANDS = {"run": _run, "artifacts": _artifacts, "sql": _sql, "serve": _serve}

if __name__ == "__main__":
    sys.exit(main())
