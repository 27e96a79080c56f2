"""Registers, stack (spills) and HGMMA use of the output kernel variants, from an offline sm_90
compile with the Triton installed here (no GPU needed): a lead for why the fused output is slower.

    python scripts/offline_output_kernel_resources.py > results/offline-sm90/output_kernel_resources.txt
"""
import inspect
import os
import re
import subprocess
import tempfile

import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from gdnbench.kernels.output import output_kernel
bindir=os.path.join(os.path.dirname(triton.__file__),"backends/nvidia/bin")
names=list(inspect.signature(output_kernel.fn).parameters)
def variant(FUSE_Q, FUSE_K, BK, BV, warps, stages):
    ptr="*bf16"
    sig={n:"constexpr" for n in names}
    sig.update(q=ptr,k=ptr,v_new=ptr,h=ptr,g_cs="*fp32",o=ptr,scale="fp32",T="i32",NT="i32")
    consts={"H":16,"HV":32,"K":128,"V":128,"BK":BK,"BV":BV,"BT":64,"IS_VARLEN":False,"FUSE_Q":FUSE_Q,"FUSE_K":FUSE_K,"PER_CHANNEL":False,"PREC":"tf32","cu_seqlens":None,"chunk_indices":None,"rstd_k":None,"aqk":None}
    if FUSE_K: sig["rstd_k"]="*fp32"; del consts["rstd_k"]
    src=ASTSource(fn=output_kernel, signature=sig, constexprs={(names.index(k),):v for k,v in consts.items()})
    k=triton.compile(src, target=GPUTarget("cuda",90,32), options={"num_warps":warps,"num_stages":stages})
    with tempfile.NamedTemporaryFile("wb",suffix=".cubin",delete=False) as f: f.write(k.asm["cubin"])
    out=subprocess.run([os.path.join(bindir,"cuobjdump"),"--dump-resource-usage",f.name],capture_output=True,text=True)
    m=re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)",out.stdout)
    sass=subprocess.run([os.path.join(bindir,"cuobjdump"),"--dump-sass",f.name],capture_output=True,text=True).stdout
    return (m.groups() if m else out.stdout[-300:]), "HGMMA" in sass, sass.count("LDL"), sass.count("STL")
print(f"triton {triton.__version__}, sm_90, K=V=128 bf16, H16/HV32; (BK, BV, warps, stages)")
for cfg in [(128,64,8,2),(64,128,4,2)]:
    for fq,fk in [(False,False),(True,False),(True,True)]:
        (reg, stack, _, _), hgmma, ldl, stl = variant(fq, fk, *cfg)
        name = ("fuse_q" if fq else "plain") + ("+k" if fk else "")
        print(f"{cfg} {name:9s} registers {reg:>3}  stack {stack:>3} B  HGMMA {hgmma}  LDL {ldl:3d}  STL {stl:3d}")
