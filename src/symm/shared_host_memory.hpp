// Pinned host memory shared between the processes of one host: a memfd that
// each process maps and registers with CUDA, so every GPU can read and write it
// and the host can too. ferry keeps its synchronization flags here: copy
// engines write them, stream waits poll them, and the watchdog reads them to
// name a peer that never arrived.
#pragma once

#include <cstddef>

namespace ferry {

class SharedHostMemory {
 public:
  SharedHostMemory() = default;
  // A new zeroed region of `bytes` (rounded up to a page).
  static SharedHostMemory create(size_t bytes);
  // Maps a region another process created; takes ownership of `fd`.
  static SharedHostMemory import(int fd, size_t bytes);
  ~SharedHostMemory();
  SharedHostMemory(SharedHostMemory&& other) noexcept;
  SharedHostMemory& operator=(SharedHostMemory&& other) noexcept;
  SharedHostMemory(const SharedHostMemory&) = delete;
  SharedHostMemory& operator=(const SharedHostMemory&) = delete;

  void* host() const { return host_; }
  void* device() const { return device_; }  // the same address for every GPU (portable registration)
  int fd() const { return fd_; }
  size_t size() const { return bytes_; }

 private:
  void map_and_register();
  void release();
  int fd_ = -1;
  size_t bytes_ = 0;
  void* host_ = nullptr;
  void* device_ = nullptr;
};

}  // namespace ferry
