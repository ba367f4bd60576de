// Relays' staging buffers on a symmetric heap over the engine's GPUs
// (relay_staging.hpp), or the fallback where the heap cannot be had.
#include <exception>

#include "core/log.hpp"
#include "symm/heap.hpp"
#include "xfer/relay_staging.hpp"

namespace ferry {
namespace xfer {

namespace {

class HeapStaging final : public RelayStaging {
 public:
  std::string where() const override {
    return "a symmetric heap over " + std::to_string(heap_->world()) + " GPU(s), " + std::to_string(bytes_) +
           " bytes each, " + std::to_string(heap_->mapped()) + " mapped";
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
  const StagingLayout layout = plan_relay_staging(devices, need, bytes);
  if (layout.gpus.empty()) return plain(devices, need, bytes, buffers, why);
  try {
    Group group;
    group.world = static_cast<int>(layout.gpus.size());
    group.devices = layout.gpus;
    for (int r = 0; r < group.world; ++r) group.ranks.push_back(r);
    auto s = std::make_unique<HeapStaging>();
    // Memory only: no words in front of the buffers, no kernel, no device
    // work (the engine runs on copy engines alone). The buffers are the
    // heap's one allocation, at offset 0, mapped in one chunk.
    s->heap_ = SymmetricHeap::create(group, layout.bytes_per_gpu, layout.bytes_per_gpu, /*words=*/false);
    const size_t offset = s->heap_->alloc(layout.bytes_per_gpu, size_t{64} << 10, {});
    s->bytes_ = layout.bytes_per_gpu;
    buffers->assign(devices.size(), {});
    why->assign(devices.size(), "");
    for (size_t l = 0; l < devices.size(); ++l)
      for (size_t at : layout.offsets[l]) (*buffers)[l].push_back(s->heap_->at(layout.gpu_of[l], offset + at));
    return s;
  } catch (const std::exception& e) {
    debug_log(std::string("multipath: staging buffers as plain allocations: the symmetric heap could not be had: ") +
              e.what());
  }
  return plain(devices, need, bytes, buffers, why);
}

}  // namespace xfer
}  // namespace ferry
