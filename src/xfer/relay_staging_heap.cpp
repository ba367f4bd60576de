// Relays' staging buffers on a symmetric heap over the engine's GPUs
// (relay_staging.hpp), or the fallback where the heap cannot be had.
#include <algorithm>
#include <exception>

#include "core/log.hpp"
#include "symm/heap.hpp"
#include "xfer/relay_staging.hpp"

namespace ferry {
namespace xfer {

namespace {

// Buffers start on 64 KiB boundaries, as the driver's allocations at least do.
constexpr size_t kStagingAlign = size_t{64} << 10;

class HeapStaging final : public RelayStaging {
 public:
  std::string where() const override {
    return "a symmetric heap over " + std::to_string(heap_->world()) + " GPU(s), " + std::to_string(bytes_) +
           " bytes each";
  }
  ~HeapStaging() override {
    try {
      if (heap_) heap_->close();
    } catch (const std::exception&) {
    }
  }
  std::unique_ptr<SymmetricHeap> heap_;
  size_t bytes_ = 0;  // of the one allocation, on each GPU
};

}  // namespace

std::unique_ptr<RelayStaging> RelayStaging::make(const std::vector<int>& devices, const std::vector<int>& need,
                                                 size_t bytes, std::vector<std::vector<char*>>* buffers,
                                                 std::vector<std::string>* why) {
  // The GPUs that relay, and the most buffers any one of them holds
  // (loopback relays put several links' buffers on one GPU).
  std::vector<int> gpus, count;
  for (size_t l = 0; l < devices.size(); ++l) {
    if (need[l] <= 0) continue;
    const auto it = std::find(gpus.begin(), gpus.end(), devices[l]);
    if (it == gpus.end()) {
      gpus.push_back(devices[l]);
      count.push_back(need[l]);
    } else {
      count[it - gpus.begin()] += need[l];
    }
  }
  if (gpus.empty()) return plain(devices, need, bytes, buffers, why);
  const size_t stride = (bytes + kStagingAlign - 1) / kStagingAlign * kStagingAlign;
  const size_t total = stride * static_cast<size_t>(*std::max_element(count.begin(), count.end()));
  try {
    Group group;
    group.world = static_cast<int>(gpus.size());
    group.devices = gpus;
    for (int r = 0; r < group.world; ++r) group.ranks.push_back(r);
    auto s = std::make_unique<HeapStaging>();
    // Address space for the heap's front and the buffers, all of it mapped
    // once the buffers are allocated. Memory only: no kernel, no device work
    // (the engine runs on copy engines alone).
    s->heap_ = SymmetricHeap::create(group, device::kHeapReservedBytes + total + kStagingAlign, total,
                                     /*words=*/false);
    const size_t offset = s->heap_->alloc(total, kStagingAlign, {});
    s->bytes_ = total;
    buffers->assign(devices.size(), {});
    why->assign(devices.size(), "");
    std::vector<size_t> next(gpus.size(), 0);
    for (size_t l = 0; l < devices.size(); ++l) {
      if (need[l] <= 0) continue;
      const size_t r = std::find(gpus.begin(), gpus.end(), devices[l]) - gpus.begin();
      for (int k = 0; k < need[l]; ++k)
        (*buffers)[l].push_back(s->heap_->at(static_cast<int>(r), offset + stride * next[r]++));
    }
    return s;
  } catch (const std::exception& e) {
    debug_log(std::string("multipath: staging buffers as plain allocations: the symmetric heap could not be had: ") +
              e.what());
  }
  return plain(devices, need, bytes, buffers, why);
}

}  // namespace xfer
}  // namespace ferry
