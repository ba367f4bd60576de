// The signal round's kernel (coll/signal_round.hpp): one thread per rank.
#include "coll/kernel_wait.cuh"
#include "coll/signal_round.hpp"
#include "core/error.hpp"

namespace ferry {
namespace {

__global__ void signal_round_kernel(SignalRound r, KernelWait c) {
  const int q = threadIdx.x;
  const uint64_t value = r.record.value;
  const bool signal = (r.signal_mask >> q) & 1, wait = (r.wait_mask >> q) & 1;
  // A captured call's state word says "running" from its first round on.
  if (q == 0 && r.state_word && !r.done) *reinterpret_cast<volatile uint64_t*>(r.state_word) = r.state_value;
  // Stream order put this kernel after this rank's pushes (done round) or
  // after the work that last used its output (ready round): both are
  // complete and visible before the release.
  if (signal && r.done) {
    store_release(&r.flags[q]->done[r.rank].value, value);
  } else if (signal) {
    // The fields the watchdog reads for its messages, then the value.
    ReadyRecord* to = &r.flags[q]->ready[r.rank];
    to->bytes_per_rank = r.record.bytes_per_rank;
    to->offset = r.record.offset;
    to->op = r.record.op;
    to->registration = r.record.registration;
    store_release(&to->value, value);
  }
  bool gave_up = false;
  if (wait) {
    uint64_t* flag = r.done ? &r.flags[r.rank]->done[q].value : &r.flags[r.rank]->ready[q].value;
    gave_up = !wait_for([&] { return load_acquire(flag) == value; }, c, q, 0, kSignalRoundFaultBit);
    // The reset: see "Flag protocol" in docs/architecture.md for why no
    // peer can have written its next value yet.
    if (!gave_up) *reinterpret_cast<volatile uint64_t*>(flag) = 0;
  }
  gave_up = __syncthreads_or(gave_up);
  if (q == 0 && !gave_up && c.gate) wait_for_gate(c.gate, c.gate_value, c);
  if (q == 0 && r.state_word && r.done) *reinterpret_cast<volatile uint64_t*>(r.state_word) = r.state_value;
}

}  // namespace

void load_signal_round_kernels() {
  cudaFuncAttributes a;
  FERRY_CUDA_CHECK(cudaFuncGetAttributes(&a, signal_round_kernel));
}

void launch_signal_round(const SignalRound& r, const KernelWait& c, cudaStream_t stream) {
  // The highest launch priority, whatever the stream's: beside a kernel that
  // fills the GPU, the block scheduler then gives this block the next SM that
  // frees up instead of queueing it behind that kernel's remaining blocks.
  static const int greatest = [] {
    int least = 0, most = 0;
    FERRY_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &most));
    return most;
  }();
  cudaLaunchAttribute priority{};
  priority.id = cudaLaunchAttributePriority;
  priority.val.priority = greatest;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(kMaxRanks);
  config.stream = stream;
  config.attrs = &priority;
  config.numAttrs = 1;
  FERRY_CUDA_CHECK(cudaLaunchKernelEx(&config, signal_round_kernel, r, c));
}

}  // namespace ferry
