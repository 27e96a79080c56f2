"""Session 12: where a Triton launch's host time goes (Triton 3.6), for our state kernel and for a whole
chunk_gdn forward: the JIT path (kernel[grid](...)) against its parts (binder, cache key, launch
metadata, the compiled kernel's run).  Small inputs, so the GPU never holds the host back."""
import os, statistics, sys, time
import torch
import triton
from triton.runtime.jit import compute_cache_key
from triton import knobs
from triton.runtime.driver import driver
from gdnbench import ops
from gdnbench.kernels.config import default_config, block, cdiv, state_piece
from gdnbench.kernels.state import state_kernel

N = 300


def per_call_us(fn, n=N, reps=5):
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        out.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def main():
    torch.manual_seed(0)
    T, H, HV, K, V = 256, 2, 8, 128, 128
    dev = "cuda"
    q = torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16)
    k = ops.l2norm(torch.randn(1, T, H, K, device=dev, dtype=torch.bfloat16))
    v = torch.randn(1, T, HV, V, device=dev, dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device=dev))
    beta = torch.rand(1, T, HV, device=dev, dtype=torch.bfloat16)
    cfg = default_config(K, V)
    g_cs, A, _, _ = ops.gram_solve(k, g, beta, config=cfg)
    w, u, _ = ops.recompute_wu(k, v, beta, A, g_cs, config=cfg)
    c = cfg.state
    BV = block(c.BV, V)
    h = torch.empty(cdiv(T, 64), HV, K, V, device=dev, dtype=k.dtype)
    v_new = torch.empty_like(u)
    grid = (cdiv(V, BV), HV)
    args = (k, w, u, g_cs, h, v_new, None, None, None, None, T)
    kw = dict(H=H, HV=HV, K=K, V=V, BV=BV, BT=64, IS_VARLEN=False, PER_CHANNEL=False, USE_H0=False,
              STORE_HT=False, PREC=ops._precision(k.dtype),
              PIECE=state_piece(c, K))
    opts = dict(num_warps=c.num_warps, num_stages=c.num_stages)
    full = lambda: state_kernel[grid](*args, **kw, **opts)
    kernel = full()
    torch.cuda.synchronize()
    device = driver.active.get_current_device()
    stream = driver.active.get_current_stream(device)
    kernel_cache, kernel_key_cache, target, backend, binder = state_kernel.device_caches[device]
    kw2 = dict(kw, **opts, debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound_args, spec, options = binder(*args, **kw2)
    vals = tuple(bound_args.values())
    meta = kernel.launch_metadata(grid, stream, *vals)
    res = {}
    res["kernel[grid](...) (Triton's JIT path)"] = per_call_us(full)
    res["  binder (argument binding + specialization)"] = per_call_us(lambda: binder(*args, **kw2), reps=3)
    res["  compute_cache_key"] = per_call_us(lambda: compute_cache_key(kernel_key_cache, spec, options), reps=3)
    res["  device + stream lookup"] = per_call_us(lambda: driver.active.get_current_stream(driver.active.get_current_device()), reps=3)
    res["  launch_metadata"] = per_call_us(lambda: kernel.launch_metadata(grid, stream, *vals), reps=3)
    res["compiled kernel.run(...) alone"] = per_call_us(
        lambda: kernel.run(grid[0], grid[1], 1, stream, kernel.function, kernel.packed_metadata, meta, None, None, *vals))
    res["ops.state_recurrence (our Python + the launch)"] = per_call_us(
        lambda: ops.state_recurrence(k, w, u, g_cs, config=cfg))
    for norm in ("none", "fused_qk"):
        res[f"ops.chunk_gdn norm={norm} (whole forward, host time)"] = per_call_us(
            lambda: ops.chunk_gdn(q, k, v, g, beta, norm=norm, output_final_state=True), n=100)
    for name, t in res.items():
        print(f"{t:8.1f} us  {name}")
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name())


if __name__ == "__main__":
    main()
