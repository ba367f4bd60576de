#include "dma/batch_plan.hpp"

#include <algorithm>

#include "core/error.hpp"

namespace ferry {

std::vector<std::pair<size_t, size_t>> split_batches(size_t count, size_t batch_max) {
  FERRY_ARG_CHECK(batch_max >= 1, "batch_max must be at least 1");
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t b = 0; b < count; b += batch_max) out.emplace_back(b, std::min(count, b + batch_max));
  return out;
}

size_t inline_batch_size(size_t count, size_t batch_max) {
  FERRY_ARG_CHECK(batch_max >= 1, "batch_max must be at least 1");
  constexpr size_t kCalls = 4, kLeast = 8;
  return std::min(batch_max, std::max(kLeast, (count + kCalls - 1) / kCalls));
}

Submission choose_submission(bool disabled, bool capturing, bool legacy_stream, bool driver_has_batch) {
  if (disabled || capturing || legacy_stream || !driver_has_batch) return Submission::kPerCopy;
  return Submission::kBatched;
}

}  // namespace ferry
