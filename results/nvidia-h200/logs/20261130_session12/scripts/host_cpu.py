import time, statistics, torch, cProfile, pstats
from gdnbench import ops
ops._launch = lambda *a, **k: None
T,H,HV,K,V=256,2,8,128,128
q=torch.randn(1,T,H,K,dtype=torch.bfloat16); k=torch.randn(1,T,H,K,dtype=torch.bfloat16); v=torch.randn(1,T,HV,V,dtype=torch.bfloat16)
g=-torch.rand(1,T,HV); beta=torch.rand(1,T,HV,dtype=torch.bfloat16)
def t(norm, n=2000):
    f=lambda: ops.chunk_gdn(q,k,v,g,beta,norm=norm,output_final_state=True)
    for _ in range(50): f()
    s=time.perf_counter()
    for _ in range(n): f()
    return (time.perf_counter()-s)/n*1e6
for norm in ("none","flag","fused_q","fused_qk"): print(norm, round(t(norm),1), "us")
pr=cProfile.Profile(); pr.enable()
for _ in range(2000): ops.chunk_gdn(q,k,v,g,beta,norm="fused_qk",output_final_state=True)
pr.disable(); pstats.Stats(pr).sort_stats("tottime").print_stats(12)
