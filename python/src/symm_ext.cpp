// Python bindings of the symmetric heap (src/symm/heap.hpp): thin. Pointers
// and streams cross as integers; ferry/symm.py turns tensors into them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "coll/communicator.hpp"
#include "symm/heap.hpp"
#include "symm/pool_ranges.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using ferry::SymmetricHeap;

namespace {

template <class T>
T* ptr(uintptr_t p) {
  return reinterpret_cast<T*>(p);
}
cudaStream_t stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

}  // namespace

void bind_symm(nb::module_& m) {
  // The symmetric pool's allocator (ferry/torch.py's SymmetricPool decides with it).
  nb::class_<ferry::PoolRanges>(m, "PoolRanges")
      .def(nb::init<>())
      .def_static("chunk_for", &ferry::PoolRanges::chunk_for, "nbytes"_a, "chunk_bytes"_a)
      .def("add_chunk", &ferry::PoolRanges::add_chunk, "size"_a)
      .def("allocate", &ferry::PoolRanges::allocate, "nbytes"_a, "stream"_a)
      .def("release", &ferry::PoolRanges::release, "chunk"_a, "offset"_a)
      .def("bytes_in_use", &ferry::PoolRanges::bytes_in_use)
      .def("free_ranges", &ferry::PoolRanges::free_ranges, "stream"_a)
      .def("in_use", &ferry::PoolRanges::in_use);
  nb::class_<SymmetricHeap>(m, "SymmetricHeap")
      .def_static(
          "create",
          [](ferry::Communicator& comm, size_t capacity) {
            ferry::Group g = comm.group();
            nb::gil_scoped_release release;  // the bootstrap may be served by Python threads of this process
            return SymmetricHeap::create(g, capacity);
          },
          "comm"_a, "capacity"_a)
      .def("close", &SymmetricHeap::close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("closed", &SymmetricHeap::closed)
      .def_prop_ro("world", &SymmetricHeap::world)
      .def_prop_ro("local_count", &SymmetricHeap::local_count)
      .def("rank", &SymmetricHeap::rank, "local"_a)
      .def_prop_ro("capacity", &SymmetricHeap::capacity)
      .def_prop_ro("used", &SymmetricHeap::used)
      .def_prop_ro("mapped", &SymmetricHeap::mapped)
      .def(
          "alloc",
          [](SymmetricHeap& h, size_t bytes, size_t align, const std::vector<uintptr_t>& streams) {
            std::vector<cudaStream_t> s;
            for (uintptr_t x : streams) s.push_back(stream(x));
            return h.alloc(bytes, align, s);
          },
          "bytes"_a, "align"_a, "streams"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("free", &SymmetricHeap::free, "offset"_a, nb::call_guard<nb::gil_scoped_release>())
      .def("reserve", &SymmetricHeap::reserve, "bytes"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "register_memory",
          [](SymmetricHeap& h, const std::vector<uintptr_t>& buffers, size_t bytes,
             const std::vector<uintptr_t>& streams) {
            std::vector<void*> b;
            for (uintptr_t x : buffers) b.push_back(ptr<void>(x));
            std::vector<cudaStream_t> s;
            for (uintptr_t x : streams) s.push_back(stream(x));
            return h.register_memory(b, bytes, s);
          },
          "buffers"_a, "bytes"_a, "streams"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "deregister",
          [](SymmetricHeap& h, size_t offset, const std::vector<uintptr_t>& streams) {
            std::vector<cudaStream_t> s;
            for (uintptr_t x : streams) s.push_back(stream(x));
            h.deregister(offset, s);
          },
          "offset"_a, "streams"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "at",
          [](const SymmetricHeap& h, int rank, size_t offset) {
            return reinterpret_cast<uintptr_t>(h.at(rank, offset));
          },
          "rank"_a, "offset"_a)
      .def(
          "locate",
          [](const SymmetricHeap& h, uintptr_t p, size_t bytes, const std::string& what) {
            int rank = 0;
            size_t offset = 0;
            h.locate(ptr<void>(p), bytes, what.c_str(), &rank, &offset);
            return std::make_tuple(rank, offset);
          },
          "ptr"_a, "bytes"_a, "what"_a)
      .def(
          "handle",
          [](const SymmetricHeap& h, int local) {
            ferry::device::Heap d = h.handle(local);
            return std::make_tuple(reinterpret_cast<uintptr_t>(d.base), d.stride, d.rank, d.world,
                                   reinterpret_cast<uintptr_t>(d.fault), d.timeout_ns,
                                   nb::bytes(reinterpret_cast<const char*>(&d), sizeof(d)));
          },
          "local"_a)
      .def("check", &SymmetricHeap::check)
      .def(
          "put",
          [](SymmetricHeap& h, int local, uintptr_t dst, uintptr_t src, size_t bytes, int peer, uintptr_t s) {
            h.put(local, ptr<void>(dst), ptr<const void>(src), bytes, peer, stream(s));
          },
          "local"_a, "dst"_a, "src"_a, "bytes"_a, "peer"_a, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "get",
          [](SymmetricHeap& h, int local, uintptr_t dst, uintptr_t src, size_t bytes, int peer, uintptr_t s) {
            h.get(local, ptr<void>(dst), ptr<const void>(src), bytes, peer, stream(s));
          },
          "local"_a, "dst"_a, "src"_a, "bytes"_a, "peer"_a, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "signal",
          [](SymmetricHeap& h, int local, uintptr_t sig, uint64_t value, int peer, uintptr_t s) {
            h.signal(local, ptr<uint64_t>(sig), value, peer, stream(s));
          },
          "local"_a, "sig"_a, "value"_a, "peer"_a, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "wait",
          [](SymmetricHeap& h, int local, uintptr_t sig, uint64_t value, int from, uintptr_t s) {
            h.wait(local, ptr<const uint64_t>(sig), value, from, stream(s));
          },
          "local"_a, "sig"_a, "value"_a, "from_rank"_a, "stream"_a, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "barrier_on_stream",
          [](SymmetricHeap& h, const std::vector<uintptr_t>& streams, bool kernel) {
            std::vector<cudaStream_t> s;
            for (uintptr_t x : streams) s.push_back(stream(x));
            h.barrier_on_stream(s, kernel);
          },
          "streams"_a, "kernel"_a = false, nb::call_guard<nb::gil_scoped_release>())
      .def(
          "quiet", [](SymmetricHeap& h, int local, uintptr_t s) { h.quiet(local, stream(s)); }, "local"_a, "stream"_a,
          nb::call_guard<nb::gil_scoped_release>());
}
