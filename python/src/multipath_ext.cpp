// Python bindings of multipath host<->GPU copies (src/xfer/multipath.hpp):
// thin. Pointers and streams cross as integers; ferry/multipath.py turns
// tensors into them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "topo/topology.hpp"
#include "xfer/multipath.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using ferry::xfer::MultipathEngine;
using ferry::xfer::MultipathOptions;
using ferry::xfer::MultipathPiece;

void bind_multipath(nb::module_& m) {
  nb::class_<MultipathEngine>(m, "MultipathEngine")
      .def(
          "__init__",
          [](MultipathEngine* self, const std::vector<int>& links, size_t chunk_bytes, size_t threshold_bytes,
             int outstanding, bool own_link_first, const std::vector<bool>& may_relay, double timeout_s,
             long long head_bytes, int own_share_on_stream, bool relays_idle) {
            MultipathOptions o;
            if (relays_idle) o.processes_on = ferry::gpu_compute_processes;
            o.head_bytes = head_bytes < 0 ? SIZE_MAX : static_cast<size_t>(head_bytes);
            o.own_share_on_stream = own_share_on_stream;
            o.link_devices = links;
            o.chunk_bytes = chunk_bytes;
            o.threshold_bytes = threshold_bytes;
            o.policy.outstanding = outstanding;
            o.policy.own_link_first = own_link_first;
            o.policy.may_relay = may_relay;
            o.timeout_s = timeout_s;
            new (self) MultipathEngine(o);
          },
          "links"_a, "chunk_bytes"_a, "threshold_bytes"_a, "outstanding"_a, "own_link_first"_a, "may_relay"_a,
          "timeout_s"_a, "head_bytes"_a, "own_share_on_stream"_a = -1, "relays_idle"_a = false,
          nb::call_guard<nb::gil_scoped_release>())
      .def(
          "copy",
          [](MultipathEngine& e, uintptr_t dst, uintptr_t src, size_t bytes, uintptr_t stream, int stream_device) {
            auto r = e.copy(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes,
                            reinterpret_cast<cudaStream_t>(stream), stream_device);
            return std::make_tuple(r.multipath, r.reason, r.chunks, r.links);
          },
          "dst"_a, "src"_a, "bytes"_a, "stream"_a, "stream_device"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "copy_batch",
          [](MultipathEngine& e, const std::vector<uintptr_t>& dsts, const std::vector<uintptr_t>& srcs,
             const std::vector<size_t>& sizes, uintptr_t stream, int stream_device) {
            std::vector<MultipathPiece> pieces(dsts.size());
            for (size_t i = 0; i < pieces.size(); ++i)
              pieces[i] = {reinterpret_cast<void*>(dsts[i]), reinterpret_cast<const void*>(srcs.at(i)), sizes.at(i)};
            auto r = e.copy_batch(pieces, reinterpret_cast<cudaStream_t>(stream), stream_device);
            return std::make_tuple(r.multipath, r.reason, r.chunks, r.links);
          },
          "dsts"_a, "srcs"_a, "sizes"_a, "stream"_a, "stream_device"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("synchronize", &MultipathEngine::synchronize, nb::call_guard<nb::gil_scoped_release>())
      .def("check", &MultipathEngine::check, nb::call_guard<nb::gil_scoped_release>())
      .def("close", &MultipathEngine::close, nb::call_guard<nb::gil_scoped_release>())
      .def("bytes_by_link", &MultipathEngine::bytes_by_link)
      .def("may_relay", &MultipathEngine::may_relay)
      .def_prop_ro("link_devices", &MultipathEngine::link_devices)
      .def_prop_ro("chunk_bytes", &MultipathEngine::chunk_bytes)
      .def_prop_ro("threshold_bytes", &MultipathEngine::threshold_bytes)
      .def_prop_ro("staging", &MultipathEngine::staging_where);
}
