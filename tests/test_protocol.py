"""The worker protocol with tiny script children: streamed messages, the end line, a dead child's
exit code and last output, a hung child's timeout, a child that cannot start, a stop signal."""

import sys
import textwrap

from gdnbench.bench import protocol

SERVE = """
import os, sys, time
sys.path.insert(0, {root!r})
from gdnbench.bench.protocol import serve

def answer(req, send):
    what = req["do"]
    if what == "rows":
        for i in range(req["n"]):
            send({{"row": i}})
        print("stray print: not a protocol line")
        return {{"rows": req["n"]}}
    if what == "die":
        sys.stderr.write("an illegal memory access was encountered\\n"); sys.stderr.flush()
        os._exit(17)
    if what == "hang":
        time.sleep(60)
    if what == "lost":
        return {{"context_lost": True}}
    if what == "signal":
        os.kill(os.getpid(), {sig})

def start():
    if os.environ.get("FAIL_START"):
        raise ValueError("no such shape file")
    return {{"env": {{"gpu": "fake"}}}}

sys.exit(serve(answer, start))
"""


def _child(tmp_path, **env):
    import signal

    from gdnbench.paths import PACKAGE_DIR

    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(SERVE.format(root=str(PACKAGE_DIR.parent), sig=int(signal.SIGTERM))))
    return protocol.Child([sys.executable, str(script)], protocol.worker_env("cpu", env))


def test_messages_stream_before_the_end_line_and_stray_prints_do_not_break_lines(tmp_path):
    child = _child(tmp_path)
    try:
        seen = []
        reply = child.request({"do": "rows", "n": 3}, 60, seen.append)
        assert reply.answered and reply.result == {"rows": 3}
        assert seen == [{"row": 0}, {"row": 1}, {"row": 2}] and list(reply.messages) == seen
        assert child.started == {"ready": True, "env": {"gpu": "fake"}}  # read before the first reply
        assert "stray print" in reply.output  # went to stderr
        assert child.request({"do": "rows", "n": 0}, 60).result == {"rows": 0}  # the same child lives on
    finally:
        child.close()


def test_a_dead_child_gives_its_exit_code_and_last_output(tmp_path):
    child = _child(tmp_path)
    try:
        reply = child.request({"do": "die"}, 60)
        assert (reply.ended, reply.exit_code, reply.result) == ("died", 17, None)
        assert reply.last_line == "an illegal memory access was encountered" and reply.stop_signal is None
    finally:
        child.close()


def test_a_hung_child_is_killed_at_its_timeout(tmp_path):
    child = _child(tmp_path)
    try:
        assert child.start(60).answered
        reply = child.request({"do": "hang"}, 1.5)
        assert reply.ended == "timeout" and not child.alive
    finally:
        child.close()


def test_a_lost_context_ends_the_child_after_its_reply(tmp_path):
    child = _child(tmp_path)
    try:
        reply = child.request({"do": "lost"}, 60)
        assert reply.answered and reply.result == {"context_lost": True}
        assert reply.exit_code == protocol.EXIT_CONTEXT_LOST
    finally:
        child.close()


def test_a_child_that_cannot_start_says_why(tmp_path):
    child = _child(tmp_path, FAIL_START="1")
    try:
        hello = child.start(60)
        assert hello.result == {"ready": False, "reason": "ValueError: no such shape file"}
        assert child.started is None and not child.alive
        assert child.request({"do": "rows", "n": 1}, 60).ended == "died"
    finally:
        child.close()


def test_a_child_killed_by_a_stop_signal_says_which(tmp_path):
    child = _child(tmp_path)
    try:
        assert child.request({"do": "signal"}, 60).stop_signal == "SIGTERM"
    finally:
        child.close()


def test_worker_env_is_set_in_one_place():
    env = protocol.worker_env("cpu", {"FLA_DISABLE_BACKEND_DISPATCH": "0"}, gpu="3")
    assert (env["FLA_DISABLE_BACKEND_DISPATCH"], env["CUDA_VISIBLE_DEVICES"], env["TRITON_INTERPRET"]) == ("0", "3", "1")
    assert protocol.worker_env("cuda")["FLA_DISABLE_BACKEND_DISPATCH"] == "1"
    assert protocol.PKG_PARENT in protocol.worker_env("cuda")["PYTHONPATH"]
