#include "coll/communicator.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "coll/local_copy.hpp"
#include "coll/reduce.hpp"
#include "coll/signal_round.hpp"
#include "coll/signature.hpp"
#include "coll/sm_path_kernel.hpp"
#include "coll/tuning.hpp"
#include "core/cuda_scope.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/host_trace.hpp"
#include "sync/holds.hpp"

namespace ferry {
namespace {

// Collectives a rank may have in flight before the next one waits for the
// oldest: work queued behind a blocked stream is finite (a few thousand
// operations enqueued behind a stream waiting on a flag made the enqueueing
// call itself block).
constexpr size_t kInFlightSlots = 1024;

std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string pci_bus_id(int device) {
  char bus[32] = {0};
  FERRY_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device));
  return bus;
}

// Named before CUDA is asked: also on a machine without a GPU.
void check_not_negative(int device, const std::string& what) {
  FERRY_ARG_CHECK(device >= 0, what + " is " + std::to_string(device) + "; expected a GPU ordinal, 0 or more");
}

void check_device_ordinal(int device, const std::string& what) {
  check_not_negative(device, what);
  int count = 0;
  FERRY_CUDA_CHECK(cudaGetDeviceCount(&count));
  FERRY_ARG_CHECK(device >= 0 && device < count, what + " is " + std::to_string(device) + "; expected 0.." +
                                                     std::to_string(count - 1) + " (" + std::to_string(count) +
                                                     " GPUs visible)");
}

// Distinct repeated eager calls kept as graphs per local rank.
constexpr size_t kReplayCapacity = 256;

}  // namespace

void Communicator::init_common(double timeout_s, int device) {
  timeout_s_ = timeout_seconds(timeout_s, "timeout_s");
  exit_after_s_ = knob_float("FERRY_EXIT_AFTER_S");
  cudaDeviceProp prop{};
  FERRY_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  gpu_name_ = prop.name;
  selector_ = Selector(gpu_name_, world_,
                       startup_rules(shipped_tables(), gpu_name_, world_, knob_string("FERRY_TUNING"))
                           .value_or(default_selector_table()),
                       parse_algo(knob_string("FERRY_ALGO"), "FERRY_ALGO"),
                       kernel_signals_default(knob_string("FERRY_SIGNALS")));
}

std::unique_ptr<Communicator::Local> Communicator::make_local(int rank, int device, int world) {
  FERRY_CUDA_CHECK(cudaSetDevice(device));
  auto local = std::make_unique<Local>();
  local->rank = rank;
  local->device = device;
  local->engines = std::make_unique<EngineSet>(device, world - 1);
  local->in_flight = std::make_unique<InFlight>(device, kInFlightSlots);
  local->records = std::make_unique<RecordPool>(device);
  local->ready_snapshot = local->records->records(kMaxRanks);
  if (knob_int("FERRY_REPLAY_CALLS") != 0) local->replays = std::make_unique<ReplayCache>(kReplayCapacity);
  local->kernel_abort = local->records->word();
  local->kernel_fault = local->records->word();
  load_local_copy_kernels();
  load_reduce_kernels();
  load_sm_path_kernels();
  load_signal_round_kernels();
  return local;
}

void Communicator::attach_memory() {
  for (auto& L : locals_) {
    L->emitter = std::make_unique<Emitter>(L->rank, world_, *L->engines, *memory_, L->kernel_abort.device,
                                           L->kernel_fault.device, timeout_s_);
    L->rescue = std::make_unique<Rescue>(L->device, world_, L->engines->rescue(), device_flags(L->rank),
                                         L->ready_snapshot.host);
  }
}

std::unique_ptr<Communicator> Communicator::create(int rank, int world, int device, const AllGatherFn& allgather,
                                                   double timeout_s, bool allgather_on_host) {
  FERRY_ARG_CHECK(world >= 1 && world <= kMaxRanks,
                  "world is " + std::to_string(world) + "; expected 1.." + std::to_string(kMaxRanks));
  FERRY_ARG_CHECK(rank >= 0 && rank < world,
                  "rank is " + std::to_string(rank) + "; expected 0.." + std::to_string(world - 1));
  FERRY_ARG_CHECK(static_cast<bool>(allgather), "allgather: a bootstrap all-gather function is required");
  timeout_seconds(timeout_s, "timeout_s");  // its bounds, before CUDA is asked anything
  check_device_ordinal(device, "device");
  const std::string refused = sync::refusal("Communicator", "setting one up (its memory, its kernels' first load)");
  // Told to the peers in the exchange they make first, before anything is
  // made here (its undoing would free memory), so that they fail at once
  // naming this rank. Only over a host-only exchange: one through a GPU (an
  // NCCL group) could itself wait for the armed stream.
  if (!refused.empty()) sync::refuse_setup(refused, allgather_on_host ? allgather : AllGatherFn());
  sync::run_kept_frees();  // what earlier teardowns kept, before this one takes more
  std::unique_ptr<Communicator> c(new Communicator());
  c->world_ = world;
  c->multi_process_ = true;
  c->allgather_ = allgather;
  c->allgather_on_host_ = allgather_on_host;
  c->init_common(timeout_s, device);
  c->locals_.push_back(make_local(rank, device, world));
  c->fds_ = std::make_shared<FdExchange>(rank, knob_string("FERRY_SOCKET_DIR"));
  c->flag_mem_.resize(world);
  c->flag_mem_[rank] = SharedHostMemory::create(sizeof(HostFlags));

  std::string mine =
      hostname() + "\n" + std::to_string(getpid()) + "\n" + pci_bus_id(device) + "\n" + c->fds_->socket_path() + "\n";
  auto all = c->allgather(mine, "communicator setup");
  sync::throw_if_refused(all, "communicator setup");
  c->pids_.resize(world);
  c->socket_paths_.resize(world);
  std::vector<std::string> bus(world), host(world);
  for (int p = 0; p < world; ++p) {
    auto f = split_lines(all[p]);
    if (f.size() != 4) throw_error(FERRY_ERROR_INTERNAL, "malformed setup record from rank " + std::to_string(p));
    host[p] = f[0];
    c->pids_[p] = std::stoi(f[1]);
    bus[p] = f[2];
    c->socket_paths_[p] = f[3];
  }
  // Several processes' ranks on one GPU only for tests (FERRY_SHARED_GPUS, as
  // in create_local): a multi-process world, its bootstrap and the death of
  // one of its processes then run where fewer GPUs are lent (tests/gpu/fuzz.py).
  const bool shared = knob_int("FERRY_SHARED_GPUS") != 0;
  for (int p = 0; p < world; ++p) {
    if (host[p] != host[rank])
      throw_error(FERRY_ERROR_UNSUPPORTED, "rank " + std::to_string(p) + " runs on host '" + host[p] + "' and rank " +
                                               std::to_string(rank) + " on '" + host[rank] +
                                               "'; ferry's communicators span the GPUs of one host");
    for (int q = 0; q < p; ++q)
      if (bus[p] == bus[q] && !shared)
        throw_error(FERRY_ERROR_INVALID_ARGUMENT, "ranks " + std::to_string(q) + " and " + std::to_string(p) +
                                                      " both drive GPU " + bus[p] + "; expected one GPU per rank");
  }
  // Share the host flag blocks: each rank sends its memfd to every peer.
  for (int p = 0; p < world; ++p)
    if (p != rank) c->fds_->send(c->socket_paths_[p], p, 1, {c->flag_mem_[rank].fd()}, "", c->timeout_s_);
  std::vector<int> peers;
  for (int p = 0; p < world; ++p)
    if (p != rank) peers.push_back(p);
  auto got = c->fds_->receive(peers, 1, c->timeout_s_, "their flag memory");
  try {
    for (auto& [p, msg] : got) {
      if (msg.fds.size() != 1)
        throw_error(FERRY_ERROR_INTERNAL, "rank " + std::to_string(p) + " sent " + std::to_string(msg.fds.size()) +
                                              " descriptors for its flag memory; expected 1");
      const int fd = msg.fds[0];
      msg.fds.clear();  // the import owns it, failed or not
      c->flag_mem_[p] = SharedHostMemory::import(fd, sizeof(HostFlags));
    }
  } catch (...) {
    for (auto& [p, msg] : got)  // the descriptors not imported
      for (int fd : msg.fds) ::close(fd);
    throw;
  }
  c->memory_ = CollectiveMemory::create(c->group());
  c->attach_memory();
  c->allgather("ready", "communicator setup (mapping peers)");
  c->start_watchdog();
  return c;
}

std::unique_ptr<Communicator> Communicator::create_local(const std::vector<int>& devices, double timeout_s) {
  int n = static_cast<int>(devices.size());
  FERRY_ARG_CHECK(n >= 1 && n <= kMaxRanks,
                  "devices: expected 1.." + std::to_string(kMaxRanks) + " GPUs, got " + std::to_string(n));
  timeout_seconds(timeout_s, "timeout_s");  // its bounds, before CUDA is asked anything
  for (int i = 0; i < n; ++i) check_not_negative(devices[i], "devices[" + std::to_string(i) + "]");
  // Several ranks on one GPU only for tests (FERRY_SHARED_GPUS): the world's
  // logic then runs on fewer GPUs than it has ranks.
  sync::refuse_while_held("Communicator", "setting one up (its memory, its kernels' first load)");
  sync::run_kept_frees();  // what earlier teardowns kept, before this one takes more
  const bool shared = knob_int("FERRY_SHARED_GPUS") != 0;
  for (int i = 0; i < n; ++i) {
    check_device_ordinal(devices[i], "devices[" + std::to_string(i) + "]");
    for (int j = 0; j < i; ++j)
      FERRY_ARG_CHECK(shared || devices[i] != devices[j],
                      "devices lists GPU " + std::to_string(devices[i]) + " twice; expected distinct GPUs");
  }
  std::unique_ptr<Communicator> c(new Communicator());
  c->world_ = n;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < i; ++j) c->shares_gpus_ = c->shares_gpus_ || devices[i] == devices[j];
  c->init_common(timeout_s, devices[0]);
  for (int i = 0; i < n; ++i) {
    FERRY_CUDA_CHECK(cudaSetDevice(devices[i]));
    for (int j = 0; j < n; ++j) {
      if (devices[i] == devices[j]) continue;
      int can = 0;
      FERRY_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, devices[i], devices[j]));
      if (!can)
        throw_error(FERRY_ERROR_UNSUPPORTED, "GPU " + std::to_string(devices[i]) + " cannot access GPU " +
                                                 std::to_string(devices[j]) +
                                                 " peer-to-peer; ferry needs P2P (NVLink or PCIe) between all GPUs");
      cudaError_t err = cudaDeviceEnablePeerAccess(devices[j], 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled)
        cudaGetLastError();
      else
        FERRY_CUDA_CHECK(err);
    }
    c->locals_.push_back(make_local(i, devices[i], n));
    c->flag_mem_.push_back(SharedHostMemory::create(sizeof(HostFlags)));
    c->pids_.push_back(getpid());
  }
  c->memory_ = CollectiveMemory::create(c->group());
  c->attach_memory();
  c->start_watchdog();
  return c;
}

void Communicator::start_watchdog() {
  std::vector<Watchdog::Rank> ranks;
  for (auto& L : locals_)
    ranks.push_back(Watchdog::Rank{L->rank, L->in_flight.get(), L->rescue.get(), L->kernel_fault.host});
  std::vector<HostFlags*> flags;
  for (int q = 0; q < world_; ++q) flags.push_back(host_flags(q));
  watchdog_ = std::make_unique<Watchdog>(std::move(ranks), std::move(flags), pids_, timeout_s_, exit_after_s_, failure_,
                                         [this](const std::string& message) { fail(message); });
  watchdog_->start();
}

Communicator::~Communicator() {
  if (!closed_) {
    try {
      close();
    } catch (...) {
    }
  }
}

void Communicator::refuse_while_held(const char* what) { sync::refuse_while_held(what, "freeing GPU memory", this); }

Group Communicator::group() {
  ensure_open("group");
  return peers();
}

Group Communicator::peers() {
  Group g;
  g.world = world_;
  for (auto& L : locals_) {
    g.ranks.push_back(L->rank);
    g.devices.push_back(L->device);
  }
  g.timeout_s = timeout_s_;
  if (multi_process_) {
    g.allgather = allgather_;
    g.allgather_on_host = allgather_on_host_;
    g.fds = fds_;
    g.socket_paths = socket_paths_;
    // Descriptor messages of the communicator and of its users share one
    // numbering, so that every rank gives the same tag to the same message.
    g.next_tag = [count = next_fd_tag_] { return (*count)++; };
  }
  return g;
}

std::vector<std::string> Communicator::allgather(const std::string& mine, const char* what) {
  auto all = allgather_(mine);
  if (static_cast<int>(all.size()) != world_)
    throw_error(FERRY_ERROR_INTERNAL, std::string(what) + ": the bootstrap all-gather returned " +
                                          std::to_string(all.size()) + " records for " + std::to_string(world_) +
                                          " ranks");
  return all;
}

void Communicator::ensure_open(const char* what) {
  if (closed_) throw_error(FERRY_ERROR_CLOSED, std::string(what) + ": the communicator is closed");
  if (failure_.broken()) check();
}

// ---------------------------------------------------------------- buffers

std::vector<void*> Communicator::alloc(size_t bytes) {
  ensure_open("alloc");
  FERRY_ARG_CHECK(bytes > 0, "alloc: bytes must be positive");
  const Registration& reg = memory_->allocate(bytes);
  recent_calls_.clear();
  std::vector<void*> out;
  for (auto& L : locals_) out.push_back(reg.base[L->rank]);
  return out;
}

void Communicator::register_buffers(const std::vector<void*>& ptrs, const std::vector<size_t>& sizes) {
  ensure_open("register");
  FERRY_ARG_CHECK(static_cast<int>(ptrs.size()) == local_count() && sizes.size() == ptrs.size(),
                  "register: expected one buffer and size per local rank (" + std::to_string(local_count()) + ")");
  // With one process per rank a refusal travels to the peers, which are
  // already in the collective part of the call, so that all refuse together.
  std::string problem;
  try {
    for (int i = 0; i < local_count(); ++i) {
      check_device_pointer(ptrs[i], device(i), "register: buffer");
      FERRY_ARG_CHECK(sizes[i] > 0, "register: size must be positive");
    }
  } catch (const Error& e) {
    if (!memory_->multi_process()) throw;
    problem = e.what();
  }
  memory_->register_buffers(ptrs, sizes, problem);
  recent_calls_.clear();
}

void Communicator::deregister(const std::vector<void*>& ptrs) {
  ensure_open("deregister");
  FERRY_ARG_CHECK(static_cast<int>(ptrs.size()) == local_count(), "deregister: expected one pointer per local rank");
  const Registration* reg = memory_->starting_at(ptrs[0]);
  if (!reg) throw_error(FERRY_ERROR_NOT_REGISTERED, "deregister: the pointer is not the start of a registered buffer");
  FERRY_ARG_CHECK(!reg->owned, "deregister: this buffer came from alloc(); release it with free()");
  prepared_.refuse_if_uses(reg->id, "deregister");
  prepared_.refuse_if_armed("deregister");
  refuse_while_held("deregister");
  synchronize();
  memory_->release(reg->id);
  recent_calls_.clear();
}

void Communicator::free(const std::vector<void*>& ptrs) {
  if (closed_) throw_error(FERRY_ERROR_CLOSED, "free: the communicator is closed");
  FERRY_ARG_CHECK(static_cast<int>(ptrs.size()) == local_count(), "free: expected one pointer per local rank");
  // Every rank says how its own checks went (a broken communicator among
  // them) before any enters the heap's exchange: a rank raising alone would
  // leave its peers there until the bootstrap's timeout.
  const Registration* reg = nullptr;
  LocalFailure checks;
  checks.run([&] {
    ensure_open("free");
    reg = memory_->starting_at(ptrs[0]);
    if (!reg)
      throw_error(FERRY_ERROR_NOT_REGISTERED, "free: the pointer did not come from this communicator's alloc()");
    FERRY_ARG_CHECK(reg->owned, "free: this buffer was registered, not allocated by ferry; use deregister()");
    prepared_.refuse_if_uses(reg->id, "free");
    prepared_.refuse_if_armed("free");
    refuse_while_held("free");
    synchronize();
  });
  if (multi_process_)
    checks.agree(peers(), "free");
  else
    checks.rethrow();
  memory_->release(reg->id);
  recent_calls_.clear();
}

// ---------------------------------------------------------------- errors and lifetime

void Communicator::fail(const std::string& message) {
  // Also said at once: the next call that raises it may be far away (a
  // graph being replayed makes no ferry call at all).
  if (failure_.set(message)) std::fprintf(stderr, "ferry: communicator failed: %s\n", message.c_str());
  // ferry's kernels that wait for a peer (SM path, signal rounds) give up now.
  for (auto& L : locals_)
    if (L->kernel_abort.host) __atomic_store_n(L->kernel_abort.host, uint64_t{1}, __ATOMIC_RELEASE);
}

void Communicator::abandon_call(int local, size_t slot, cudaStream_t stream, const std::string& what,
                                const std::exception& why) {
  locals_[local]->in_flight->abandon(slot, stream);
  fail(what + " on rank " + std::to_string(rank(local)) + " could not enqueue all its commands (" + why.what() +
       "); its peers would wait for the rest. Close this communicator");
}

void Communicator::check() {
  // A ferry kernel that gave up has finished: a caller that waited
  // for it must hear why now, not at the watchdog's next look.
  if (watchdog_)
    for (int i = 0; i < local_count(); ++i) watchdog_->check_kernel_fault(i);
  failure_.raise();
}

void Communicator::synchronize() {
  if (closed_) throw_error(FERRY_ERROR_CLOSED, "synchronize: the communicator is closed");
  check();
  prepared_.refuse_if_armed("synchronize");
  wait_for_enqueued();
  retire_released();
  sync::run_kept_frees();  // what a teardown kept while an arming of this communicator held its stream
}

void Communicator::wait_for_enqueued() {
  double interval = static_cast<double>(watchdog_interval_ms()) / 1000.0;
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(timeout_s_ + 10 * interval + 1.0));
  for (auto& L : locals_) {
    while (!L->in_flight->idle()) {
      if (std::chrono::steady_clock::now() > deadline) {
        check();
        throw_error(FERRY_ERROR_TIMEOUT, "synchronize: collectives on rank " + std::to_string(L->rank) +
                                             " did not finish within " + std::to_string(timeout_s_) +
                                             " s, and every peer did its part: the stream is held by other work");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  check();
}

void Communicator::close() {
  if (closed_) throw_error(FERRY_ERROR_CLOSED, "close: the communicator is already closed");
  host_trace_report();
  // A handle left armed holds ferry's armed stream in a wait: open its gate so
  // the stream drains (its collective runs, as on every rank that does the same).
  // So does one handed to a kernel (device_trigger) whose trigger has not
  // landed, released or not.
  for (const auto& [id, p] : prepared_.calls())
    if (p.armed || (p.hold && p.hold->holding()))
      for (int i = 0; i < local_count(); ++i) locals_[i]->rescue->open_gate(watched_gate(p, i));
  for (const PreparedCall& p : released_holding_)
    for (int i = 0; i < local_count(); ++i) locals_[i]->rescue->open_gate(watched_gate(p, i));
  try {
    // Also after a failure: the watchdog releases the broken collectives' waits
    // while this waits, so no stream is left blocked on a flag about to be freed.
    wait_for_enqueued();
  } catch (...) {
    // Closing after a failure still releases everything; the error was reported or stays in check().
  }
  watchdog_.reset();  // stops its threads before what it watches goes
  // ferry's own streams only, not the whole device; bounded: a stream still
  // blocked now stays blocked (its memory is then released under it, which
  // CUDA reports on that stream, not here).
  for (auto& L : locals_) L->engines->synchronize(timeout_s_);
  prepared_.drop_holds();  // before their events go
  for (PreparedCall& p : released_holding_) retire(p);
  released_holding_.clear();
  for (const auto& [id, p] : prepared_.calls())
    for (int i = 0; i < local_count() && i < static_cast<int>(p.finished.size()); ++i) {
      cudaSetDevice(device(i));
      cudaEventDestroy(p.finished[i]);
    }
  prepared_.clear();
  for (auto& L : locals_) {
    cudaSetDevice(L->device);
    L->gates.drop_retiring();
  }
  // Closed, not dropped: what it says of the SM path stays readable (choose()).
  if (memory_) memory_->close();
  // Freeing waits for every stream of the GPU: what the local ranks and the
  // flags hold is kept for later while an armed transfer may hold one.
  const int first_device = locals_.empty() ? 0 : locals_[0]->device;
  auto parts =
      std::make_shared<std::pair<decltype(locals_), decltype(flag_mem_)>>(std::move(locals_), std::move(flag_mem_));
  locals_.clear();
  flag_mem_.clear();
  sync::free_when_unheld(
      [parts, first_device] {
        RelaxedCaptureScope relax;          // it may run on a thread that captures
        DeviceScope restore(first_device);  // the parts set devices of their own; the caller's comes back
        parts->first.clear();
        parts->second.clear();
      },
      "a communicator's streams, records and flags");
  fds_.reset();
  closed_ = true;
}

}  // namespace ferry
