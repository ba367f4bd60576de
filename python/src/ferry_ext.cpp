// Python bindings: thin. Pointers and streams cross as integers; ferry/comm.py
// turns tensors into them. ferry::Error becomes one of the exception types
// declared here, by result code.
#include <nanobind/nanobind.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <optional>

#include "coll/communicator.hpp"
#include "coll/local_copy.hpp"
#include "coll/reduce.hpp"
#include "coll/selector.hpp"
#include "coll/sm_path.hpp"
#include "coll/tuning.hpp"
#include "core/driver.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/log.hpp"
#include "dma/batch_plan.hpp"
#include "topo/clock_sampler.hpp"
#include "topo/topology.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using ferry::Communicator;

namespace {

struct Exceptions {
  PyObject* base = nullptr;
  PyObject* by_code[16] = {nullptr};
};
Exceptions g_exc;

PyObject* make_exception(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  std::string qual = std::string("ferry._ferry.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qual.c_str(), doc, bases, nullptr);
  m.attr(name) = nb::handle(t);
  return t;
}

void declare_exceptions(nb::module_& m) {
  g_exc.base = make_exception(m, "FerryError", PyExc_RuntimeError, "Base of every ferry error.");
  auto sub = [&](const char* name, PyObject* extra, const char* doc) {
    PyObject* bases = extra ? PyTuple_Pack(2, g_exc.base, extra) : PyTuple_Pack(1, g_exc.base);
    PyObject* t = make_exception(m, name, bases, doc);
    Py_DECREF(bases);
    return t;
  };
  g_exc.by_code[FERRY_ERROR_INVALID_ARGUMENT] = sub("InvalidArgumentError", PyExc_ValueError, "An argument is wrong.");
  g_exc.by_code[FERRY_ERROR_NO_GPU] = sub("NoGpuError", nullptr, "No CUDA driver or GPU.");
  g_exc.by_code[FERRY_ERROR_CUDA] = sub("CudaError", nullptr, "A CUDA call failed.");
  g_exc.by_code[FERRY_ERROR_SYSTEM] = sub("SystemCallError", PyExc_OSError, "An OS call failed.");
  g_exc.by_code[FERRY_ERROR_TIMEOUT] = sub("PeerTimeoutError", PyExc_TimeoutError, "A peer did not arrive in time.");
  g_exc.by_code[FERRY_ERROR_NOT_REGISTERED] = sub("NotRegisteredError", PyExc_ValueError, "Buffer not registered.");
  g_exc.by_code[FERRY_ERROR_CLOSED] = sub("ClosedError", nullptr, "The communicator is closed.");
  g_exc.by_code[FERRY_ERROR_UNSUPPORTED] = sub("UnsupportedError", nullptr, "The machine lacks a needed feature.");
  g_exc.by_code[FERRY_ERROR_BROKEN] = sub("BrokenError", nullptr, "An earlier collective failed.");
  g_exc.by_code[FERRY_ERROR_OUT_OF_MEMORY] =
      sub("OutOfMemoryError", PyExc_MemoryError, "The symmetric heap has no room; the message names the knob.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ferry::Error& e) {
      PyObject* t = g_exc.by_code[e.code()] ? g_exc.by_code[e.code()] : g_exc.base;
      PyErr_SetString(t, e.what());
    }
  });
}

template <typename T>
std::vector<T> as_pointers(const std::vector<uintptr_t>& v) {
  std::vector<T> out;
  for (auto x : v) out.push_back(reinterpret_cast<T>(x));
  return out;
}

ferry::CollOp parse_op(const std::string& op) { return ferry::parse_coll_op(op, "op"); }

// A tuning rule as Python passes it: (op, world, max_bytes, algo, signals).
using RuleTuple = std::tuple<std::string, int, size_t, std::string, std::string>;

// Rules back to Python; no bound (SIZE_MAX) becomes ferry.tune.ANY (2^63 - 1).
std::optional<std::vector<RuleTuple>> rule_tuples(const std::optional<std::vector<ferry::SelectorRule>>& rules) {
  if (!rules) return std::nullopt;
  constexpr size_t kPythonAny = (size_t(1) << 63) - 1;
  std::vector<RuleTuple> out;
  for (const auto& r : *rules)
    out.emplace_back(ferry::coll_op_name(r.op), r.world, std::min(r.max_bytes, kPythonAny), ferry::algo_name(r.algo),
                     ferry::signals_name(r.signals));
  return out;
}

std::vector<ferry::SelectorRule> selector_rules(const std::vector<RuleTuple>& rules) {
  std::vector<ferry::SelectorRule> t;
  for (const auto& [op, world, max_bytes, algo, signals] : rules)
    t.push_back(
        {parse_op(op), world, max_bytes, ferry::parse_algo(algo, "algo"), ferry::parse_signals(signals, "signals")});
  return t;
}

// Every collective crosses as one call: pointers and stream handles as
// integers, names for the enums, and the op-specific fields with defaults.
ferry::CollectiveArgs make_args(const std::string& op, const std::vector<uintptr_t>& outs,
                                const std::vector<uintptr_t>& ins, const std::vector<uintptr_t>& streams, size_t bytes,
                                const std::vector<size_t>& counts, int root, size_t count, const std::string& dtype,
                                const std::string& red_op, const std::string& algo, const std::string& local_copy,
                                const std::string& signals) {
  ferry::CollectiveArgs a;
  a.op = parse_op(op);
  a.outs = as_pointers<void*>(outs);
  a.ins = as_pointers<const void*>(ins);
  a.streams = as_pointers<cudaStream_t>(streams);
  a.bytes_per_rank = bytes;
  a.counts = counts;
  a.root = root;
  a.count = count;
  if (a.op == ferry::CollOp::kReduceScatter || a.op == ferry::CollOp::kAllReduce) {
    a.dtype = ferry::parse_dtype(dtype, "dtype");
    a.red_op = ferry::parse_red_op(red_op, "op");
  }
  a.algo = ferry::parse_algo(algo, "algo");
  a.local_copy = ferry::parse_local_copy(local_copy, "local_copy");
  a.signals = ferry::parse_signals(signals, "signals");
  return a;
}

// Binds `fn(comm, args)` to the Python signature of FERRY_CALL_ARGS, with the
// GIL released while ferry enqueues (it may wait, bounded, for in-flight work).
template <typename Fn>
auto call_with_args(Fn fn) {
  return [fn](Communicator& c, const std::string& op, const std::vector<uintptr_t>& outs,
              const std::vector<uintptr_t>& ins, const std::vector<uintptr_t>& streams, size_t bytes,
              const std::vector<size_t>& counts, int root, size_t count, const std::string& dtype,
              const std::string& red_op, const std::string& algo, const std::string& local_copy,
              const std::string& signals) {
    auto a = make_args(op, outs, ins, streams, bytes, counts, root, count, dtype, red_op, algo, local_copy, signals);
    nb::gil_scoped_release release;
    return fn(c, a);
  };
}

#define FERRY_CALL_ARGS                                                                                                \
  "op"_a, "outs"_a, "ins"_a, "streams"_a, "bytes"_a = 0, "counts"_a = std::vector<size_t>{}, "root"_a = 0,             \
                                          "count"_a = 0, "dtype"_a = "float32", "red_op"_a = "sum", "algo"_a = "auto", \
                                          "local_copy"_a = "auto", "signals"_a = "auto"

}  // namespace

void bind_kv(nb::module_& m);         // python/src/kv_ext.cpp
void bind_symm(nb::module_& m);       // python/src/symm_ext.cpp
void bind_multipath(nb::module_& m);  // python/src/multipath_ext.cpp

NB_MODULE(_ferry, m) {
  m.doc() = "ferry native layer (use the ferry package, not this module)";
  // A program that ends on an uncaught exception keeps its frames' objects
  // (pools, transfers) alive past the module's teardown; nanobind would list
  // each as a leak on stderr under the program's own error. Kept for
  // FERRY_DEBUG=1, where a binding's reference counting is what is debugged.
  if (!ferry::debug_enabled()) nb::set_leak_warnings(false);
  declare_exceptions(m);
  bind_kv(m);
  bind_symm(m);
  bind_multipath(m);

  m.def("driver_available", &ferry::driver_available);
  m.def("driver_missing_hint", &ferry::driver_missing_hint);
  m.def("knobs", [] {
    std::vector<std::vector<std::string>> out;
    for (const auto& k : ferry::knobs()) out.push_back({k.name, k.type, k.default_value, k.doc, ferry::knob_range(k)});
    return out;
  });
  m.def("knob_problems", [] {
    std::vector<std::string> out;
    for (const auto& k : ferry::knobs())
      if (auto p = ferry::knob_problem(k); !p.empty()) out.push_back(p);
    return out;
  });
  m.def("knob_string", [](const std::string& name) { return ferry::knob_string(name.c_str()); });
  m.def("knob_int_in", [](const std::string& name) { return ferry::knob_int_in(name.c_str()); });
  m.def("timeout_seconds",
        [](double given, const std::string& what) { return ferry::timeout_seconds(given, what.c_str()); });

  nb::class_<ferry::GpuInfo>(m, "GpuInfo")
      .def(nb::init<>())
      .def_rw("index", &ferry::GpuInfo::index)
      .def_rw("name", &ferry::GpuInfo::name)
      .def_rw("pci_bus_id", &ferry::GpuInfo::pci_bus_id)
      .def_rw("numa_node", &ferry::GpuInfo::numa_node)
      .def_rw("copy_engines", &ferry::GpuInfo::copy_engines)
      .def_rw("sm_count", &ferry::GpuInfo::sm_count)
      .def_rw("memory_bytes", &ferry::GpuInfo::memory_bytes)
      .def_rw("stream_memops", &ferry::GpuInfo::stream_memops)
      .def_rw("memops_64bit", &ferry::GpuInfo::memops_64bit)
      .def_rw("vmm_posix_fd", &ferry::GpuInfo::vmm_posix_fd)
      .def_rw("nvswitch_links", &ferry::GpuInfo::nvswitch_links);
  nb::class_<ferry::Topology>(m, "Topology")
      .def(nb::init<>())
      .def_rw("gpus", &ferry::Topology::gpus)
      .def_rw("p2p", &ferry::Topology::p2p)
      .def_rw("nvlink", &ferry::Topology::nvlink)
      .def_rw("driver_version", &ferry::Topology::driver_version)
      .def_rw("runtime_version", &ferry::Topology::runtime_version)
      .def_rw("source", &ferry::Topology::source)
      .def("fully_connected", &ferry::Topology::fully_connected)
      .def("nvswitch", &ferry::Topology::nvswitch);
  m.def("probe_topology", &ferry::probe_topology);

  // Pure: the selector's (algo, signals) for a call; "auto" signals: the rule says nothing.
  m.def(
      "select_variant",
      [](const std::string& op, int world, size_t bytes, const std::string& forced,
         const std::vector<RuleTuple>& rules) {
        std::vector<ferry::SelectorRule> t = selector_rules(rules);
        if (t.empty()) t = ferry::default_selector_table();
        const ferry::Selection s =
            ferry::select_variant(parse_op(op), world, bytes, ferry::parse_algo(forced, "algo"), t);
        return std::make_pair(std::string(ferry::algo_name(s.algo)), std::string(ferry::signals_name(s.signals)));
      },
      "op"_a, "world"_a, "bytes_per_rank"_a, "algo"_a = "auto", "rules"_a = std::vector<RuleTuple>{});
  // The shipped tables (compiled in) and FERRY_TUNING's choice: coll/tuning.hpp.
  m.def(
      "preset_rules",
      [](const std::string& gpu_name, int world, const std::string& preset) {
        return rule_tuples(ferry::preset_rules(ferry::shipped_tables(), gpu_name, world, preset));
      },
      "gpu_name"_a, "world"_a, "preset"_a);
  m.def(
      "startup_rules",
      [](const std::string& gpu_name, int world, const std::string& setting) {
        return rule_tuples(ferry::startup_rules(ferry::shipped_tables(), gpu_name, world, setting));
      },
      "gpu_name"_a, "world"_a, "setting"_a);
  // Pure: why algo "sm" cannot take such a call ("" when it can); CPU-tested.
  m.def(
      "sm_path_refuses",
      [](const std::string& op, int world, size_t largest_block, size_t slot_bytes) {
        return ferry::sm_path_unsupported(parse_op(op), world, largest_block, slot_bytes);
      },
      "op"_a, "world"_a, "largest_block"_a, "slot_bytes"_a);
  m.def("split_batches", &ferry::split_batches, "count"_a, "batch_max"_a);
  m.def("total_energy_mj", &ferry::total_energy_mj, "pci_bus_id"_a);
  m.def("gpu_compute_processes", &ferry::gpu_compute_processes, "cuda_device"_a);
  // ferry bench --overlap: what the GPU's clocks did while something ran.
  nb::class_<ferry::ClockSampler>(m, "ClockSampler")
      .def(nb::init<std::string, int>(), "pci_bus_id"_a, "period_us"_a = 500)
      .def("start", &ferry::ClockSampler::start, nb::call_guard<nb::gil_scoped_release>())
      .def("stop", [](ferry::ClockSampler& s) {
        ferry::ClockSummary c;
        {
          nb::gil_scoped_release release;
          c = s.stop();
        }
        nb::dict d;
        d["samples"] = c.samples;
        d["mean_sm_mhz"] = c.mean_sm_mhz;
        d["min_sm_mhz"] = c.min_sm_mhz;
        d["mean_power_w"] = c.mean_power_w;
        d["power_capped"] = c.power_capped;
        d["thermal"] = c.thermal;
        return d;
      });
  // One GPU's PCI bus id from the CUDA runtime (no topology probe, no NVLink queries).
  m.def(
      "pci_bus_id",
      [](int device) {
        char bus[32] = {0};
        FERRY_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device));
        return std::string(bus);
      },
      "device"_a);
  nb::class_<Communicator> comm(m, "Communicator");
  comm.def_static(
          "create",
          [](int rank, int world, int device, nb::callable allgather, double timeout_s, bool allgather_on_host) {
            // The communicator copies and destroys its bootstrap function without
            // the GIL; only the shared_ptr moves then, and the Python object is
            // released under the GIL.
            std::shared_ptr<nb::object> holder(new nb::object(allgather), [](nb::object* o) {
              nb::gil_scoped_acquire gil;
              delete o;
            });
            ferry::AllGatherFn fn = [holder](const std::string& mine) {
              nb::gil_scoped_acquire gil;
              nb::object res = (*holder)(nb::bytes(mine.data(), mine.size()));
              std::vector<std::string> out;
              for (nb::handle item : res) {
                nb::bytes b = nb::cast<nb::bytes>(item);
                out.emplace_back(b.c_str(), b.size());
              }
              return out;
            };
            // The bootstrap may be served by Python threads of this very process
            // (rank 0's TCP store): never hold the GIL while waiting for peers.
            nb::gil_scoped_release release;
            return Communicator::create(rank, world, device, fn, timeout_s, allgather_on_host);
          },
          "rank"_a, "world"_a, "device"_a, "allgather"_a, "timeout_s"_a, "allgather_on_host"_a = false)
      .def_static("create_local", &Communicator::create_local, "devices"_a, "timeout_s"_a,
                  nb::call_guard<nb::gil_scoped_release>())
      .def("close", &Communicator::close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("closed", &Communicator::closed)
      .def_prop_ro("world", &Communicator::world)
      .def_prop_ro("gpu_name", &Communicator::gpu_name)
      .def_prop_ro("local_count", &Communicator::local_count)
      .def_prop_ro("timeout_s", &Communicator::timeout_s)
      .def("rank", &Communicator::rank)
      .def("device", &Communicator::device)
      .def("alloc",
           [](Communicator& c, size_t bytes) {
             std::vector<void*> ptrs;
             {
               nb::gil_scoped_release release;
               ptrs = c.alloc(bytes);
             }
             std::vector<uintptr_t> out;
             for (void* p : ptrs) out.push_back(reinterpret_cast<uintptr_t>(p));
             return out;
           })
      .def(
          "free", [](Communicator& c, const std::vector<uintptr_t>& p) { c.free(as_pointers<void*>(p)); },
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "register_buffers",
          [](Communicator& c, const std::vector<uintptr_t>& p, const std::vector<size_t>& sizes) {
            c.register_buffers(as_pointers<void*>(p), sizes);
          },
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "deregister", [](Communicator& c, const std::vector<uintptr_t>& p) { c.deregister(as_pointers<void*>(p)); },
          nb::call_guard<nb::gil_scoped_release>())
      .def("reserve_scratch", &Communicator::reserve_scratch, "bytes"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("check", &Communicator::check)
      .def("synchronize", &Communicator::synchronize, nb::call_guard<nb::gil_scoped_release>())
      .def("run", call_with_args([](Communicator& c, const ferry::CollectiveArgs& a) { c.run(a); }), FERRY_CALL_ARGS)
      .def("prepare", call_with_args([](Communicator& c, const ferry::CollectiveArgs& a) { return c.prepare(a); }),
           FERRY_CALL_ARGS)
      .def(
          "arm",
          [](Communicator& c, int h, const std::vector<uintptr_t>& after, bool gate_on_device) {
            c.arm(h, as_pointers<cudaStream_t>(after), gate_on_device);
          },
          "handle"_a, "after"_a, "gate_on_device"_a = false, nb::call_guard<nb::gil_scoped_release>())
      .def("trigger", &Communicator::trigger, "handle"_a)
      .def(
          "trigger_on",
          [](Communicator& c, int h, const std::vector<uintptr_t>& streams) {
            c.trigger_on(h, as_pointers<cudaStream_t>(streams));
          },
          "handle"_a, "streams"_a)
      .def(
          "device_trigger",
          [](Communicator& c, int h, int local) {
            auto [word, value] = c.device_trigger(h, local);
            return std::make_pair(reinterpret_cast<uintptr_t>(word), value);
          },
          "handle"_a, "local"_a)
      .def(
          "wait",
          [](Communicator& c, int h, const std::vector<uintptr_t>& streams) {
            c.wait(h, as_pointers<cudaStream_t>(streams));
          },
          "handle"_a, "streams"_a)
      .def("armed", &Communicator::armed, "handle"_a)
      .def(
          "finished_event",
          // The event the run of an armed handle records at its end (cudaEvent_t as an integer),
          // valid until release(): for timing a run from outside.
          [](Communicator& c, int h, int local) { return reinterpret_cast<uintptr_t>(c.finished_event(h, local)); },
          "handle"_a, "local"_a)
      .def("release", &Communicator::release_prepared, "handle"_a)
      .def(
          "set_selector_table",
          [](Communicator& c, const std::vector<RuleTuple>& rules) { c.set_selector_table(selector_rules(rules)); },
          "rules"_a)
      .def("set_selector_preset", &Communicator::set_selector_preset, "preset"_a)
      .def(
          "choose",
          [](const Communicator& c, const std::string& op, size_t bytes) {
            const ferry::Resolved r = c.choose(parse_op(op), bytes);
            return std::make_pair(std::string(ferry::algo_name(r.algo)),
                                  std::string(r.kernel_signals ? "kernel" : "copy"));
          },
          "op"_a, "bytes_per_rank"_a)
      .def(
          "sm_path_takes",
          [](const Communicator& c, const std::string& op, size_t bytes) {
            return c.sm_path_takes(parse_op(op), bytes);
          },
          "op"_a, "bytes"_a);
}
