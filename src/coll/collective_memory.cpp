#include "coll/collective_memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "coll/plan.hpp"
#include "core/cuda_scope.hpp"
#include "core/driver.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "sync/holds.hpp"

namespace ferry {
namespace {

// The heap maps what its allocations need, one granule at a time: ranks
// sharing a GPU (FERRY_SHARED_GPUS) map no more than they use.
constexpr size_t kHeapChunk = size_t(2) << 20;
// Address space per rank, the same on every rank (not FERRY_SYMM_HEAP_BYTES,
// which sizes users' heaps): more than any GPU's memory, so that scratch
// (older blocks included) runs out of GPU memory before it runs out of room.
constexpr size_t kHeapCapacity = size_t(256) << 30;
// Scratch and the SM path's windows start on a granule: a block never shares
// a page with another, and its start is aligned for any copy or vector load.
constexpr size_t kBlockAlign = size_t(2) << 20;

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

// Zeroes `bytes` at `p` on `device` and waits for it, on a stream of its own:
// the device may hold work that waits for the host (an armed collective),
// which a device-wide synchronize would wait for.
void zero(int device, void* p, size_t bytes) {
  DeviceScope on(device);
  cudaStream_t s = nullptr;
  FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaError_t err = cudaMemsetAsync(p, 0, bytes, s);
  if (err == cudaSuccess) err = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  FERRY_CUDA_CHECK(err);
}

}  // namespace

std::unique_ptr<CollectiveMemory> CollectiveMemory::create(const Group& group) {
  std::unique_ptr<CollectiveMemory> m(new CollectiveMemory());
  m->group_ = group;
  m->heap_ = SymmetricHeap::create(group, kHeapCapacity, kHeapChunk);
  // Every rank's flags zeroed before any peer may write them: in a world of
  // processes, peers start calling only after the setup's last all-gather.
  m->device_flags_offset_ = m->heap_->alloc(sizeof(DeviceFlags), 4096, {});
  for (int i = 0; i < group.local_count(); ++i)
    zero(group.devices[i], m->device_flags(group.ranks[i]), sizeof(DeviceFlags));
  m->create_sm_path_windows();
  return m;
}

CollectiveMemory::~CollectiveMemory() {
  try {
    close();
  } catch (...) {
  }
}

void CollectiveMemory::close() {
  if (closed_) return;
  closed_ = true;
  // Unmapping waits for every stream of the GPU: kept for later while an
  // armed transfer may hold one (the heap keeps its own likewise).
  std::vector<void*> ipc;
  std::vector<VmmView> views;
  for (auto& reg : registrations_) {
    ipc.insert(ipc.end(), reg.ipc.begin(), reg.ipc.end());
    views.insert(views.end(), reg.views.begin(), reg.views.end());
  }
  registrations_.clear();
  sync::free_when_unheld(
      [ipc, views, device = group_.devices[0]]() mutable {
        RelaxedCaptureScope relax;  // it may run on a thread that captures
        DeviceScope on(device);
        for (void* base : ipc) ipc_close(base);
        for (auto& v : views) vmm_view_release(v);
      },
      "a communicator's registered buffers");
  if (heap_) heap_->close();
  heap_.reset();
  // The communicator's close releases the descriptor exchange (its socket and
  // folder) unless a user's heap still holds it.
  group_.fds.reset();
  group_.next_tag = nullptr;
}

std::vector<std::string> CollectiveMemory::allgather(const std::string& mine, const char* what) const {
  auto all = group_.allgather(mine);
  if (static_cast<int>(all.size()) != group_.world)
    throw_error(FERRY_ERROR_INTERNAL, std::string(what) + ": the bootstrap all-gather returned " +
                                          std::to_string(all.size()) + " records for " + std::to_string(group_.world) +
                                          " ranks");
  return all;
}

// Every rank computes its peers' side of the SM path from its own settings,
// compared in one exchange.
// The raw settings are compared before any rank parses its own, so that a
// malformed or differing value is raised by every rank (one rank raising
// alone would leave the others in the exchange).
std::vector<long long> CollectiveMemory::agreed_knobs(const std::vector<const char*>& names) const {
  if (group_.multi_process()) {
    const std::string why = knob_mismatch(
        names, allgather(knob_settings(names), "communicator setup (the SM path's knobs)"), group_.ranks[0]);
    if (!why.empty()) throw_error(FERRY_ERROR_INVALID_ARGUMENT, why);
  }
  std::vector<long long> values;
  for (const char* name : names) values.push_back(knob_int(name));
  return values;
}

void CollectiveMemory::create_sm_path_windows() {
  const int world = group_.world;
  const auto knobs = agreed_knobs({"FERRY_SM_BYTES", "FERRY_SM_LL_BLOCK_BYTES", "FERRY_SM_BLOCK_BYTES",
                                   "FERRY_SM_MAX_BLOCKS", "FERRY_SHARED_GPUS", "FERRY_SM_TWO_SHOT_BYTES"});
  const long long slot = knobs[0], ll_block = knobs[1], span_block = knobs[2], max_blocks = knobs[3],
                  shared_gpus = knobs[4], two_shot_from = knobs[5];
  // After the agreement checks, so that every rank raises them.
  FERRY_ARG_CHECK(slot >= 0, "FERRY_SM_BYTES=" + std::to_string(slot) + ": expected 0 (off) or a byte count");
  FERRY_ARG_CHECK(ll_block >= 8 && ll_block <= static_cast<long long>(kSmPathLowLatencyMaxBytes) && ll_block % 8 == 0,
                  "FERRY_SM_LL_BLOCK_BYTES=" + std::to_string(ll_block) + ": expected a multiple of 8 from 8 to " +
                      std::to_string(kSmPathLowLatencyMaxBytes));
  FERRY_ARG_CHECK(span_block >= 16 && span_block % 16 == 0,
                  "FERRY_SM_BLOCK_BYTES=" + std::to_string(span_block) + ": expected a positive multiple of 16");
  FERRY_ARG_CHECK(
      max_blocks >= 1 && max_blocks <= kSmPathMaxBlocks,
      "FERRY_SM_MAX_BLOCKS=" + std::to_string(max_blocks) + ": expected 1 to " + std::to_string(kSmPathMaxBlocks));
  FERRY_ARG_CHECK(two_shot_from >= 0,
                  "FERRY_SM_TWO_SHOT_BYTES=" + std::to_string(two_shot_from) + ": expected 0 (never) or a byte count");
  if (slot == 0 || world > kSmPathMaxRanks) return;
  sm_path_blocks_ = SmPathBlocks{static_cast<size_t>(ll_block), static_cast<size_t>(span_block),
                                 static_cast<int>(max_blocks), static_cast<size_t>(two_shot_from)};
  if (shared_gpus || max_blocks > kSmPathDefaultMaxBlocks) {
    // A block that waits for a peer's block needs that block resident, so a
    // grid must fit on the GPU at once (with ranks sharing a GPU, all of
    // theirs together): every rank takes the least occupancy of all. Every
    // GPU holds the default grid.
    int resident = std::numeric_limits<int>::max();
    LocalFailure asked;  // a rank that could not ask still takes part, so that every rank raises
    asked.run([&] {
      for (int d : group_.devices) resident = std::min(resident, sm_path_resident_blocks(d));
    });
    if (group_.multi_process()) {
      asked.agree(group_, "communicator setup (the SM path's occupancy)");
      for (const auto& r : allgather(std::to_string(resident), "communicator setup (the SM path's occupancy)"))
        resident = std::min(resident, std::stoi(r));
    } else {
      asked.rethrow();
    }
    sm_path_blocks_.max_blocks = sm_path_grid_bound(static_cast<int>(max_blocks), resident, shared_gpus ? world : 1);
  }
  sm_path_blocks_.slot_bytes = round_up(static_cast<size_t>(slot), 256);
  const size_t slot_bytes = sm_path_blocks_.slot_bytes;
  const size_t offset = heap_->alloc(sm_path_window_bytes(world, slot_bytes), kBlockAlign, {});
  for (int p = 0; p < world; ++p) sm_path_windows_.base[p] = heap_->at(p, offset);
  // The header and the low-latency slots (whatever holds a flag) zeroed before
  // any peer can write one.
  const size_t ll_begin = sm_path_ll_slot_offset(world, slot_bytes, 0, 0);
  for (int i = 0; i < group_.local_count(); ++i) {
    char* window = sm_path_windows_.base[group_.ranks[i]];
    zero(group_.devices[i], window, kSmPathHeaderBytes);
    zero(group_.devices[i], window + ll_begin, 2 * world * kSmPathLowLatencySlotBytes);
  }
}

const CollectiveMemory::ScratchBlock* CollectiveMemory::find_scratch(size_t bytes) const {
  return !scratch_.empty() && scratch_.back().bytes >= bytes ? &scratch_.back() : nullptr;
}

const CollectiveMemory::ScratchBlock& CollectiveMemory::scratch(size_t bytes) {
  if (const ScratchBlock* s = find_scratch(bytes)) return *s;
  const size_t size = round_up(bytes, kBlockAlign);
  scratch_.push_back(ScratchBlock{heap_->alloc(size, kBlockAlign, {}), size});
  return scratch_.back();
}

const CollectiveMemory::Registration* CollectiveMemory::find(int rank, const void* ptr, size_t bytes) const {
  auto p = static_cast<const char*>(ptr);
  for (const auto& reg : registrations_)  // (differences, not sums, which could wrap)
    if (p >= reg.base[rank] && bytes <= reg.size[rank] &&
        static_cast<size_t>(p - reg.base[rank]) <= reg.size[rank] - bytes)
      return &reg;
  return nullptr;
}

CollectiveMemory::Registration* CollectiveMemory::starting_at(const void* ptr) {
  for (auto& reg : registrations_)
    if (reg.base[group_.ranks[0]] == ptr) return &reg;
  return nullptr;
}

CollectiveMemory::Registration& CollectiveMemory::allocate(size_t bytes) {
  // Fresh VMM memory on each rank, registered into the heap (which takes the
  // physical memory to every rank, and holds it), then let go of: the buffer
  // lives at the heap's addresses until free() deregisters it, which returns
  // the memory to the driver.
  // With one process per rank a rank that cannot make its memory (its GPU
  // is full) still takes part in the registration, and every rank refuses.
  std::vector<VmmMapping> own;
  std::vector<void*> buffers(group_.local_count(), nullptr);
  LocalFailure made;
  size_t offset = 0;
  try {
    for (int i = 0; i < group_.local_count(); ++i) {
      DeviceScope on(group_.devices[i]);
      auto make = [&] {
        own.push_back(vmm_allocate(group_.devices[i], bytes, group_.multi_process(), {group_.devices[i]}));
        buffers[i] = reinterpret_cast<void*>(own.back().ptr);
      };
      if (group_.multi_process())
        made.run(make);
      else
        make();
    }
    offset = heap_->register_memory(buffers, bytes, {}, "alloc", &made);
  } catch (...) {
    for (auto& m : own) vmm_release(m);
    throw;
  }
  for (auto& m : own) vmm_release(m);
  Registration reg;
  reg.id = next_registration_++;
  reg.owned = true;
  reg.heap_offset = offset;
  reg.size.assign(group_.world, bytes);
  for (int p = 0; p < group_.world; ++p) reg.base.push_back(heap_->at(p, offset));
  registrations_.push_back(std::move(reg));
  return registrations_.back();
}

CollectiveMemory::Registration& CollectiveMemory::register_buffers(const std::vector<void*>& ptrs,
                                                                   const std::vector<size_t>& sizes,
                                                                   const std::string& problem) {
  const int world = group_.world;
  auto check_overlap = [&] {
    for (int i = 0; i < group_.local_count(); ++i)
      for (const auto& reg : registrations_)
        FERRY_ARG_CHECK(!ranges_overlap(ptrs[i], sizes[i], reg.base[group_.ranks[i]], reg.size[group_.ranks[i]]),
                        "register: the buffer overlaps one already registered (buffers from alloc() are registered "
                        "already); deregister that one first");
  };
  if (!group_.multi_process()) check_overlap();
  Registration reg;
  reg.id = next_registration_++;
  reg.base.assign(world, nullptr);
  reg.size.assign(world, 0);
  try {
    if (group_.multi_process()) {
      const int me = group_.ranks[0], device = group_.devices[0];
      DeviceScope on(device);
      // VMM memory (PyTorch's expandable segments, say) travels as file
      // descriptors of its pieces; cudaMalloc memory through CUDA IPC. Each
      // rank says which it has (or why neither works) before anything moves,
      // so that all refuse together.
      RegistrationRecord mine;
      VmmBuffer vb;
      std::vector<int> fds;
      try {
        if (!problem.empty()) throw_error(FERRY_ERROR_INVALID_ARGUMENT, problem);
        check_overlap();
        if (is_vmm_memory(ptrs[0])) {
          vb = find_vmm_buffer(ptrs[0], sizes[0], device, "register: buffer");
          if (!vb.exportable)
            throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                        "register: the buffer is VMM memory made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, so "
                        "no other process can map it");
          mine.kind = 'V';
          mine.span.lead = vb.lead;
          for (const VmmPiece& p : vb.pieces) {
            int fd = -1;
            FERRY_CU_CHECK(
                driver().MemExportToShareableHandle(&fd, p.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
            fds.push_back(fd);
            mine.span.pieces.push_back(p.size);
          }
        } else {
          const IpcExport e = ipc_export(ptrs[0]);
          mine.kind = 'I';
          mine.ipc.assign(reinterpret_cast<const char*>(&e), sizeof(e));
        }
        mine.bytes = sizes[0];
      } catch (const std::exception& e) {
        mine.kind = '!';
        mine.error = e.what();
        mine.code = error_code(e, FERRY_ERROR_INVALID_ARGUMENT);
      }
      release_vmm_buffer(vb);  // the descriptors keep the pieces alive until peers import them
      auto close_fds = [&] {
        for (int fd : fds) ::close(fd);
        fds.clear();
      };
      std::vector<RegistrationRecord> all(world);
      try {
        const std::vector<std::string> records = allgather(encode_registration(mine), "register");
        for (int p = 0; p < world; ++p) {
          all[p] = decode_registration(records[p], p);
          if (all[p].kind == '!')
            throw_error(static_cast<ferry_result_t>(all[p].code), "rank " + std::to_string(p) + ": " + all[p].error);
          if (all[p].kind == 'I' && all[p].ipc.size() != sizeof(IpcExport))
            throw_error(FERRY_ERROR_INTERNAL, "register: malformed record from rank " + std::to_string(p));
        }
      } catch (...) {
        close_fds();
        throw;
      }
      std::vector<size_t> counts(world, 0);
      for (int p = 0; p < world; ++p)
        if (all[p].kind == 'V') counts[p] = all[p].span.pieces.size();
      reg.base[me] = static_cast<char*>(ptrs[0]);
      reg.views.resize(world);
      // From here a failure is this rank's alone: it still takes part in
      // every exchange, then all ranks learn of it and refuse together.
      LocalFailure failure;
      failure.run([&] {
        for (int p = 0; p < world; ++p) {
          reg.size[p] = all[p].bytes;
          if (p == me) continue;
          if (all[p].kind == 'V') {
            reg.views[p] = vmm_view_reserve(all[p].span.pieces);
          } else {
            IpcExport pe;
            std::memcpy(&pe, all[p].ipc.data(), sizeof(pe));
            void* base = ipc_open(pe.handle);
            reg.ipc.push_back(base);
            reg.base[p] = static_cast<char*>(base) + pe.offset;
          }
        }
      });
      try {
        exchange_vmm_pieces(
            group_, fds, counts,
            [&](int p, size_t k, CUmemGenericAllocationHandle h) {
              vmm_view_map(reg.views[p], h, all[p].span.pieces[k], device);
            },
            failure);
      } catch (...) {
        close_fds();
        throw;
      }
      close_fds();
      failure.agree(group_, "register");
      for (int p = 0; p < world; ++p)
        if (p != me && counts[p]) reg.base[p] = reinterpret_cast<char*>(reg.views[p].base) + all[p].span.lead;
    } else {
      for (int i = 0; i < group_.local_count(); ++i) {
        // Peer access reaches cudaMalloc memory of an enabled peer, but VMM
        // memory only where its mapping grants it: grant every GPU of the
        // communicator read and write on the pieces under the buffer (the
        // owner's own access stays).
        DeviceScope on(group_.devices[i]);
        if (is_vmm_memory(ptrs[i])) {
          VmmBuffer b = find_vmm_buffer(ptrs[i], sizes[i], group_.devices[i], "register: buffer");
          try {
            for (const VmmPiece& p : b.pieces) vmm_set_access(p.start, p.size, group_.devices);
          } catch (...) {
            release_vmm_buffer(b);
            throw;
          }
          release_vmm_buffer(b);
        }
        reg.base[group_.ranks[i]] = static_cast<char*>(ptrs[i]);
        reg.size[group_.ranks[i]] = sizes[i];
      }
    }
  } catch (...) {
    unmap(reg);
    throw;
  }
  registrations_.push_back(std::move(reg));
  return registrations_.back();
}

void CollectiveMemory::release(uint32_t id) {
  for (auto it = registrations_.begin(); it != registrations_.end(); ++it)
    if (it->id == id) {
      if (it->owned) heap_->deregister(it->heap_offset, {}, "free");
      unmap(*it);
      registrations_.erase(it);
      return;
    }
}

// Never throws: it also runs on the way out of a failure.
void CollectiveMemory::unmap(Registration& reg) {
  int previous = 0;
  cudaGetDevice(&previous);
  cudaSetDevice(group_.devices[0]);
  for (void* base : reg.ipc) ipc_close(base);
  for (auto& v : reg.views) vmm_view_release(v);
  reg.ipc.clear();
  reg.views.clear();
  cudaSetDevice(previous);
}

}  // namespace ferry
