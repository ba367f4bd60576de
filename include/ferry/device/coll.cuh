// clang-format off
/* Collectives over a team, run by whole grids: every block of a kernel on
 * every member calls them, with the same grid size (at most kMaxGridBlocks
 * blocks) and the same arguments, and the blocks split the work.
 *
 *   grid_sync(h)                                   every block of this rank's grid arrived (no peers)
 *   barrier_all(h, team)                           every block of every member arrived
 *   broadcast(h, team, dst, src, count, root)      root's src into every member's dst
 *   fcollect(h, team, dst, src, count)             all-gather: member i's src into dst[i * count ...]
 *   alltoall(h, team, dst, src, count)             member i's src[j * count ...] into member j's dst[i * count ...]
 *   reduce(h, team, dst, src, count, op, root)     root's dst = op over members' src
 *   all_reduce(h, team, dst, src, count, op, algo) every member's dst = op over members' src
 *   reduce_scatter(h, team, dst, src, count, op)   member i's dst = op over members' src[i * count ...]
 *
 * dst and src are on the heap (the same objects on every member) and do not
 * overlap; root is a team rank (another: false, and check() names it). T: float, __half, __nv_bfloat16, int32_t
 * (reductions; halves add in float), any trivially copyable T for the others.
 * Each call starts and ends with barrier_all: on return dst is complete here
 * and src may be written again. all_reduce's low-latency algorithms
 * (coll_algo.cuh) have no barrier with the other members, and its per-block
 * two-shot meets them block by block; what they leave done on return is
 * above all_reduce. Returns false when a wait gave up
 * (h.timeout_ns; heap.check() names the peer) or the grid is larger than
 * kMaxGridBlocks; dst is then undefined, and the heap's barrier words are out
 * of step: close the heap (a later barrier could pass early). Pushes
 * (broadcast, fcollect, alltoall) are stores over NVLink from SMs; reductions
 * read every member's src. */
// clang-format on
#ifndef FERRY_DEVICE_COLL_CUH_
#define FERRY_DEVICE_COLL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "ferry/device/coll_algo.cuh"
#include "ferry/device/heap.cuh"
#include "ferry/device/impl/meet.cuh"
#include "ferry/device/impl/spin.cuh"
#include "ferry/device/rma.cuh"
#include "ferry/device/team.cuh"

namespace ferry {
namespace device {

enum class ReduceOp { kSum, kMax, kMin };

namespace impl {

__device__ __forceinline__ unsigned grid_blocks() { return gridDim.x * gridDim.y * gridDim.z; }
__device__ __forceinline__ unsigned grid_block() {
  return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}

/* Thread 0 of each block (grids of at most kMaxGridBlocks): every block of
 * this rank's grid arrived, with the stores its block made before (the
 * caller's __syncthreads). A grid of
 * `blocks` counts on its own word, raised only by grids of that size, whole
 * (one grid per rank at a time), so a round ends at the next multiple of
 * `blocks`: one atomic and a poll, nothing to reset. */
__device__ inline bool local_grid_sync(const Heap& h) {
  const unsigned blocks = grid_blocks();
  if (blocks == 1) return true;
  unsigned long long* count = reinterpret_cast<unsigned long long*>(&h.sync(h.rank)->grid_local_arrivals[blocks]);
  unsigned long long old;
  // A release on the way in (cumulative: the block's stores this thread saw), acquires on the polls.
  asm volatile("atom.add.release.gpu.global.u64 %0, [%1], 1;" : "=l"(old) : "l"(count) : "memory");
  const unsigned long long target = old - old % blocks + blocks;
  return spin(
      h,
      [&] {
        unsigned long long v;
        asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(count) : "memory");
        return v >= target;
      },
      WaitKind::kGridSync, -1);
}

/* One thread: the grid is at most kMaxGridBlocks blocks and the team is one
 * this rank is in; otherwise the fault word says which, and false. */
__device__ inline bool grid_and_team_usable(const Heap& h, const Team& t) {
  if (grid_blocks() > unsigned(kMaxGridBlocks)) {
    report(h, WaitKind::kBadGrid, -1);
    return false;
  }
  if (!team_usable(t, h.world) || team_world_rank(t, t.my) != h.rank) {
    report(h, WaitKind::kBadTeam, -1);
    return false;
  }
  return true;
}

/* Thread 0 of one block: the grid and the team are usable, and every block of this rank arrived. */
__device__ inline bool grid_sync_local(const Heap& h, const Team& t) {
  return grid_and_team_usable(h, t) && local_grid_sync(h);
}

/* Lane `lane` of `lanes` (after grid_sync_local): this block meets the same
 * block of members lane, lane + lanes, ..., each of which passed
 * grid_sync_local there. Counters are per (peer, block): they stay in step
 * because every member runs the same grid. */
__device__ inline bool grid_sync_peers(const Heap& h, const Team& t, unsigned lane, unsigned lanes) {
  const unsigned me_block = grid_block();
  HeapSync* own = h.sync(h.rank);
  return meet_members(
      h, t, lane, lanes, [&](int peer) -> uint64_t& { return own->grid_rounds[peer][me_block]; },
      [&](int r, int from) { return &h.sync(r)->grid_arrivals[from][me_block]; });
}

/* [begin, end) of `count` items for this block. */
__device__ __forceinline__ void block_slice(uint64_t count, uint64_t* begin, uint64_t* end) {
  const uint64_t blocks = grid_blocks(), b = grid_block();
  const uint64_t per = (count + blocks - 1) / blocks;
  *begin = per * b < count ? per * b : count;
  *end = *begin + per < count ? *begin + per : count;
}

template <class T>
struct Acc {
  using type = T;
  static __device__ __forceinline__ type in(T v) { return v; }
  static __device__ __forceinline__ T out(type v) { return v; }
};
template <>
struct Acc<__half> {
  using type = float;
  static __device__ __forceinline__ float in(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half out(float v) { return __float2half(v); }
};
template <>
struct Acc<__nv_bfloat16> {
  using type = float;
  static __device__ __forceinline__ float in(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 out(float v) { return __float2bfloat16(v); }
};

template <class A>
__device__ __forceinline__ A combine(A a, A b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return a + b;
    case ReduceOp::kMax:
      return a > b ? a : b;
    default:
      return a < b ? a : b;
  }
}

/* [begin, end) of the items [from, to) for this block. */
__device__ __forceinline__ void block_slice(uint64_t from, uint64_t to, uint64_t* begin, uint64_t* end) {
  block_slice(to - from, begin, end);
  *begin += from;
  *end += from;
}

/* dst[i] = op over members, in team order, of (member's copy of src)[i] for i in [begin, end), by elements. */
template <class T>
__device__ inline void reduce_elements(const Heap& h, const Team& t, T* dst, const T* src, uint64_t begin, uint64_t end,
                                       ReduceOp op) {
  using A = typename Acc<T>::type;
  const unsigned lane = scope_lane<Scope::kBlock>(), lanes = scope_size<Scope::kBlock>();
  for (uint64_t i = begin + lane; i < end; i += lanes) {
    A acc = Acc<T>::in(h.peer_ptr(src, team_world_rank(t, 0))[i]);
    for (int m = 1; m < t.size; ++m) acc = combine(acc, Acc<T>::in(h.peer_ptr(src, team_world_rank(t, m))[i]), op);
    dst[i] = Acc<T>::out(acc);
  }
}

/* 16-byte vectors of T, reduced in the accumulating type. */
template <class T>
struct Vec {
  static constexpr int kLanes = 16 / sizeof(T);
  using A = typename Acc<T>::type;
  static __device__ __forceinline__ void first(const uint4& v, A* a) {
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int k = 0; k < kLanes; ++k) a[k] = Acc<T>::in(e[k]);
  }
  static __device__ __forceinline__ void add(const uint4& v, A* a, ReduceOp op) {
    const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
    for (int k = 0; k < kLanes; ++k) a[k] = combine(a[k], Acc<T>::in(e[k]), op);
  }
  static __device__ __forceinline__ uint4 out(const A* a) {
    uint4 v;
    T* e = reinterpret_cast<T*>(&v);
#pragma unroll
    for (int k = 0; k < kLanes; ++k) e[k] = Acc<T>::out(a[k]);
    return v;
  }
};

/* Vectors v and v + stride (the second where `two`) of op over the
 * members' src, in team order (every member computes the same bits); the
 * loads of up to four members for both vectors are in flight at once. */
template <class T>
__device__ __forceinline__ void reduce_vectors(const Heap& h, const Team& t, const uint4* src, uint64_t v,
                                               uint64_t stride, bool two, ReduceOp op, uint4* r0, uint4* r1) {
  typename Vec<T>::A a0[Vec<T>::kLanes], a1[Vec<T>::kLanes];
  for (int m0 = 0; m0 < t.size; m0 += 4) {
    uint4 x0[4], x1[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (m0 + k >= t.size) break;
      const uint4* from = h.peer_ptr(src, team_world_rank(t, m0 + k));
      x0[k] = __ldcg(from + v);
      if (two) x1[k] = __ldcg(from + v + stride);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (m0 + k >= t.size) break;
      if (m0 + k == 0) {
        Vec<T>::first(x0[k], a0);
        if (two) Vec<T>::first(x1[k], a1);
      } else {
        Vec<T>::add(x0[k], a0, op);
        if (two) Vec<T>::add(x1[k], a1, op);
      }
    }
  }
  *r0 = Vec<T>::out(a0);
  if (two) *r1 = Vec<T>::out(a1);
}

/* Vectors [begin, end) of op over the members' src, this block's threads
 * taking two at a time (both vectors' loads in flight); store(v, r) puts
 * vector v's result where it goes. */
template <class T, class Store>
__device__ inline void reduce_vector_range(const Heap& h, const Team& t, const uint4* src, uint64_t begin, uint64_t end,
                                           ReduceOp op, Store store) {
  const unsigned lane = scope_lane<Scope::kBlock>(), lanes = scope_size<Scope::kBlock>();
  for (uint64_t v = begin + lane; v < end; v += 2 * uint64_t(lanes)) {
    const bool two = v + lanes < end;
    uint4 r0, r1;
    reduce_vectors<T>(h, t, src, v, lanes, two, op, &r0, &r1);
    store(v, r0);
    if (two) store(v + lanes, r1);
  }
}

/* One-shot: this block's share of dst[i] = op over members' src[i], i < count. */
template <class T>
__device__ inline void reduce_slice(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, ReduceOp op) {
  uint64_t begin, end;
  if (((uintptr_t(dst) | uintptr_t(src)) & 15) != 0) {
    block_slice(count, &begin, &end);
    reduce_elements(h, t, dst, src, begin, end, op);
    return;
  }
  constexpr int N = Vec<T>::kLanes;
  const uint64_t vectors = count / N;
  block_slice(vectors, &begin, &end);
  uint4* d = reinterpret_cast<uint4*>(dst);
  reduce_vector_range<T>(h, t, reinterpret_cast<const uint4*>(src), begin, end, op,
                         [&](uint64_t v, const uint4& r) { d[v] = r; });
  if (grid_block() == grid_blocks() - 1) reduce_elements(h, t, dst, src, vectors * N, count, op);
}

/* Two-shot: member i reduces the i-th part of the vectors and stores it into
 * every member's dst; each member reduces the tail (fewer than one vector)
 * itself. dst and src on 16-byte boundaries. */
template <class T>
__device__ inline void reduce_and_push(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count,
                                       ReduceOp op) {
  constexpr int N = Vec<T>::kLanes;
  const uint64_t vectors = count / N, part = (vectors + t.size - 1) / t.size;
  const uint64_t from = part * t.my < vectors ? part * t.my : vectors;
  const uint64_t to = from + part < vectors ? from + part : vectors;
  uint64_t begin, end;
  block_slice(from, to, &begin, &end);
  uint4* d = reinterpret_cast<uint4*>(dst);
  reduce_vector_range<T>(h, t, reinterpret_cast<const uint4*>(src), begin, end, op, [&](uint64_t v, const uint4& r) {
    for (int k = 0; k < t.size; ++k) h.peer_ptr(d, team_world_rank(t, (t.my + k) % t.size))[v] = r;
  });
  if (grid_block() == grid_blocks() - 1) reduce_elements(h, t, dst, src, vectors * N, count, op);
}

__device__ __forceinline__ void store_line(uint64_t* p, uint64_t v) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ uint64_t load_line(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/* Elements [u * E, u * E + E) of src (E = 4 / sizeof(T)) as one 4-byte word, zeros past count. */
template <class T>
__device__ __forceinline__ uint32_t pack_unit(const T* src, uint64_t u, uint64_t count) {
  if constexpr (sizeof(T) == 4) {
    return *reinterpret_cast<const uint32_t*>(src + u);
  } else {
    const uint32_t lo = *reinterpret_cast<const uint16_t*>(src + 2 * u);
    const uint32_t hi = 2 * u + 1 < count ? *reinterpret_cast<const uint16_t*>(src + 2 * u + 1) : 0u;
    return lo | (hi << 16);
  }
}

/* The 32 bits of a round that travel beside the data: never 0 (what a line
 * never written holds), and different for the rounds r and r + 2 that share
 * a parity. */
__device__ __forceinline__ uint32_t low_latency_tag(uint64_t round) { return uint32_t(round % 0xffffffffull) + 1u; }

/* One line of the low-latency format: waits until `line` carries `tag` (its round's), returns its data word. */
__device__ __forceinline__ uint32_t wait_line(const Heap& h, const uint64_t* line, uint32_t tag, int peer, bool* good) {
  uint64_t v = 0;
  *good = spin(
      h,
      [&] {
        v = load_line(line);
        return uint32_t(v >> 32) == tag;
      },
      WaitKind::kBarrier, peer);
  return uint32_t(v);
}

/* acc (E accumulators) combined with the elements of `word`, or set to them when `first`. */
template <class T>
__device__ __forceinline__ void combine_unit(typename Acc<T>::type* acc, uint32_t word, bool first, ReduceOp op) {
  const T* e = reinterpret_cast<const T*>(&word);
#pragma unroll
  for (int k = 0; k < int(4 / sizeof(T)); ++k)
    acc[k] = first ? Acc<T>::in(e[k]) : combine(acc[k], Acc<T>::in(e[k]), op);
}

template <class T>
__device__ __forceinline__ uint32_t pack_acc(const typename Acc<T>::type* acc) {
  uint32_t word = 0;
  T* e = reinterpret_cast<T*>(&word);
#pragma unroll
  for (int k = 0; k < int(4 / sizeof(T)); ++k) e[k] = Acc<T>::out(acc[k]);
  return word;
}

/* The elements of unit u (those below count) from `word` into dst. */
template <class T>
__device__ __forceinline__ void unpack_unit(T* dst, uint64_t u, uint64_t count, uint32_t word) {
  constexpr int E = 4 / sizeof(T);
  const T* e = reinterpret_cast<const T*>(&word);
#pragma unroll
  for (int k = 0; k < E; ++k)
    if (u * E + k < count) dst[u * E + k] = e[k];
}

/* Unit u reduced in team order: this rank's from src, each peer's from line
 * `line` of its region of this rank's receive slot (this block's, the
 * round's parity), once it carries the round's tag. Clears *good when a wait
 * gave up. */
template <class T>
__device__ inline uint32_t reduce_unit_lines(const Heap& h, const Team& t, const T* src, uint64_t u, uint64_t count,
                                             const uint64_t* rounds, const uint32_t* tags, unsigned block,
                                             uint64_t line, ReduceOp op, bool* good) {
  typename Acc<T>::type acc[4 / sizeof(T)];
  for (int i = 0; i < t.size && *good; ++i) {
    const int p = team_world_rank(t, i);
    const uint32_t word =
        p == h.rank ? pack_unit(src, u, count)
                    : wait_line(h, h.low_latency_slot(h.rank, rounds[p] & 1, p, block) + line, tags[p], p, good);
    combine_unit<T>(acc, word, i == 0, op);
  }
  return pack_acc<T>(acc);
}

/* The start of a low-latency call, by the whole block: this call's round
 * with each member (per peer and block) into `rounds` (by world rank), and
 * this block's token, the round, to each member. Returns false, with the
 * fault word set, when the grid, world or team does not fit. */
__device__ inline bool low_latency_begin(const Heap& h, const Team& t, uint64_t* rounds, uint32_t* tags) {
  __shared__ int usable;
  const unsigned block = grid_block(), lane = scope_lane<Scope::kBlock>();
  __syncthreads();  // the block's earlier reads of its receive slots are done before new rounds go out
  if (lane == 0) {
    const bool grid_fits = grid_blocks() <= unsigned(kMaxGridBlocks);
    usable =
        grid_fits && h.world <= kLowLatencyMaxRanks && team_usable(t, h.world) && team_world_rank(t, t.my) == h.rank;
    if (!usable) {
      report(h, grid_fits ? WaitKind::kBadTeam : WaitKind::kBadGrid, -1);
    } else {
      HeapSync* own = h.sync(h.rank);
      for (int i = 0; i < t.size; ++i) {
        const int p = team_world_rank(t, i);
        if (p == h.rank) continue;
        rounds[p] = ++own->low_latency_rounds[p][block];
        tags[p] = low_latency_tag(rounds[p]);
      }
    }
  }
  __syncthreads();
  if (!usable) return false;
  for (int i = int(lane); i < t.size; i += int(scope_size<Scope::kBlock>())) {
    const int p = team_world_rank(t, i);
    if (p != h.rank) store_line(&h.sync(p)->low_latency_tokens[h.rank][block], rounds[p]);
  }
  return true;
}

/* The end of a low-latency call, by the whole block: each member's token of
 * this round has arrived. A member's block sends it only after finishing the
 * call before, so once it is here this block may write its region of that
 * member's slots in the next round's parity, whatever lines this call had;
 * a region is only ever written by the block of the same index, so a change
 * of grid or count between calls cannot mix rounds. With `whole_grid`, it
 * returns only once every block of this rank's grid has its share of dst;
 * without, once this block has. */
__device__ inline bool low_latency_end(const Heap& h, const Team& t, const uint64_t* rounds, bool good,
                                       bool whole_grid) {
  const unsigned block = grid_block(), lane = scope_lane<Scope::kBlock>();
  for (int i = int(lane); i < t.size && good; i += int(scope_size<Scope::kBlock>())) {
    const int p = team_world_rank(t, i);
    if (p == h.rank) continue;
    const uint64_t* token = &h.sync(h.rank)->low_latency_tokens[p][block];
    good = spin(
        h, [&] { return load_line(token) >= rounds[p]; }, WaitKind::kBarrier, p);
  }
  bool all_good = __syncthreads_and(good ? 1 : 0) != 0;  // also: the block's share of dst is written
  if (whole_grid) {                                      // the same on every thread of the block
    __shared__ int grid_good;
    if (lane == 0) grid_good = local_grid_sync(h);
    __syncthreads();
    all_good = all_good && grid_good;
  }
  return all_good;
}

/* Low latency, one shot: each block pushes its slice of src, one 4-byte unit
 * per 8-byte line with this call's round (per peer and block) beside it,
 * into its region of every member's receive slot for this rank; then
 * reduces the lines that carry the round, in team order. A slot's two parities let a member
 * run one call ahead of another; the tokens (low_latency_end) keep it from
 * running two ahead. */
template <class T>
__device__ inline bool low_latency_all_reduce(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count,
                                              ReduceOp op, bool whole_grid) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "the low-latency format carries 2- and 4-byte elements");
  constexpr int E = 4 / sizeof(T);
  __shared__ uint64_t rounds[kLowLatencyMaxRanks];
  __shared__ uint32_t tags[kLowLatencyMaxRanks];
  if (!low_latency_begin(h, t, rounds, tags)) return false;
  const unsigned block = grid_block();
  const uint64_t units = (count + E - 1) / E;
  uint64_t begin, end;
  block_slice(units, &begin, &end);  // at most kLowLatencyBlockLines (choose_all_reduce)
  const unsigned lane = scope_lane<Scope::kBlock>(), lanes = scope_size<Scope::kBlock>();
  for (uint64_t u = begin + lane; u < end; u += lanes) {
    const uint64_t word = pack_unit(src, u, count);
    for (int i = 1; i < t.size; ++i) {
      const int p = team_world_rank(t, (t.my + i) % t.size);
      store_line(h.low_latency_slot(p, rounds[p] & 1, h.rank, block) + (u - begin), (uint64_t(tags[p]) << 32) | word);
    }
  }
  bool good = true;
  for (uint64_t u = begin + lane; u < end && good; u += lanes) {
    const uint32_t out = reduce_unit_lines(h, t, src, u, count, rounds, tags, block, u - begin, op, &good);
    if (good) unpack_unit(dst, u, count, out);
  }
  return low_latency_end(h, t, rounds, good, whole_grid);
}

/* Low latency, two shots: member i's part of the units (parts of `part`
 * units, in team order) goes from every member into the first half of
 * member i's slot for it; member i reduces its part and sends the result
 * into the second half of every member's slot for i; each member unpacks
 * the parts it receives. Each block takes the same slice of every part and
 * keeps its lines in its own region of each slot: the first half for the
 * parts coming in, the second for the reduced parts coming back. Only run
 * when asked by name, so it ends when this block has its share of dst. */
template <class T>
__device__ inline bool low_latency_two_shot(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count,
                                            ReduceOp op) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "the low-latency format carries 2- and 4-byte elements");
  constexpr int E = 4 / sizeof(T);
  constexpr uint64_t kHalf = kLowLatencyBlockLines / 2;  // lines in half a block's region
  __shared__ uint64_t rounds[kLowLatencyMaxRanks];
  __shared__ uint32_t tags[kLowLatencyMaxRanks];
  if (!low_latency_begin(h, t, rounds, tags)) return false;
  const unsigned block = grid_block();
  const uint64_t units = (count + E - 1) / E, part = (units + t.size - 1) / t.size;
  uint64_t b0, b1;
  block_slice(part, &b0, &b1);  // at most kHalf (choose_all_reduce)
  const unsigned lane = scope_lane<Scope::kBlock>(), lanes = scope_size<Scope::kBlock>();
  // Each member's part of this rank's src, to that member.
  for (int k = 1; k < t.size; ++k) {
    const int m = (t.my + k) % t.size, p = team_world_rank(t, m);
    uint64_t* region = h.low_latency_slot(p, rounds[p] & 1, h.rank, block);
    const uint64_t tag = tags[p];
    for (uint64_t j = b0 + lane; j < b1 && m * part + j < units; j += lanes)
      store_line(region + (j - b0), (tag << 32) | pack_unit(src, m * part + j, count));
  }
  // This rank's part, reduced in team order, into dst here and to every member.
  bool good = true;
  for (uint64_t j = b0 + lane; j < b1 && t.my * part + j < units && good; j += lanes) {
    const uint64_t u = t.my * part + j;
    const uint32_t out = reduce_unit_lines(h, t, src, u, count, rounds, tags, block, j - b0, op, &good);
    if (!good) break;
    unpack_unit(dst, u, count, out);
    for (int k = 1; k < t.size; ++k) {
      const int p = team_world_rank(t, (t.my + k) % t.size);
      store_line(h.low_latency_slot(p, rounds[p] & 1, h.rank, block) + kHalf + (j - b0),
                 (uint64_t(tags[p]) << 32) | out);
    }
  }
  // The other members' parts, reduced there.
  for (int k = 1; k < t.size && good; ++k) {
    const int m = (t.my + k) % t.size, p = team_world_rank(t, m);
    const uint64_t* region = h.low_latency_slot(h.rank, rounds[p] & 1, p, block) + kHalf;
    for (uint64_t j = b0 + lane; j < b1 && m * part + j < units && good; j += lanes) {
      const uint32_t word = wait_line(h, region + (j - b0), tags[p], p, &good);
      if (good) unpack_unit(dst, m * part + j, count, word);
    }
  }
  return low_latency_end(h, t, rounds, good, false);
}

/* This block meets the same block of every other member of the team, and no
 * other block of this rank's grid: the block's earlier stores land first
 * (meet_members' fence). Called by every thread of the block. */
__device__ inline bool block_meet(const Heap& h, const Team& t) {
  __shared__ int ok;
  const unsigned tid = scope_lane<Scope::kBlock>(), size = scope_size<Scope::kBlock>();
  __syncthreads();
  if (tid == 0) ok = grid_and_team_usable(h, t);
  __syncthreads();
  if (!ok) return false;
  // The first warp's lanes take a peer each.
  const bool met = tid >= 32 || grid_sync_peers(h, t, tid, size < 32 ? size : 32);
  return __syncthreads_and(met ? 1 : 0) != 0;
}

/* Two-shot with per-block meetings (AllReduceAlgo::kTwoShotPerBlock): block
 * b reads slice b of this member's part from every member's src once the
 * same block of each has started the call (src was written before), stores
 * the sums into every member's dst, and returns once the same block of
 * every member has stored its slices here: this block's share of dst (slice
 * b of every part, and for the grid's last block the tail of fewer than 16
 * bytes) is complete, and its share of src (the same elements) is read by
 * every member. The shares follow the team's size, T, count and the grid.
 * Members that run different grids are not detected (the low-latency
 * algorithms' limit too): the same block of each meets, and the blocks one
 * grid has and another lacks wait out the timeout on their own rank. */
template <class T>
__device__ inline bool two_shot_per_block(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count,
                                          ReduceOp op) {
  if (!block_meet(h, t)) return false;
  reduce_and_push(h, t, dst, src, count, op);
  return block_meet(h, t);
}

/* This block's slice of `bytes` from src into `peer`'s copy of dst. */
__device__ inline void push_slice(const Heap& h, char* dst, const char* src, uint64_t bytes, int peer) {
  uint64_t begin, end;
  block_slice(bytes, &begin, &end);
  if (end > begin) copy_bytes<Scope::kBlock>(h.peer_ptr(dst + begin, peer), src + begin, end - begin);
}

}  // namespace impl

/* Every block of this rank's grid arrived, and each block's earlier stores
 * are visible to the others; no peer takes part. Called by every thread of
 * every block. Between collectives that split buffers differently (above
 * all_reduce), or before a block reads what another block wrote. */
__device__ inline bool grid_sync(const Heap& h) {
  __shared__ int ok;
  __syncthreads();
  if (impl::scope_lane<Scope::kBlock>() == 0) {
    ok = impl::grid_blocks() <= unsigned(kMaxGridBlocks);
    if (!ok)
      impl::report(h, WaitKind::kBadGrid, -1);
    else
      ok = impl::local_grid_sync(h);
  }
  __syncthreads();
  return ok != 0;
}

/* Every block of every member of the team arrived (and its earlier stores landed). */
__device__ inline bool barrier_all(const Heap& h, const Team& t) {
  __shared__ int ok, failed;
  const unsigned tid = impl::scope_lane<Scope::kBlock>(), size = impl::scope_size<Scope::kBlock>();
  __syncthreads();
  if (tid == 0) {
    ok = impl::grid_sync_local(h, t);
    failed = 0;
  }
  __syncthreads();
  // The first warp's lanes take a peer each.
  if (ok && tid < 32 && !impl::grid_sync_peers(h, t, tid, size < 32 ? size : 32)) failed = 1;
  __syncthreads();
  return ok && !failed;
}

namespace impl {

/* Every thread: root is a team rank; otherwise thread 0 of each block leaves
 * the fault word (kBadRoot) and every member returns before any barrier. */
__device__ inline bool root_in_team(const Heap& h, const Team& t, int root) {
  if (root >= 0 && root < t.size) return true;
  if (scope_lane<Scope::kBlock>() == 0) report(h, WaitKind::kBadRoot, root);
  return false;
}

}  // namespace impl

template <class T>
__device__ inline bool broadcast(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, int root) {
  if (!impl::root_in_team(h, t, root) || !barrier_all(h, t)) return false;
  if (t.my == root)
    for (int m = 0; m < t.size; ++m)
      impl::push_slice(h, reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), count * sizeof(T),
                       team_world_rank(t, m));
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool fcollect(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count) {
  if (!barrier_all(h, t)) return false;
  for (int k = 0; k < t.size; ++k) {
    const int m = (t.my + k) % t.size;  // every member starts with a different peer
    impl::push_slice(h, reinterpret_cast<char*>(dst + uint64_t(t.my) * count), reinterpret_cast<const char*>(src),
                     count * sizeof(T), team_world_rank(t, m));
  }
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool alltoall(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count) {
  if (!barrier_all(h, t)) return false;
  for (int k = 0; k < t.size; ++k) {
    const int m = (t.my + k) % t.size;
    impl::push_slice(h, reinterpret_cast<char*>(dst + uint64_t(t.my) * count),
                     reinterpret_cast<const char*>(src + uint64_t(m) * count), count * sizeof(T),
                     team_world_rank(t, m));
  }
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool reduce(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, ReduceOp op,
                              int root) {
  if (!impl::root_in_team(h, t, root) || !barrier_all(h, t)) return false;
  if (t.my == root) impl::reduce_slice(h, t, dst, src, count, op);
  return barrier_all(h, t);
}

/* `algo` (coll_algo.cuh): kAuto picks by size and grid; another is taken
 * where the call allows it. What is done when a block returns:
 *   kAuto, kOneShot, kTwoShot   all of this rank's dst, and this rank's src
 *                               may be written again
 *   kLowLatency, kLowLatencyTwoShot, kTwoShotPerBlock asked by name
 *                               this block's share of dst only. The blocks
 *                               split the work by algorithm, element type,
 *                               count, team and grid: call grid_sync(h) (or end the
 *                               kernel) before reading the rest of dst,
 *                               writing src, or a next collective on
 *                               overlapping buffers that differs in any of
 *                               these; no grid-wide wait is
 *                               why one asks for them
 * The low-latency algorithms (the one-shot form also under kAuto) and kTwoShotPerBlock end
 * without a barrier with the other members: when this rank returns, a peer
 * may still be writing its own dst, and other blocks of the peers may still
 * be storing into this rank's (barrier_all before touching peers' copies).
 * If a block touched another block's share of dst or src since a call asked
 * by name, grid_sync(h) again before the next one: its first stores into a
 * member wait only for the same block there. */
template <class T>
__device__ inline bool all_reduce(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, ReduceOp op,
                                  AllReduceAlgo algo = AllReduceAlgo::kAuto) {
  const bool aligned = ((uintptr_t(dst) | uintptr_t(src)) & 15) == 0;
  const AllReduceAlgo run = choose_all_reduce(count * sizeof(T), h.world, t.size, impl::grid_blocks(), aligned, algo);
  if constexpr (sizeof(T) == 2 || sizeof(T) == 4) {
    const bool whole_grid = algo == AllReduceAlgo::kAuto;
    if (run == AllReduceAlgo::kLowLatency) return impl::low_latency_all_reduce(h, t, dst, src, count, op, whole_grid);
    if (run == AllReduceAlgo::kLowLatencyTwoShot) return impl::low_latency_two_shot(h, t, dst, src, count, op);
  }
  if (run == AllReduceAlgo::kTwoShotPerBlock) return impl::two_shot_per_block(h, t, dst, src, count, op);
  if (!barrier_all(h, t)) return false;
  if (run == AllReduceAlgo::kTwoShot)
    impl::reduce_and_push(h, t, dst, src, count, op);
  else
    impl::reduce_slice(h, t, dst, src, count, op);
  return barrier_all(h, t);
}

template <class T>
__device__ inline bool reduce_scatter(const Heap& h, const Team& t, T* dst, const T* src, uint64_t count, ReduceOp op) {
  if (!barrier_all(h, t)) return false;
  // Read the members' block t.my; write it to this rank's dst. reduce_slice reads
  // src + i through peer_ptr, so shift src to the block first.
  impl::reduce_slice(h, t, dst, src + uint64_t(t.my) * count, count, op);
  return barrier_all(h, t);
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_COLL_CUH_ */
