"""FlashInfer (flashinfer-python): GDN prefill `chunk_gated_delta_rule`, KDA `recurrent_kda`.

GDN, `flashinfer.gdn_prefill.chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None,
initial_state=None, output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False, ...)`
(read in flashinfer-ai/flashinfer, flashinfer/gdn_prefill.py, up to 0.6.18):
- packed varlen only: q, k [T, H, D], v [T, HV, D], one head size D for q/k/v, cu_seqlens
  [N+1] of an integer dtype (documented int64; cast inside to int32 on SM100, int64 on SM90/SM120);
- g is the LINEAR decay alpha = exp(our log-space g), g and beta fp32 [T, max(H, HV)];
- initial and final state fp32 [N, HV, V, K] (the transpose of our [N, HV, K, V]);
- GVA (HV a multiple of H, q/k heads equal) is native: value head i reads q/k head i // (HV/H),
  as FLA and our reference do (FlashInfer's tests expand q/k with repeat_interleave), so q/k
  are passed un-expanded;
- SM90, SM100/SM103 (torch built for CUDA >= 13), SM120; head size 128; fp16/bf16 q/k/v.
- `use_qk_l2norm_in_kernel` is accepted but not used by the prefill paths up to 0.6.18
  (flashinfer PR #5255 adds it; 0.7.x normalizes in fp32 with eps 1e-6); route `flag` passes it
  and lets the gate judge the result.
- 0.7.x also chooses among its kernels per call (`backend="auto"`, `use_cp="auto"`: on SM90 the
  fused CuTe-DSL kernel, or its context-parallel variant when (sequences x heads) is small for the
  card's SM count). The adapter calls it as a user does, with both left at "auto", and traces the
  first call: the row's variant names the kernel entry points that ran (`KERNEL_ENTRIES`).

KDA, `flashinfer.kda.recurrent_kda(q, k, v, g, beta, A_log=None, dt_bias=None, scale=None,
initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=True,
use_gate_in_kernel=False, lower_bound=None, cu_seqlens=None, ..., beta_is_logit=False, ...)`
(flashinfer/kda.py): Blackwell only. Its prefill kernels (FlashKDA / CuTe DSL) take exactly the
legacy-six harness contract: bf16 [B,T,H,128] q/k/v, a RAW bf16 gate computed in-kernel as
lower_bound * sigmoid(exp(A_log) * (g + dt_bias)), beta as a bf16 logit, in-kernel q/k l2norm,
H == HV, bf16 state [N, HV, V, K] updated in place. Our inputs carry the computed gate, so
prepare() inverts it (A_log = 0, dt_bias = 0, raw g = logit(g / lower_bound)); only route `flag`
exists (the contract requires the in-kernel l2norm).

GDN decode (mode decode), `flashinfer.gdn_decode.gated_delta_rule_decode_pretranspose(q, k, v, state,
A_log, a, dt_bias, b, scale=None, output=None, use_qk_l2norm=True, initial_state=None,
initial_state_indices=None, ...)` (flashinfer/gdn_decode.py, releases with the state-pool arguments):
q, k [B,1,H,K], v [B,1,HV,V] fp16/bf16; raw gates computed in-kernel, g = -exp(A_log) *
softplus(a + dt_bias) and beta = sigmoid(b), a and b [B,1,HV] in q's dtype, A_log and dt_bias fp32
[HV]; pool mode: `initial_state` [P,HV,V,K] (K-last) fp32 or bf16 (K = V = 128), `state=None`,
updated in place at `initial_state_indices`. SM90+. Our decode inputs are handed over as
q/k/v views [N,1,...], a = log(expm1(-g)) and b = logit(beta) in q's dtype with A_log = 0,
dt_bias = 0 (so -softplus(a) = g and sigmoid(b) = beta up to that rounding), the pool transposed
to a K-last copy once in prepare_decode (the closure returns a transposed view of it).

All layout, gate and state conversion is done in prepare(), outside the timed closure; the closure
calls FlashInfer and returns views of its outputs in our layout (o [B,T,HV,V], state [N,HV,K,V]
as a transposed view). Exceptions, said where they are: the explicit route's l2norm (the route's
own work, timed as for FLA) and, for KDA, restoring the in-place-updated initial state.
"""

from __future__ import annotations

import sys

from .base import PLAIN_ROUTES, YES, Backend, no, one_line
from ..data.results import dist_version

DIST = "flashinfer-python"
HEAD_SIZE = 128
GDN_ARCHS = "SM90, SM100/SM103 or SM120"
KDA_ARCHS = "SM100/SM103/SM120"


# ----------------------------------------------------------------------------- environment probes
# Module-level so tests can replace them.
def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def _capability() -> tuple[int, int]:
    import torch

    return tuple(torch.cuda.get_device_capability())


def _torch_cuda_major() -> int:
    import torch

    return int(torch.version.cuda.split(".")[0]) if torch.version.cuda else 0


GDN_MODULE = "flashinfer.gdn_prefill"


def _gdn_op():
    # from the submodule: the top-level `flashinfer.chunk_gated_delta_rule` export can vanish
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def _kda_op():
    try:
        from flashinfer.kda import recurrent_kda
    except ImportError:  # older layouts kept it in kda_decode
        from flashinfer.kda_decode import recurrent_kda
    return recurrent_kda


def _decode_op():
    from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose

    return gated_delta_rule_decode_pretranspose


DECODE_POOL_ARGS = ("initial_state", "initial_state_indices")

# flashinfer.gdn_prefill's module globals that launch one prefill path each (0.7.x); the first call of
# a prepared closure is traced through them so the row says which ran (the cp_* ones: context parallel)
KERNEL_ENTRIES = tuple(f"{p}_sm{a}" for p in ("chunk_gated_delta_rule", "cp_delta_rule_dsl")
                       for a in (80, 90, 100, 120)) + ("_chunk_gated_delta_rule_gdn_cp_sm100",)


def traced(module, call):
    """Run ``call()`` once with every KERNEL_ENTRIES global of ``module`` wrapped to note its name;
    returns (call's result, the names that ran, in order). The globals are restored afterwards."""
    ran: list[str] = []
    saved = {n: getattr(module, n) for n in KERNEL_ENTRIES if callable(getattr(module, n, None))}

    def note(name, fn):
        def wrapper(*a, **kw):
            ran.append(name)
            return fn(*a, **kw)
        return wrapper

    try:
        for n, fn in saved.items():
            setattr(module, n, note(n, fn))
        out = call()
    finally:
        for n, fn in saved.items():
            setattr(module, n, fn)
    return out, list(dict.fromkeys(ran))


def _caller_l2norm(x):
    """The explicit route's l2norm (FLA semantics: x / sqrt(sum x^2 + 1e-6) in fp32, cast back):
    our Triton kernel on CUDA, the torch reference elsewhere."""
    if x.is_cuda:
        from ..kernels.ops import l2norm

        return l2norm(x)
    from ..oracle.reference import l2norm

    return l2norm(x)


# ----------------------------------------------------------------------------- pure conversions
def _batch_tokens(shape) -> tuple[int, int]:
    return (1, shape.tokens) if shape.varlen else (shape.B, shape.lens[0])


def _cu_seqlens(inputs, shape, dtype):
    import torch

    if inputs.cu_seqlens is not None:
        return inputs.cu_seqlens.to(dtype).contiguous()
    B, T = _batch_tokens(shape)
    return torch.arange(0, (B + 1) * T, T, dtype=dtype, device=inputs.q.device)


def to_flashinfer(inputs, shape, cu_dtype=None) -> dict:
    """Our inputs -> chunk_gated_delta_rule's keyword arguments (everything but the l2norm flag).

    [B,T,H,K] -> packed [B*T,H,K] (a view for contiguous inputs); fixed-length B>1 gets
    cu_seqlens [0, T, 2T, ..., B*T]; g -> exp(g) fp32 [B*T, HV]; beta -> fp32 [B*T, HV];
    initial state [N,HV,K,V] -> contiguous fp32 [N,HV,V,K]."""
    import torch

    B, T = _batch_tokens(shape)
    tok = B * T

    def pack(x):
        return x.reshape(tok, *x.shape[2:]).contiguous()

    h0 = inputs.initial_state
    return dict(
        q=pack(inputs.q), k=pack(inputs.k), v=pack(inputs.v),
        g=pack(torch.exp(inputs.g.float())), beta=pack(inputs.beta.float()),
        scale=inputs.scale,
        initial_state=None if h0 is None else h0.float().transpose(-1, -2).contiguous(),
        output_final_state=True,
        cu_seqlens=_cu_seqlens(inputs, shape, cu_dtype or torch.int64),
    )


def from_flashinfer(o, state, shape):
    """FlashInfer's (o [B*T,HV,V], state [N,HV,V,K]) -> ours (o [B,T,HV,V], state [N,HV,K,V]), views only."""
    B, T = _batch_tokens(shape)
    o = o.view(B, T, *o.shape[1:])
    return o, (None if state is None else state.transpose(-1, -2))


def to_flashinfer_kda(inputs, shape) -> dict:
    """Our KDA inputs -> recurrent_kda's frozen-prefill contract (raw in-kernel gate, beta logit).

    Our g = lower_bound * sigmoid(z) is handed over as the raw gate z = logit(g / lower_bound)
    with A_log = 0 and dt_bias = 0 (so exp(A_log) * (z + dt_bias) = z); beta -> logit(beta);
    all bf16, layout kept ([B,T,...] fixed, [1,T,...] + int64 cu_seqlens packed); the initial
    state -> bf16 [N,HV,V,K] (FlashInfer updates it in place: the caller keeps this as the
    pristine copy)."""
    import torch

    lb = float(inputs.lower_bound)
    bf = torch.bfloat16
    HV, K = inputs.g.shape[2], inputs.g.shape[3]
    dev = inputs.q.device
    ratio = (inputs.g.double() / lb).clamp(1e-12, 1 - 1e-12)  # g in [lb, 0): ratio in (0, 1]
    raw_g = torch.logit(ratio).to(bf).contiguous()
    beta_logit = torch.logit(inputs.beta.double().clamp(1e-12, 1 - 1e-12)).to(bf).contiguous()
    h0 = inputs.initial_state
    kw = dict(
        q=inputs.q.contiguous(), k=inputs.k.contiguous(), v=inputs.v.contiguous(),
        g=raw_g, beta=beta_logit,
        A_log=torch.zeros(HV, dtype=torch.float32, device=dev),
        dt_bias=torch.zeros(HV * K, dtype=torch.float32, device=dev),
        scale=inputs.scale,
        initial_state=None if h0 is None else h0.to(bf).transpose(-1, -2).contiguous(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, lower_bound=lb, beta_is_logit=True,
    )
    if inputs.cu_seqlens is not None:
        kw["cu_seqlens"] = inputs.cu_seqlens.to(torch.int64).contiguous()
    return kw


def from_flashinfer_kda(o, state):
    """recurrent_kda's (o [B,T,HV,V], state [N,HV,V,K] bf16) -> ours, views only."""
    return o, (None if state is None else state.transpose(-1, -2))


def to_flashinfer_decode(inputs, shape) -> dict:
    """Our decode inputs -> gated_delta_rule_decode_pretranspose's pool-mode keyword arguments
    (everything but use_qk_l2norm; module docstring)."""
    import torch

    N, HV = shape.B, shape.HV
    dt, dev = inputs.q.dtype, inputs.q.device
    g = inputs.g.double().reshape(N, 1, HV)
    beta = inputs.beta.double().reshape(N, 1, HV)

    def per_seq(x):  # [1,N,...] -> [N,1,...], a view
        return x.reshape(N, 1, *x.shape[2:])

    return dict(
        q=per_seq(inputs.q), k=per_seq(inputs.k), v=per_seq(inputs.v), state=None,
        A_log=torch.zeros(HV, dtype=torch.float32, device=dev),
        a=torch.log(torch.expm1((-g).clamp_min(1e-30))).to(dt).contiguous(),
        dt_bias=torch.zeros(HV, dtype=torch.float32, device=dev),
        b=torch.logit(beta.clamp(1e-12, 1 - 1e-12)).to(dt).contiguous(),
        scale=inputs.scale,
        initial_state=inputs.state_pool.transpose(-1, -2).contiguous(),
        initial_state_indices=inputs.state_indices.to(torch.int32),
    )


# ----------------------------------------------------------------------------- the adapter
class FlashinferBackend(Backend):
    name = "flashinfer"
    routes = PLAIN_ROUTES
    families = ("gdn", "kda")
    devices = ("cuda",)
    no_backward = "has no backward (its GDN prefill and KDA kernels are forward-only, no autograd)"
    decode_routes = PLAIN_ROUTES

    def __init__(self):
        self._ran: dict[str, list[str]] = {}  # shape id -> the prefill entry points its first call ran

    def is_available(self):
        try:
            _gdn_op()
        except ModuleNotFoundError as e:
            if (e.name or "").split(".")[0] == "flashinfer" and self.version() is None:
                return no(f"{DIST} is not installed (pip install {DIST})")
            return no(one_line(e, "import flashinfer.gdn_prefill failed"))
        except Exception as e:  # JIT / CUDA / cutlass-dsl import problems
            return no(one_line(e, "import flashinfer.gdn_prefill failed"))
        if not _cuda_available():
            return no("no CUDA device (flashinfer runs on CUDA only)")
        return YES

    def version(self):
        return dist_version(DIST)

    def supports(self, shape, route, mode, device):
        base = super().supports(shape, route, mode, device)
        if not base:
            return base
        if shape.K != HEAD_SIZE or shape.V != HEAD_SIZE:
            return no(f"K={shape.K}, V={shape.V}: flashinfer's {shape.family} kernels take head size 128 only")
        major, minor = _capability()
        sm = f"sm{major}{minor}"
        if mode == "decode":
            return self._decode_support(shape, sm, major)
        if shape.family == "gdn":
            if shape.dtype not in ("bfloat16", "float16"):
                return no(f"dtype {shape.dtype}: chunk_gated_delta_rule takes fp16/bf16 q/k/v only")
            if shape.HV % shape.H:
                return no(f"H={shape.H}, HV={shape.HV}: GVA needs HV a multiple of H")
            if major == 10 and _torch_cuda_major() < 13:
                return no(f"GDN prefill on {sm} (Blackwell) needs torch built for CUDA >= 13 "
                          f"(torch has CUDA {_torch_cuda_major()})")
            if major not in (9, 10, 12):
                return no(f"GDN prefill needs {GDN_ARCHS}; this GPU is {sm}")
            return YES
        # kda
        if major not in (10, 12):
            return no(f"recurrent_kda is Blackwell only ({KDA_ARCHS}); this GPU is {sm}")
        if route != "flag":
            return no("recurrent_kda's prefill contract normalizes q/k in-kernel: route 'flag' only")
        if shape.dtype != "bfloat16":
            return no(f"dtype {shape.dtype}: recurrent_kda takes bf16 only")
        if shape.HV != shape.H:
            return no(f"H={shape.H}, HV={shape.HV}: recurrent_kda's prefill contract needs HV == H")
        if shape.lower_bound is None:
            return no("recurrent_kda's prefill gate needs a lower_bound")
        try:
            _kda_op()
        except Exception as e:
            return no(one_line(e, "flashinfer has no recurrent_kda"))
        return YES

    def _decode_support(self, shape, sm: str, major: int):
        if shape.family != "gdn":
            return no("decode: only flashinfer's GDN decode (gdn_decode) is adapted; its KDA kernels are Blackwell-only "
                      "prefill (recurrent_kda)")
        if shape.dtype not in ("bfloat16", "float16"):
            return no(f"dtype {shape.dtype}: gated_delta_rule_decode_pretranspose takes fp16/bf16 q/k/v only")
        if shape.state_dtype not in ("float32", "bfloat16"):
            return no(f"state_dtype {shape.state_dtype}: flashinfer's decode pools are fp32 or bf16")
        if shape.HV % shape.H:
            return no(f"H={shape.H}, HV={shape.HV}: GVA needs HV a multiple of H")
        if major < 9:
            return no(f"gdn_decode needs SM90+; this GPU is {sm}")
        try:
            import inspect

            params = inspect.signature(_decode_op()).parameters
        except Exception as e:
            return no(one_line(e, "flashinfer has no gdn_decode.gated_delta_rule_decode_pretranspose"))
        if not all(a in params for a in DECODE_POOL_ARGS):
            return no(f"flashinfer {self.version()}: gated_delta_rule_decode_pretranspose has no state-pool arguments "
                      f"({', '.join(DECODE_POOL_ARGS)}); needs a newer flashinfer")
        return YES

    def variant(self, shape, route):
        v = f"flashinfer {self.version()}"
        if shape.decode:
            how = "caller l2norm, use_qk_l2norm=False" if route == "explicit" else "use_qk_l2norm=True (in-kernel)"
            return (f"{v} gdn_decode.gated_delta_rule_decode_pretranspose pool mode (K-last copy of the pool made in "
                    f"prepare, initial_state_indices int32), raw gates a=log(expm1(-g)), b=logit(beta), A_log=0, "
                    f"dt_bias=0, {how}")
        if shape.family == "kda":
            return (f"{v} recurrent_kda(use_gate_in_kernel, beta_is_logit, lower_bound, in-kernel l2norm) "
                    "on our gate inverted to raw z=logit(g/lb), A_log=0, dt_bias=0 (bf16 gate/beta/state)")
        how = ("caller l2norm (gdnbench.kernels.ops.l2norm), use_qk_l2norm_in_kernel=False" if route == "explicit"
               else "use_qk_l2norm_in_kernel=True")
        ran = self._ran.get(shape.id)
        ran = "not yet called" if ran is None else ("ran " + ", ".join(ran) if ran else "ran no traced entry point")
        return (f"{v} gdn_prefill.chunk_gated_delta_rule(backend=auto, use_cp=auto) packed [T,H,D] + cu_seqlens, "
                f"exp(g), native GVA, {how}: {ran}")

    def prepare(self, shape, route, inputs):
        if shape.family == "kda":
            return self._prepare_kda(shape, route, inputs)
        import torch

        op = _gdn_op()
        # the dtype each architecture's kernel reads (older releases cast per call otherwise)
        cu_dtype = torch.int64
        if inputs.q.is_cuda and _capability()[0] == 10:
            cu_dtype = torch.int32
        kw = to_flashinfer(inputs, shape, cu_dtype=cu_dtype)
        q, k = kw.pop("q"), kw.pop("k")

        flag = route == "flag"

        def run():
            qq, kk = (q, k) if flag else (_caller_l2norm(q), _caller_l2norm(k))
            o, s = op(q=qq, k=kk, use_qk_l2norm_in_kernel=flag, **kw)
            return from_flashinfer(o, s, shape)

        first = [True]

        def call():
            if first[0]:  # once per closure, outside what is timed (the harness's first call)
                first[0] = False
                out, self._ran[shape.id] = traced(sys.modules[GDN_MODULE], run)
                return out
            return run()
        return call

    def _prepare_kda(self, shape, route, inputs):
        op = _kda_op()
        kw = to_flashinfer_kda(inputs, shape)
        pristine = kw.pop("initial_state")
        work = None if pristine is None else pristine.clone()

        def call():
            if work is not None:
                # unavoidable in the timed region: recurrent_kda updates initial_state in place,
                # and every call (first call, gate, timing) must start from the same state
                work.copy_(pristine)
            out = op(initial_state=work, **kw)
            return from_flashinfer_kda(out[0], out[1])
        return call

    def prepare_decode(self, shape, route, inputs):
        op = _decode_op()
        kw = to_flashinfer_decode(inputs, shape)
        q, k, pool = kw.pop("q"), kw.pop("k"), kw["initial_state"]
        N, HV, V = shape.B, shape.HV, shape.V
        flag = route == "flag"

        def call():
            qq, kk = (q, k) if flag else (_caller_l2norm(q), _caller_l2norm(k))
            o, _ = op(q=qq, k=kk, use_qk_l2norm=flag, **kw)
            return o.view(1, N, HV, V), pool.transpose(-1, -2)
        return call
