// The device gate slots of one local rank (DeviceFlags::gates): which a new
// prepared collective may take, and those of released ones waiting for their
// last run to finish. A slot comes back only then: that run's trigger write is
// known to have landed, so a late write can never open another handle's run.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <utility>
#include <vector>

namespace ferry {

class GateSlots {
 public:
  // Whether an event has completed; destroys one. CUDA's by default (tests pass their own).
  using Finished = std::function<bool(cudaEvent_t)>;
  using Destroy = std::function<void(cudaEvent_t)>;
  explicit GateSlots(int count, Finished finished = {}, Destroy destroy = {});

  // A free slot, after taking back those whose last run finished. Throws
  // FERRY_ERROR_INVALID_ARGUMENT, naming the limit, when none is free.
  int take();
  // `slot` comes back once `last_run` has completed; the event is then
  // destroyed (it belongs to this object from now on).
  void retire(int slot, cudaEvent_t last_run);
  // A slot taken for a prepared collective that never came to exist (a
  // later step of prepare() failed): nothing can have written its gate, so
  // it comes back at once.
  void put_back(int slot);
  // Takes back the slots whose last run has completed.
  void reclaim();
  // Destroys the events of slots still waiting (close(), with their GPU current).
  void drop_retiring();
  size_t free_count() const { return free_.size(); }

 private:
  int count_;
  Finished finished_;
  Destroy destroy_;
  std::vector<int> free_;
  std::vector<std::pair<int, cudaEvent_t>> retiring_;
};

}  // namespace ferry
