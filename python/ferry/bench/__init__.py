"""Benchmarks: ferry's collectives against NCCL (through torch.distributed) in one run."""
