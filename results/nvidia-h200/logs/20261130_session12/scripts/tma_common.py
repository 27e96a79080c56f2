import sys
import torch
from triton.tools.tensor_descriptor import TensorDescriptor
from gdnbench import ops
from gdnbench.kernels.config import cdiv, block, CHUNK_SIZE
sys.path.insert(0, ".devrun/s12")
from state_tma import state_tma_kernel


def run_tma(k, w, u, g_cs, s0, info, cfg, T, piece, tma_load, tma_h):
    B, _, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    N = info.num_seqs if info is not None else B
    n_chunks = info.num_chunks if info is not None else B * cdiv(T, CHUNK_SIZE)
    h = torch.empty(n_chunks, HV, K, V, device=k.device, dtype=k.dtype)
    v_new = torch.empty_like(u)
    ht = torch.empty(N, HV, K, V, device=k.device, dtype=torch.float32)
    BV = block(cfg.BV, V)
    BT = CHUNK_SIZE
    wd = TensorDescriptor.from_tensor(w.view(-1, HV * K), [BT, piece]) if tma_load else None
    kd = TensorDescriptor.from_tensor(k.view(-1, H * K), [BT, piece]) if tma_load else None
    ud = TensorDescriptor.from_tensor(u.view(-1, HV * V), [BT, BV]) if tma_load else None
    hd = TensorDescriptor.from_tensor(h.view(-1, V), [piece, BV]) if tma_h else None
    ops._launch(state_tma_kernel, (cdiv(V, BV), N * HV), cfg, k, w, u, g_cs, h, v_new, s0, ht,
                None if info is None else info.cu_seqlens, None if info is None else info.chunk_offsets, T,
                wd, kd, ud, hd, H=H, HV=HV, K=K, V=V, BV=BV, BT=BT, PIECE=piece,
                IS_VARLEN=info is not None, USE_H0=s0 is not None, STORE_HT=True, PREC=ops._precision(k.dtype),
                TMA_LOAD=tma_load, TMA_H=tma_h)
    return h, v_new, ht
