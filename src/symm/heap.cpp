#include "symm/heap.hpp"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstring>
#include <thread>
#include <utility>

#include "core/clock.hpp"
#include "core/cuda_scope.hpp"
#include "core/driver.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dma/engine.hpp"
#include "symm/barrier_kernel.hpp"
#include "symm/peer_buffer.hpp"
#include "symm/registration.hpp"
#include "sync/holds.hpp"

namespace ferry {

namespace {

// Pinned words a rank's releases copy from, reused in turn.
constexpr unsigned kRescueSlots = 64;

}  // namespace

std::unique_ptr<SymmetricHeap> SymmetricHeap::create(const Group& g, size_t capacity, size_t min_chunk, bool words) {
  FERRY_ARG_CHECK(g.world >= 1 && g.world <= device::kMaxHeapRanks, "the heap's world is " + std::to_string(g.world) +
                                                                        " ranks; expected 1.." +
                                                                        std::to_string(device::kMaxHeapRanks));
  FERRY_ARG_CHECK(g.local_count() >= 1 && g.devices.size() == g.ranks.size(), "the group has no local ranks");
  const std::string refused = sync::refusal("SymmetricHeap", "setting one up (mapping its memory, a first barrier)");
  // Told to the peers in the exchange they make first (agree() below), so
  // that they fail at once naming this rank; only over a host-only exchange,
  // which cannot itself wait for the armed stream.
  if (!refused.empty()) sync::refuse_setup(refused, g.allgather_on_host ? g.allgather : AllGatherFn());
  sync::run_kept_frees();  // what earlier teardowns kept, before this one maps more
  std::unique_ptr<SymmetricHeap> h(new SymmetricHeap());
  h->group_ = g;
  h->words_ = words;
  // A heap of memory only keeps no words, so its allocations start at 0.
  h->front_ = words ? device::kHeapReservedBytes : 0;
  const DriverApi& cu = driver();
  DeviceScope scope(g.devices[0]);
  CUmemAllocationProp prop = vmm_prop(g.devices[0], g.multi_process());
  FERRY_CU_CHECK(cu.MemGetAllocationGranularity(&h->granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  h->capacity_ = heap_capacity(capacity, capacity ? 0 : static_cast<size_t>(knob_int_in("FERRY_SYMM_HEAP_BYTES")),
                               h->granularity_);
  h->min_chunk_ = min_chunk ? min_chunk : static_cast<size_t>(knob_int_in("FERRY_SYMM_CHUNK_BYTES"));
  FERRY_ARG_CHECK(h->capacity_ > h->front_, "capacity is " + std::to_string(h->capacity_) +
                                                " bytes; expected more than " + std::to_string(h->front_));
  // Every rank must take the same capacity: it is the stride kernels use.
  h->agree("create(capacity " + std::to_string(h->capacity_) + " bytes per rank, chunks of at least " +
           std::to_string(h->min_chunk_) + " bytes)");
  h->allocator_ = HeapAllocator(h->capacity_, h->front_);
  const size_t range = h->capacity_ * static_cast<size_t>(g.world);
  CUresult r = cu.MemAddressReserve(&h->base_, range, h->granularity_, 0, 0);
  if (r != CUDA_SUCCESS)
    throw_error(FERRY_ERROR_OUT_OF_MEMORY,
                "the symmetric heap could not reserve " + std::to_string(range) + " bytes of address space (" +
                    std::to_string(g.world) + " ranks x " + std::to_string(h->capacity_) +
                    " bytes: " + driver_error_name(r) +
                    "); create it with a smaller capacity (FERRY_SYMM_HEAP_BYTES or the capacity argument; a "
                    "communicator's own heap takes 256 GiB per rank, so fewer ranks per "
                    "process)");
  try {
    for (int i = 0; i < g.local_count(); ++i) {
      void* word = nullptr;
      FERRY_CUDA_CHECK(cudaHostAlloc(&word, sizeof(unsigned long long), cudaHostAllocMapped | cudaHostAllocPortable));
      h->fault_.push_back(static_cast<unsigned long long*>(word));
      *h->fault_.back() = 0;
    }
    for (int i = 0; i < g.local_count(); ++i) {
      DeviceScope on(g.devices[i]);
      // The greatest priority: such streams get hardware queues of their own,
      // so a release never queues behind the wait it releases (a stream of
      // default priority did, on two H100s).
      int least = 0, greatest = 0;
      FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      cudaStream_t s = nullptr;
      FERRY_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
      h->rescue_.push_back(s);
      void* words = nullptr;
      FERRY_CUDA_CHECK(cudaHostAlloc(&words, kRescueSlots * sizeof(uint64_t), cudaHostAllocPortable));
      h->rescue_values_.push_back(static_cast<uint64_t*>(words));
    }
    h->barrier_generation_.assign(g.local_count(), 0);
    h->staging_next_.assign(g.local_count(), 0);
    h->spare_events_.assign(g.local_count(), {});
    h->issued_.assign(g.local_count(), {});
    if (h->front_) h->grow(h->front_);
    // ferry's words start at zero on every rank before any peer may touch them.
    // A stream of its own: the device may hold work that waits for the host
    // (an armed collective), which a device-wide synchronize would wait for.
    for (int i = 0; i < g.local_count() && words; ++i) {
      DeviceScope on(g.devices[i]);
      cudaStream_t s = nullptr;
      FERRY_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      cudaError_t err = cudaMemsetAsync(h->at(g.ranks[i], 0), 0, device::kHeapReservedBytes, s);
      if (err == cudaSuccess) err = launch_barrier_kernel(h->handle(i), s, false);  // loaded before any spins
      if (err == cudaSuccess) err = cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
      FERRY_CUDA_CHECK(err);
    }
    h->agree(words ? "create (words zeroed)" : "create (memory only)");
  } catch (...) {
    h->close();
    throw;
  }
  h->watcher_ = std::thread([p = h.get()] { p->watcher_loop(); });
  return h;
}

SymmetricHeap::~SymmetricHeap() {
  try {
    close();
  } catch (...) {
  }
}

void SymmetricHeap::close() {
  if (closed_) return;
  closed_ = true;
  // A fault left after the last check() is still raised by check() once closed.
  for (int i = 0; i < static_cast<int>(fault_.size()) && !fault_at_close_.code; ++i) fault_at_close_ = fault_of(i);
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    stop_watcher_ = true;
  }
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
  watched_.clear();  // the watcher took and let go every wait before it ended
  for (size_t i = 0; i < spare_events_.size(); ++i) {
    try {
      DeviceScope on(group_.devices[i]);
      for (cudaEvent_t e : spare_events_[i]) cudaEventDestroy(e);
    } catch (const std::exception&) {  // a broken device: its events went with its context
    }
  }
  spare_events_.clear();
  for (size_t i = 0; i < issued_.size(); ++i) {
    try {
      DeviceScope on(group_.devices[i]);
      for (auto& [stream, e] : issued_[i]) cudaEventDestroy(e);
    } catch (const std::exception&) {  // a broken device: its events went with its context
    }
  }
  issued_.clear();
  if (!driver_available()) return;
  // Unmapping and freeing wait for every stream of the GPU: kept for later
  // while an armed transfer may hold one. The address range goes last, so
  // nothing else is mapped there before.
  std::vector<std::vector<Chunk>> chunks;
  for (auto& [region, reg] : registrations_) chunks.push_back(std::move(reg.chunks));
  registrations_.clear();
  chunks.push_back(std::move(chunks_));
  chunks_.clear();
  sync::free_when_unheld(
      [chunks = std::move(chunks), base = base_, span = capacity_ * static_cast<size_t>(group_.world),
       fault = std::move(fault_), rescue = std::move(rescue_), values = std::move(rescue_values_),
       device = group_.devices.empty() ? 0 : group_.devices[0]]() mutable {
        RelaxedCaptureScope relax;  // it may run on a thread that captures
        DeviceScope on(device);
        for (auto& c : chunks) unmap_chunks(c);
        if (base) driver().MemAddressFree(base, span);
        for (auto* w : fault) cudaFreeHost(w);
        for (auto st : rescue) cudaStreamDestroy(st);
        for (auto* w : values) cudaFreeHost(w);
      },
      "a symmetric heap's memory");
  base_ = 0;
  fault_.clear();
  rescue_.clear();
  rescue_values_.clear();
}

void SymmetricHeap::agree(const std::string& what, const LocalFailure* local) {
  const std::string mine = heap_call_record(++calls_, what);
  const bool refused = local != nullptr && local->failed();
  if (!group_.multi_process()) {  // one process makes every rank's call at once
    if (refused) local->rethrow();
    return;
  }
  auto all = group_.allgather(refused ? sync::refusal_record(local->message()) : mine);
  if (static_cast<int>(all.size()) != group_.world)
    throw_error(FERRY_ERROR_INTERNAL, "heap: the bootstrap all-gather returned " + std::to_string(all.size()) +
                                          " records for " + std::to_string(group_.world) + " ranks");
  if (refused) local->rethrow();
  sync::throw_if_refused(all, "heap: " + what);
  std::string mismatch = heap_calls_mismatch(all);
  if (!mismatch.empty()) throw_error(FERRY_ERROR_INVALID_ARGUMENT, mismatch);
}

void SymmetricHeap::map_chunk(std::vector<Chunk>& into, CUdeviceptr at, size_t size,
                              CUmemGenericAllocationHandle handle, const std::vector<int>& access) {
  const DriverApi& cu = driver();
  Chunk c;
  c.handle = handle;
  c.size = size;
  c.ptr = at;
  CUresult res = cu.MemMap(c.ptr, size, 0, handle, 0);
  if (res != CUDA_SUCCESS) {
    cu.MemRelease(handle);
    FERRY_CU_CHECK(res);
  }
  into.push_back(c);  // before set_access: a failure there is undone with the rest
  vmm_set_access(c.ptr, size, access);
}

void SymmetricHeap::unmap_chunks(std::vector<Chunk>& chunks) {
  if (!driver_available()) return;
  const DriverApi& cu = driver();
  while (!chunks.empty()) {
    cu.MemUnmap(chunks.back().ptr, chunks.back().size);
    cu.MemRelease(chunks.back().handle);
    chunks.pop_back();
  }
}

size_t SymmetricHeap::ceiling() const { return registrations_.empty() ? capacity_ : registrations_.begin()->first; }

void SymmetricHeap::grow(size_t end) {
  const size_t new_end = heap_mapped_end(mapped_, end, granularity_, min_chunk_, ceiling());
  if (new_end <= mapped_) return;
  const size_t size = new_end - mapped_;
  const DriverApi& cu = driver();
  auto map_chunk = [&](int r, CUmemGenericAllocationHandle handle, const std::vector<int>& access) {
    this->map_chunk(chunks_, base_ + static_cast<CUdeviceptr>(r) * capacity_ + mapped_, size, handle, access);
  };
  auto create_chunk = [&](int device) {
    CUmemAllocationProp prop = vmm_prop(device, group_.multi_process());
    CUmemGenericAllocationHandle handle = 0;
    CUresult res = cu.MemCreate(&handle, size, &prop, 0);
    if (res == CUDA_ERROR_OUT_OF_MEMORY)
      throw_error(FERRY_ERROR_OUT_OF_MEMORY, "the symmetric heap could not map " + std::to_string(size) +
                                                 " more bytes on GPU " + std::to_string(device) +
                                                 " (the GPU is out of memory)");
    FERRY_CU_CHECK(res);
    return handle;
  };
  // A failure part way leaves the heap as it was: the chunks this call mapped
  // are unmapped again, and every descriptor received is closed.
  const size_t chunks_before = chunks_.size();
  std::vector<int> received;
  try {
    if (!group_.multi_process()) {
      for (int i = 0; i < group_.local_count(); ++i) {
        DeviceScope on(group_.devices[i]);
        map_chunk(group_.ranks[i], create_chunk(group_.devices[i]), group_.devices);
      }
    } else {
      const int me = group_.ranks[0], dev = group_.devices[0];
      DeviceScope on(dev);
      // A rank that cannot make its chunk (its GPU is out of memory, say)
      // says so before anything moves: its peers would otherwise wait for a
      // descriptor that never comes. Every rank then refuses together, naming it.
      LocalFailure made;
      made.run([&] {
        map_chunk(me, create_chunk(dev), {dev});
        int fd = -1;
        FERRY_CU_CHECK(
            cu.MemExportToShareableHandle(&fd, chunks_.back().handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
        received.push_back(fd);
      });
      made.agree(group_, "the symmetric heap's growth");
      LocalFailure mapped;
      exchange_vmm_pieces(
          group_, received, std::vector<size_t>(group_.world, 1),
          [&](int p, size_t, CUmemGenericAllocationHandle h) { map_chunk(p, h, {dev}); }, mapped,
          "symmetric heap memory");
      mapped.agree(group_, "the symmetric heap's growth");
    }
  } catch (...) {
    for (int fd : received) ::close(fd);
    while (chunks_.size() > chunks_before) {
      cu.MemUnmap(chunks_.back().ptr, chunks_.back().size);
      cu.MemRelease(chunks_.back().handle);
      chunks_.pop_back();
    }
    throw;
  }
  for (int fd : received) ::close(fd);
  mapped_ = new_end;
}

size_t SymmetricHeap::alloc(size_t bytes, size_t align, const std::vector<cudaStream_t>& streams) {
  FERRY_ARG_CHECK(!closed_, "alloc: the heap is closed");
  // Everything this rank alone could refuse is found before the call's
  // exchange, so that its peers refuse with it rather than going on to grow.
  LocalFailure local;
  size_t offset = 0, end = 0;
  bool placed = false;
  local.run([&] {
    offset = allocator_.alloc(bytes, align);
    placed = true;
    end = offset + heap_rounded_bytes(bytes);
    if (end > ceiling())
      throw_error(FERRY_ERROR_OUT_OF_MEMORY,
                  "alloc: " + std::to_string(bytes) + " bytes do not fit below the registered memory at offset " +
                      std::to_string(ceiling()) +
                      " of the heap (registered buffers sit at its top); deregister some, or create the heap with "
                      "a larger capacity (FERRY_SYMM_HEAP_BYTES, or the capacity argument)");
    bool capturing = false;
    for (size_t i = 0; end > mapped_ && i < streams.size() && static_cast<int>(i) < local_count() && !capturing; ++i) {
      DeviceScope on(group_.devices[i]);
      capturing = dma::is_capturing(streams[i]);
    }
    if (capturing)
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  "alloc: " + std::to_string(bytes) +
                      " bytes need new physical memory, which cannot be mapped while a CUDA graph is being "
                      "captured; call reserve(" +
                      std::to_string(end - front_) + ") on every rank before capturing");
  });
  try {
    agree("alloc(" + std::to_string(bytes) + " bytes, align " + std::to_string(align) + ")", &local);
    if (end > mapped_) grow(end);
  } catch (...) {
    if (placed) allocator_.free(offset);
    throw;
  }
  return offset;
}

void SymmetricHeap::free(size_t offset) {
  FERRY_ARG_CHECK(!closed_, "free: the heap is closed");
  LocalFailure local;
  local.run([&] {
    size_t start = 0;
    const bool live = allocator_.find(offset, 1, &start, nullptr);
    // (A registered buffer's data starts inside its region: named as such first.)
    FERRY_ARG_CHECK(!live || !registrations_.count(start),
                    "free: offset " + std::to_string(offset) + " is a registered buffer; deregister it instead");
    FERRY_ARG_CHECK(live && start == offset,
                    "free: offset " + std::to_string(offset) + " is not the start of a live heap allocation");
  });
  agree("free(offset " + std::to_string(offset) + ")", &local);
  allocator_.free(offset);
}

void SymmetricHeap::reserve(size_t bytes) {
  FERRY_ARG_CHECK(!closed_, "reserve: the heap is closed");
  FERRY_ARG_CHECK(bytes <= capacity_ - front_, "reserve: " + std::to_string(bytes) + " bytes; the heap holds at most " +
                                                   std::to_string(capacity_ - front_) + " (FERRY_SYMM_HEAP_BYTES)");
  FERRY_ARG_CHECK(front_ + bytes <= ceiling(), "reserve: " + std::to_string(bytes) +
                                                   " bytes reach the registered memory at offset " +
                                                   std::to_string(ceiling()) + "; reserve less, or before registering");
  agree("reserve(" + std::to_string(bytes) + " bytes)");
  grow(front_ + bytes);
}

size_t SymmetricHeap::register_memory(const std::vector<void*>& buffers, size_t bytes,
                                      const std::vector<cudaStream_t>& streams, const char* call,
                                      const LocalFailure* failed_before) {
  FERRY_ARG_CHECK(!closed_, "register: the heap is closed");
  FERRY_ARG_CHECK(static_cast<int>(buffers.size()) == local_count(),
                  "register: " + std::to_string(buffers.size()) + " buffers for " + std::to_string(local_count()) +
                      " local ranks; expected one per local rank");
  FERRY_ARG_CHECK(bytes > 0, "register: bytes is 0; expected a buffer of at least one byte");
  agree(std::string(call) + "(" + std::to_string(bytes) + " bytes)");
  const DriverApi& cu = driver();
  // What each local rank found, or why it cannot: every rank learns every
  // rank's answer before anything is mapped, so that all refuse together.
  std::vector<VmmBuffer> mine(local_count());
  std::vector<std::string> problems(local_count());
  std::vector<int> codes(local_count(), FERRY_ERROR_INVALID_ARGUMENT);
  std::vector<int> out_fds;  // with one process per rank: this rank's pieces, exported
  for (int i = 0; i < local_count(); ++i) {
    DeviceScope on(group_.devices[i]);
    if (failed_before && failed_before->failed()) {
      problems[i] = failed_before->message();
      codes[i] = failed_before->code();
      continue;
    }
    try {
      if (i < static_cast<int>(streams.size()) && dma::is_capturing(streams[i]))
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    "register maps memory, which cannot be done while a CUDA graph is being captured; register "
                    "before capturing");
      mine[i] = find_vmm_buffer(buffers[i], bytes, group_.devices[i], "register: the buffer");
      if (group_.multi_process()) {
        if (!mine[i].exportable)
          throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                      "register: the buffer's memory was made without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, so "
                      "no other process can map it (PyTorch's expandable segments and ferry's heaps are "
                      "exportable)");
        for (const VmmPiece& p : mine[i].pieces) {
          int fd = -1;
          FERRY_CU_CHECK(cu.MemExportToShareableHandle(&fd, p.handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
          out_fds.push_back(fd);
        }
      }
    } catch (const std::exception& e) {
      problems[i] = e.what();
      codes[i] = error_code(e, FERRY_ERROR_INVALID_ARGUMENT);
    }
  }
  auto release_mine = [&] {
    for (auto& b : mine) release_vmm_buffer(b);
    for (int fd : out_fds) ::close(fd);
    out_fds.clear();
  };
  auto record = [&](const VmmBuffer& b, const std::string& problem, int code) {
    RegistrationRecord r;
    r.kind = problem.empty() ? 'V' : '!';
    r.error = problem;
    r.code = code;
    r.bytes = bytes;
    r.span.lead = b.lead;
    for (const auto& p : b.pieces) r.span.pieces.push_back(p.size);
    return encode_registration(r);
  };
  std::vector<std::string> records(world());
  try {
    if (group_.multi_process())
      records = group_.allgather(record(mine[0], problems[0], codes[0]));
    else
      for (int i = 0; i < local_count(); ++i) records[rank(i)] = record(mine[i], problems[i], codes[i]);
  } catch (...) {
    release_mine();
    throw;
  }
  std::vector<RegistrationSpan> spans(world());
  for (int r = 0; r < world(); ++r) {
    RegistrationRecord rec;
    try {
      rec = decode_registration(records[r], r);
      if (rec.kind != '!' && (rec.kind != 'V' || rec.bytes != bytes))
        throw_error(FERRY_ERROR_INTERNAL, "rank " + std::to_string(r) + " sent a record of another registration");
    } catch (...) {
      release_mine();
      throw;
    }
    if (rec.kind == '!') {
      release_mine();
      throw_error(static_cast<ferry_result_t>(rec.code), "rank " + std::to_string(r) + ": " + rec.error);
    }
    spans[r] = rec.span;
  }
  // Pieces are whole multiples of the device's smallest granule and are
  // mapped at multiples of it; the region itself starts on the heap's granule.
  CUmemAllocationProp prop = vmm_prop(group_.devices[0], group_.multi_process());
  size_t granule = 0;
  FERRY_CU_CHECK(cu.MemGetAllocationGranularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const RegistrationPlan plan = plan_registration(spans, bytes, granule);
  if (!plan.error.empty()) {
    release_mine();
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, "register: " + plan.error);
  }
  size_t region = 0;
  try {
    region = allocator_.alloc_top(plan.region_bytes, granularity_);
  } catch (...) {
    release_mine();
    throw;
  }
  if (region < mapped_) {
    allocator_.free(region);
    release_mine();
    throw_error(FERRY_ERROR_OUT_OF_MEMORY,
                std::string(call) + ": " + std::to_string(plan.region_bytes) +
                    " bytes of heap addresses are needed above the " + std::to_string(mapped_) +
                    " bytes the heap has mapped for its allocations, and fewer are free "
                    "there; register before large allocations or reserve(), or create the heap with a larger "
                    "capacity (FERRY_SYMM_HEAP_BYTES, or the capacity argument)");
  }
  Registration reg;
  reg.data_offset = plan.data_offset;
  reg.bytes = bytes;
  auto piece_at = [&](int r, size_t k) {
    size_t at = region + plan.shift[r];
    for (size_t j = 0; j < k; ++j) at += spans[r].pieces[j];
    return static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(this->at(r, at)));
  };
  try {
    if (!group_.multi_process()) {
      for (int i = 0; i < local_count(); ++i) {
        DeviceScope on(group_.devices[i]);
        for (size_t k = 0; k < mine[i].pieces.size(); ++k) {
          VmmPiece& p = mine[i].pieces[k];
          const CUmemGenericAllocationHandle h = std::exchange(p.handle, 0);  // the chunk owns it now
          map_chunk(reg.chunks, piece_at(rank(i), k), p.size, h, group_.devices);
        }
      }
    } else {
      const int me = rank(0), dev = group_.devices[0];
      DeviceScope on(dev);
      // A failure to map is this rank's alone: it still takes part in every
      // exchange, then all ranks learn of it and refuse together.
      LocalFailure failure;
      for (size_t k = 0; k < mine[0].pieces.size(); ++k) {
        VmmPiece& p = mine[0].pieces[k];
        failure.run([&] { map_chunk(reg.chunks, piece_at(me, k), p.size, std::exchange(p.handle, 0), {dev}); });
      }
      std::vector<size_t> counts;
      for (const auto& sp : spans) counts.push_back(sp.pieces.size());
      exchange_vmm_pieces(
          group_, out_fds, counts,
          [&](int p, size_t k, CUmemGenericAllocationHandle h) {
            map_chunk(reg.chunks, piece_at(p, k), spans[p].pieces[k], h, {dev});
          },
          failure);
      failure.agree(group_, "register");
    }
  } catch (...) {
    unmap_chunks(reg.chunks);
    release_mine();
    allocator_.free(region);
    throw;
  }
  release_mine();  // the exported descriptors; every handle went to a chunk
  registrations_[region] = std::move(reg);
  return region + plan.data_offset;
}

void SymmetricHeap::deregister(size_t offset, const std::vector<cudaStream_t>& streams, const char* call) {
  FERRY_ARG_CHECK(!closed_, "deregister: the heap is closed");
  // Every refusal of this rank alone goes to its peers in the call's
  // exchange: its range is reused at once, so the unmapping cannot wait
  // while held, and the peers must not unmap what this rank keeps.
  LocalFailure local;
  auto it = registrations_.end();
  size_t start = 0;
  local.run([&] {
    for (size_t i = 0; i < streams.size() && static_cast<int>(i) < local_count(); ++i) {
      DeviceScope on(group_.devices[i]);
      FERRY_ARG_CHECK(!dma::is_capturing(streams[i]),
                      "deregister unmaps memory, which cannot be done while a CUDA graph is being captured");
    }
    if (allocator_.find(offset, 1, &start, nullptr)) it = registrations_.find(start);
    FERRY_ARG_CHECK(it != registrations_.end() && start + it->second.data_offset == offset,
                    "deregister: offset " + std::to_string(offset) +
                        " is not a registered buffer's (what register returned; memory from alloc() is freed "
                        "with free())");
    sync::refuse_while_held(call, "unmapping the buffer");
  });
  agree(std::string(call) + "(offset " + std::to_string(offset) + ")", &local);
  unmap_chunks(it->second.chunks);
  registrations_.erase(it);
  allocator_.free(start);
}

char* SymmetricHeap::at(int rank, size_t offset) const {
  return reinterpret_cast<char*>(base_) + static_cast<size_t>(rank) * capacity_ + offset;
}

void SymmetricHeap::locate(const void* p, size_t bytes, const char* what, int* rank, size_t* offset) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p), b = static_cast<uintptr_t>(base_);
  const size_t range = capacity_ * static_cast<size_t>(group_.world);
  if (closed_ || a < b || a - b >= range)
    throw_error(
        FERRY_ERROR_INVALID_ARGUMENT,
        std::string(what) +
            " is not on the symmetric heap; expected memory from the heap's alloc(), or the heap address register() "
            "gave");
  const int r = static_cast<int>((a - b) / capacity_);
  const size_t off = (a - b) % capacity_;
  size_t start = 0;
  if (!allocator_.find(off, bytes, &start, nullptr))
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + ": [offset " + std::to_string(off) + ", +" +
                                                  std::to_string(bytes) +
                                                  ") does not lie inside one live allocation of the heap");
  // Of a registered region only the buffer is the same on every rank (the
  // pieces around it differ, or are not mapped).
  auto reg = registrations_.find(start);
  if (reg != registrations_.end()) {
    const size_t first = start + reg->second.data_offset;
    if (off < first || off - first > reg->second.bytes || bytes > reg->second.bytes - (off - first))
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  std::string(what) + ": [offset " + std::to_string(off) + ", +" + std::to_string(bytes) +
                      ") is not inside the registered buffer at offset " + std::to_string(first) + " (" +
                      std::to_string(reg->second.bytes) + " bytes)");
  }
  *rank = r;
  *offset = off;
}

void SymmetricHeap::check_words(const char* what) const {
  FERRY_ARG_CHECK(words_, std::string(what) +
                              ": this heap holds memory only (made without its own words, for "
                              "copy-engine staging); barriers, signals, waits and kernels need a "
                              "heap made with them");
}

device::Heap SymmetricHeap::handle(int local) const {
  check_words("handle");
  check_local(local, "handle");
  device::Heap h{};
  h.base = reinterpret_cast<char*>(base_);
  h.stride = capacity_;
  h.rank = group_.ranks[local];
  h.world = group_.world;
  h.fault = fault_[local];
  h.timeout_ns = static_cast<uint64_t>(group_.timeout_s * 1e9);
  return h;
}

void SymmetricHeap::check_local(int local, const char* what) const {
  FERRY_ARG_CHECK(!closed_, std::string(what) + ": the heap is closed");
  FERRY_ARG_CHECK(local >= 0 && local < local_count(), std::string(what) + ": local rank " + std::to_string(local) +
                                                           "; expected 0.." + std::to_string(local_count() - 1));
}

void SymmetricHeap::check() {
  if (closed_) {
    if (fault_at_close_.code) throw_error(static_cast<ferry_result_t>(fault_at_close_.code), fault_at_close_.message);
    return;
  }
  for (int i = 0; i < static_cast<int>(fault_.size()); ++i) {
    const HeapFault f = fault_of(i);
    if (f.code) throw_error(static_cast<ferry_result_t>(f.code), f.message);
  }
}

HeapFault SymmetricHeap::fault_of(int local) const {
  return heap_fault(*reinterpret_cast<volatile unsigned long long*>(fault_[local]), group_.ranks[local],
                    group_.timeout_s);
}

namespace {

void check_peer(int peer, int world, const char* what) {
  FERRY_ARG_CHECK(peer >= 0 && peer < world, std::string(what) + ": peer is " + std::to_string(peer) +
                                                 "; expected a rank 0.." + std::to_string(world - 1));
}

}  // namespace

size_t SymmetricHeap::own_offset(int local, const void* p, size_t bytes, const char* what) const {
  int r = 0;
  size_t off = 0;
  locate(p, bytes, what, &r, &off);
  FERRY_ARG_CHECK(r == rank(local), std::string(what) + " lies in rank " + std::to_string(r) +
                                        "'s heap; expected an address in the calling rank's own heap (the call "
                                        "moves or signals the peer's copy)");
  return off;
}

void SymmetricHeap::put(int local, void* dst, const void* src, size_t bytes, int peer, cudaStream_t stream) {
  check_local(local, "put");
  check_peer(peer, world(), "put");
  const size_t off = own_offset(local, dst, bytes, "put: dst");
  FERRY_ARG_CHECK(bytes == 0 || src != nullptr, "put: src is a null pointer");
  DeviceScope on(group_.devices[local]);
  dma::copy_one(stream, Copy{at(peer, off), src, bytes});
  issued(local, stream);
}

void SymmetricHeap::get(int local, void* dst, const void* src, size_t bytes, int peer, cudaStream_t stream) {
  check_local(local, "get");
  check_peer(peer, world(), "get");
  const size_t off = own_offset(local, src, bytes, "get: src");
  FERRY_ARG_CHECK(bytes == 0 || dst != nullptr, "get: dst is a null pointer");
  DeviceScope on(group_.devices[local]);
  dma::copy_one(stream, Copy{dst, at(peer, off), bytes});
  issued(local, stream);
}

void SymmetricHeap::signal(int local, uint64_t* sig, uint64_t value, int peer, cudaStream_t stream) {
  check_words("signal");
  check_local(local, "signal");
  check_peer(peer, world(), "signal");
  const size_t off = own_offset(local, sig, sizeof(uint64_t), "signal: sig");
  FERRY_ARG_CHECK(off % 8 == 0, "signal: sig must be an 8-byte aligned word");
  DeviceScope on(group_.devices[local]);
  // A stream write reaches only local memory on our GPUs; a copy engine carries
  // the value from a staging word here to the peer. Slots are reused in turn,
  // so at most kStagingSlots signals of one rank may be in flight at once.
  const int me = rank(local);
  uint64_t* slot =
      &reinterpret_cast<device::HeapSync*>(at(me, 0))->staging[staging_next_[local]++ % device::kStagingSlots];
  dma::mem_ops(stream, {MemOp{MemOp::Kind::kWrite, slot, value}});
  dma::copy_one(stream, Copy{at(peer, off), slot, sizeof(uint64_t)});
  issued(local, stream);
}

namespace {

// A stream's own id: cudaStreamPerThread and the legacy stream are one handle
// for many streams, which quiet must tell apart.
unsigned long long stream_key(cudaStream_t stream) {
  unsigned long long id = 0;
  FERRY_CUDA_CHECK(cudaStreamGetId(stream, &id));
  return id;
}

// Drops the streams (but `keep`) whose last call has landed: nothing to wait
// for there, and their streams may be gone by the next look. `each` sees
// every entry first (quiet's wait).
template <class Each>
void drop_landed(std::map<unsigned long long, cudaEvent_t>& by_stream, unsigned long long keep, Each each) {
  for (auto it = by_stream.begin(); it != by_stream.end();) {
    each(it->first, it->second);
    const cudaError_t q = it->first == keep ? cudaErrorNotReady : cudaEventQuery(it->second);
    if (q == cudaErrorNotReady) {
      ++it;
      continue;
    }
    if (q != cudaSuccess) cudaGetLastError();
    cudaEventDestroy(it->second);
    it = by_stream.erase(it);
  }
}

}  // namespace

void SymmetricHeap::issued(int local, cudaStream_t stream) {
  if (dma::is_capturing(stream)) return;  // runs when the graph does: ordered by the graph
  const unsigned long long key = stream_key(stream);
  std::lock_guard<std::mutex> lock(issued_mu_);
  auto& by_stream = issued_[local];
  // So that a program that never calls quiet keeps no more events than streams in use.
  drop_landed(by_stream, key, [](unsigned long long, cudaEvent_t) {});
  cudaEvent_t& e = by_stream[key];
  if (!e) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  FERRY_CUDA_CHECK(cudaEventRecord(e, stream));
}

void SymmetricHeap::quiet(int local, cudaStream_t stream) {
  FERRY_ARG_CHECK(!closed_, "quiet: the heap is closed");
  check_local(local, "quiet");
  DeviceScope on(group_.devices[local]);
  FERRY_ARG_CHECK(!dma::is_capturing(stream),
                  "quiet: the stream is capturing a CUDA graph; the puts, gets and signals in a graph are ordered "
                  "by the graph itself");
  const unsigned long long key = stream_key(stream);
  std::lock_guard<std::mutex> lock(issued_mu_);
  // `stream`'s own calls are before it already; its entry is dropped once landed too.
  drop_landed(issued_[local], ~0ULL, [&](unsigned long long other, cudaEvent_t e) {
    if (other != key) FERRY_CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0));
  });
}

void SymmetricHeap::refuse_if_faulted(int local, const char* what) const {
  const HeapFault f = fault_of(local);
  if (f.code)
    throw_error(static_cast<ferry_result_t>(f.code),
                std::string(what) +
                    ": refused, the heap faulted earlier and its stream waits would be let go at once (close "
                    "it and make a new one): " +
                    f.message);
}

void SymmetricHeap::wait(int local, const uint64_t* sig, uint64_t value, int from, cudaStream_t stream) {
  check_words("wait");
  check_local(local, "wait");
  refuse_if_faulted(local, "wait");
  FERRY_ARG_CHECK(from >= -1 && from < world(), "wait: from is " + std::to_string(from) + "; expected -1 or a rank");
  const size_t off = own_offset(local, sig, sizeof(uint64_t), "wait: sig");
  FERRY_ARG_CHECK(off % 8 == 0, "wait: sig must be an 8-byte aligned word");
  DeviceScope on(group_.devices[local]);
  watch(local, sig, value, from, "wait", stream);
}

void SymmetricHeap::barrier_on_stream(const std::vector<cudaStream_t>& streams, bool kernel) {
  FERRY_ARG_CHECK(!closed_, "barrier_on_stream: the heap is closed");
  check_words("barrier_on_stream");
  FERRY_ARG_CHECK(static_cast<int>(streams.size()) == local_count(),
                  "barrier_on_stream: expected one stream per local rank (" + std::to_string(local_count()) + ")");
  for (int i = 0; i < local_count(); ++i) refuse_if_faulted(i, "barrier_on_stream");
  if (kernel) {
    for (int i = 0; i < local_count(); ++i) {
      DeviceScope on(group_.devices[i]);
      FERRY_CUDA_CHECK(launch_barrier_kernel(handle(i), streams[i]));
    }
    return;
  }
  for (int i = 0; i < local_count(); ++i) {
    DeviceScope on(group_.devices[i]);
    // Its generation is a value of this call: a graph replaying it would wait
    // for the same generation again, which every later replay finds passed.
    FERRY_ARG_CHECK(!dma::is_capturing(streams[i]),
                    "barrier_on_stream: the stream is capturing a CUDA graph; the barrier cannot be captured (call "
                    "it outside the graph, or use the device API's barrier inside a kernel)");
  }
  for (int i = 0; i < local_count(); ++i) {
    DeviceScope on(group_.devices[i]);
    const int me = rank(i);
    const uint64_t gen = ++barrier_generation_[i];
    uint64_t* slot =
        &reinterpret_cast<device::HeapSync*>(at(me, 0))->staging[staging_next_[i]++ % device::kStagingSlots];
    dma::mem_ops(streams[i], {MemOp{MemOp::Kind::kWrite, slot, gen}});
    std::vector<Copy> announce;  // one submission for every peer: the host's time per barrier is most of it
    for (int p = 0; p < world(); ++p) {
      if (p == me) continue;
      auto* peer_sync = reinterpret_cast<device::HeapSync*>(at(p, 0));
      announce.push_back(Copy{&peer_sync->stream_arrivals[me], slot, sizeof(uint64_t)});
    }
    if (!announce.empty()) dma::copy_batch(streams[i], announce);
  }
  for (int i = 0; i < local_count(); ++i) {
    DeviceScope on(group_.devices[i]);
    const int me = rank(i);
    auto* own = reinterpret_cast<device::HeapSync*>(at(me, 0));
    for (int p = 0; p < world(); ++p)
      if (p != me) watch(i, &own->stream_arrivals[p], barrier_generation_[i], p, "barrier_on_stream", streams[i]);
  }
}

void SymmetricHeap::watch(int local, const uint64_t* word, uint64_t value, int from, const char* what,
                          cudaStream_t stream) {
  // A captured wait runs when the graph does; the watcher cannot see that.
  if (dma::is_capturing(stream)) {
    dma::mem_ops(stream, {MemOp{MemOp::Kind::kWaitAtLeast, word, value}});
    return;
  }
  // The clock starts when the stream reaches the wait (`reached`), not when it
  // is enqueued: work queued before it may take longer than the timeout.
  Watched w{local, nullptr, nullptr, const_cast<uint64_t*>(word), value, from, what, 0};
  {
    std::lock_guard<std::mutex> lock(watch_mu_);
    auto& spare = spare_events_[local];
    for (cudaEvent_t* e : {&w.reached, &w.passed}) {
      if (spare.empty()) break;
      *e = spare.back();
      spare.pop_back();
    }
  }
  try {
    if (!w.reached) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&w.reached, cudaEventDisableTiming));
    if (!w.passed) FERRY_CUDA_CHECK(cudaEventCreateWithFlags(&w.passed, cudaEventDisableTiming));
    FERRY_CUDA_CHECK(cudaEventRecord(w.reached, stream));
    dma::mem_ops(stream, {MemOp{MemOp::Kind::kWaitAtLeast, word, value}});
    FERRY_CUDA_CHECK(cudaEventRecord(w.passed, stream));
  } catch (...) {
    // An event is recorded afresh each time it is taken again: back to the pool.
    std::lock_guard<std::mutex> lock(watch_mu_);
    for (cudaEvent_t e : {w.reached, w.passed})
      if (e) spare_events_[local].push_back(e);
    throw;
  }
  std::lock_guard<std::mutex> lock(watch_mu_);
  watched_.push_back(w);
  watch_cv_.notify_all();
}

// Stream waits past their deadline are released (a copy engine writes the
// value they wait for into the word, on a stream the heap made for this) and
// leave the fault check() raises: a peer that never signals costs a timeout,
// never a hang. Once a fault is set, every wait the stream has reached is
// released at the next look, so a queue of them costs one timeout. No CUDA
// call is made under the lock, so a thread adding a wait never waits for one.
void SymmetricHeap::watcher_loop() {
  // The watcher queries events while the user's threads may capture CUDA
  // graphs in the global mode; in relaxed mode its calls never invalidate them.
  RelaxedCaptureScope relaxed;
  std::vector<Watched> mine;
  unsigned next_slot = 0;
  // `why`: what the debug log says; null while closing (no fault is left then).
  auto release = [&](Watched& w, const char* why) {
    const bool closing = why == nullptr;
    // A stream write on the greatest-priority stream, as the communicator's
    // watchdog opens its gates (proven on the GPU); a copy from pinned memory
    // if the write cannot be queued.
    try {
      dma::mem_ops(rescue_[w.local], {MemOp{MemOp::Kind::kWrite, w.word, w.value}});
      debug_log(std::string("symmetric heap: released a stream's ") + w.what + " on local rank " +
                std::to_string(w.local) + (closing ? " (closing)" : why));
    } catch (const std::exception& e) {
      uint64_t* value = &rescue_values_[w.local][next_slot++ % kRescueSlots];
      *value = w.value;
      const cudaError_t err =
          cudaMemcpyAsync(w.word, value, sizeof(uint64_t), cudaMemcpyHostToDevice, rescue_[w.local]);
      if (err != cudaSuccess) cudaGetLastError();
      debug_log(std::string("symmetric heap: the stream write releasing a ") + w.what + " failed (" + e.what() +
                "); a copy released it: " + cudaGetErrorName(err));
    }
    if (closing) return;
    const auto kind = w.what[0] == 'b' ? device::WaitKind::kStreamBarrier : device::WaitKind::kStreamWait;
    unsigned long long expected = 0;
    __atomic_compare_exchange_n(fault_[w.local], &expected,
                                static_cast<unsigned long long>(device::heap_fault_word(kind, w.from)), false,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  };
  auto done = [](cudaEvent_t e) {
    const cudaError_t q = cudaEventQuery(e);
    if (q != cudaSuccess) cudaGetLastError();
    return q == cudaSuccess;
  };
  bool stopping = false;
  while (!stopping) {
    {
      std::unique_lock<std::mutex> lock(watch_mu_);
      watch_cv_.wait_for(lock, std::chrono::milliseconds(watched_.empty() && mine.empty() ? 200 : 5));
      stopping = stop_watcher_;
      mine.insert(mine.end(), watched_.begin(), watched_.end());
      watched_.clear();
    }
    const double t = steady_seconds();
    for (size_t i = 0; i < mine.size();) {
      Watched& w = mine[i];
      if (cudaSetDevice(group_.devices[w.local]) != cudaSuccess) cudaGetLastError();
      if (stopping) {
        // Closing with waits still queued: let them go before the memory they
        // watch is unmapped, so that no stream waits on unmapped memory.
        if (!done(w.passed)) release(w, nullptr);
      } else if (!done(w.passed)) {
        if (w.deadline == 0 && done(w.reached)) {
          w.deadline = t + group_.timeout_s;
          debug_log(std::string("symmetric heap: a stream reached its ") + w.what + " on local rank " +
                    std::to_string(w.local) + "; released in " + std::to_string(group_.timeout_s) +
                    " s unless it passes");
        }
        // Once a wait of this rank has given up the heap is out of step, and
        // waits queued behind it would each hold their stream a whole timeout.
        const bool faulted = *reinterpret_cast<volatile unsigned long long*>(fault_[w.local]) & device::kHeapFaultBit;
        if (w.deadline == 0 || (t < w.deadline && !faulted)) {
          ++i;
          continue;
        }
        release(w, t < w.deadline ? " after an earlier wait gave up" : " past the timeout");
      }
      if (stopping) {
        cudaEventDestroy(w.reached);
        cudaEventDestroy(w.passed);
      } else {
        std::lock_guard<std::mutex> lock(watch_mu_);
        spare_events_[w.local].push_back(w.reached);
        spare_events_[w.local].push_back(w.passed);
      }
      mine.erase(mine.begin() + static_cast<long>(i));
    }
  }
  // The releases' writes land before their memory goes; bounded, for a
  // rescue stream that shares a hardware queue with a stream held elsewhere.
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(group_.timeout_s);
  for (size_t i = 0; i < rescue_.size(); ++i) {
    if (cudaSetDevice(group_.devices[i]) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    cudaError_t q;
    while ((q = cudaStreamQuery(rescue_[i])) == cudaErrorNotReady && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (q != cudaSuccess) cudaGetLastError();
  }
}

}  // namespace ferry
