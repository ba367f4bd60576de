"""Where a symmetric pool puts each buffer: a deterministic range allocator
over chunks of registered memory. Pure (no GPU): CPU-tested.

ferry's collectives need a peer's buffer at the same offset of the same
registration on every rank. A pool whose every rank makes the same requests
in the same order gets the same answers here, because every decision depends
only on that sequence: first fit in chunk order, then the untouched tail of
the first chunk with room, else the caller adds a chunk (collectively).

A freed range goes back to the stream it was allocated on and is reused
only by later requests on that stream, which is PyTorch's caching-allocator
rule: a program whose memory reuse is correct with torch.empty (FSDP's is)
stays correct here, with no event of our own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

ALIGN = 512  # bytes: every range starts at a multiple (any dtype, any copy engine)


def round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass
class _Chunk:
    size: int
    tail: int = 0  # bytes from the start never handed out yet


@dataclass
class Ranges:
    """Ranges (chunk, offset, size) over a growing list of chunks."""

    chunks: List[_Chunk] = field(default_factory=list)
    # stream -> sorted free ranges (chunk, offset, size) that stream may reuse
    free_by_stream: Dict[int, List[Tuple[int, int, int]]] = field(default_factory=dict)
    in_use: Dict[Tuple[int, int], Tuple[int, int]] = field(
        default_factory=dict
    )  # (chunk, off) -> (size, stream)

    def add_chunk(self, size: int) -> int:
        if size <= 0 or size % ALIGN:
            raise ValueError(f"chunk size {size} is not a positive multiple of {ALIGN}")
        self.chunks.append(_Chunk(size))
        return len(self.chunks) - 1

    def allocate(self, nbytes: int, stream: int) -> Optional[Tuple[int, int]]:
        """(chunk, offset) of `nbytes` (rounded up to ALIGN) for `stream`, or
        None when no chunk has room (add one of at least that size)."""
        size = round_up(max(nbytes, 1), ALIGN)
        free = self.free_by_stream.get(stream, [])
        for i, (c, off, n) in enumerate(free):
            if n >= size:
                if n == size:
                    del free[i]
                else:
                    free[i] = (c, off + size, n - size)
                self.in_use[(c, off)] = (size, stream)
                return c, off
        for c, chunk in enumerate(self.chunks):
            if chunk.size - chunk.tail >= size:
                off = chunk.tail
                chunk.tail += size
                self.in_use[(c, off)] = (size, stream)
                return c, off
        return None

    def release(self, chunk: int, offset: int) -> None:
        """Returns a range to its stream's free list, merged with free
        neighbours of the same stream."""
        size, stream = self.in_use.pop((chunk, offset))
        free = self.free_by_stream.setdefault(stream, [])
        free.append((chunk, offset, size))
        free.sort()
        merged: List[Tuple[int, int, int]] = []
        for c, off, n in free:
            if merged and merged[-1][0] == c and merged[-1][1] + merged[-1][2] == off:
                pc, poff, pn = merged[-1]
                merged[-1] = (pc, poff, pn + n)
            else:
                merged.append((c, off, n))
        self.free_by_stream[stream] = merged

    def bytes_in_use(self) -> int:
        return sum(size for size, _ in self.in_use.values())
