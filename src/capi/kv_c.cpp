// The C API of paged KV transfers (include/ferry/kv.h): a thin shim over
// src/xfer/.
#include <algorithm>
#include <memory>

#include "capi/guarded.hpp"
#include "core/env.hpp"
#include "ferry/kv.h"
#include "xfer/host_pool.hpp"
#include "xfer/page_copy.hpp"

static_assert(FERRY_KV_PER_PAGE == 1 + static_cast<int>(ferry::xfer::PageStrategy::kPerPage) &&
                  FERRY_KV_KERNEL == 1 + static_cast<int>(ferry::xfer::PageStrategy::kKernel),
              "ferry_kv_mode_t");

struct ferry_host_pool {
  std::shared_ptr<ferry::xfer::HostPool> impl;
};

struct ferry_kv_prepared {
  std::unique_ptr<ferry::xfer::PreparedPages> impl;
};

namespace {

ferry::xfer::PageSide side_of(const ferry_kv_region_t* regions, size_t n, const char* name) {
  FERRY_ARG_CHECK(regions || n == 0, std::string(name) + " is NULL");
  ferry::xfer::PageSide s;
  for (size_t i = 0; i < n; ++i)
    s.regions.push_back(ferry::xfer::PageRegion{reinterpret_cast<uintptr_t>(regions[i].base), regions[i].page_stride,
                                                regions[i].page_bytes, regions[i].pages});
  return s;
}

ferry::xfer::PreparedPages& prepared_of(ferry_kv_prepared_t p) {
  FERRY_ARG_CHECK(p && p->impl, "prepared is NULL");
  return *p->impl;
}

}  // namespace

ferry_result_t ferry_kv_copy_blocks(int device, const ferry_kv_region_t* dst, const ferry_kv_region_t* src,
                                    size_t regions, const int64_t* dst_ids, const int64_t* src_ids, size_t count,
                                    ferry_kv_mode_t mode, unsigned flags, ferry_stream_t stream) {
  return ferry::capi::guarded([&] {
    const int how = ferry::capi::enum_in(mode, FERRY_KV_AUTO, FERRY_KV_KERNEL, "mode is not a ferry_kv_mode_t");
    FERRY_ARG_CHECK(device >= 0, "device must be a CUDA device ordinal");
    constexpr unsigned known =
        FERRY_KV_ZERO_SM | FERRY_KV_URGENT | FERRY_KV_SETTLED_SOURCE | FERRY_KV_SLICED | FERRY_KV_UNPITCHED;
    FERRY_ARG_CHECK((flags & ~known) == 0, "flags has bits that are no FERRY_KV_* flag (" +
                                               std::to_string(flags & ~known) +
                                               "); combine FERRY_KV_ZERO_SM, "
                                               "FERRY_KV_URGENT, FERRY_KV_SETTLED_SOURCE, FERRY_KV_SLICED and "
                                               "FERRY_KV_UNPITCHED");
    ferry::xfer::PageCopyOptions o;
    if (how != FERRY_KV_AUTO) o.strategy = static_cast<ferry::xfer::PageStrategy>(how - 1);
    o.zero_sm = flags & FERRY_KV_ZERO_SM;
    o.urgent = flags & FERRY_KV_URGENT;
    o.settled_source = flags & FERRY_KV_SETTLED_SOURCE;
    o.pitched = !(flags & FERRY_KV_UNPITCHED);
    if (flags & FERRY_KV_SLICED) o.slice_bytes = static_cast<size_t>(ferry::knob_int_in("FERRY_KV_SLICE_BYTES"));
    ferry::xfer::PageCopier::on(device).copy(
        side_of(dst, regions, "dst"), side_of(src, regions, "src"), ferry::xfer::PageIds{dst_ids, count, true},
        ferry::xfer::PageIds{src_ids, count, true}, o, static_cast<cudaStream_t>(stream));
  });
}

ferry_result_t ferry_kv_prepare(int device, const ferry_kv_region_t* dst, const ferry_kv_region_t* src, size_t regions,
                                const int64_t* dst_ids, const int64_t* src_ids, size_t count, ferry_kv_mode_t mode,
                                unsigned flags, ferry_kv_prepared_t* prepared) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(prepared, "prepared is NULL");
    *prepared = nullptr;
    FERRY_ARG_CHECK(device >= 0, "device must be a CUDA device ordinal");
    const int how = ferry::capi::enum_in(mode, FERRY_KV_AUTO, FERRY_KV_KERNEL, "mode is not a ferry_kv_mode_t");
    FERRY_ARG_CHECK(how != FERRY_KV_KERNEL && how != FERRY_KV_AUTO,
                    std::string("mode is ") + (how == FERRY_KV_AUTO ? "FERRY_KV_AUTO" : "FERRY_KV_KERNEL") +
                        "; a prepared transfer runs on copy engines (an armed kernel would hold its SMs while it "
                        "waits): FERRY_KV_BATCHED, FERRY_KV_STREAMS or FERRY_KV_PER_PAGE");
    constexpr unsigned allowed = FERRY_KV_ZERO_SM | FERRY_KV_UNPITCHED;
    FERRY_ARG_CHECK((flags & ~allowed) == 0,
                    "flags has bits a prepared transfer does not take (" + std::to_string(flags & ~allowed) +
                        "); it takes FERRY_KV_UNPITCHED and FERRY_KV_ZERO_SM (always true of it)");
    const auto strategy =
        how == FERRY_KV_PER_PAGE ? ferry::xfer::PageStrategy::kPerPage : ferry::xfer::PageStrategy::kBatched;
    auto impl = std::make_unique<ferry::xfer::PreparedPages>(
        device, side_of(dst, regions, "dst"), side_of(src, regions, "src"), ferry::xfer::PageIds{dst_ids, count, true},
        ferry::xfer::PageIds{src_ids, count, true}, strategy, true, !(flags & FERRY_KV_UNPITCHED));
    *prepared = new ferry_kv_prepared{std::move(impl)};
  });
}

ferry_result_t ferry_kv_prepared_arm(ferry_kv_prepared_t prepared, ferry_stream_t after) {
  return ferry::capi::guarded([&] { prepared_of(prepared).arm(static_cast<cudaStream_t>(after)); });
}

ferry_result_t ferry_kv_prepared_trigger(ferry_kv_prepared_t prepared) {
  return ferry::capi::guarded([&] { prepared_of(prepared).trigger(); });
}

ferry_result_t ferry_kv_prepared_trigger_on(ferry_kv_prepared_t prepared, ferry_stream_t stream) {
  return ferry::capi::guarded([&] { prepared_of(prepared).trigger_on(static_cast<cudaStream_t>(stream)); });
}

ferry_result_t ferry_kv_prepared_device_trigger(ferry_kv_prepared_t prepared, ferry_trigger_t* trigger) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(trigger, "trigger is NULL");
    auto [word, value] = prepared_of(prepared).device_trigger();
    trigger->word = reinterpret_cast<unsigned long long*>(word);
    trigger->value = value;
  });
}

ferry_result_t ferry_kv_prepared_wait(ferry_kv_prepared_t prepared, ferry_stream_t stream) {
  return ferry::capi::guarded([&] { prepared_of(prepared).wait(static_cast<cudaStream_t>(stream)); });
}

ferry_result_t ferry_kv_prepared_synchronize(ferry_kv_prepared_t prepared, double timeout_s) {
  return ferry::capi::guarded([&] {
    // (nan, infinity or past 1e6 s: a wait without end)
    FERRY_ARG_CHECK(timeout_s >= 0 && timeout_s <= ferry::kMaxTimeoutS,
                    "timeout_s is " + std::to_string(timeout_s) + "; expected 0 to " +
                        std::to_string(ferry::kMaxTimeoutS) + " seconds");
    prepared_of(prepared).synchronize(timeout_s);
  });
}

ferry_result_t ferry_kv_prepared_sizes(ferry_kv_prepared_t prepared, size_t* bytes, size_t* copies) {
  return ferry::capi::guarded([&] {
    const auto& p = prepared_of(prepared);
    if (bytes) *bytes = p.bytes();
    if (copies) *copies = p.copies();
  });
}

ferry_result_t ferry_kv_prepared_destroy(ferry_kv_prepared_t prepared) {
  if (!prepared) return FERRY_SUCCESS;  // as free(NULL); the last error stays
  return ferry::capi::guarded([&] { delete prepared; });
}

ferry_result_t ferry_host_pool_create(size_t bytes, int device, ferry_host_pool_t* pool) {
  return ferry::capi::guarded([&] {
    FERRY_ARG_CHECK(pool, "pool is NULL");
    *pool = nullptr;
    FERRY_ARG_CHECK(device >= 0, "device must be a CUDA device ordinal");
    auto p = ferry::xfer::HostPool::create(bytes, ferry::xfer::HostPoolOptions{device, -2, -1});
    *pool = new ferry_host_pool{std::move(p)};
  });
}

void* ferry_host_pool_data(ferry_host_pool_t pool) { return pool && pool->impl ? pool->impl->data() : nullptr; }

ferry_result_t ferry_host_pool_destroy(ferry_host_pool_t pool) {
  if (!pool) return FERRY_SUCCESS;  // as free(NULL); the last error stays
  return ferry::capi::guarded([&] {
    pool->impl->close();
    delete pool;
  });
}
