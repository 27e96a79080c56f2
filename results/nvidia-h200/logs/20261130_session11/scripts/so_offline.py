import os, re, sys, subprocess, tempfile
sys.path.insert(0, os.path.dirname(__file__))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from state_out import state_out_kernel
BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
for spec in sys.argv[1:]:
    BV, warps, stages = map(int, spec.split(","))
    sig = {"q": "*bf16", "k": "*bf16", "w": "*bf16", "u": "*bf16", "g_cs": "*fp32", "o": "*bf16", "h0": "*fp32",
           "ht": "*fp32", "cu_seqlens": "*i64", "scale": "fp32", "T": "i32"}
    consts = dict(H=16, HV=32, K=128, V=128, BV=BV, BT=64, IS_VARLEN=True, USE_H0=True, STORE_HT=True, PREC="tf32")
    names = list(sig) + list(consts)
    for n in consts: sig[n] = "constexpr"
    c = triton.compile(ASTSource(fn=state_out_kernel, signature=sig, constexprs={(names.index(n),): v for n, v in consts.items()}),
                       target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        out = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out)
    print(spec, "regs", m.group(1), "stack", m.group(2), "smem", c.metadata.shared, "async", c.asm["ttgir"].count("async_copy_global_to_local"), "wgmma", c.asm["ttgir"].count("warp_group_dot "), flush=True)
