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


def _count(low: int):
    """An argparse type: a whole number of at least `low` (0 or 1), refused with the flag's name."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pforge", description="Passage Forge: dense passage retrieval pipelines")
    parser.add_argument("--root", help="artifact root (default: $PFORGE_HOME, else ./artifacts)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on the terminal too")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the pipeline (a Prefect flow) on a config")
    run.add_argument("config", type=Path)
    only = run.add_mutually_exclusive_group()
    only.add_argument("--stage", help="rerun only this stage on its latest upstream artifacts")
    only.add_argument("--upto", metavar="STAGE[,STAGE]", help="run this stage (or each of several, comma-separated) "
                                                              "and every stage it needs, not the rest (e.g. another "
                                                              "config's classifier or generator)")
    run.add_argument("--nproc", type=_count(1), default=1, help="train a train:NAME stage data-parallel on this many "
                                                          "ranks (torchrun + DDP: one per GPU, gloo on CPUs)")
    run.add_argument("--smoke", action="store_true", help="every stage of the config on a few seconds' work each "
                                                          "(3 articles, 2 steps, CPU, fp32): a check before the real run")
    arts = sub.add_parser("artifacts", help="list artifacts, or one artifact's lineage")
    arts.add_argument("--stage", help="only this stage")
    arts.add_argument("--lineage", metavar="STAGE[:VERSION]", help="the chain of artifacts behind one artifact")
    sql = sub.add_parser("sql", help="query the catalog's DuckDB views")
    sql.add_argument("query")
    sql.add_argument("--param", action="append", default=[], help="a bound query parameter ($1, $2, ...)")
    search = sub.add_parser("search", help="the top passages for a question, from the latest or promoted artifacts")
    search.add_argument("question")
    which = search.add_mutually_exclusive_group()
    which.add_argument("--system", help="bm25, a dense system, hybrid, a fusion (default: the promoted encoder, else bm25)")
    which.add_argument("--promoted", action="store_true", help="the dense system of the last promoted encoder")
    search.add_argument("-k", type=int, default=10, help="passages to print (default 10)")
    search.add_argument("--config", type=Path, help="the artifacts this config built (default: the latest of the system)")
    search.add_argument("--chars", type=_count(0), default=240, help="characters of each passage's text to print (0: all)")
    promote = sub.add_parser("promote", help="mark the trained encoder (dense_model version) that serves searches; "
                                             "without a version, list the promotions")
    promote.add_argument("version", nargs="?", help="a dense_model version (or a unique prefix of one)")
    promote.add_argument("--note", help="why, recorded with the promotion")
    gc = sub.add_parser("gc", help="delete old artifact versions: keeps the newest of each stage (and system), "
                                   "what a promotion serves, and every input of what is kept")
    gc.add_argument("--keep", type=int, default=1, metavar="N", help="newest versions kept per stage and system (default 1)")
    gc.add_argument("--dry-run", action="store_true", help="list what would be removed and its size; delete nothing")
    refresh = sub.add_parser("refresh", help="refresh a built corpus from a newer dump: re-ingest, re-chunk and "
                                             "re-encode what changed, update the BM25 and FAISS indexes")
    refresh.add_argument("config", type=Path)
    refresh.add_argument("--dump", help="the newer dump: a path, a glob (the newest match) or a URL with an optional "
                                        "{date} (default: the config's refresh.dump, else its own dump read again)")
    compare = sub.add_parser("compare", help="A's top-k accuracy (or nDCG@k, without answers) minus B's with its "
                                             "paired bootstrap 95%% interval, from the newest evaluation that scored both")
    compare.add_argument("system_a")
    compare.add_argument("system_b")
    compare.add_argument("--split", default="test", help="the questions resampled (default test)")
    compare.add_argument("-k", type=_count(1), nargs="+", default=[1, 20], help="cut-offs (default 1 20)")
    compare.add_argument("--samples", type=int, default=10_000, help="bootstrap resamples (default 10,000)")
    compare.add_argument("--seed", type=int, default=0)
    compare.add_argument("--evaluation", metavar="VERSION", help="this evaluation artifact (default: the newest with both)")
    compare.add_argument("--metric", default="auto", choices=["auto", "top_k_accuracy", "ndcg_cut", "recall", "mrr", "P"],
                         help="what is resampled per question (default auto: top-k answer accuracy when the questions "
                              "carry answers, else nDCG@k on the qrels)")
    plan = sub.add_parser("plan", help="the stages a config runs, in order, with their versions and whether each is "
                                       "built in the artifact root (nothing runs); optionally the stage DAG")
    plan.add_argument("config", type=Path)
    plan.add_argument("--smoke", action="store_true", help="the plan of `pforge run --smoke`")
    plan.add_argument("--mermaid", type=Path, metavar="FILE", help="write the stage DAG as a Mermaid flowchart ('-': stdout)")
    plan.add_argument("--dot", type=Path, metavar="FILE", help="write the stage DAG as Graphviz dot ('-': stdout)")
    plan.add_argument("--reduced", action="store_true", help="draw only the edges no longer path implies "
                                                               "(a large plan's picture, as the docs draw it)")
    view = plan.add_mutually_exclusive_group()
    view.add_argument("--overview", action="store_true", help="draw one node per stage family (a large plan's "
                                                               "first picture, as the docs draw it)")
    view.add_argument("--part", type=_count(1), metavar="N", help="draw part N of the parts the docs draw a large "
                                                                 "plan in (edges as --reduced; a small plan is part 1)")
    serve = sub.add_parser("serve", help="register deployments on a Prefect server and serve them")
    serve.add_argument("configs", nargs="*", type=Path, default=[CONFIGS / "squad-open.yaml", CONFIGS / "tiny.yaml", CONFIGS / "nfcorpus.yaml"])
    serve.add_argument("--cron", help="schedule the full pipelines, e.g. '0 3 * * 0' (each config's corpus refresh runs on its refresh.cron)")
    export = sub.add_parser("export", help="write an artifact as a checksummed archive with a description of "
                                           "its version and lineage (for another machine's store: pforge import)")
    export.add_argument("artifact", metavar="STAGE[:VERSION]", help="as `pforge artifacts --lineage` takes it")
    export.add_argument("--to", type=Path, required=True, metavar="FOLDER", help="where the two files go")
    imp = sub.add_parser("import", help="commit exported artifacts into the store, after checking each archive's "
                                        "SHA-256 and that its parameters and inputs give the version it names")
    imp.add_argument("descriptions", nargs="+", type=Path, metavar="STAGE-VERSION.json")
    verify = sub.add_parser("verify", help="check committed artifacts against the sizes and SHA-256 digests their "
                                           "manifests record; exit 1 when a file is damaged")
    what = verify.add_mutually_exclusive_group()
    what.add_argument("artifact", nargs="?", metavar="STAGE[:VERSION]", help="only this artifact (default: every "
                                                                              "committed version)")
    what.add_argument("--config", type=Path, help="only the versions this config plans that are built")
    verify.add_argument("--repair", action="store_true", help="move each damaged version aside (kept as "
                                                              "<stage>/.damaged-...) so the next run rebuilds it")
    from flows.study.cli import add_parser as add_study_parser

    study = add_study_parser(sub)
    for command in (run, arts, sql, search, promote, gc, refresh, serve, compare, plan, study, export, imp, verify):  # --root and --debug are accepted before or after the command
        command.add_argument("--root", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if argv is None:  # a `pforge` process, not a caller's (a test's) own: its environment and signals
        _prepare_process()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per Prefect API call otherwise
    if args.debug:
        os.environ["PFORGE_DEBUG"] = "1"  # the JVM's and the ONNX export's own messages too (subprocesses included)
    else:
        logging.getLogger("faiss.loader").setLevel(logging.WARNING)  # which SIMD build it tried, on every import
        quiet_prefect_tracebacks()
        if argv is None:
            # A failed log write is dropped without a word (the stdlib's production setting): Prefect's
            # API log worker reports each one on the terminal, with no newline at its end, while its
            # server is unreachable, and the watchdog's one line says what happened instead.
            logging.raiseExceptions = False
    try:
        return COMMANDS[args.command](args)
    except (InputError, ConfigError, ValueError, RuntimeError, OSError) as exc:
        if args.debug:
            traceback.print_exc()
        print(f"pforge: error: {' '.join(str(exc).split())}", file=sys.stderr)  # one line
        return 2


def _prepare_process() -> None:
    """Before Prefect is imported: its settings (analytics off unless the user opts in, a patient
    ephemeral server on a database no other run writes), then Ctrl-C/SIGTERM handling that stops
    the run and its children (the ephemeral server among them) and removes a private database.
    First, what a killed `pforge` left running is stopped (before its database folder goes), and
    this process's children are tagged as its own (flows/orphans.py)."""
    from flows.interrupts import stop_on_signals
    from flows.orphans import mark_descendants, stop_orphans
    from flows.prefect_env import prepare_process, remove_database_dir

    stop_orphans()
    mark_descendants()
    database_dir = prepare_process()
    stop_on_signals([lambda: remove_database_dir(database_dir)])


TEMPORARY_SERVER_NOTE = ("Prefect: a temporary server for this run at {address}; a Prefect UI started later does "
                         "not show its runs (set PREFECT_API_URL to a server's API to keep them)")


class _NoFailureReports(logging.Filter):
    """Drops Prefect's own reports of a failed task or flow (each a traceback) from the terminal:
    the CLI prints the one clear error line; the Prefect run log (API handler) keeps them. Its
    temporary server's three lines (a docs link among them) become one that says what it means."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prefect"):
            return True
        message = record.getMessage()
        if message.startswith("Stopping temporary server on "):
            return False
        if message.startswith("Starting temporary server on "):
            record.msg, record.args = TEMPORARY_SERVER_NOTE.format(address=message.split()[4]), ()
        return record.levelno < logging.ERROR and not message.startswith("Finished in state Failed")


def quiet_prefect_tracebacks() -> None:
    from prefect.logging.loggers import get_logger

    get_logger()  # sets up Prefect's logging configuration, so its handlers exist
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    for handler in {id(h): h for lg in loggers for h in getattr(lg, "handlers", [])}.values():
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
            handler.addFilter(_NoFailureReports())  # the terminal only: the API handler keeps the report


def _run(args) -> int:
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "passage_forge")
    if args.nproc > 1 and args.smoke:  # the arguments alone: before the config is read
        raise ValueError("--smoke runs in one process: leave out --nproc")
    cfg = load_config(args.config, smoke=args.smoke)
    _check_stage_names(cfg, args)  # before the Prefect server starts: a typo costs no half a minute
    _refuse_read_only(args)  # before the Prefect server starts, too
    if args.nproc > 1:
        return _run_data_parallel(args)
    from flows.pipeline import pipeline
    from flows.server_watchdog import stopping_if_the_server_dies
    from storage import ArtifactStore, resolve_root

    with stopping_if_the_server_dies():  # a dead Prefect server: one line, not minutes of retries
        versions = pipeline(config=cfg, stage=args.stage, root=args.root, upto=args.upto)
    store = ArtifactStore(resolve_root(args.root))
    for stage, version in versions.items():
        print(f"{stage:18s} {version}")
    if "evaluate" in versions:
        evaluation = store.get("evaluation", versions["evaluate"])
        print()
        print((evaluation.path / "report.md").read_text(encoding="utf-8"))
        print(f"report: {evaluation.path / 'report.md'}")
    return 0


def _check_stage_names(cfg, args) -> None:
    """Every stage --stage or --upto names is one of the config's (ValueError naming the file)."""
    from flows.registry import plan_for

    names = [args.stage] if args.stage else args.upto.split(",") if args.upto is not None else []
    plan = plan_for(cfg)
    for name in names:
        try:
            plan.resolve_name(name.strip())
        except ValueError as exc:
            flag = "--stage" if args.stage else "--upto"
            raise ValueError(f"{args.config}: {flag}: {exc}") from None


def _refuse_read_only(args) -> None:
    """A command that writes refuses a read-only root in one line (exit 2) before any work starts."""
    from storage import require_writable_root, resolve_root

    require_writable_root(resolve_root(args.root))


def _run_data_parallel(args) -> int:
    """`--nproc N`: the stage under torchrun (flows/ddp.py: rank 0 alone touches the store, and
    alone watches the Prefect server)."""
    from flows.ddp import launch, torchrun_command

    if not (args.stage or "").startswith("train:"):
        raise ValueError(f"--nproc {args.nproc} runs one training stage (--stage train:NAME), not {args.stage or 'the pipeline'}")
    root = ["--root", str(Path(args.root).absolute())] if args.root else []
    command = torchrun_command(args.nproc, "flows.ddp", str(args.config.absolute()), "--stage", args.stage, *root)
    return launch(command, cwd=Path(__file__).resolve().parents[1])


def _plan(args) -> int:
    from flows.plan import DAG_FORMATS, OVERVIEW, plan_text, planned_stages
    from flows.registry import plan_for
    from storage import resolve_root

    cfg = load_config(args.config, smoke=args.smoke)
    plan = plan_for(cfg)
    targets = {fmt: getattr(args, fmt) for fmt in DAG_FORMATS if getattr(args, fmt) is not None}
    for fmt, target in targets.items():
        text = DAG_FORMATS[fmt](plan, reduced=args.reduced, view=OVERVIEW if args.overview else args.part)
        if str(target) == "-":
            sys.stdout.write(text)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
    if any(str(t) == "-" for t in targets.values()):
        return 0  # stdout holds the DAG alone, ready for a pipe
    root = resolve_root(args.root)
    print(plan_text(cfg.name, root, planned_stages(plan, root)), end="")
    for fmt, target in targets.items():
        print(f"{fmt} DAG: {target}")
    return 0


def _artifacts(args) -> int:
    from storage import ArtifactStore, resolve_root

    store = ArtifactStore(resolve_root(args.root), create=False)
    if args.lineage:
        artifact = store.find(args.lineage)
        for row in store.lineage(artifact.stage, artifact.version):
            print(f"{'  ' * row['depth']}{row['stage']} {row['version']} {json.dumps(row['parameters'], sort_keys=True)[:160]}")
        return 0
    rows = store.list_artifacts(args.stage)
    if args.stage and not rows:
        known = sorted({row["stage"] for row in store.list_artifacts()})
        raise ValueError(f"{store.root}: no artifact of stage {args.stage!r}; stages: {', '.join(known) or '(none)'}")
    print(f"{'stage':14s} {'version':16s} {'rows':>10s} {'bytes':>12s} {'created_at':26s} inputs")
    for row in rows:
        inputs = row["inputs"] if isinstance(row["inputs"], dict) else json.loads(row["inputs"] or "{}")
        upstream = ", ".join(f"{v['stage']}:{v['version']}" for v in inputs.values())
        print(f"{row['stage']:14s} {row['version']:16s} {row['rows'] or 0:>10,} {row['bytes'] or 0:>12,} {str(row['created_at']):26s} {upstream}")
    return 0


def _sql(args) -> int:
    from storage import ArtifactStore, resolve_root

    table = ArtifactStore(resolve_root(args.root), create=False).sql(args.query, args.param or None)  # CatalogError: one line
    print(table.to_pandas().to_string(index=False) if table.num_rows else "(no rows)")
    return 0


def _compare(args) -> int:
    from flows.compare import compare
    from storage import ArtifactStore, resolve_root
    from tasks.evaluation.bootstrap import comparisons_markdown

    store = ArtifactStore(resolve_root(args.root), create=False)
    artifact, rows = compare(store, args.system_a, args.system_b, args.split, args.k, args.samples, args.seed,
                             args.evaluation, args.metric)
    print(f"evaluation {artifact.version} ({rows[0]['questions']:,} {args.split} questions, {args.samples:,} paired "
          "bootstrap resamples)")
    print(comparisons_markdown(rows))
    return 0


def _search(args) -> int:
    from flows.search import search

    if not args.debug:  # the passages are the output: no loader chatter (faiss, the stages' INFO lines)
        logging.getLogger().setLevel(logging.WARNING)
    result = search(args.question, system=args.system, promoted=args.promoted, k=args.k, root=args.root,
                    config=args.config)
    encoder = f", encoder dense_model {result.encoder}" if result.encoder else ""
    encoder += f", refreshed by corpus_refresh {result.refresh}" if result.refresh else ""
    print(f"{result.system} ({result.runs.stage} {result.runs.version}{encoder}): top {len(result.hits)} "
          f"for {result.question!r}")
    for hit in result.hits:
        text = " ".join(hit.text.split())
        if args.chars > 0 and len(text) > args.chars:
            text = text[:args.chars].rsplit(" ", 1)[0] + " ..."
        print(f"{hit.rank:3d}  {hit.score:10.4f}  {hit.title}  [{hit.pid}]")
        print(f"     {text}")
    return 0


def _promote(args) -> int:
    from flows.promotion import promote, promotions
    from storage import ArtifactStore, resolve_root

    if args.version is None:
        rows = promotions(ArtifactStore(resolve_root(args.root), create=False))
        if not rows:
            print("(no promotions)")
        for row in rows:
            print(f"{row['seq']:3d}  {row['promoted_at']}  {row['stage']} {row['version']}  {row['note'] or ''}".rstrip())
        return 0
    record = promote(args.version, root=args.root, note=args.note)
    system = f" (system {record['system']})" if record.get("system") else ""
    print(f"promoted {record['stage']} {record['version']}{system}: `pforge search` serves it")
    return 0


def _gc(args) -> int:
    from storage import ArtifactStore, resolve_root

    store = ArtifactStore(resolve_root(args.root), create=False, writable=not args.dry_run)
    doomed = store.gc_plan(args.keep)
    total = sum(r["disk_bytes"] for r in doomed)
    for row in doomed:
        print(f"{row['stage']:18s} {row['version']:16s} {row['disk_bytes']:>14,} bytes  {row['created_at']}")
    if args.dry_run:
        print(f"would remove {len(doomed)} artifact(s), {total:,} bytes, from {store.root} (dry run: nothing deleted)")
        return 0
    removed = store.gc(plan=doomed)
    print(f"removed {len(removed)} artifact(s), {total:,} bytes, from {store.root}")
    return 0


def _refresh(args) -> int:
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "passage_forge")
    cfg = load_config(args.config)
    _refuse_read_only(args)  # before the Prefect server starts
    from flows.refresh import corpus_refresh
    from tasks.refresh.locate import is_url
    from tasks.refresh.stages import configured_dump, locate_configured_dump

    dump = args.dump
    if dump and not is_url(dump):  # a path on the command line is relative to where it is typed
        dump = str(Path(dump).expanduser().absolute())
    if not is_url(dump or configured_dump(cfg)):  # refused before the Prefect server starts (a URL: in the flow)
        locate_configured_dump(cfg, dump)
    from flows.server_watchdog import stopping_if_the_server_dies

    with stopping_if_the_server_dies():  # as `run`'s: a dead Prefect server is one line, not minutes of retries
        summary = corpus_refresh(config=cfg, dump=dump, root=args.root)
    if summary["up_to_date"]:
        print(f"up to date: the corpus was built from {summary['dump']}; nothing written")
        return 0
    for stage, version in summary["versions"].items():
        print(f"{stage:18s} {version}")
    for level in ("documents", "passages"):
        counts = summary[level]
        print(f"{level:10s} " + ", ".join(f"{counts[c]:,} {c}" for c in ("new", "changed", "deleted", "unchanged")))
    if summary.get("reencoded") is not None:
        print(f"re-encoded {summary['reencoded']:,} passages")
    print(f"report: {summary['report']}")
    return 0


def _export(args) -> int:
    from storage import ArtifactStore, resolve_root
    from storage.transfer import export_artifact

    store = ArtifactStore(resolve_root(args.root), create=False)
    artifact = store.find(args.artifact)
    description = export_artifact(store, artifact, args.to)
    print(f"exported {artifact.stage} {artifact.version}: {description} (and its archive beside it)")
    return 0


def _import(args) -> int:
    from storage import ArtifactStore, resolve_root
    from storage.transfer import import_artifact

    store = ArtifactStore(resolve_root(args.root), writable=True)
    for description in args.descriptions:
        artifact = import_artifact(store, description)
        print(f"{'already in the store' if artifact.cache_hit else 'imported'}: {artifact.stage} {artifact.version}")
    return 0


def _verify(args) -> int:
    from storage import ArtifactStore, resolve_root
    from storage.promotions import ledger_path
    from storage.verify import repair, repair_promotions, verify_catalog, verify_promotions, verify_store

    root = resolve_root(args.root)
    whole = not (args.artifact or args.config)  # the catalog and the promotions too; before the open, which may rebuild it
    catalog_checked, catalog_damage = verify_catalog(root) if whole else (False, [])
    ledger, ledger_damage = verify_promotions(root) if whole else (None, [])
    store = ArtifactStore(root, create=False, writable=args.repair)  # --repair moves folders
    def progress(i: int, n: int, artifact) -> None:
        size = sum(record["bytes"] for record in (artifact.manifest.get("files") or {}).values())
        logging.getLogger("passage_forge").info("verify %d/%d: %s %s (%s bytes)", i, n, artifact.stage,
                                                artifact.version, f"{size:,}")
    report = verify_store(store, _verify_targets(store, args), progress)
    report.damaged = catalog_damage + ledger_damage + report.damaged
    for damage in report.damaged:
        print(damage)
    for artifact in report.unrecorded:
        print(f"{artifact.stage} {artifact.version}: no digests recorded (committed before they were): not checked")
    if ledger is not None and ledger.unchecked:
        print(f"{ledger_path(root)}: {ledger.unchecked} promotion(s) without digests "
              "(recorded before they were): not checked")
    print(_verified_line(report, catalog_checked, ledger is not None))
    if args.repair and report.damaged:
        kept = repair_promotions(store) if ledger_damage else None  # first: the rebuild below indexes what is kept
        for moved in repair(store, report.damaged):
            print(f"moved {moved.stage} {moved.version} aside to {moved.folder}: the next `pforge run` of a config "
                  "that plans it rebuilds it")
        if kept is not None:
            print(f"kept {kept.kept} promotion(s) in {ledger_path(root)} and dropped "
                  f"{kept.dropped} damaged line(s), whose promotions no longer count (promote again what should "
                  f"serve); the damaged file is kept as {kept.aside}")
        if catalog_damage:
            print(f"rebuilt {store.catalog.disk_path} from the manifests")
    return 1 if report.damaged else 0  # 1 even once repaired: damage was found


def _verified_line(report, catalog_checked: bool, ledger_checked: bool) -> str:
    """`verified N artifacts, M files[, the catalog][ and the promotions record]: K damaged[; ...]`."""
    checked = [f"{report.files} files", *(["the catalog"] if catalog_checked else []),
               *(["the promotions record"] if ledger_checked else [])]
    listed = f"{', '.join(checked[:-1])} and {checked[-1]}" if len(checked) > 1 else checked[0]
    unchecked = f"; {len(report.unrecorded)} without digests, not checked" if report.unrecorded else ""
    return f"verified {report.artifacts} artifacts, {listed}: {len(report.damaged)} damaged{unchecked}"


def _verify_targets(store, args) -> list | None:
    """The (stage, version) pairs `pforge verify` checks: the artifact named, the versions a config
    plans (those built), or None (every version of the store)."""
    if args.artifact:
        artifact = store.find(args.artifact)
        return [(artifact.stage, artifact.version)]
    if args.config:
        from flows.registry import plan_for

        plan = plan_for(load_config(args.config))
        return sorted({(stage.artifact, plan.planned_version(stage.name)) for stage in plan})
    return None


def _study(args) -> int:
    from flows.study.cli import study_command

    return study_command(args)


def _serve(args) -> int:
    from flows.serve import serve_pipeline

    serve_pipeline(args.configs, root=args.root, cron=args.cron)
    return 0


COMMANDS = {"run": _run, "artifacts": _artifacts, "sql": _sql, "search": _search, "promote": _promote, "gc": _gc,
            "refresh": _refresh, "serve": _serve, "compare": _compare, "plan": _plan,
            "study": _study, "export": _export, "import": _import, "verify": _verify}

if __name__ == "__main__":
    sys.exit(main())
