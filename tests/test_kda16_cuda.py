"""KDA's CUDA C++ prepare kernel (kernels/kda16_cuda.py) without a GPU: where it applies, and its source compiled
for sm_90 through NVRTC (the nvidia-cuda-nvrtc wheel) and ptxas; tests/test_gpu.py runs it against the Triton
kernel."""

import pytest
import torch

from gdnbench.backends.gdnbench import _cuda_prepare
from gdnbench.data.shapes import Shape
from gdnbench.kernels import kda16_cuda, offline
from gdnbench.kernels.config import GDNConfig


def _inputs(dtype=torch.bfloat16, K=128):
    q = torch.zeros(1, 32, 2, K, dtype=dtype)
    return q, q.clone(), torch.zeros(1, 32, 2, K), torch.zeros(1, 32, 2, dtype=dtype)


def test_it_applies_to_gpu_tensors_only():
    assert not kda16_cuda.applies(*_inputs())


def test_the_label_names_it_only_for_kda_on_cuda():
    kda = Shape(id="k", family="kda", H=2, HV=2, K=128, V=128, lens=(64,), seed=1, gate="bounded", lower_bound=-5.0)
    gdn = Shape(id="g", family="gdn", H=2, HV=2, K=128, V=128, lens=(64,), seed=1, gate="logsigmoid")
    chunk16 = GDNConfig(kda_chunk16=True)
    assert GDNConfig().kda16_prep_cuda  # on by default, where it applies
    assert not _cuda_prepare(kda, chunk16, "cpu")
    assert not _cuda_prepare(gdn, chunk16, "cuda")
    assert not _cuda_prepare(kda, GDNConfig(kda_chunk16=False), "cuda")


def test_source_compiles_for_hopper_without_spills():
    """Every norm mode, dense and packed: no local memory, and at most 168 registers, so that three blocks of 128
    threads share an SM (the occupancy it was measured at)."""
    rows = offline.compile_cuda(90)
    if not rows:
        pytest.skip("NVRTC not installed (pip install nvidia-cuda-nvrtc-cu12)")
    assert len(rows) == 6
    for r in rows:
        assert r.verdict == "fits", (r.specialization, r.error, r.local_bytes)
        assert r.registers <= 168, (r.specialization, r.registers)
        assert r.shared_bytes == 4 * (16 * 128 + 128) * 4  # per warp: the c tile and 2^c_last
