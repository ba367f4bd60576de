"""Where a symmetric pool puts each buffer: the deterministic range allocator
of src/symm/pool_ranges.hpp (PoolRanges), which C and C++ programs use
through ferry_pool_* and ferry.torch.SymmetricPool through this module.

ferry's collectives need a peer's buffer at the same offset of the same
registration on every rank. A pool whose every rank makes the same requests
in the same order gets the same answers, because every decision depends
only on that sequence: first fit in the stream's free ranges, then the
untouched tail of the first chunk with room, else the caller adds a chunk
(collectively). A freed range goes back to the stream it was allocated on
and is reused only by later requests on that stream, which is PyTorch's
caching-allocator rule."""

from __future__ import annotations

from ._native import require

ALIGN = 512  # bytes: every range starts at a multiple (PoolRanges::kAlign)


def chunk_for(nbytes: int, chunk_bytes: int) -> int:
    """The size of the chunk a pool adds for a request that fit no chunk it
    has (PoolRanges::chunk_for): whole 2 MiB, at least `chunk_bytes`."""
    return require().PoolRanges.chunk_for(nbytes, chunk_bytes)


def Ranges():  # noqa: N802 - a factory standing for the class it returns
    """A new allocator: add_chunk(size) -> index; allocate(nbytes, stream) ->
    (chunk, offset) or None; release(chunk, offset); bytes_in_use();
    free_ranges(stream) -> [(chunk, offset, size)]; in_use() -> {(chunk,
    offset): (size, stream)}."""
    return require().PoolRanges()
