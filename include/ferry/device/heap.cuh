/* The symmetric heap as a kernel sees it.
 *
 * Every rank of a heap reserves one range of addresses holding every rank's
 * heap, rank r's at base + r * stride, and an allocation sits at the same
 * offset in each. So the address of a peer's copy of an object is the
 * object's own address moved by (peer - rank) * stride: no table, no lookup.
 *
 *   __global__ void k(ferry::device::Heap h, float* x) {   // x: on the heap
 *     float* xs_on_peer = h.peer_ptr(x, (h.rank + 1) % h.world);
 *   }
 *
 * The handle is a plain struct passed to kernels by value; it stays valid
 * until the heap is closed. Python: ferry.symm.Heap.handle(); C++: SymmetricHeap::handle().
 */
#ifndef FERRY_DEVICE_HEAP_CUH_
#define FERRY_DEVICE_HEAP_CUH_

#include <stdint.h>

#if defined(__CUDACC__)
#define FERRY_DEVICE_HD __host__ __device__ __forceinline__
#else
#define FERRY_DEVICE_HD inline
#endif

namespace ferry {
namespace device {

constexpr int kMaxHeapRanks = 64;
constexpr int kStagingSlots = 1024;
constexpr int kMaxGridBlocks = 64; /* most blocks of one grid-wide barrier or collective (coll.cuh) */
/* The low-latency format of the collectives (coll.cuh): data and its round
 * travel together in 8-byte lines into a receive area of every rank: a slot
 * per sending rank and per round's parity, each slot a region of
 * kLowLatencyBlockLines lines per block of the grid, so that a line is only
 * ever written by one block. It serves worlds of at most kLowLatencyMaxRanks
 * ranks. */
constexpr int kLowLatencyMaxRanks = 8;
constexpr uint64_t kLowLatencyBlockLines = 2048; /* 8 KB of data per block and peer */
constexpr uint64_t kLowLatencySlotBytes = kLowLatencyBlockLines * sizeof(uint64_t) * kMaxGridBlocks;
constexpr uint64_t kLowLatencyOffset = 262144; /* from the start of a rank's heap */

/* At offset 0 of every rank's heap: ferry's own words, then the low-latency
 * receive area. User allocations start at kHeapReservedBytes. */
struct HeapSync {
  uint64_t arrivals[kMaxHeapRanks];        /* [src]: device barriers src announced to this rank */
  uint64_t completed[kMaxHeapRanks];       /* [src]: device barriers this rank finished with src */
  uint64_t stream_arrivals[kMaxHeapRanks]; /* [src]: barrier_on_stream announcements (copy engines) */
  uint64_t staging[kStagingSlots];         /* values that signals on a stream copy to peers */
  /* Grid-wide barriers (coll.cuh): [src][block] the round block `block` of
   * rank src announced to this rank; [peer][block] the rounds this rank's
   * block `block` has done with peer. */
  uint64_t grid_arrivals[kMaxHeapRanks][kMaxGridBlocks];
  uint64_t grid_rounds[kMaxHeapRanks][kMaxGridBlocks];
  /* [blocks]: arrivals at barriers among this rank's own blocks, by grids of that many blocks. */
  uint64_t grid_local_arrivals[kMaxGridBlocks + 1];
  /* [peer][block]: low-latency collectives block `block` of this rank has done with peer. */
  uint64_t low_latency_rounds[kMaxHeapRanks][kMaxGridBlocks];
  /* [src][block]: the latest low-latency round block `block` of rank src began with this rank. */
  uint64_t low_latency_tokens[kMaxHeapRanks][kMaxGridBlocks];
};
static_assert(sizeof(HeapSync) <= kLowLatencyOffset, "HeapSync must fit in front of the low-latency area");
constexpr uint64_t kHeapReservedBytes = kLowLatencyOffset + 2 * kLowLatencyMaxRanks * kLowLatencySlotBytes;

/* What a bounded wait that gave up was waiting for. */
enum class WaitKind : uint32_t {
  kBarrier = 1,
  kSignal = 2,
  kWaitUntil = 3,
  kBadTeam = 4,
  kStreamWait = 5,    /* the host API's wait on a stream */
  kStreamBarrier = 6, /* barrier_on_stream */
  kBadGrid = 7,       /* a collective's grid larger than kMaxGridBlocks */
  kGridSync = 8,      /* the wait among this rank's own blocks (grid_sync, and the collectives' first step) */
  kBadRoot = 9        /* broadcast or reduce with a root outside the team (the peer field: the root) */
};

/* The word such a wait leaves in Heap::fault (the first one stays):
 * bit 63, the WaitKind in bits 32-39, the peer (or -1 as 0xffffffff) below. */
constexpr uint64_t kHeapFaultBit = uint64_t(1) << 63;
FERRY_DEVICE_HD uint64_t heap_fault_word(WaitKind kind, int peer) {
  return kHeapFaultBit | (uint64_t(kind) << 32) | uint64_t(uint32_t(peer));
}

struct Heap {
  char* base;                /* rank 0's heap as mapped in this process */
  uint64_t stride;           /* bytes from one rank's heap to the next: the heap's capacity */
  int rank;                  /* the rank this handle belongs to */
  int world;                 /* ranks in the heap */
  unsigned long long* fault; /* pinned host word: where a wait that gave up names its peer */
  uint64_t timeout_ns;       /* bound on every wait of the device API */

  FERRY_DEVICE_HD char* rank_base(int r) const { return base + uint64_t(r) * stride; }
  FERRY_DEVICE_HD char* own_base() const { return rank_base(rank); }
  FERRY_DEVICE_HD HeapSync* sync(int r) const { return reinterpret_cast<HeapSync*>(rank_base(r)); }
  /* Rank r's receive region for block `block`'s low-latency lines from rank `from` in rounds of parity `parity`. */
  FERRY_DEVICE_HD uint64_t* low_latency_slot(int r, int parity, int from, unsigned block) const {
    return reinterpret_cast<uint64_t*>(rank_base(r) + kLowLatencyOffset +
                                       (uint64_t(parity) * kLowLatencyMaxRanks + uint64_t(from)) *
                                           kLowLatencySlotBytes) +
           uint64_t(block) * kLowLatencyBlockLines;
  }
  /* `p` (an address in this rank's heap) as `peer`'s copy of the same object. */
  template <class T>
  FERRY_DEVICE_HD T* peer_ptr(T* p, int peer) const {
    return reinterpret_cast<T*>(reinterpret_cast<char*>(const_cast<void*>(static_cast<const void*>(p))) +
                                (int64_t(peer) - int64_t(rank)) * int64_t(stride));
  }
  /* Whether [p, p + bytes) lies in this rank's heap. */
  FERRY_DEVICE_HD bool contains(const void* p, uint64_t bytes) const {
    const char* c = static_cast<const char*>(p);
    return c >= own_base() && bytes <= stride && uint64_t(c - own_base()) <= stride - bytes;
  }
};

/* The handle from its bytes (HeapHandle.as_bytes() in Python, or a copy of
 * what ferry_heap_handle wrote), for launchers that receive it untyped. */
inline Heap heap_from_bytes(const void* raw) {
  Heap h;
  const char* from = static_cast<const char*>(raw);
  char* to = reinterpret_cast<char*>(&h);
  for (unsigned i = 0; i < sizeof(Heap); ++i) to[i] = from[i];
  return h;
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_HEAP_CUH_ */
