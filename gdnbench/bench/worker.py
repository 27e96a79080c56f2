"""Worker processes for the autotuner: a client per worker subprocess (restarted when it dies) and a
compile pool that warms Triton's cache in parallel.

Compile pool. A candidate's first call took 0.8-1.0 s on the H200 (search of 38 candidates: 37 s), nearly all
of it Triton's compile, while the gate and the timing take milliseconds. So before a batch of candidates is
evaluated, ``compile_workers`` extra worker processes on the same GPU run each candidate's forward once, in
parallel, filling Triton's on-disk cache; the timing worker then loads the binaries. Nothing is timed while the
pool runs, and a pool failure only costs the warm-up: the timing worker's own call records what went wrong.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time


class WorkerDied(RuntimeError):
    pass


class WorkerClient:
    """Talks to one worker subprocess; starts a fresh one after a crash or a timeout."""

    def __init__(self, spec: dict, device: str, gpu: str | None = None, timeout_s: float = 600.0,
                 start_timeout_s: float = 600.0):
        self.spec, self.device, self.gpu = spec, device, gpu
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.env: dict | None = None
        self.start_failures = 0
        self.last_error = ""
        self.eof = False
        self._buf = b""
        self._err = tempfile.TemporaryFile()

    def _environ(self) -> dict:
        from .runner import worker_env

        env = worker_env(self.device)
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        return env

    def _start(self) -> None:
        self._buf = b""
        self._err.seek(0)
        self._err.truncate()
        self.proc = subprocess.Popen([sys.executable, "-m", "gdnbench.autotune.bench", "--worker", json.dumps(self.spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     env=self._environ(), bufsize=0)
        hello = self._read(self.start_timeout_s)
        if hello is None or not hello.get("hello"):
            reason = (hello or {}).get("reason") or self._death("worker did not start")
            self._kill()
            self.start_failures += 1
            self.last_error = f"worker failed to start: {reason}"
            raise WorkerDied(self.last_error)
        self.start_failures = 0
        self.env = hello["env"]

    def ensure_started(self) -> dict | None:
        """Start the worker if needed; its device identity, or None when it cannot start."""
        try:
            if self.proc is None:
                self._start()
        except WorkerDied:
            return None
        return self.env

    def _read(self, timeout: float) -> dict | None:
        """The next JSON line; None on timeout or end of file (self.eof says which)."""
        self.eof = False
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                self.eof = True
                return None
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def _death(self, what: str) -> str:
        rc = self.proc.poll() if self.proc else None
        self._err.seek(0)
        lines = [l.strip() for l in self._err.read().decode(errors="replace").splitlines() if l.strip()]
        last = lines[-1][:300] if lines else "no output"
        return f"{what} (exit code {rc}): {last}"

    def _kill(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        self.proc = None

    def evaluate(self, kernel: str, route: str, point: dict, warm: bool = False) -> dict:
        """One candidate's result; a dead or hung worker is recorded as the candidate's result.
        ``warm``: only compile it (a compile-pool worker)."""
        if self.proc is None:
            if self.start_failures >= 2:
                return {"status": "error", "reason": "worker cannot start (failed twice)", "time_us": None}
            try:
                self._start()
            except WorkerDied as e:
                return {"status": "error", "reason": str(e), "time_us": None}
        try:
            req = {"kernel": kernel, "route": route, "point": point, "warm": warm}
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            res = self._read(self.timeout_s)
        except (BrokenPipeError, OSError, json.JSONDecodeError):
            res, self.eof = None, True
        if res is None:
            hung = not self.eof
            if not hung:
                try:
                    self.proc.wait(timeout=10)  # reap it, for its exit code
                except subprocess.TimeoutExpired:
                    pass
            reason = self._death(f"worker hung over {self.timeout_s:.0f} s" if hung else "worker died")
            self._kill()
            return {"status": "timeout" if hung else "crashed", "reason": reason, "time_us": None}
        if res.get("context_lost"):
            self._kill()
        return res

    def close(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                pass
            self._kill()
        self._err.close()


class CompilePool:
    """``n`` compile-only workers (clients from ``make_client``, started on first use);
    :meth:`warm` compiles a batch of candidates in parallel to fill Triton's on-disk cache."""

    def __init__(self, spec: dict, n: int, make_client):
        self.clients = [make_client({**spec, "warm_only": True}) for _ in range(max(0, n))]

    def warm(self, kernel: str, route: str, points: list[dict]) -> list[dict]:
        if not self.clients or not points:
            return []
        import queue
        from concurrent.futures import ThreadPoolExecutor

        free: queue.Queue = queue.Queue()
        for c in self.clients:
            free.put(c)

        def one(p):
            c = free.get()
            try:
                return c.evaluate(kernel, route, p, warm=True)
            finally:
                free.put(c)

        with ThreadPoolExecutor(len(self.clients)) as ex:
            return list(ex.map(one, points))

    def close(self) -> None:
        for c in self.clients:
            c.close()
