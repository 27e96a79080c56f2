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

from .protocol import Child, module_command, worker_env


class WorkerClient:
    """Talks to one autotune worker (`python -m gdnbench.autotune.bench --worker SPEC`, through
    gdnbench.bench.protocol); starts a fresh one after a crash or a timeout."""

    def __init__(self, spec: dict, device: str, gpu: str | None = None, timeout_s: float = 600.0,
                 start_timeout_s: float = 600.0):
        self.spec, self.device, self.gpu = spec, device, gpu
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.child: Child | None = None
        self.env: dict | None = None
        self.start_failures = 0
        self.last_error = ""

    def command(self) -> list[str]:
        return module_command("gdnbench.autotune.bench", "--worker", json.dumps(self.spec))

    def _start(self) -> bool:
        self.child = Child(self.command(), worker_env(self.device, gpu=self.gpu))
        hello = self.child.start(self.start_timeout_s)
        if self.child.started is None:
            reason = (hello.result or {}).get("reason") or _death(hello, "worker did not start")
            self._drop()
            self.start_failures += 1
            self.last_error = f"worker failed to start: {reason}"
            return False
        self.start_failures = 0
        self.env = self.child.started.get("env")
        return True

    def ensure_started(self) -> dict | None:
        """Start the worker if needed; its device identity, or None when it cannot start."""
        if self.child is None and not self._start():
            return None
        return self.env

    def evaluate(self, kernel: str, route: str, point: dict, warm: bool = False) -> dict:
        """One candidate's result; a dead or hung worker is recorded as the candidate's result.
        ``warm``: only compile it (a compile-pool worker)."""
        if self.child is None:
            if self.start_failures >= 2:
                return {"status": "error", "reason": "worker cannot start (failed twice)", "time_us": None}
            if not self._start():
                return {"status": "error", "reason": self.last_error, "time_us": None}
        req = {"kernel": kernel, "route": route, "point": point, "warm": warm}
        reply = self.child.request(req, self.timeout_s)
        if not reply.answered:
            hung = reply.ended == "timeout"
            self._drop()
            reason = _death(reply, f"worker hung over {self.timeout_s:.0f} s" if hung else "worker died")
            return {"status": "timeout" if hung else "crashed", "reason": reason, "time_us": None}
        if reply.result.get("context_lost"):
            self._drop()
        return reply.result

    def _drop(self) -> None:
        if self.child is not None:
            self.child.close(0)
        self.child = None

    def close(self) -> None:
        if self.child is not None:
            self.child.close(30)
        self.child = None


def _death(reply, what: str) -> str:
    return f"{what} (exit code {reply.exit_code}): {reply.last_line}"


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
