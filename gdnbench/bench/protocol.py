"""The worker protocol: how `gdnbench run` and `gdnbench autotune` talk to their worker subprocesses.

Why a subprocess: an illegal memory access poisons the whole CUDA context of a process, so what
might crash (a backend, a candidate config) runs in a child; a dead child costs its request, and
the parent starts a fresh one.

A worker is ``python -m MODULE ARGS`` started with :func:`worker_env`, the one place that sets the
variables a worker needs. On its original stdout the child (:func:`serve`) first writes a ready
line, then answers each request (one JSON object per stdin line) with any number of streamed
messages and one end line; everything else the child prints goes to stderr, which the parent keeps
in a file for the last output of a child that died. Wire format, one JSON object per line:

- ``{"_end": payload}``: the end of a reply (the ready line is the end of the start's reply:
  ``{"ready": true, ...}``, or ``{"ready": false, "reason": ...}`` when the child could not start);
- anything else: a streamed message (a row of `gdnbench run`).

A request ends one of three ways (:class:`Reply`): answered (its end line came), died (the child
exited first: its exit code and its output since the request began say why) or timeout (the
child was killed after ``timeout_s``). A payload with ``"context_lost": true`` ends the child
after its reply (exit code 3). A stop signal in the parent (SIGINT, SIGTERM) kills the child at
once; a child killed by a stop signal says so (:attr:`Reply.stop_signal`).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..data.journal import STOP_SIGNALS

PKG_PARENT = str(Path(__file__).resolve().parents[2])
STOP_SIGNUMS = {int(getattr(signal, n)): n for n in STOP_SIGNALS if hasattr(signal, n)}
END = "_end"
EXIT_CONTEXT_LOST = 3
OUTPUT_KEPT = 4000  # characters of a request's output a Reply keeps (its tail)
POLL_S = 0.5  # how often a waiting parent checks that the child still lives (a grandchild may hold its pipe)


def worker_env(device: str, extra: dict | None = None, gpu: str | None = None) -> dict:
    """The environment of a worker: this process's, FLA's backend dispatch off unless ``extra`` (a
    backend's ``worker_env``) says otherwise, ``gpu`` as CUDA_VISIBLE_DEVICES, the Triton
    interpreter on the CPU, this package importable, unbuffered output."""
    env = dict(os.environ)
    env.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    env.update(extra or {})
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def module_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


@dataclass(frozen=True)
class Reply:
    """How one request (or the start) ended: ``ended`` is answered, died or timeout; ``messages`` the
    streamed ones that came; ``result`` the end line's payload (None unless answered); ``output`` the
    tail of what the child printed meanwhile."""

    ended: str
    messages: tuple = ()
    result: dict | None = None
    exit_code: int | None = None
    output: str = ""

    @property
    def answered(self) -> bool:
        return self.ended == "answered"

    @property
    def last_line(self) -> str:
        """The child's last line of output (at most 300 characters), or 'no output'."""
        lines = [ln.strip() for ln in self.output.splitlines() if ln.strip()]
        return lines[-1][:300] if lines else "no output"

    @property
    def stop_signal(self) -> str | None:
        """The stop signal (SIGINT, SIGTERM, SIGHUP) that killed the child, if one did."""
        if self.ended != "died" or self.exit_code is None:
            return None
        return STOP_SIGNUMS.get(-self.exit_code)


class Child:
    """One worker subprocess (parent side): :meth:`start` reads its ready line, :meth:`request` sends
    a request and collects its reply. Not thread-safe: one caller at a time."""

    def __init__(self, command: list[str], env: dict):
        self._err = tempfile.TemporaryFile()
        self._buf = b""
        self.started: dict | None = None  # the ready payload, once read
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     env=env, bufsize=0)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def start(self, timeout_s: float) -> Reply:
        """Wait for the ready line. A child that is not ready (its payload's ``ready`` false) has exited."""
        reply = self._collect(time.monotonic() + timeout_s, self._output_size(), None)
        if reply.answered and (reply.result or {}).get("ready"):
            self.started = reply.result
        else:
            self.kill()
        return reply

    def request(self, req: dict, timeout_s: float, on_message: Callable[[dict], None] | None = None) -> Reply:
        """Send ``req``; its reply, each streamed message also handed to ``on_message`` as it comes.
        The start (if not read yet) shares the deadline. Any exception here (a stop signal in this
        process) kills the child and propagates."""
        deadline, mark = time.monotonic() + timeout_s, self._output_size()
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # died before the request: reading says how
        if self.started is None:
            first = self.start(max(deadline - time.monotonic(), 0.0))
            if self.started is None:
                ended = first.ended if not first.answered else "died"
                return Reply(ended, exit_code=self.proc.poll(), output=self._output_since(mark))
        return self._collect(deadline, mark, on_message)

    def _collect(self, deadline: float, mark: int, on_message) -> Reply:
        messages = []
        try:
            while True:
                msg = self._next(deadline)
                if not isinstance(msg, dict):
                    break
                if END in msg:
                    if (msg[END] or {}).get("context_lost"):
                        self._reap(10)
                    return Reply("answered", tuple(messages), msg[END], self.proc.poll(), self._output_since(mark))
                messages.append(msg)
                if on_message is not None:
                    on_message(msg)
        except BaseException:
            self.kill()
            raise
        if msg == "timeout":
            self.kill()
        else:
            self._reap(10)  # its exit code
        return Reply(msg, tuple(messages), None, self.proc.poll(), self._output_since(mark))

    def _next(self, deadline: float) -> dict | str:
        """The next protocol line as a dict, or 'died' (end of file, or the child exited with nothing
        more to read) or 'timeout'. A line that is not a JSON object is skipped."""
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    return "timeout"
                exited = self.proc.poll() is not None
                if not select.select([fd], [], [], 0 if exited else min(left, POLL_S))[0]:
                    if exited:
                        return "died"
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    return "died"
                self._buf += chunk
            line, _, self._buf = self._buf.partition(b"\n")
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(msg, dict):
                return msg

    def _output_size(self) -> int:
        return os.fstat(self._err.fileno()).st_size

    def _output_since(self, mark: int) -> str:
        """What the child printed from byte ``mark`` on (its tail). pread: the child writes through the
        same open file, so moving its offset here would misplace the child's next write."""
        fd = self._err.fileno()
        start = max(mark, os.fstat(fd).st_size - 4 * OUTPUT_KEPT)  # bytes enough for the kept characters
        data = os.pread(fd, max(os.fstat(fd).st_size - start, 0), start)
        return data.decode(errors="replace")[-OUTPUT_KEPT:]

    def _reap(self, wait_s: float) -> None:
        try:
            self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self, wait_s: float = 5.0) -> None:
        """End the child: closing its stdin ends a live worker's loop; killed after ``wait_s``."""
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=wait_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout, self._err):
            try:
                f.close()
            except OSError:
                pass


# ----------------------------------------------------------------------------- child side
def serve(answer: Callable[[dict, Callable[[dict], None]], dict | None],
          start: Callable[[], dict] | None = None) -> int:
    """The child's loop; returns its exit code. ``start()`` sets up and returns what the ready line
    carries (an exception: its traceback on stderr, a not-ready line, exit code 1). Then per stdin
    line, ``answer(request, send)`` streams messages with ``send`` and returns the end line's payload.
    An exception in ``answer`` ends the process with its traceback (a CUDA error poisons the context);
    the parent records the death and starts a fresh child."""
    from ..backends.base import one_line

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever else is printed goes to stderr

    def send(msg: dict) -> None:
        proto.write(json.dumps(msg, default=str) + "\n")
        proto.flush()

    try:
        info = start() if start is not None else {}
    except Exception as e:
        traceback.print_exc()
        send({END: {"ready": False, "reason": one_line(e)}})
        return 1
    send({END: {"ready": True, **info}})
    for line in sys.stdin:
        if not line.strip():
            continue
        payload = answer(json.loads(line), send)
        send({END: payload})
        if (payload or {}).get("context_lost"):
            return EXIT_CONTEXT_LOST
    return 0
