// Pinned, device-mapped host memory for what ferry's streams read or wait on
// and must stay put for as long as commands may refer to them: the records a
// rank copies into its peers' flags (interned: one per distinct call, so a
// CUDA graph or a prepared collective can keep pointing at it) and small words
// (the trigger of a prepared collective, the state of a captured one).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "coll/flags.hpp"

namespace ferry {

template <typename T>
struct Pinned {
  T* host = nullptr;
  T* device = nullptr;
};

class RecordPool {
 public:
  explicit RecordPool(int device);
  ~RecordPool();
  RecordPool(const RecordPool&) = delete;
  RecordPool& operator=(const RecordPool&) = delete;

  // The pinned copy of `s` (the same one for equal records). Never moves or
  // changes. With FERRY_FLAG_SOURCE=device, `device` points at a copy in GPU
  // memory instead of the mapped host copy (the host view stays for messages).
  Pinned<SourceSlot> intern(const SourceSlot& s);
  // A fresh zeroed 64-bit word on its own 64-byte line.
  Pinned<uint64_t> word();

 private:
  struct Line {
    alignas(64) unsigned char bytes[64];
  };
  Pinned<Line> lines(size_t n);
  SourceSlot* device_copy(const SourceSlot& s);

  int device_;
  std::mutex mu_;
  std::vector<void*> chunks_;
  Pinned<Line> current_{};
  size_t used_ = 0, capacity_ = 0;
  std::map<std::string, Pinned<SourceSlot>> interned_;
  bool device_records_ = false;
  std::vector<void*> device_chunks_;
  SourceSlot* device_next_ = nullptr;
  size_t device_left_ = 0;
};

}  // namespace ferry
