// ferry._hooks: what the tests and the benchmarks reach into, kept out of the
// library and the extension users load. A kernel that spins and then fires a
// device trigger, a host trigger at a given instant, a kernel that holds
// every SM, and single launches of the production kernels a benchmark times
// alone (a local copy, a reduction).
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <time.h>

#include <cstdint>
#include <string>
#include <utility>

#include "coll/flags.hpp"
#include "coll/local_copy.hpp"
#include "coll/reduce.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "sm_holder.hpp"
#include "trigger_kernel.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

long long monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

}  // namespace

NB_MODULE(_hooks, m) {
  // Tests and `ferry bench --prelaunch`: a kernel that spins, then fires a device trigger.
  m.def(
      "launch_trigger_kernel",
      [](uintptr_t word, uint64_t value, long long spin_ns, uintptr_t stream) {
        ferry::launch_trigger_kernel(reinterpret_cast<uint64_t*>(word), value, spin_ns,
                                     reinterpret_cast<cudaStream_t>(stream));
      },
      "word"_a, "value"_a, "spin_ns"_a, "stream"_a);
  // `ferry bench --prelaunch`: spins until CLOCK_MONOTONIC reaches start_ns
  // (one instant for every process of the host), calls `trigger` (a prepared
  // collective's host trigger; its Python call costs about a microsecond more
  // than the trigger itself), spins until `event` (the run's end,
  // Communicator.finished_event) completes, and returns (trigger_ns,
  // done_ns). Every spin is bounded by FERRY_TIMEOUT_S.
  m.def(
      "timed_trigger",
      [](nb::callable trigger, uintptr_t event, long long start_ns) {
        const long long bound_ns = static_cast<long long>(ferry::knob_float("FERRY_TIMEOUT_S") * 1e9);
        FERRY_ARG_CHECK(start_ns - monotonic_ns() <= bound_ns,
                        "timed_trigger: start_ns is more than FERRY_TIMEOUT_S ahead of CLOCK_MONOTONIC");
        {
          // The GIL is taken back 50 us early, so that its wait is not in the time.
          nb::gil_scoped_release release;
          while (monotonic_ns() < start_ns - 50000) {
          }
        }
        while (monotonic_ns() < start_ns) {
        }
        const long long t0 = monotonic_ns();
        trigger();
        nb::gil_scoped_release release;
        auto ev = reinterpret_cast<cudaEvent_t>(event);
        cudaError_t err;
        while ((err = cudaEventQuery(ev)) == cudaErrorNotReady && monotonic_ns() - t0 < bound_ns) {
        }
        const long long t1 = monotonic_ns();
        if (err == cudaErrorNotReady)
          ferry::throw_error(FERRY_ERROR_TIMEOUT,
                             "timed_trigger: the collective did not finish within FERRY_TIMEOUT_S");
        if (err != cudaSuccess) ferry::throw_error(FERRY_ERROR_CUDA, "timed_trigger: the collective failed");
        return std::make_pair(t0, t1);
      },
      "trigger"_a, "event"_a, "start_ns"_a);
  // Tests: every SM of the current GPU held by spinning blocks (coll/sm_holder.hpp).
  nb::class_<ferry::SmHolder>(m, "SmHolder")
      .def(nb::init<>())
      .def(
          "hold",
          [](ferry::SmHolder& h, uintptr_t stream, double max_s) {
            nb::gil_scoped_release release;
            h.hold(reinterpret_cast<cudaStream_t>(stream), max_s);
          },
          "stream"_a, "max_s"_a)
      .def("release", &ferry::SmHolder::release)
      .def_prop_ro("blocks", &ferry::SmHolder::blocks);
  // For measurements (python -m ferry.bench.kv, the field's approach): `count`
  // copies (host arrays of destinations, sources and sizes at these
  // addresses) in one cudaMemcpyBatchAsync call, whatever their number, as
  // vLLM submits a transfer; sources read in any order with `any_order`.
  m.def(
      "memcpy_batch_once",
      [](uintptr_t dsts, uintptr_t srcs, uintptr_t sizes, size_t count, bool any_order, uintptr_t stream) {
        if (count == 0) return;
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = any_order ? cudaMemcpySrcAccessOrderAny : cudaMemcpySrcAccessOrderStream;
        attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t attr_idx = 0;
        FERRY_CUDA_CHECK(cudaMemcpyBatchAsync(reinterpret_cast<void**>(dsts), reinterpret_cast<const void**>(srcs),
                                              reinterpret_cast<size_t*>(sizes), count, &attr, &attr_idx, 1,
                                              reinterpret_cast<cudaStream_t>(stream)));
      },
      "dsts"_a, "srcs"_a, "sizes"_a, "count"_a, "any_order"_a, "stream"_a);
  // For measurements (ferry bench --local-copy): one copy within a GPU, by `how`.
  m.def(
      "copy_local",
      [](uintptr_t dst, uintptr_t src, size_t bytes, const std::string& how, uintptr_t stream) {
        ferry::copy_local(ferry::Copy{reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes},
                          ferry::parse_local_copy(how, "how"), reinterpret_cast<cudaStream_t>(stream));
      },
      "dst"_a, "src"_a, "bytes"_a, "how"_a, "stream"_a);
  // For measurements (python -m ferry.bench.reduce_kernel): the reduction
  // kernel of reduce_scatter and all_reduce on one GPU, `world` sources in
  // rank order (`own` for this rank's, slots of `scratch` for the others).
  m.def(
      "reduce_local",
      [](uintptr_t out, uintptr_t own, uintptr_t scratch, size_t slot_stride, int rank, int world, size_t count,
         const std::string& dtype, const std::string& op, uintptr_t stream, int max_blocks) {
        FERRY_ARG_CHECK(world >= 1 && world <= ferry::kMaxRanks,
                        "world is " + std::to_string(world) + "; expected 1.." + std::to_string(ferry::kMaxRanks));
        FERRY_ARG_CHECK(rank >= 0 && rank < world,
                        "rank is " + std::to_string(rank) + "; expected 0.." + std::to_string(world - 1));
        ferry::ReduceStep s{reinterpret_cast<void*>(out),
                            reinterpret_cast<const void*>(own),
                            reinterpret_cast<const char*>(scratch),
                            slot_stride,
                            rank,
                            world,
                            count,
                            ferry::parse_dtype(dtype, "dtype"),
                            ferry::parse_red_op(op, "op"),
                            max_blocks};
        ferry::launch_reduce(s, reinterpret_cast<cudaStream_t>(stream));
      },
      "out"_a, "own"_a, "scratch"_a, "slot_stride"_a, "rank"_a, "world"_a, "count"_a, "dtype"_a, "op"_a, "stream"_a,
      "max_blocks"_a);
}
