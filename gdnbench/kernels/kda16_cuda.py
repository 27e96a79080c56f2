"""KDA's 16-token prepare kernel in CUDA C++ (``kda16_prep.cu``): the outputs of :mod:`.kda16`'s Triton
``kda16_prep_kernel``, where it applies (:func:`applies`: a Hopper GPU, bf16 q, k and beta, fp32 g, K = 128,
contiguous 16-byte-aligned tensors).  ``GDNConfig.kda16_prep_cuda`` (on by default) lets :func:`ops.kda16_prepare`
take it; anywhere else, and under the interpreter, the Triton kernel runs.

Why CUDA here: the Triton kernel is one warp per tile at 232-248 registers, eight warps an SM, and its time
follows its instruction chain, so folding the norms in cost its fused routes 3-12 % over flag's (design notes,
KDA).  Here the layouts are ours: the gates' cumsum runs in-thread (no shuffles), the grams take their operands
straight from registers in the mma fragment layout, the rows' sums of squares are two tensor-core products, and
every load and store moves whole sectors.  On an H100 (the kernel alone, kda-legacy6) it ran flag in 369-592 us
against Triton's 406-604, and fused_qk within 1 % of its own flag at the dense keys.

Compiled with NVRTC through ``torch.cuda._compile_kernel`` (no nvcc, no build step) once per process and
(norm_q, norm_k, varlen); a compile failure leaves the Triton kernel in charge (:func:`unavailable`)."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .config import GRID_Y_MAX

SOURCE = Path(__file__).with_name("kda16_prep.cu")
K = 128
CAPABILITIES = ((9, 0),)  # where it was measured; other GPUs keep the Triton kernel
WARPS = 4  # a block: one 64-token chunk of one value head, a warp per 16-token tile


def applies(q, k, g, beta) -> bool:
    """Whether :func:`launch` serves these inputs: q, k [B,T,H,128] and beta [B,T,HV] bf16, g [B,T,HV,128] fp32,
    all contiguous and 16-byte aligned, B * HV within a grid axis, on the current GPU if it is one of
    :data:`CAPABILITIES` and the kernel compiles there."""
    if not (q.is_cuda and k.is_cuda and g.is_cuda and beta.is_cuda):
        return False
    if q.shape[-1] != K or k.shape[-1] != K or g.shape[-1] != K:
        return False
    if not (q.dtype == k.dtype == beta.dtype == torch.bfloat16 and g.dtype == torch.float32):
        return False
    if not all(x.is_contiguous() and x.data_ptr() % 16 == 0 for x in (q, k, g)) or not beta.is_contiguous():
        return False
    if q.shape[0] * beta.shape[2] > GRID_Y_MAX or q.device.index != torch.cuda.current_device():  # grid (chunks, B*HV)
        return False
    return _runs_here()


def serves(dtype: str, channels: int) -> bool:
    """Whether a shape of this storage dtype and K takes the CUDA kernel on the current GPU (what
    :func:`applies` decides per call for the contract's inputs: bf16 storage, fp32 gates)."""
    return dtype == "bfloat16" and channels == K and torch.cuda.is_available() and _runs_here()


def _runs_here() -> bool:
    """The current GPU is one of :data:`CAPABILITIES` and the kernel compiles there."""
    return _runs_on(torch.cuda.current_device())


@functools.cache
def _runs_on(device: int) -> bool:
    """:func:`_runs_here` for one device, asked once: :func:`applies` runs on every KDA forward."""
    return torch.cuda.get_device_capability(device) in CAPABILITIES and _unavailable(device) is None


def compile_options(norm_q: bool, norm_k: bool, varlen: bool) -> list[str]:
    """NVRTC's options for one variant (kernels/offline.py compiles the same)."""
    return ["-std=c++17", f"-DNORM_Q={int(norm_q)}", f"-DNORM_K={int(norm_k)}", f"-DVARLEN={int(varlen)}"]


@functools.cache
def _kernel(norm_q: bool, norm_k: bool, varlen: bool, device: int):
    with torch.cuda.device(device):
        return torch.cuda._compile_kernel(SOURCE.read_text(), "kda16_prep_cuda",
                                          nvcc_options=compile_options(norm_q, norm_k, varlen))


@functools.cache
def _unavailable(device: int) -> str | None:
    if not hasattr(torch.cuda, "_compile_kernel"):
        return f"torch {torch.__version__} has no torch.cuda._compile_kernel (NVRTC)"
    try:
        _kernel(False, False, False, device)
    except Exception as e:  # NVRTC missing or refusing the source: the Triton kernel runs
        return f"NVRTC could not compile kda16_prep.cu: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
    return None


def unavailable(device) -> str | None:
    """Why the CUDA kernel cannot run on ``device`` (None where it compiles there)."""
    return _unavailable(torch.device(device).index or 0)


def launch(q, k, g, beta, out: dict, *, scale: float, norm_q: bool, norm_k: bool, varlen, T: int, NT: int,
           n_chunks: int) -> None:
    """Write :func:`ops.kda16_prepare`'s tensors (``out``: qd, kd, kr, inv, mqk, dec) for the inputs
    :func:`applies` accepted; ``varlen``: ops.VarlenInfo or None."""
    B, _, H, _ = k.shape
    HV = beta.shape[2]
    kernel = _kernel(bool(norm_q), bool(norm_k), varlen is not None, q.device.index or 0)
    if varlen is not None:
        cu, ci = varlen.cu_seqlens, varlen.chunk_indices
    else:
        cu = ci = out["dec"]  # unread: any device pointer
    kernel(grid=(n_chunks, B * HV, 1), block=(32 * WARPS, 1, 1),
           args=[q, k, g, beta, out["qd"], out["kd"], out["kr"], out["inv"], out["mqk"], out["dec"], cu, ci,
                 int(T), int(NT), float(scale), int(H), int(HV)])
