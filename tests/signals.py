"""Signals at their defaults in a test's child process."""
import signal


def default_signals() -> None:
    """A Popen preexec_fn. A suite started in the background (`cmd &` ignores SIGINT, nohup SIGHUP)
    hands SIG_IGN down to every child, and an ignored signal rightly stays ignored in `pforge`: a
    test that delivers these signals must first give its child the defaults a terminal gives."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
