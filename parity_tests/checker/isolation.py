"""Kernel calls in a child process, so that a kernel that crashes the interpreter (a SIGSEGV in
compiled code, an abort) or hangs gets an "error" verdict instead of killing or stalling the
checker: ``check_kernel(..., isolate=True)``.

One child process (``multiprocessing``'s "spawn": a fresh interpreter, safe whatever threads the
parent runs) serves the calls one after another, so torch is imported once, not per case. The
kernel is sent to it by pickle, which is why an isolated kernel must be a module-level function
(or "module:function", or a ``functools.partial`` of one): the child imports its module. A child
that dies is reported with the signal that killed it, and a new one serves the next call; a
call that does not answer within the time limit is a hang: its child is killed.

Tests: tests/checker/test_isolation.py
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
from typing import Any

from .calls import Kernel, Outcome, Request, run_case

# A child that has not imported torch and unpickled the kernel within this many seconds is
# stopped: starting is not the kernel's time.
STARTUP_LIMIT_S = 180.0


class IsolatedKernel:
    """``kernel`` behind a child process: ``self(request)`` gives its ``Outcome``."""

    def __init__(self, kernel: Kernel, limit: float) -> None:
        try:
            self._payload = pickle.dumps(kernel)
        except Exception as exc:  # what pickle raises for closures, lambdas, local classes
            raise TypeError(
                "isolate=True sends the kernel to a child process by pickle, and "
                f"{getattr(kernel, '__qualname__', kernel)!r} does not pickle ({exc}); pass a "
                "module-level function, or 'module:function'"
            ) from exc
        self.limit = limit
        self._process: Any = None
        self._conn: Any = None

    def __call__(self, request: Request) -> Outcome:
        if self._process is None:
            failure = self._start()
            if failure:
                return _error(failure)
        self._conn.send(request)
        if not self._conn.poll(self.limit):
            self.close()
            return _error(
                f"no answer within the time limit of {self.limit:g} s (a hang?); the kernel's "
                "process was stopped"
            )
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            return _error(f"the kernel's process {self._died()}")

    def _start(self) -> str:
        """Start a child and wait until it holds the kernel; an empty string, or why not."""
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, self._payload), daemon=True)
        self._process.start()
        child.close()
        if not self._conn.poll(STARTUP_LIMIT_S):
            self.close()
            return f"the kernel's process did not start within {STARTUP_LIMIT_S:g} s"
        try:
            state, message = self._conn.recv()
        except (EOFError, OSError):
            return f"the kernel's process {self._died()} while starting"
        if state != "ready":
            self.close()
            return f"the kernel's process could not load the kernel: {message}"
        return ""

    def _died(self) -> str:
        """How the child ended ("was killed by signal SIGSEGV", say); it is reaped."""
        process = self._process
        process.join(10)
        code = process.exitcode
        self._process = self._conn = None
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by signal {name}"
        return f"exited with code {code}"

    def close(self) -> None:
        """Stop the child, if any."""
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(10)
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None


def _error(message: str) -> Outcome:
    return Outcome("error", {}, {}, [], None, message)


def _serve(conn: Any, payload: bytes) -> None:
    """The child: load the kernel, then answer requests until the parent goes away."""
    try:
        kernel = pickle.loads(payload)
    except BaseException as exc:  # reported to the parent as the reason, whatever it is
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", ""))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        conn.send(run_case(kernel, request))
