"""One forward under test (run it under compute-sanitizer, one process alone on the GPU).
env: FAM gdn|kda, NORM, DT, KK, VV, SET "kernel=field:val,...;kernel=..." (config overrides), DEFAULT=1 to
skip the overrides and use ops.default_config as is.  Prints rel-RMS of o against the fp64 recurrence."""
import dataclasses, os, sys
sys.path.insert(0, "tests")
import torch
from gdnbench import ops
import test_ops_gdn as tg
import test_ops_kda as tk

DEV = "cuda" if torch.cuda.is_available() else "cpu"
fam, norm = os.environ.get("FAM", "gdn"), os.environ.get("NORM", "flag")
K, V = int(os.environ.get("KK", 32)), int(os.environ.get("VV", 16))
dt = getattr(torch, os.environ.get("DT", "float32"))
mod = tk if fam == "kda" else tg
q, k, v, g, beta, _ = mod.make_inputs(1, 100, 1, 1, K, V, dt, seed=9)
cfg = ops.default_config(K, V, q.element_size(), fam)
for spec in filter(None, os.environ.get("SET", "").split(";")):
    name, fields = spec.split("=", 1)
    kw = {f: None if x == "None" else int(x) for f, x in (it.split(":") for it in fields.split(","))}
    cfg = dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), **kw)})
op = ops.chunk_kda if fam == "kda" else ops.chunk_gdn
kw = dict(lower_bound=-5.0) if fam == "kda" and "lower_bound" in op.__code__.co_varnames else {}
o, fs = op(*(x.to(DEV) for x in (q, k, v, g, beta)), norm=norm, output_final_state=True, config=cfg, **kw)
torch.cuda.synchronize() if DEV == "cuda" else None
ref = mod.reference(q, k, v, g, beta, normalize=norm != "none")[0]
print(f"RESULT {fam} {norm} {os.environ.get('DT', 'float32')} K{K} V{V}: rel-RMS {mod.rel_rms(o.cpu(), ref):.2e}", flush=True)
