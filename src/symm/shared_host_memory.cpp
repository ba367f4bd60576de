#include "symm/shared_host_memory.hpp"

#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "core/error.hpp"

namespace ferry {

static size_t round_to_page(size_t n) {
  size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

SharedHostMemory SharedHostMemory::create(size_t bytes) {
  SharedHostMemory m;
  m.bytes_ = round_to_page(bytes);
  m.fd_ = memfd_create("ferry-flags", MFD_CLOEXEC);
  FERRY_SYS_CHECK(m.fd_, "memfd_create");
  FERRY_SYS_CHECK(ftruncate(m.fd_, static_cast<off_t>(m.bytes_)), "ftruncate memfd");
  m.map_and_register();
  return m;
}

SharedHostMemory SharedHostMemory::import(int fd, size_t bytes) {
  SharedHostMemory m;
  m.fd_ = fd;
  m.bytes_ = round_to_page(bytes);
  m.map_and_register();
  return m;
}

void SharedHostMemory::map_and_register() {
  host_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (host_ == MAP_FAILED) {
    host_ = nullptr;
    throw_errno("mmap of shared flag memory", errno, __FILE__, __LINE__);
  }
  FERRY_CUDA_CHECK(cudaHostRegister(host_, bytes_, cudaHostRegisterPortable | cudaHostRegisterMapped));
  FERRY_CUDA_CHECK(cudaHostGetDevicePointer(&device_, host_, 0));
}

void SharedHostMemory::release() {
  if (host_) {
    cudaHostUnregister(host_);
    munmap(host_, bytes_);
  }
  if (fd_ >= 0) close(fd_);
  host_ = device_ = nullptr;
  fd_ = -1;
}

SharedHostMemory::~SharedHostMemory() { release(); }

SharedHostMemory::SharedHostMemory(SharedHostMemory&& o) noexcept { *this = std::move(o); }

SharedHostMemory& SharedHostMemory::operator=(SharedHostMemory&& o) noexcept {
  if (this != &o) {
    release();
    std::swap(fd_, o.fd_);
    std::swap(bytes_, o.bytes_);
    std::swap(host_, o.host_);
    std::swap(device_, o.device_);
  }
  return *this;
}

}  // namespace ferry
