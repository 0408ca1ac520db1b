"""The one shape of this project's projection kernels (kernels.PackedLinear, kernels.Int8Linear,
cpukernel.Bf16Linear): an nn.Linear whose forward runs another kernel on a form it makes of its weight
(packed, quantized, or the weight itself), made again at every cast."""
from __future__ import annotations

import torch
from torch import nn


class WrappedLinear(nn.Linear):
    """`weight` stays the same Parameter (a tied embedding, the draft head's scoring rows and weight hashes
    read it); `_prepare` makes the kernel's form of it (at wrapping and after each cast: a weight changed
    in place is not seen) and `forward` runs it. For inference."""

    @classmethod
    def of(cls, linear: nn.Linear) -> "WrappedLinear":
        return cls.wrapping(linear.weight, linear.bias)

    @classmethod
    def wrapping(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "WrappedLinear":
        """x -> x @ weight.T + bias on the kernel, for a weight (out, in) that is no nn.Linear's (the
        draft head's scoring rows)."""
        wrapped = cls.__new__(cls)
        nn.Module.__init__(wrapped)
        wrapped.out_features, wrapped.in_features = weight.shape
        wrapped.weight, wrapped.bias = weight, bias  # Parameters stay registered; plain tensors stay attributes
        wrapped._prepare()
        return wrapped

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._prepare()
        return self

    def _prepare(self) -> None:
        raise NotImplementedError
