"""Route compositions shared by the training step and the layer: Megatron's around a backend's kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from ...data.shapes import Shape


def megatron_forward(backend, shape: Shape, inputs, qk, flag: bool) -> Callable[[], tuple]:
    """Megatron's composition around `backend.kernel`: normalize the fused q|k (unless the kernel's
    flag does it), split, repeat_interleave q/k heads to HV, kernel with H = HV."""
    kern = backend.kernel(shape, inputs, flag)
    H, group = shape.H, shape.HV // shape.H

    def call():
        x = qk if flag else backend.caller_l2norm(qk)
        q, k = x.split(H, dim=2)
        return kern(q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2))

    return call
