// A communicator: the ranks, their flags, their registered buffers, and the
// watchdog that bounds every wait. One process per GPU (create) or one process
// driving several GPUs (create_local); the collectives below serve both, with
// one entry per local rank in every array argument.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/unix_socket.hpp"
#include "coll/flags.hpp"
#include "coll/in_flight.hpp"
#include "coll/local_copy.hpp"
#include "coll/selector.hpp"
#include "dma/engine.hpp"
#include "symm/peer_buffer.hpp"
#include "symm/shared_host_memory.hpp"

namespace ferry {

// Out-of-band all-gather of one blob per rank (rank order). Must be bounded in
// time and name missing ranks when it gives up.
using AllGatherFn = std::function<std::vector<std::string>(const std::string& mine)>;

struct CollectiveArgs {
  std::vector<void*> outs;
  std::vector<const void*> ins;
  size_t bytes_per_rank = 0;
  std::vector<cudaStream_t> streams;
  Algo algo = Algo::kAuto;
  LocalCopy local_copy = LocalCopy::kAuto;
};

class Communicator {
 public:
  static std::unique_ptr<Communicator> create(int rank, int world, int device, const AllGatherFn& allgather,
                                              double timeout_s);
  static std::unique_ptr<Communicator> create_local(const std::vector<int>& devices, double timeout_s);
  ~Communicator();

  void close();
  bool closed() const { return closed_; }

  int world() const { return world_; }
  int local_count() const { return static_cast<int>(locals_.size()); }
  int rank(int local) const { return locals_.at(local)->rank; }
  int device(int local) const { return locals_.at(local)->device; }
  double timeout_s() const { return timeout_s_; }

  // Collective. One pointer per local rank.
  std::vector<void*> alloc(size_t bytes);
  void free(const std::vector<void*>& ptrs);
  void register_buffers(const std::vector<void*>& ptrs, const std::vector<size_t>& sizes);
  void deregister(const std::vector<void*>& ptrs);

  void all_gather(const CollectiveArgs& args) { run(CollOp::kAllGather, args); }
  void all_to_all(const CollectiveArgs& args) { run(CollOp::kAllToAll, args); }

  // Throws the first asynchronous error (FERRY_ERROR_BROKEN after it was seen once).
  void check();
  // Waits (bounded) for every enqueued collective; then check().
  void synchronize();

 private:
  struct Local {
    int rank = 0;
    int device = 0;
    std::unique_ptr<EngineSet> engines;
    std::unique_ptr<InFlight> in_flight;
  };
  struct Registration {
    uint32_t id = 0;
    bool owned = false;           // from alloc(): ferry frees it
    std::vector<char*> base;      // by rank, as mapped in this process
    std::vector<size_t> size;     // by rank
    std::vector<VmmMapping> vmm;  // to unmap/release on close
    std::vector<void*> ipc;       // to close on close
  };

  Communicator() = default;
  void init_common(double timeout_s);
  void start_watchdog();
  void ensure_open(const char* what);
  std::vector<std::string> allgather(const std::string& mine, const char* what);
  const Registration* find_registration(int local, const void* ptr, size_t bytes) const;
  void release(Registration& reg);

  void run(CollOp op, const CollectiveArgs& args);
  // b2b and seq: everything on one stream; b2b submits the pushes as one
  // batch (no order among them), seq one after another in cyclic-shift order.
  void enqueue_one_stream(int local, CollOp op, const std::vector<char*>& out_by_rank, const char* in, size_t bytes,
                          cudaStream_t stream, size_t slot, uint64_t tag, const Copy& local_copy, LocalCopy how,
                          bool batched);
  void enqueue_pcpy(int local, CollOp op, const std::vector<char*>& out_by_rank, const char* in, size_t bytes,
                    cudaStream_t stream, size_t slot, uint64_t tag, const Copy& local_copy, LocalCopy how);

  FlagBlock* flags_host(int rank) const { return static_cast<FlagBlock*>(flag_mem_[rank].host()); }
  FlagBlock* flags_device(int rank) const { return static_cast<FlagBlock*>(flag_mem_[rank].device()); }

  void watchdog_loop();
  bool diagnose_and_unblock(int local, const InFlight::Pending& p);
  void fail(const std::string& message);

  int world_ = 0;
  bool multi_process_ = false;
  double timeout_s_ = 300;
  AllGatherFn allgather_;
  std::vector<std::unique_ptr<Local>> locals_;
  std::vector<SharedHostMemory> flag_mem_;  // by rank; peers' blocks imported
  std::vector<int> pids_;                   // by rank
  std::unique_ptr<FdExchange> fds_;
  std::vector<std::string> socket_paths_;
  std::vector<Registration> registrations_;
  uint32_t next_registration_ = 1;
  int next_fd_tag_ = 100;
  uint64_t seq_ = 0;
  std::vector<SelectorRule> table_;
  Algo forced_algo_ = Algo::kAuto;

  bool closed_ = false;
  std::mutex error_mu_;
  std::string error_;
  std::atomic<bool> broken_{false};
  bool error_reported_ = false;

  std::thread watchdog_;
  std::mutex watchdog_mu_;
  std::condition_variable watchdog_cv_;
  bool stop_watchdog_ = false;
};

}  // namespace ferry
