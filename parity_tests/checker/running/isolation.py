"""Kernel calls in a child process, so that a kernel that crashes the interpreter (a SIGSEGV in
compiled code, an abort) or hangs gets an "error" verdict instead of killing or stalling the
checker: ``check_kernel(..., isolate=True)``.

One child process (``multiprocessing``'s "spawn": a fresh interpreter, safe whatever threads the
parent runs) serves the calls one after another, so torch is imported once, not per case. A
kernel given as "module:function" is imported by the child by that very name, as the user gave
it: a function that a module re-exports after patching something at import (a shim setting an
environment variable, replacing a library's function) keeps its patches there, where a pickled
function would be imported from the module that defined it (its ``__module__``) and lose them.
Any other kernel is sent by pickle, which is why it must be a module-level function (or a
``functools.partial`` of one). A child that dies is reported with the signal that killed it,
and a new one serves the next call; a call that does not answer within the time limit
(``check_kernel``'s ``timeout``) is a hang: its child is killed.

What the child writes (its stdout and stderr, a C library's messages included) goes to a file,
not to the terminal: a call that fails carries what the child wrote during it in its error
(``Outcome.error``, the JSON report's ``errors``); what it writes during a call that succeeds is
not kept. When the checker is done, the child is asked to exit (its input closes) and given
``STOP_LIMIT_S`` to do so, so that it releases what it holds as any process that ends normally
does; only a child that does not exit is killed. A child that dies, or is killed, cannot release
the named semaphores and shared memory it registered with ``multiprocessing``'s resource tracker
(a spawned child shares its parent's): it notes each registration in a ledger, and the parent
unlinks and unregisters whatever the ledger still holds, so nothing is left behind for the
tracker to warn about at exit ("leaked semaphore objects").

Tests: tests/checker/running/test_isolation.py
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import signal
import sys
import tempfile
from multiprocessing import resource_tracker
from typing import Any

from .calls import Kernel, Outcome, Request, load_kernel

# A child that has not imported torch and unpickled the kernel within this many seconds is
# stopped: starting is not the kernel's time.
STARTUP_LIMIT_S = 180.0
# A child asked to exit that is still running after this many seconds is killed.
STOP_LIMIT_S = 10.0
# At most this much of what a child wrote during one call is kept (its end).
OUTPUT_LIMIT_BYTES = 64 * 1024


class IsolatedKernel:
    """``kernel`` behind a child process: ``self(request)`` gives its ``Outcome``."""

    def __init__(self, kernel: Kernel | str, limit: float) -> None:
        try:
            self._payload = pickle.dumps(kernel)  # a "module:function" string as it is
        except Exception as exc:  # what pickle raises for closures, lambdas, local classes
            raise TypeError(
                "isolate=True sends the kernel to a child process by pickle, and "
                f"{getattr(kernel, '__qualname__', kernel)!r} does not pickle ({exc}); pass a "
                "module-level function, or 'module:function'"
            ) from exc
        self.limit = limit
        self._process: Any = None
        self._conn: Any = None
        self._folder = ""  # the child's output and its ledger of resources

    def __call__(self, request: Request) -> Outcome:
        if self._process is None:
            failure = self._start()
            if failure is not None:
                return failure
        start = os.path.getsize(self._path("output"))
        self._conn.send(request)
        if not self._conn.poll(self.limit):
            self._stop(kill=True)
            message = (
                f"no answer within the time limit of {self.limit:g} s (a hang?); the kernel's "
                "process was stopped"
            )
            return _failure("hang", message, self._end(start))
        try:
            outcome = self._conn.recv()
        except (EOFError, OSError):
            message = f"the kernel's process {self._died()}"
            return _failure("crash", message, self._end(start))
        return _with_output(outcome, self._output(start))

    def _start(self) -> Outcome | None:
        """Start a child and wait until it holds the kernel; None, or the failure."""
        self._folder = tempfile.mkdtemp(prefix="parity-isolated-")
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(
            target=_serve, args=(child, self._payload, self._folder), daemon=True
        )
        self._process.start()
        child.close()
        if not self._conn.poll(STARTUP_LIMIT_S):
            self._stop(kill=True)
            message = f"the kernel's process did not start within {STARTUP_LIMIT_S:g} s"
            return _failure("startup", message, self._end(0))
        try:
            state, message = self._conn.recv()
        except (EOFError, OSError):
            message = f"the kernel's process {self._died()} while starting"
            return _failure("startup", message, self._end(0))
        if state != "ready":
            self._stop(kill=False)
            message = f"the kernel's process could not load the kernel: {message}"
            return _failure("startup", message, self._end(0))
        return None

    def _died(self) -> str:
        """How the child ended ("was killed by signal SIGSEGV", say); it is reaped."""
        self._process.join(STOP_LIMIT_S)
        code = self._process.exitcode
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed by signal {name}"
        return f"exited with code {code}"

    def _stop(self, *, kill: bool) -> None:
        """End the child: closing its input asks it to exit; it is killed if ``kill`` or if it
        is still running after ``STOP_LIMIT_S``. It is reaped either way."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._process is None:
            return
        if not kill:
            self._process.join(STOP_LIMIT_S)
        if self._process.is_alive():
            self._process.kill()
        self._process.join(STOP_LIMIT_S)

    def _end(self, start: int) -> str:
        """After the child has ended: what it wrote since ``start``, once it has released (or
        the parent for it) everything it registered; the folder is removed."""
        if self._conn is not None:
            self._conn.close()
        output = self._output(start)
        _release(self._path("ledger"))
        shutil.rmtree(self._folder, ignore_errors=True)
        self._process = self._conn = None
        self._folder = ""
        return output

    def close(self) -> None:
        """Ask the child to exit (kill it if it does not), and release what it left."""
        if self._process is not None:
            self._stop(kill=False)
            self._end(0)

    def _path(self, name: str) -> str:
        return os.path.join(self._folder, name)

    def _output(self, start: int) -> str:
        """What the child wrote from byte ``start`` on (its last ``OUTPUT_LIMIT_BYTES``)."""
        with open(self._path("output"), "rb") as stream:
            size = stream.seek(0, os.SEEK_END)
            begin = max(start, size - OUTPUT_LIMIT_BYTES)
            stream.seek(begin)
            text = stream.read().decode("utf-8", "replace")
        if begin > start:
            text = f"[the first {begin - start} bytes left out]\n{text}"
        return text


def _failure(kind: str, message: str, output: str) -> Outcome:
    """An "error" outcome of the child itself ("crash", "hang", "startup"), with what it wrote
    as the error's text."""
    return Outcome("error", {}, {}, [], None, message, (kind, message, _text(message, output)))


def _with_output(outcome: Outcome, output: str) -> Outcome:
    """``outcome`` with what the child wrote during the call added to its error, if the call
    (or only its backward) raised or failed."""
    if not output:
        return outcome
    if outcome.kind in ("error", "refused"):
        return outcome._replace(error=_noted(outcome.message, outcome.error, output))
    if outcome.backward is not None and outcome.backward[0] in ("error", "refused"):
        kind, message, error = outcome.backward
        return outcome._replace(backward=(kind, message, _noted(message, error, output)))
    return outcome


def _noted(message: str, error: tuple[str, str, str] | None, output: str) -> tuple[str, str, str]:
    """``error`` (or, for a failure that raised nothing, ``message``) with ``output`` added."""
    if error is None:
        return "error", message, _text(message, output)
    kind, first, text = error
    return kind, first, _text(text.rstrip("\n"), output)


def _text(head: str, output: str) -> str:
    if not output:
        return f"{head}\n(the kernel's process wrote nothing)\n"
    return f"{head}\nthe kernel's process wrote:\n{output}"


def _release(ledger: str) -> None:
    """Unlink and unregister each resource the ledger holds as registered and not released."""
    held: dict[tuple[str, str], None] = {}
    try:
        with open(ledger, encoding="utf-8") as stream:
            for line in stream:
                action, rtype, name = line.rstrip("\n").split(" ", 2)
                if action == "register":
                    held[(rtype, name)] = None
                else:
                    held.pop((rtype, name), None)
    except FileNotFoundError:
        return
    cleanup = getattr(resource_tracker, "_CLEANUP_FUNCS", {})
    for rtype, name in held:
        if rtype not in cleanup:  # unknown kind: left to the tracker, which names it at exit
            continue
        try:
            cleanup[rtype](name)
        except OSError:  # already gone
            pass
        resource_tracker.unregister(name, rtype)


def _serve(conn: Any, payload: bytes, folder: str) -> None:
    """The child: send its output to the folder, keep the ledger, load the kernel, then answer
    requests until the parent closes the connection."""
    fd = os.open(os.path.join(folder, "output"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    _keep_ledger(os.path.join(folder, "ledger"))
    try:
        kernel = load_kernel(pickle.loads(payload))
    except BaseException as exc:  # reported to the parent as the reason, whatever it is
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", ""))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        from ..specs import get  # in the child: the spec by name, as the request carries it

        outcome = get(request.spec).run(kernel, request)
        sys.stdout.flush()
        sys.stderr.flush()
        conn.send(outcome)


def _keep_ledger(path: str) -> None:
    """Note each registration with the resource tracker (and each release) in ``path``, before
    a release and after a registration: a process that dies in between leaves at worst a
    resource that the tracker still names, never one unregistered twice."""
    register, unregister = resource_tracker.register, resource_tracker.unregister

    def note(action: str, name: str, rtype: str) -> None:
        with open(path, "a", encoding="utf-8") as stream:
            stream.write(f"{action} {rtype} {name}\n")

    def noted_register(name: str, rtype: str) -> None:
        register(name, rtype)
        note("register", name, rtype)

    def noted_unregister(name: str, rtype: str) -> None:
        note("unregister", name, rtype)
        unregister(name, rtype)

    resource_tracker.register = noted_register
    resource_tracker.unregister = noted_unregister
