"""A reader that leaves early (`specdistill check ... | head -3`): the command ends quietly with exit 141, as a Unix
tool that SIGPIPE ends does, not in a BrokenPipeError traceback and an "Exception ignored" line at the interpreter's
last flush. Only a closed stdout or stderr is answered so: a BrokenPipeError from anything else (a socket, a child's
stdin) is raised as it is.

    @quiet_on_a_closed_pipe
    def cli(argv=None, prog=PROG): ...
"""
from __future__ import annotations

import functools
import os
import select
import sys
from collections.abc import Callable
from typing import TypeVar

CLOSED_PIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a tool its closed pipe ended

F = TypeVar("F", bound=Callable)


def reader_gone(stream) -> bool:
    """Whether ``stream`` writes into a pipe nobody reads any more (poll reports an error on its write end)."""
    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no file behind it (a test's capture), or a closed one
        return False


def quiet_on_a_closed_pipe(cli: F) -> F:
    """``cli`` ending in exit 141 without a word when its stdout's or stderr's reader has gone."""
    @functools.wraps(cli)
    def wrapped(*args, **kwargs):
        try:
            return cli(*args, **kwargs)
        except BrokenPipeError:
            gone = [stream for stream in (sys.stdout, sys.stderr) if reader_gone(stream)]
            if not gone:
                raise
            devnull = os.open(os.devnull, os.O_WRONLY)
            for stream in gone:  # what is still buffered, and the interpreter's last flush, go nowhere
                os.dup2(devnull, stream.fileno())
            raise SystemExit(CLOSED_PIPE_EXIT) from None
    return wrapped  # type: ignore[return-value]
