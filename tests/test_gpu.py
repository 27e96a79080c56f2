"""GPU checks (skipped without CUDA): real backends through the gate and both timers."""

import os

import pytest

from gdnbench import backends
from gdnbench.bench.runner import run_set
from gdnbench.data.shapes import Shape, ShapeSet
from gdnbench.oracle.check import rel_rms
from gdnbench.bench.timing import TimingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1",
    reason="Triton's interpreter is on in this process (the CPU kernel tests): run `pytest -m gpu tests/`")]

SMALL = ShapeSet("gpu-small", 1, "", "", (
    Shape(id="gdn", family="gdn", H=2, HV=4, K=128, V=128, lens=(300, 200), seed=7, gate="logsigmoid",
          initial_state=True),
    Shape(id="kda", family="kda", H=4, HV=4, K=128, V=128, lens=(512,), seed=8, gate="bounded", lower_bound=-5.0),
), families=("gdn", "kda"))


@pytest.mark.parametrize("name", ["fla", "gdnbench"])
def test_backend_passes_gate_and_gets_both_times(name):
    b = backends.get(name)
    if not b.is_available():
        pytest.skip(b.is_available().reason)
    rows = run_set(SMALL, [name], ["explicit", "flag"], device="cuda", check_tokens=512,
                   params=TimingParams(warmup=2, rounds=2, iters=5), isolate=False)
    for r in rows:
        if r["status"] == "skipped":
            continue
        assert r["status"] == "ok", r
        assert r["gpu"]["median_us"] > 0 and r["wall"]["median_us"] > 0 and r["profiler_us"] > 0


def _small_head(family: str, dtype: str) -> Shape:
    kda = family == "kda"
    return Shape(id=f"{family}_{dtype}", family=family, H=1, HV=1, K=32, V=16, lens=(100,), seed=9,
                 gate="bounded" if kda else "logsigmoid", lower_bound=-5.0 if kda else None, dtype=dtype)


SMALL_HEADS = ShapeSet("gpu-small-heads", 1, "", "", tuple(
    _small_head(f, d) for f in ("gdn", "kda") for d in ("bfloat16", "float32")), families=("gdn", "kda"))


def test_small_heads_on_the_gpu():
    """K=32, V=16 with the default configs, every route, bf16 and fp32: the shapes where Triton 3.6 read
    shared memory out of bounds on the H200 (and KDA fused_qk bf16 gave rel-RMS 0.73) until validate
    rejected those configs; they pass the correctness gate now."""
    b = backends.get("gdnbench")
    if not b.is_available():
        pytest.skip(b.is_available().reason)
    rows = run_set(SMALL_HEADS, ["gdnbench"], ["flag", "fused_q", "fused_qk"], device="cuda", check_tokens=100,
                   params=TimingParams(warmup=1, rounds=1, iters=2), isolate=False)
    assert len(rows) == 12
    for r in rows:
        assert r["status"] == "ok", r


def test_direct_launch_matches_the_jit_path():
    """gdnbench.kernels.launch on the GPU: every route's forward is bitwise the JIT path's, also when
    q and k start off 16-byte alignment (views 2 bytes into a buffer: another specialization)."""
    import torch

    from gdnbench.kernels import ops
    from gdnbench.kernels import launch

    torch.manual_seed(0)
    T, H, HV, K, V = 200, 2, 4, 128, 64
    # rows of norm ~1: with norm="none", randn k (|k|^2 ~ K) makes the recurrence blow up to NaN
    qk = (torch.randn(2 * T * H * K + 1, device="cuda") * K**-0.5).to(torch.bfloat16)
    v = torch.randn(1, T, HV, V, device="cuda", dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device="cuda"))
    beta = torch.rand(1, T, HV, device="cuda")
    outs = {}
    try:
        for path in ("1", "0", "0"):  # JIT; direct (the first call fills the cache); direct (hits)
            os.environ["GDNBENCH_JIT_LAUNCH"] = path
            launch._direct_launch_api.cache_clear()
            for start in (0, 1):
                q = qk[start:start + T * H * K].view(1, T, H, K)
                k = qk[start + T * H * K:start + 2 * T * H * K].view(1, T, H, K)
                for norm in ops.NORM_MODES:
                    o, s = ops.chunk_gdn(q, k, v, g, beta, norm=norm, output_final_state=True)
                    outs.setdefault((start, norm), []).append((o, s))
    finally:
        os.environ.pop("GDNBENCH_JIT_LAUNCH", None)
        launch._direct_launch_api.cache_clear()
    assert launch._COMPILED  # the direct path ran
    for key, runs in outs.items():
        assert torch.isfinite(runs[0][0]).all() and torch.isfinite(runs[0][1]).all(), key
        for o, s in runs[1:]:
            assert torch.equal(o, runs[0][0]) and torch.equal(s, runs[0][1]), key


@pytest.mark.parametrize("norm", ["none", "flag", "fused_q", "fused_qk"])
def test_one_pass_matches_the_two_kernels(norm):
    """GDN's one-pass path (forced) against the two-kernel path in bf16 on the GPU, packed sequences
    with initial states, K = V = 128: the same o and final state up to bf16 rounding (the fused routes'
    one-pass forms normalize q in another order)."""
    import dataclasses

    import torch

    from gdnbench.kernels import ops

    torch.manual_seed(0)
    T, H, HV, K, V = 700, 2, 8, 128, 128
    q = torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16)
    if norm == "none":
        q, k = ops.l2norm(q), ops.l2norm(k)
    v = torch.randn(1, T, HV, V, device="cuda", dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device="cuda") + 2)
    beta = torch.rand(1, T, HV, device="cuda")
    cu = torch.tensor([0, 100, 163, 600, 700], device="cuda")
    h0 = torch.randn(4, HV, K, V, device="cuda") * 0.1
    base = ops.default_config(K, V)
    outs = [ops.chunk_gdn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, norm=norm,
                          config=dataclasses.replace(base, one_pass=one)) for one in (True, False)]
    (o1, s1), (o2, s2) = outs
    assert torch.isfinite(o1).all() and torch.isfinite(s1).all()
    assert rel_rms(o1, o2) < 1e-2 and rel_rms(s1, s2) < 1e-2, (rel_rms(o1, o2), rel_rms(s1, s2))


def test_fused_qk_redoes_its_risky_output_programs_on_the_gpu():
    """fused_qk's two-kernel path in bf16 with q and k rows of 1e30 (raw q k^T overflows fp32, k's sums of squares
    reach the gram's rare path): the output programs they reach redo themselves with k normalized on load (a
    call, output._output_rare), and o and the final state match flag's on the same inputs."""
    import dataclasses

    import torch

    from gdnbench.kernels import ops

    torch.manual_seed(1)
    T, H, HV, K, V = 700, 2, 8, 128, 128
    q = torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16)
    q[0, [5, 130, 640]] *= 1e30
    k[0, [3, 130, 650]] *= 1e30
    v = torch.randn(1, T, HV, V, device="cuda", dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device="cuda") + 2)
    beta = torch.rand(1, T, HV, device="cuda")
    cu = torch.tensor([0, 100, 163, 600, 700], device="cuda")
    h0 = torch.randn(4, HV, K, V, device="cuda") * 0.1
    cfg = dataclasses.replace(ops.default_config(K, V), one_pass=False)
    (o1, s1), (o2, s2) = (ops.chunk_gdn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                        norm=norm, config=cfg) for norm in ("fused_qk", "flag"))
    assert torch.isfinite(o1).all() and torch.isfinite(s1).all()
    assert rel_rms(o1, o2) < 1e-2 and rel_rms(s1, s2) < 1e-2, (rel_rms(o1, o2), rel_rms(s1, s2))


@pytest.mark.parametrize("segments", [1, 4])
def test_in_loop_k_tile_forms_on_the_gpu(segments):
    """fused_qk's in-loop forms as the tuned entries run them (bf16, K = V = 128, BK 64, BV 64, 4 warps, 3 stages),
    packed sequences with initial states, one segment or four with split_v: k's rstd as a vector, from aqk's quad
    tile, and with c_last from that tile.  The tile forms agree with the vector form to bf16 rounding, c_last from
    the tile is bitwise the tile form (the interpreter checks the same on the CPU: tests/test_ops_in_loop.py), and
    all three agree with the two-kernel path."""
    import dataclasses

    import torch

    from gdnbench.kernels import ops
    from gdnbench.kernels.config import KernelConfig

    torch.manual_seed(1)
    T, H, HV, K, V = 1500, 2, 4, 128, 128
    q = torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, T, H, K, device="cuda", dtype=torch.bfloat16) * 3
    v = torch.randn(1, T, HV, V, device="cuda", dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device="cuda") + 2)
    beta = torch.rand(1, T, HV, device="cuda")
    cu = torch.tensor([0, 100, 163, 1200, 1500], device="cuda")
    h0 = torch.randn(4, HV, K, V, device="cuda") * 0.1
    base = dataclasses.replace(ops.default_config(K, V), one_pass=True, in_loop="wu")
    loop = KernelConfig(BK=64, BV=64, num_warps=4, num_stages=3, segments=segments, split_v=segments == 4,
                        early_beta=True)

    def run(config):
        return ops.chunk_gdn(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                             norm="fused_qk", config=config)

    vec = run(dataclasses.replace(base, fused_out=loop))
    tile = run(dataclasses.replace(base, fused_out=dataclasses.replace(loop, k_rstd_tile=True)))
    summed = run(dataclasses.replace(base, fused_out=dataclasses.replace(loop, k_rstd_tile=True,
                                                                         c_last_from_tile=True)))
    two = run(dataclasses.replace(ops.default_config(K, V), one_pass=False))
    assert all(torch.isfinite(x).all() for x in vec + tile + summed)
    assert all(torch.equal(a, b) for a, b in zip(tile, summed))
    assert all(rel_rms(a, b) < 1e-2 for a, b in zip(tile, vec)), [rel_rms(a, b) for a, b in zip(tile, vec)]
    assert all(rel_rms(a, b) < 1e-2 for a, b in zip(tile, two)), [rel_rms(a, b) for a, b in zip(tile, two)]


@pytest.mark.parametrize("norm", ["flag", "fused_q", "fused_qk"])
@pytest.mark.parametrize("packed", [False, True])
def test_cuda_prepare_matches_the_triton_kernel(norm, packed):
    """KDA's CUDA C++ prepare kernel (kernels/kda16_cuda.py) against the Triton one, GVA 2, partial 16-token tiles
    (a dense batch of two with T = 200; packed lengths 37, 100, 300), k rows of norm up to 30: each prepared tensor,
    and the forward through the loop, within bf16 rounding of the Triton kernel's.  Skips where it does not apply
    (not Hopper, or NVRTC missing)."""
    import dataclasses

    import torch

    from gdnbench.kernels import kda16_cuda, ops

    torch.manual_seed(3)
    B, T, H, HV, K, V = (1, 437, 2, 4, 128, 64) if packed else (2, 200, 2, 4, 128, 64)
    q = torch.randn(B, T, H, K, device="cuda").to(torch.bfloat16)
    k = (torch.randn(B, T, H, K, device="cuda") * torch.rand(B, T, H, 1, device="cuda") * 3).to(torch.bfloat16)
    if norm != "fused_qk":
        k = ops.l2norm(k)
    if norm == "flag":
        q = ops.l2norm(q)
    g = -5.0 * torch.sigmoid(torch.randn(B, T, HV, K, device="cuda"))
    beta = torch.rand(B, T, HV, device="cuda").to(torch.bfloat16)
    v = torch.randn(B, T, HV, V, device="cuda").to(torch.bfloat16)
    if not kda16_cuda.applies(q, k, g, beta):
        pytest.skip(f"the CUDA prepare kernel does not apply here: {kda16_cuda.unavailable('cuda') or 'not Hopper'}")
    varlen = ops.prepare_varlen(torch.tensor([0, 37, 137, 437], device="cuda")) if packed else None
    from gdnbench.kernels.config import KernelConfig

    # the Triton kernel as the shipped entries run it: one step, tile grams of operands rounded to tf32
    base = dataclasses.replace(ops.default_config(K, V, 2, "kda"), kda_chunk16=True,
                               kda16_prep=KernelConfig(num_warps=1, num_stages=1, tf32_grams=True))
    kw = dict(scale=K**-0.5, norm_q=norm != "flag", norm_k=norm == "fused_qk", varlen=varlen)
    cuda = ops.kda16_prepare(q, k, g, beta, config=base, **kw)
    triton = ops.kda16_prepare(q, k, g, beta, config=dataclasses.replace(base, kda16_prep_cuda=False), **kw)
    limits = dict(qd=1e-3, kd=1e-3, kr=1e-3, inv=1e-3, mqk=5e-3, dec=1e-5)
    errs = {n: rel_rms(cuda[n].float(), triton[n].float()) for n in limits}
    assert all(errs[n] < lim for n, lim in limits.items()), errs
    outs = [ops.kda16_loop(t, v, initial_state=None, output_final_state=True, varlen=varlen, config=base)
            for t in (cuda, triton)]
    assert rel_rms(outs[0][0].float(), outs[1][0].float()) < 2e-3
    assert rel_rms(outs[0][1], outs[1][1]) < 2e-3


def test_cuda_prepare_replays_in_a_cuda_graph():
    """The runner times forwards as CUDA-graph replays: the CUDA C++ prepare kernel captured in a graph writes
    what an eager call writes, replay after replay, with the caching allocator busy in between."""
    import dataclasses

    import torch

    from gdnbench.kernels import kda16_cuda, ops

    torch.manual_seed(4)
    B, T, H, HV, K = 1, 1000, 2, 2, 128
    q = torch.randn(B, T, H, K, device="cuda").to(torch.bfloat16)
    k = torch.randn(B, T, H, K, device="cuda").to(torch.bfloat16)
    g = -5.0 * torch.sigmoid(torch.randn(B, T, HV, K, device="cuda"))
    beta = torch.rand(B, T, HV, device="cuda").to(torch.bfloat16)
    if not kda16_cuda.applies(q, k, g, beta):
        pytest.skip(f"the CUDA prepare kernel does not apply here: {kda16_cuda.unavailable('cuda') or 'not Hopper'}")
    cfg = dataclasses.replace(ops.default_config(K, K, 2, "kda"), kda_chunk16=True)

    def call():
        return ops.kda16_prepare(q, k, g, beta, scale=K**-0.5, norm_q=True, norm_k=True, config=cfg)

    eager = call()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()
    for _ in range(20):
        junk = [torch.empty(1 << 20, device="cuda") for _ in range(4)]
        del junk
        graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(captured[n], eager[n]) for n in eager)
