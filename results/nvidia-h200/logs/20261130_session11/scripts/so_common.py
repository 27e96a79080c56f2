import torch
from gdnbench import ops
from gdnbench.kernels.config import cdiv, block, CHUNK_SIZE
from state_out import state_out_kernel


def state_out(q, k, w, u, g_cs, *, scale, initial_state=None, output_final_state=False, varlen=None, cfg=None):
    B, T, H, K = k.shape
    HV, V = u.shape[2], u.shape[3]
    N = varlen.num_seqs if varlen is not None else B
    o = torch.empty_like(u)
    ht = torch.empty(N, HV, K, V, device=k.device, dtype=torch.float32) if output_final_state else None
    BV = block(cfg.BV, V)
    ops._launch(state_out_kernel, (cdiv(V, BV), N * HV), cfg,
                q, k, w, u, g_cs, o, initial_state, ht, None if varlen is None else varlen.cu_seqlens,
                float(scale), T, H=H, HV=HV, K=K, V=V, BV=BV, BT=CHUNK_SIZE,
                IS_VARLEN=varlen is not None, USE_H0=initial_state is not None, STORE_HT=output_final_state,
                PREC=ops._precision(k.dtype))
    return o, ht


def two_kernels(q, k, w, u, g_cs, *, scale, initial_state=None, output_final_state=False, varlen=None, config=ops.DEFAULT_CONFIG):
    h, v_new, ht = ops.state_recurrence(k, w, u, g_cs, initial_state=initial_state,
                                        output_final_state=output_final_state, varlen=varlen, config=config)
    return ops.chunk_output(q, k, v_new, h, g_cs, scale=scale, varlen=varlen, config=config), ht
