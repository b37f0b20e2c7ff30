"""FLOPs of a training step and the peak FLOP/s of an accelerator, for model FLOP utilisation (MFU).

MFU is the FLOP/s a step achieves (its FLOPs, counted once, over its measured wall time) divided by the
accelerator's peak. :func:`count_flops` runs one step (forward and backward) under torch's FLOP counter
(``torch.utils.flop_counter.FlopCounterMode``: matmuls, convolutions, attention); :func:`peak_flops` looks the
peak up for known accelerators. The table is dense (no structured sparsity) tensor-core throughput in bf16 from
the vendors' datasheets, per device:

============================  ==============
device name contains           peak FLOP/s
============================  ==============
B200                           2.25e15
H200                           9.89e14
H100 (SXM, H800)               9.89e14
H100 PCIe                      7.56e14
H100 NVL                       8.35e14
A100                           3.12e14
L40S                           3.62e14
L4                             1.21e14
V100 (fp16)                    1.25e14
MI300X                         1.307e15
============================  ==============

On any other device (a CPU included) pass the peak yourself: ``StepTimer(flops_per_step=..., peak_flops=...)``.

    >>> import torch
    >>> layer = torch.nn.Linear(8, 4, bias=False)
    >>> count_flops(lambda: layer(torch.ones(2, 8)).sum().backward())  # 2*2*8*4 forward + the same for dW
    256
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["PEAK_FLOPS", "count_flops", "peak_flops", "useful_fraction"]

# (substring of the device name, peak dense bf16 FLOP/s); the first match wins, so longer names come first
PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("B200", 2.25e15),
    ("H200", 9.89e14),
    ("H100 PCIe", 7.56e14),
    ("H100 NVL", 8.35e14),
    ("H100", 9.89e14),
    ("H800", 9.89e14),
    ("A100", 3.12e14),
    ("L40S", 3.62e14),
    ("L4", 1.21e14),
    ("V100", 1.25e14),
    ("MI300X", 1.307e15),
)


def count_flops(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """The floating-point operations of ``fn(*args, **kwargs)`` (one training step: forward and backward)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def peak_flops(device: Any = None) -> float | None:
    """The peak FLOP/s of a CUDA ``device`` (default: the current one) from :data:`PEAK_FLOPS`, or None."""
    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda" if device is None else device)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_FLOPS:
        if key.lower() in name.lower():
            return peak
    return None


def useful_fraction(batch: Any) -> float | None:
    """The non-padding share of a batch's token slots, read on the host: a :class:`~mmfeed.packing.PackedBatch`
    (its real tokens over rows x capacity), or a mapping with an ``attention_mask``; None for anything else."""
    cu = getattr(batch, "cu_seqlens", None)
    ids = getattr(batch, "document_ids", None)
    if isinstance(cu, torch.Tensor) and isinstance(ids, torch.Tensor):
        if ids.numel() == 0 or ids.device.type != "cpu":
            return None
        return float(cu[-1]) / ids.numel() if cu.numel() else 0.0
    if isinstance(batch, dict):
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.numel() and mask.device.type == "cpu":
            return float(mask.float().mean())
    return None
