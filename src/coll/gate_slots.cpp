#include "coll/gate_slots.hpp"

#include <string>

#include "core/error.hpp"

namespace ferry {

GateSlots::GateSlots(int count, Finished finished, Destroy destroy)
    : count_(count), finished_(std::move(finished)), destroy_(std::move(destroy)) {
  if (!finished_)
    finished_ = [](cudaEvent_t e) {
      const cudaError_t err = cudaEventQuery(e);
      if (err == cudaErrorNotReady) return false;
      cudaGetLastError();  // an error also ends the wait: the run is over either way
      return true;
    };
  if (!destroy_) destroy_ = [](cudaEvent_t e) { cudaEventDestroy(e); };
  // Handed out from slot 0 up.
  for (int g = count - 1; g >= 0; --g) free_.push_back(g);
}

void GateSlots::reclaim() {
  for (size_t k = 0; k < retiring_.size();) {
    auto [slot, ev] = retiring_[k];
    if (!finished_(ev)) {
      ++k;
      continue;
    }
    destroy_(ev);
    free_.push_back(slot);
    retiring_.erase(retiring_.begin() + static_cast<long>(k));
  }
}

int GateSlots::take() {
  reclaim();
  if (free_.empty())
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, "prepare: " + std::to_string(count_) +
                                                  " prepared collectives exist already on this communicator (or "
                                                  "their last runs are unfinished); release() some first");
  const int slot = free_.back();
  free_.pop_back();
  return slot;
}

void GateSlots::retire(int slot, cudaEvent_t last_run) {
  retiring_.emplace_back(slot, last_run);
  reclaim();
}

void GateSlots::put_back(int slot) { free_.push_back(slot); }

void GateSlots::drop_retiring() {
  for (auto& [slot, ev] : retiring_) destroy_(ev);
  retiring_.clear();
}

}  // namespace ferry
