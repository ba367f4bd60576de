#include "symm/registration.hpp"

#include <unistd.h>

#include <algorithm>
#include <string>

#include "core/driver.hpp"
#include "core/error.hpp"
#include "symm/heap_plan.hpp"
#include "symm/peer_buffer.hpp"

namespace ferry {

namespace {

// True and a retained handle when `a` is mapped VMM memory.
bool retain(CUdeviceptr a, CUmemGenericAllocationHandle* h) {
  return driver().MemRetainAllocationHandle(h, reinterpret_cast<void*>(a)) == CUDA_SUCCESS;
}

// The handle's allocation lives on GPU `device`; whether it is exportable.
bool check_piece(CUmemGenericAllocationHandle h, int device, const std::string& what) {
  CUmemAllocationProp prop{};
  FERRY_CU_CHECK(driver().MemGetAllocationPropertiesFromHandle(&prop, h));
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE || prop.location.id != device)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                what + " is memory of " +
                    (prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? "GPU " + std::to_string(prop.location.id)
                                                                       : std::string("the host")) +
                    "; expected memory of GPU " + std::to_string(device));
  return (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
}

}  // namespace

bool is_vmm_memory(const void* ptr) {
  CUmemGenericAllocationHandle h = 0;
  if (!retain(reinterpret_cast<CUdeviceptr>(ptr), &h)) return false;
  driver().MemRelease(h);
  return true;
}

VmmBuffer find_vmm_buffer(const void* ptr, size_t bytes, int device, const char* what_c) {
  const std::string what(what_c);
  const DriverApi& cu = driver();
  FERRY_ARG_CHECK(ptr != nullptr, what + " is a null pointer");
  FERRY_ARG_CHECK(bytes > 0, what + " has 0 bytes; expected at least one");
  // Every allocation is a whole number of this device's smallest granules
  // and mapped at a multiple of it, so a walk in such steps sees every piece.
  CUmemAllocationProp probe{};
  probe.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  probe.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  probe.location.id = device;
  size_t step = 0;
  FERRY_CU_CHECK(cu.MemGetAllocationGranularity(&step, &probe, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  const CUdeviceptr a0 = reinterpret_cast<CUdeviceptr>(ptr), end = a0 + bytes;
  VmmBuffer b;
  VmmPiece cur;
  if (!retain(a0, &cur.handle))
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                what +
                    " is not memory that CUDA's virtual memory management made (cuMemCreate: PyTorch's allocator "
                    "with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or a ferry heap); memory from "
                    "cudaMalloc cannot be mapped at a second address: allocate it on the heap instead");
  try {
    b.exportable = check_piece(cur.handle, device, what);
    // Back to where this allocation's mapping starts.
    cur.start = a0 / step * step;
    for (;;) {
      CUmemGenericAllocationHandle h = 0;
      if (cur.start < step || !retain(cur.start - step, &h)) break;
      cu.MemRelease(h);
      if (h != cur.handle) break;
      cur.start -= step;
    }
    // Forward, piece by piece, to the end of the allocation under the last byte.
    CUdeviceptr a = a0 / step * step + step;
    for (;;) {
      CUmemGenericAllocationHandle h = 0;
      const bool mapped = retain(a, &h);
      if (mapped && h == cur.handle) {
        cu.MemRelease(h);
        a += step;
        continue;
      }
      cur.size = a - cur.start;
      b.pieces.push_back(cur);
      cur = VmmPiece{};
      if (a >= end) {
        if (mapped) cu.MemRelease(h);
        break;
      }
      if (!mapped)
        throw_error(FERRY_ERROR_INVALID_ARGUMENT, what + " is not mapped throughout: nothing is mapped " +
                                                      std::to_string(a - a0) + " bytes after its start");
      cur.handle = h;
      cur.start = a;
      if (!check_piece(h, device, what)) b.exportable = false;
      a += step;
    }
  } catch (...) {
    if (cur.handle) cu.MemRelease(cur.handle);
    release_vmm_buffer(b);
    throw;
  }
  b.lead = a0 - b.pieces[0].start;
  return b;
}

void release_vmm_buffer(VmmBuffer& b) {
  if (driver_available())
    for (VmmPiece& p : b.pieces)
      if (p.handle) driver().MemRelease(p.handle);
  b.pieces.clear();
}

VmmView vmm_view_reserve(const std::vector<size_t>& sizes) {
  VmmView v;
  for (size_t s : sizes) v.size += s;
  v.pieces.reserve(sizes.size());  // so that recording a mapped piece cannot throw
  if (v.size) FERRY_CU_CHECK(driver().MemAddressReserve(&v.base, v.size, 0, 0, 0));
  return v;
}

void vmm_view_map(VmmView& v, CUmemGenericAllocationHandle handle, size_t size, int device) {
  const DriverApi& cu = driver();
  if (v.mapped + size > v.size) {
    cu.MemRelease(handle);
    throw_error(FERRY_ERROR_INTERNAL, "a registered piece does not fit the range reserved for it");
  }
  const CUdeviceptr at = v.base + v.mapped;
  CUresult r = cu.MemMap(at, size, 0, handle, 0);
  if (r != CUDA_SUCCESS) {
    cu.MemRelease(handle);
    FERRY_CU_CHECK(r);
  }
  v.pieces.emplace_back(handle, size);
  v.mapped += size;
  vmm_set_access(at, size, {device});
}

void vmm_view_release(VmmView& v) {
  if (driver_available() && v.base) {
    const DriverApi& cu = driver();
    CUdeviceptr at = v.base;
    for (auto& [h, size] : v.pieces) {
      cu.MemUnmap(at, size);
      cu.MemRelease(h);
      at += size;
    }
    cu.MemAddressFree(v.base, v.size);
  }
  v = VmmView{};
}

void LocalFailure::run(const std::function<void()>& step) {
  if (error_) return;
  try {
    step();
  } catch (const std::exception& e) {
    error_ = std::current_exception();
    code_ = error_code(e, FERRY_ERROR_INTERNAL);
    try {
      message_ = e.what();
    } catch (...) {  // out of memory for the message: the rank still answers agree()
    }
  } catch (...) {
    error_ = std::current_exception();
    code_ = FERRY_ERROR_INTERNAL;
    message_ = "an unknown error";
  }
}

void LocalFailure::agree(const Group& g, const char* what) const {
  RegistrationRecord mine;
  mine.kind = '!';
  mine.code = code_;
  mine.error = message_;
  const std::vector<std::string> all = g.allgather(error_ ? encode_registration(mine) : std::string("ok"));
  if (static_cast<int>(all.size()) != g.world)
    throw_error(FERRY_ERROR_INTERNAL, std::string(what) + ": the bootstrap all-gather returned " +
                                          std::to_string(all.size()) + " answers for " + std::to_string(g.world) +
                                          " ranks");
  if (error_) std::rethrow_exception(error_);
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != "ok") {
      const RegistrationRecord theirs = decode_registration(all[r], static_cast<int>(r));
      // The failing rank's message often names the same step ("free: ..."): said once.
      const std::string step = std::string(what) + ": ";
      const bool named = theirs.error.compare(0, step.size(), step) == 0;
      throw_error(
          static_cast<ferry_result_t>(theirs.code),
          step + "rank " + std::to_string(r) + " failed: " + (named ? theirs.error.substr(step.size()) : theirs.error));
    }
}

void exchange_vmm_pieces(const Group& g, const std::vector<int>& mine, const std::vector<size_t>& counts,
                         const std::function<void(int, size_t, CUmemGenericAllocationHandle)>& take,
                         LocalFailure& failure, const std::string& what) {
  const DriverApi& cu = driver();
  const int me = g.ranks[0];
  size_t most = 0;
  for (size_t c : counts) most = std::max(most, c);
  std::vector<int> peers;
  for (int p = 0; p < g.world; ++p)
    if (p != me) peers.push_back(p);
  for (size_t first = 0; first < most; first += kMaxFdsPerMessage) {
    const int tag = g.next_tag();
    std::vector<int> batch;
    for (size_t k = first; k < mine.size() && k < first + kMaxFdsPerMessage; ++k) batch.push_back(mine[k]);
    for (int p : peers) g.fds->send(g.socket_paths[p], p, tag, batch, "", g.timeout_s);
    auto got = g.fds->receive(peers, tag, g.timeout_s, "their " + what);
    for (auto& [p, msg] : got) {
      const size_t expect = counts[p] > first ? std::min<size_t>(kMaxFdsPerMessage, counts[p] - first) : 0;
      failure.run([&] {
        FERRY_ARG_CHECK(msg.fds.size() == expect, "rank " + std::to_string(p) + " sent " +
                                                      std::to_string(msg.fds.size()) + " descriptors for its " + what +
                                                      "; expected " + std::to_string(expect));
      });
      for (size_t j = 0; j < msg.fds.size(); ++j)
        failure.run([&] {
          CUmemGenericAllocationHandle h = 0;
          FERRY_CU_CHECK(cu.MemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(msg.fds[j])),
                                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
          take(p, first + j, h);
        });
    }
    for (auto& [p, msg] : got)
      for (int fd : msg.fds) ::close(fd);
  }
}

}  // namespace ferry
