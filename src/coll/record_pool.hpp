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

// An interned record: its pinned copy (host and device-mapped views), and a
// word in GPU memory that the call's streams set to the done value and copy
// into targets' done flags (GPU to GPU, on the engine that moved the data).
struct Record {
  ReadyRecord* host = nullptr;
  ReadyRecord* mapped = nullptr;
  uint64_t* done_source = nullptr;
};

class RecordPool {
 public:
  explicit RecordPool(int device);
  ~RecordPool();
  RecordPool(const RecordPool&) = delete;
  RecordPool& operator=(const RecordPool&) = delete;

  // The record for `s` (the same one for equal records). Never moves; the
  // done source holds the done value once a stream has written it (every
  // writer writes the same constant, so concurrent calls do not race).
  Record intern(const ReadyRecord& s);
  // A fresh zeroed 64-bit word on its own 64-byte line.
  Pinned<uint64_t> word();
  // `n` fresh zeroed records (the watchdog copies flags into them).
  Pinned<ReadyRecord> records(size_t n);

 private:
  struct Line {
    alignas(64) unsigned char bytes[64];
  };
  Pinned<Line> lines(size_t n);
  uint64_t* device_line();

  int device_;
  std::mutex mu_;
  std::vector<void*> chunks_;
  Pinned<Line> current_{};
  size_t used_ = 0, capacity_ = 0;
  std::map<std::string, Record> interned_;
  std::vector<void*> device_chunks_;
  Line* device_next_ = nullptr;
  size_t device_left_ = 0;
};

}  // namespace ferry
