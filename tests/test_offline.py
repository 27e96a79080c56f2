"""The offline compile tool's verdicts, table and routes, on hand-made rows (no compile: that needs
minutes of CPU and is run as a tool, python -m gdnbench.kernels.offline)."""
from gdnbench.kernels import offline
from gdnbench.kernels.offline import Row, compress_routes, specialization, table

LIMIT = offline.SMEM_LIMIT[100]


def _row(**kw):
    base = dict(kernel="state_kernel", specialization="plain", options="num_warps=4 num_stages=3",
                routes=("gdn none 2-pass",), registers=150, threads=128, local_bytes=0,
                shared_bytes=102968, limit=LIMIT)
    return Row(**{**base, **kw})


def test_verdicts():
    assert _row().verdict == "fits"
    assert _row(shared_bytes=LIMIT).verdict == "fits"
    assert _row(shared_bytes=LIMIT + 1).verdict == "over shared"
    assert _row(registers=255, threads=512).verdict == "over registers"
    assert _row(registers=None, local_bytes=None, shared_bytes=None, error="RuntimeError: x").verdict == "FAILED"


def test_table_counts_kernels_and_verdicts():
    rows = [_row(), _row(specialization="IS_VARLEN"), _row(kernel="aqk_kernel", shared_bytes=LIMIT + 8),
            _row(kernel="output_kernel", registers=None, local_bytes=None, shared_bytes=None,
                 error="RuntimeError: PassManager::run failed")]
    text = table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows) + 2
    assert "| aqk_kernel | plain |" in text and "| over shared |" in text
    assert "FAILED (RuntimeError: PassManager::run failed)" in text
    assert lines[-1] == "3 kernels, 4 specializations: 1 FAILED, 2 fits, 1 over shared"


def test_routes_grouped_by_suffix():
    used = ("gdn none 2-pass", "gdn flag 2-pass", "gdn none varlen 2-pass", "kda fused_q", "gdn none 2-pass")
    assert compress_routes(used) == "gdn none,flag 2-pass; gdn none varlen 2-pass; kda fused_q"


def test_specialization_names_set_flags():
    assert specialization({"IS_VARLEN": True, "FUSE_Q": True, "FUSE_K": False, "BK": 64}) == "IS_VARLEN+FUSE_Q"
    assert specialization({"IS_VARLEN": False}) == "plain"


def test_bad_arch_is_exit_2(capsys):
    assert offline.main(["--arch", "sm_100,sm_80"]) == 2
    assert "'sm_80'" in capsys.readouterr().err


def test_spills_verdict():
    assert _row(local_bytes=8).verdict == "spills"
    assert _row(local_bytes=8, shared_bytes=LIMIT + 1).verdict == "over shared"


def test_routes_cover_the_in_loop_forms():
    labels = [r[0] for r in offline.routes()]
    assert "gdn flag 1-pass in-loop wu" in labels and "gdn none varlen 1-pass in-loop wu_aqk" in labels
    assert "gdn fused_qk 1-pass in-loop wu" in labels
    assert not any("fused" in label and "wu_aqk" in label for label in labels)  # refused by ops
    assert not any(label.startswith("kda") and "in-loop" in label for label in labels)
    assert "kda fused_qk varlen 16-token tiles" in labels
    assert len(offline.IN_LOOP_CANDIDATES) == len(set(offline.IN_LOOP_CANDIDATES))
