import sys, re, os
sys.path.insert(0, os.path.dirname(__file__))
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import importlib; state_t_kernel = importlib.import_module(os.environ.get("ST_MOD", "state_t")).state_t_kernel

def build(dt="bf16", BV=64, warps=4, stages=3, K=128, V=128, varlen=False, per_channel=False):
    sig = {"k": f"*{dt}", "w": f"*{dt}", "u": f"*{dt}", "g_cs": "*fp32", "h": f"*{dt}", "v_new": f"*{dt}",
           "h0": "*fp32", "ht": "*fp32", "cu_seqlens": "*i64", "chunk_offsets": "*i64", "T": "i32"}
    consts = dict(H=16, HV=32, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV, BT=64, IS_VARLEN=varlen,
                  PER_CHANNEL=per_channel, USE_H0=True, STORE_HT=True, PREC="tf32x3" if dt == "fp32" else "tf32")
    names = list(sig) + list(consts)
    for n in consts: sig[n] = "constexpr"
    cx = {(names.index(n),): v for n, v in consts.items()}
    return triton.compile(ASTSource(fn=state_t_kernel, signature=sig, constexprs=cx),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))

if __name__ == "__main__":
    dt, BV, warps, stages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    c = build(dt, BV, warps, stages)
    ttgir = c.asm["ttgir"]
    open(f"/tmp/state_t_{dt}_{BV}_{warps}_{stages}.ttgir", "w").write(ttgir)
    import tempfile, subprocess
    BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin") as f:
        f.write(c.asm["cubin"]); f.flush()
        out = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    print(re.search(r"REG:\d+.*", out).group(0)[:120], "smem", c.metadata.shared)
    for l in ttgir.splitlines():
        if "warp_group_dot " in l or "ttg.local_alloc" in l or "tt.dot " in l or "mma" in l.split("=")[0]:
            print(l.strip()[:220])
