/* Teams: ordered subsets of a heap's ranks, as in NVSHMEM. A team is the
 * ranks start, start + stride, ..., start + (size - 1) * stride; a member's
 * team rank is its index there. Plain values, made on the host or in a kernel
 * (the same functions), passed by value.
 *
 *   Team world = ferry::device::world_team(h);   // node_team(h): the same ranks (one machine)
 *   Team evens = ferry::device::team_split_strided(world, 0, 2, h.world / 2);
 *   if (evens.my >= 0) ferry::device::barrier<Scope::kBlock>(h, evens);
 */
#ifndef FERRY_DEVICE_TEAM_CUH_
#define FERRY_DEVICE_TEAM_CUH_

#include "ferry/device/heap.cuh"

namespace ferry {
namespace device {

struct Team {
  int start;  /* world rank of team rank 0 */
  int stride; /* world ranks between consecutive members (>= 1) */
  int size;   /* members; 0: not a team (a split that did not fit its parent) */
  int my;     /* this rank's team rank, or -1 when it is not a member */
};

FERRY_DEVICE_HD int team_world_rank(const Team& t, int team_rank) { return t.start + team_rank * t.stride; }

/* `world_rank`'s rank in the team, or -1. */
FERRY_DEVICE_HD int team_rank_of(const Team& t, int world_rank) {
  if (t.size <= 0 || t.stride < 1 || world_rank < t.start) return -1;
  const int d = world_rank - t.start;
  if (d % t.stride != 0 || d / t.stride >= t.size) return -1;
  return d / t.stride;
}

FERRY_DEVICE_HD Team world_team(int rank, int world) { return Team{0, 1, world, rank}; }
FERRY_DEVICE_HD Team world_team(const Heap& h) { return world_team(h.rank, h.world); }

/* The ranks on this rank's node, as NVSHMEM's TEAM_NODE: a heap maps every
 * rank's GPU memory into every rank's address space, which only GPUs of one
 * machine can do, so they are the whole world. */
FERRY_DEVICE_HD Team node_team(int rank, int world) { return world_team(rank, world); }
FERRY_DEVICE_HD Team node_team(const Heap& h) { return node_team(h.rank, h.world); }

/* The members parent[start], parent[start + stride], ... (size of them), in
 * parent team ranks. Size 0 (not a team) when they do not all lie in the
 * parent, or a count is not positive. `my` follows the parent's. */
FERRY_DEVICE_HD Team team_split_strided(const Team& parent, int start, int stride, int size) {
  Team t{0, 1, 0, -1};
  if (parent.size <= 0 || start < 0 || stride < 1 || size < 1) return t;
  if (start + (int64_t)(size - 1) * stride >= parent.size) return t;
  // A team of one has no second member to be a stride away (a nested split
  // could otherwise multiply strides past int).
  const int64_t world_stride = size == 1 ? 1 : (int64_t)parent.stride * stride;
  if (world_stride > 0x7fffffff) return t;
  t.start = team_world_rank(parent, start);
  t.stride = (int)world_stride;
  t.size = size;
  t.my = parent.my < 0 ? -1 : team_rank_of(t, team_world_rank(parent, parent.my));
  return t;
}

/* A team every member of which is a rank of a heap of `world` ranks, and
 * that `rank` belongs to. */
FERRY_DEVICE_HD bool team_usable(const Team& t, int world) {
  return t.size > 0 && t.stride >= 1 && t.start >= 0 && t.start + (int64_t)(t.size - 1) * t.stride < world &&
         t.my >= 0 && t.my < t.size;
}

}  // namespace device
}  // namespace ferry

#endif /* FERRY_DEVICE_TEAM_CUH_ */
