"""PyTorch conveniences (importing this module imports torch)."""

from __future__ import annotations

import torch

from .comm import Communicator


def communicator(group=None, timeout: float = 0.0) -> Communicator:
    """A ferry communicator over a torch.distributed group, on the current CUDA device."""
    return Communicator.from_torch(group, device=torch.cuda.current_device(), timeout=timeout)
