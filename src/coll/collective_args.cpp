#include "coll/collective_args.hpp"

#include "core/error.hpp"

namespace ferry {

namespace {

// Null is the legacy default stream, which cudaStreamLegacy also names.
cudaStream_t same_as(cudaStream_t s) { return s == nullptr ? cudaStreamLegacy : s; }

}  // namespace

void check_own_streams(const char* op, const std::vector<int>& ranks, const std::vector<int>& devices,
                       const std::vector<cudaStream_t>& streams) {
  for (size_t i = 0; i < streams.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (devices[i] == devices[j] && same_as(streams[i]) == same_as(streams[j]))
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    std::string(op) + ": stream: ranks " + std::to_string(ranks[j]) + " and " +
                        std::to_string(ranks[i]) + " share GPU " + std::to_string(devices[i]) +
                        " and one stream; with FERRY_SHARED_GPUS every rank needs a stream of its own (pass "
                        "stream=[...] in Python, one stream per rank in C)");
}

}  // namespace ferry
