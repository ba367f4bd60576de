// Pure helpers of the command layer, tested on the CPU.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace ferry {

// One copy: `bytes` from `src` to `dst` (any two device-visible addresses).
struct Copy {
  void* dst;
  const void* src;
  size_t bytes;
};

// `rows` rows of `width` bytes: row i from src + i * src_pitch to
// dst + i * dst_pitch (each pitch at least `width`). One row is a plain
// copy. A copy engine takes the rows as one command (cudaMemcpy2DAsync), so
// rows cost the host one call instead of one per row.
struct PitchedCopy {
  void* dst;
  const void* src;
  size_t width;
  size_t rows = 1;
  size_t dst_pitch = 0;
  size_t src_pitch = 0;
  size_t bytes() const { return width * rows; }
  // Row i as a plain copy.
  Copy row(size_t i) const {
    return Copy{static_cast<char*>(dst) + i * dst_pitch, static_cast<const char*>(src) + i * src_pitch, width};
  }
};

// Half-open index ranges [begin, end) covering `count` items in runs of at most
// `batch_max` (>= 1). Large batches have crashed drivers, so every batched
// submission is bounded.
std::vector<std::pair<size_t, size_t>> split_batches(size_t count, size_t batch_max);

// How a list of copies gets submitted on one stream.
enum class Submission { kBatched, kPerCopy };

// Batched unless: the caller disabled it, the stream is capturing a graph
// (cudaMemcpyBatchAsync cannot be captured on CUDA 13.0), the stream is the
// legacy default stream (not allowed), or the driver lacks the call.
Submission choose_submission(bool disabled, bool capturing, bool legacy_stream, bool driver_has_batch);

}  // namespace ferry
