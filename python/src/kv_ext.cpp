// Python bindings of paged KV transfers (src/xfer/): thin. Pointers, streams
// and index lists cross as integers; ferry/kv.py turns tensors into them.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>

#include "core/error.hpp"
#include "xfer/host_pool.hpp"
#include "xfer/page_copy.hpp"
#include "xfer/page_select.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace ferry::xfer;

namespace {

// (base, stride, bytes, pages) per region.
using RegionTuple = std::tuple<uintptr_t, size_t, size_t, size_t>;

PageSide side_of(const std::vector<RegionTuple>& regions) {
  PageSide s;
  for (const auto& [base, stride, bytes, pages] : regions) s.regions.push_back(PageRegion{base, stride, bytes, pages});
  return s;
}

PageCopyOptions options_of(const std::string& mode, bool zero_sm, bool urgent, bool settled, bool merge, bool pitched,
                           int blocks, int threads, size_t chunk, size_t slice_bytes) {
  PageCopyOptions o;
  if (mode != "auto") o.strategy = parse_strategy(mode, "mode");
  o.zero_sm = zero_sm;
  o.urgent = urgent;
  o.settled_source = settled;
  o.merge = merge;
  o.pitched = pitched;
  o.kernel_blocks = blocks;
  o.kernel_threads = threads;
  o.kernel_chunk = chunk;
  o.slice_bytes = slice_bytes;
  return o;
}

// Plain C++ values: the call runs without the GIL, so no Python object may be
// made before it returns (nanobind converts the tuple after).
using Report = std::tuple<std::string, std::string, size_t, size_t, int, size_t>;

Report report(const PageCopyReport& r) {
  return {strategy_name(r.strategy), direction_name(r.direction), r.copies, r.bytes, r.sms, r.pitched};
}

cudaStream_t as_stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

// A Python list, tuple or range of page indices as int64, read in one pass:
// array.array("q", ids) parses each entry through a format string, about 30
// ns an entry (63 us for two lists of 1,024 on an H200 host).
struct IdList {
  std::vector<int64_t> ids;
};

// A numpy bool scalar or a bool tensor (a list's entry that is not an int).
bool is_array_bool(PyObject* x) {
  const char* type = Py_TYPE(x)->tp_name;
  if (std::strcmp(type, "numpy.bool") == 0 || std::strcmp(type, "numpy.bool_") == 0) return true;
  if (std::strcmp(type, "Tensor") != 0) return false;
  PyObject* dtype = PyObject_GetAttrString(x, "dtype");
  if (!dtype) {
    PyErr_Clear();
    return false;
  }
  nb::object keep = nb::steal(dtype);
  PyObject* text = PyObject_Str(dtype);
  if (!text) {
    PyErr_Clear();
    return false;
  }
  nb::object keep_text = nb::steal(text);
  const char* s = PyUnicode_AsUTF8(text);
  return s && std::strcmp(s, "torch.bool") == 0;
}

IdList id_list(nb::handle seq, const std::string& name) {
  // A tuple of the entries: an entry's __index__ runs Python code, which
  // could resize a list under a pointer into its storage.
  PyObject* tuple = PySequence_Tuple(seq.ptr());
  if (!tuple) {
    PyErr_Clear();
    ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT, name + ": expected a list of integer page indices");
  }
  nb::object keep = nb::steal(tuple);
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  IdList out;
  out.ids.resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* x = PyTuple_GET_ITEM(tuple, i);
    // A mask (a list of bools) would be taken as pages 0 and 1.
    if (PyBool_Check(x))
      ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                         name + ": expected integer page indices, got bools (a mask? pass the indices it selects)");
    nb::object index;  // numpy integers and other __index__ types
    if (!PyLong_Check(x)) {
      // numpy's and torch's bools have __index__ too (numpy's only warns).
      if (is_array_bool(x))
        ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT, name + ": expected integer page indices, got bools (entry " +
                                                             std::to_string(i) + " is a " + Py_TYPE(x)->tp_name +
                                                             "; a mask? pass the indices it selects)");
      PyObject* y = PyNumber_Index(x);
      if (!y) {
        PyErr_Clear();
        ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT, name + ": expected integer page indices (entry " +
                                                             std::to_string(i) + " is a " + Py_TYPE(x)->tp_name + ")");
      }
      index = nb::steal(y);
      x = y;
    }
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(x, &overflow);
    if (overflow)
      ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT, name + ": page index at entry " + std::to_string(i) +
                                                           " is out of range (it needs more than 64 bits)");
    out.ids[static_cast<size_t>(i)] = v;
  }
  return out;
}

}  // namespace

void bind_kv(nb::module_& m) {
  nb::class_<IdList>(m, "IdList")
      .def_prop_ro("ptr", [](const IdList& l) { return l.ids.empty() ? uintptr_t(0) : uintptr_t(l.ids.data()); })
      .def_prop_ro("count", [](const IdList& l) { return l.ids.size(); });
  m.def("kv_id_list", &id_list, "ids"_a, "name"_a);
  m.def(
      "kv_copy",
      [](int device, const std::vector<RegionTuple>& dst, const std::vector<RegionTuple>& src, uintptr_t dst_ids,
         uintptr_t src_ids, size_t count, bool ids_64, bool ids_on_device, const std::string& mode, bool zero_sm,
         bool urgent, bool settled, bool merge, bool pitched, int blocks, int threads, size_t chunk, size_t slice_bytes,
         uintptr_t stream) {
        PageCopier& c = PageCopier::on(device);
        PageCopyOptions o =
            options_of(mode, zero_sm, urgent, settled, merge, pitched, blocks, threads, chunk, slice_bytes);
        if (ids_on_device)
          return report(c.copy_device_ids(
              side_of(dst), side_of(src),
              DeviceIds{reinterpret_cast<const void*>(dst_ids), reinterpret_cast<const void*>(src_ids), count, ids_64},
              o, as_stream(stream)));
        return report(c.copy(side_of(dst), side_of(src), PageIds{reinterpret_cast<const void*>(dst_ids), count, ids_64},
                             PageIds{reinterpret_cast<const void*>(src_ids), count, ids_64}, o, as_stream(stream)));
      },
      "device"_a, "dst"_a, "src"_a, "dst_ids"_a, "src_ids"_a, "count"_a, "ids_64"_a, "ids_on_device"_a, "mode"_a,
      "zero_sm"_a, "urgent"_a, "settled"_a, "merge"_a, "pitched"_a, "blocks"_a, "threads"_a, "chunk"_a, "slice_bytes"_a,
      "stream"_a, nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "kv_direction",
      [](int device, const std::vector<RegionTuple>& dst, const std::vector<RegionTuple>& src) {
        return std::string(direction_name(PageCopier::on(device).direction(side_of(dst), side_of(src))));
      },
      "device"_a, "dst"_a, "src"_a);
  m.def(
      "kv_choose",
      [](int device, const std::string& direction, size_t copies, size_t bytes, bool zero_sm) {
        for (auto d :
             {Direction::kHostToDevice, Direction::kDeviceToHost, Direction::kDeviceToDevice, Direction::kHostToHost})
          if (direction == direction_name(d))
            return std::string(strategy_name(PageCopier::on(device).choose(d, copies, bytes, zero_sm)));
        ferry::throw_error(FERRY_ERROR_INVALID_ARGUMENT, "direction: expected h2d, d2h, d2d or h2h");
      },
      "device"_a, "direction"_a, "copies"_a, "bytes"_a, "zero_sm"_a);
  m.def(
      "kv_set_table",
      [](int device, const std::string& json_text) {
        PageCopier::on(device).set_rules(page_table_from_json(json_text, "table").rules);
      },
      "device"_a, "json_text"_a);

  nb::class_<HostPool>(m, "HostPool")
      .def_static(
          "create",
          [](size_t bytes, int device, int numa_node, int huge_pages) {
            return HostPool::create(bytes, HostPoolOptions{device, numa_node, huge_pages});
          },
          "bytes"_a, "device"_a = -1, "numa_node"_a = -2, "huge_pages"_a = -1)
      .def_prop_ro("data_ptr", [](const HostPool& p) { return reinterpret_cast<uintptr_t>(p.data()); })
      .def_prop_ro("nbytes", &HostPool::bytes)
      .def_prop_ro("numa_node", &HostPool::numa_node)
      .def_prop_ro("backing", &HostPool::backing)
      .def_prop_ro("huge_pages", &HostPool::huge_pages)
      .def_prop_ro("closed", &HostPool::closed)
      .def_prop_ro("views", &HostPool::views)
      .def("in_flight", &HostPool::in_flight)
      .def("close", &HostPool::close)
      // A 1-D uint8 torch tensor over [offset, offset + nbytes) that keeps the pool alive.
      .def(
          "view",
          [](std::shared_ptr<HostPool> p, size_t offset, size_t nbytes) {
            FERRY_ARG_CHECK(!p->closed(), "HostPool.view: the pool is closed");
            FERRY_ARG_CHECK(offset <= p->bytes() && nbytes <= p->bytes() - offset,
                            "HostPool.view: [offset, offset + nbytes) = [" + std::to_string(offset) + ", " +
                                std::to_string(offset + nbytes) + ") is outside the pool's " +
                                std::to_string(p->bytes()) + " bytes");
            auto* keep = new std::shared_ptr<HostPool>(p);
            p->add_view();
            nb::capsule owner(keep, [](void* k) noexcept {
              auto* pool = static_cast<std::shared_ptr<HostPool>*>(k);
              (*pool)->drop_view();
              delete pool;
            });
            size_t shape[1] = {nbytes};
            return nb::ndarray<nb::pytorch, uint8_t, nb::ndim<1>, nb::device::cpu>(
                static_cast<uint8_t*>(p->data()) + offset, 1, shape, owner);
          },
          "offset"_a, "nbytes"_a);

  nb::class_<PreparedPages>(m, "PreparedPages")
      .def(
          "__init__",
          [](PreparedPages* self, int device, const std::vector<RegionTuple>& dst, const std::vector<RegionTuple>& src,
             uintptr_t dst_ids, uintptr_t src_ids, size_t count, bool ids_64, const std::string& mode, bool merge,
             bool pitched) {
            new (self) PreparedPages(device, side_of(dst), side_of(src),
                                     PageIds{reinterpret_cast<const void*>(dst_ids), count, ids_64},
                                     PageIds{reinterpret_cast<const void*>(src_ids), count, ids_64},
                                     parse_strategy(mode, "mode"), merge, pitched);
          },
          "device"_a, "dst"_a, "src"_a, "dst_ids"_a, "src_ids"_a, "count"_a, "ids_64"_a, "mode"_a, "merge"_a,
          "pitched"_a)
      .def(
          "arm", [](PreparedPages& p, uintptr_t after) { p.arm(as_stream(after)); }, "after"_a,
          nb::call_guard<nb::gil_scoped_release>())
      .def("trigger", &PreparedPages::trigger, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "trigger_on", [](PreparedPages& p, uintptr_t s) { p.trigger_on(as_stream(s)); }, "stream"_a)
      .def("device_trigger",
           [](PreparedPages& p) {
             auto [word, value] = p.device_trigger();
             return std::make_pair(reinterpret_cast<uintptr_t>(word), value);
           })
      .def(
          "wait", [](PreparedPages& p, uintptr_t s) { p.wait(as_stream(s)); }, "stream"_a)
      .def("synchronize", &PreparedPages::synchronize, "timeout_s"_a, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("armed", &PreparedPages::armed)
      .def_prop_ro("copies", &PreparedPages::copies)
      .def_prop_ro("bytes", &PreparedPages::bytes)
      .def_prop_ro("strategy", [](const PreparedPages& p) { return std::string(strategy_name(p.strategy())); })
      .def_prop_ro("direction", [](const PreparedPages& p) { return std::string(direction_name(p.direction())); });
}
