#include "dma/batch_plan.hpp"

#include "core/error.hpp"

namespace ferry {

std::vector<std::pair<size_t, size_t>> split_batches(size_t count, size_t batch_max) {
  FERRY_ARG_CHECK(batch_max >= 1, "batch_max must be at least 1");
  std::vector<std::pair<size_t, size_t>> out;
  // Steps taken from what is left: b + batch_max can pass 2^64.
  for (size_t b = 0; b < count;) {
    const size_t e = b + std::min(batch_max, count - b);
    out.emplace_back(b, e);
    b = e;
  }
  return out;
}

Submission choose_submission(bool disabled, bool capturing, bool legacy_stream, bool driver_has_batch) {
  if (disabled || capturing || legacy_stream || !driver_has_batch) return Submission::kPerCopy;
  return Submission::kBatched;
}

}  // namespace ferry
