"""Fake backends that exercise the framework without a GPU (tritonbench style)."""

from __future__ import annotations

import os

from gdnbench.backends.base import YES, Backend, no
from gdnbench.backends.reference import ReferenceBackend


class CorrectFake(ReferenceBackend):
    """The reference, named otherwise: must pass the gate."""

    name = "fake_correct"
    routes = ("explicit", "flag")


class WrongFake(ReferenceBackend):
    """Output 10 % too large: must be marked incorrect and never timed."""

    name = "fake_wrong"
    routes = ("explicit",)

    def prepare(self, shape, route, inputs):
        inner = super().prepare(shape, route, inputs)

        def call():
            o, s = inner()
            return o * 1.1, s

        return call


class NaNFake(ReferenceBackend):
    name = "fake_nan"
    routes = ("explicit",)

    def prepare(self, shape, route, inputs):
        inner = super().prepare(shape, route, inputs)

        def call():
            o, s = inner()
            o = o.clone()
            o.view(-1)[0] = float("nan")
            return o, s

        return call


class RaisingFake(ReferenceBackend):
    name = "fake_raising"
    routes = ("explicit",)

    def prepare(self, shape, route, inputs):
        raise RuntimeError("kernel launch failed: out of resources")


class UnavailableFake(Backend):
    name = "fake_unavailable"
    routes = ("explicit",)
    devices = ("cpu",)

    def is_available(self):
        return no("library not installed")


class CrashingFake(ReferenceBackend):
    """Kills its process mid-run, as an illegal memory access would poison it."""

    name = "fake_crash"
    routes = ("explicit",)

    def prepare(self, shape, route, inputs):
        os._exit(17)


class KdaOnlyFake(CorrectFake):
    name = "fake_kda_only"
    families = ("kda",)

    def supports(self, shape, route, mode, device):
        return super().supports(shape, route, mode, device) if shape.family == "kda" else no("no gdn kernel")


__all__ = ["CorrectFake", "WrongFake", "NaNFake", "RaisingFake", "UnavailableFake", "CrashingFake", "YES"]


class WrongGradFake(ReferenceBackend):
    """Right forward, q and k gradients 10 % too large: the fwd_bwd gate must catch it on dq/dk."""

    name = "fake_wrong_grad"
    routes = ("explicit",)
    train_routes = ("explicit",)

    def caller_l2norm(self, x):
        import torch

        class ScaleGrad(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                return t.view_as(t)

            @staticmethod
            def backward(ctx, grad):
                return grad * 1.1

        return super().caller_l2norm(ScaleGrad.apply(x))


class ScaledOutputFake(ReferenceBackend):
    """Every route's kernel output 1 % too large: the layer gate must name the weights whose gradients move."""

    name = "fake_scaled_output"
    routes = ("explicit",)
    train_routes = ("explicit", "megatron")

    def kernel(self, shape, inputs, flag):
        inner = super().kernel(shape, inputs, flag)

        def call(q, k):
            o, s = inner(q, k)
            return o * 1.01, s

        return call


class SlowFake(CorrectFake):
    """The reference, slow to prepare (GDNBENCH_FAKE_SLOW_S seconds): a run long enough to be stopped."""

    name = "fake_slow"
    routes = ("explicit",)

    def prepare(self, shape, route, inputs):
        import time

        time.sleep(float(os.environ.get("GDNBENCH_FAKE_SLOW_S", "2")))
        return super().prepare(shape, route, inputs)


class PerturbedFake(ReferenceBackend):
    """The reference with one systematic fault in what it returns (`perturb`); the gate must catch each."""

    name = "fake_perturbed"
    routes = ("explicit",)

    def perturb(self, o, s):
        return o, s

    def prepare(self, shape, route, inputs):
        inner = super().prepare(shape, route, inputs)
        return lambda: self.perturb(*inner())


def _middle_row(o, factor):
    """One (token, head) row of o times factor: the middle token's first head."""
    o = o.clone()
    o[0, o.shape[1] // 2, 0] *= factor
    return o


class ScaledOFake(PerturbedFake):
    name = "fake_o_x1.01"

    def perturb(self, o, s):
        return o * 1.01, s


class ScaledStateFake(PerturbedFake):
    name = "fake_state_x1.01"

    def perturb(self, o, s):
        return o, s * 1.01


class ZeroRowFake(PerturbedFake):
    name = "fake_zero_row"

    def perturb(self, o, s):
        return _middle_row(o, 0.0), s


class DoubledRowFake(PerturbedFake):
    name = "fake_doubled_row"

    def perturb(self, o, s):
        return _middle_row(o, 2.0), s


class RecordingFake(CorrectFake):
    """The reference, noting the token count of every input it prepares a closure for."""

    name = "fake_recording"
    routes = ("explicit",)

    def __init__(self):
        self.prepared: list[int] = []

    def prepare(self, shape, route, inputs):
        self.prepared.append(inputs.v.shape[0] * inputs.v.shape[1])
        return super().prepare(shape, route, inputs)


class FlakyRowFake(PerturbedFake):
    """Right on its first call, one o row doubled on every later one: a result that changes between calls on the
    same inputs, which the gate reports beside its verdict."""

    name = "fake_flaky_row"

    def __init__(self):
        self.calls = 0

    def perturb(self, o, s):
        self.calls += 1
        return (o if self.calls == 1 else _middle_row(o, 2.0)), s
