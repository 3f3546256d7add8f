"""The `pforge` process's entry point. It installs one handler before anything heavy is imported
(the CLI's imports load torch and pyarrow: seconds on a loaded machine), so Ctrl-C while the
command starts ends it with one line instead of an import traceback; the command installs its own
handlers (flows/interrupts.py) once it runs."""
from __future__ import annotations

import os
import signal
import sys

STARTING_SIGNALS = (signal.SIGINT,)  # SIGTERM and SIGHUP end a process silently by default already


def _interrupted_while_starting(signum, frame) -> None:
    os.write(2, b"pforge: interrupted while starting; nothing was run\n")
    os._exit(128 + signum)


def main() -> int:
    for signum in STARTING_SIGNALS:
        if signal.getsignal(signum) is not signal.SIG_IGN:  # `&` in a script: stays ignored
            signal.signal(signum, _interrupted_while_starting)
    from flows.cli import main as command_line

    return command_line()


if __name__ == "__main__":
    sys.exit(main())
