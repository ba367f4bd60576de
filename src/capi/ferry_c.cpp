// The C API: a thin shim that turns ferry::Error into result codes and a
// thread-local message.
#include <cstring>
#include <string>

#include "capi/comm_handle.hpp"
#include "capi/guarded.hpp"
#include "coll/communicator.hpp"
#include "core/error.hpp"
#include "ferry/ferry.h"

// The C enums are cast to ferry's: their values must agree.
static_assert(FERRY_ALGO_PCPY == static_cast<int>(ferry::Algo::kPcpy) &&
                  FERRY_ALGO_B2B == static_cast<int>(ferry::Algo::kB2b) &&
                  FERRY_ALGO_SEQ == static_cast<int>(ferry::Algo::kSeq) &&
                  FERRY_ALGO_SM == static_cast<int>(ferry::Algo::kSm),
              "ferry_algo_t");
static_assert(FERRY_OP_ALL_GATHER == static_cast<int>(ferry::CollOp::kAllGather) &&
                  FERRY_OP_ALL_REDUCE == static_cast<int>(ferry::CollOp::kAllReduce),
              "ferry_op_t");
static_assert(FERRY_LOCAL_COPY_PEER == static_cast<int>(ferry::LocalCopy::kPeer), "ferry_local_copy_t");
static_assert(FERRY_SIGNALS_COPY == static_cast<int>(ferry::Signals::kCopy) &&
                  FERRY_SIGNALS_KERNEL == static_cast<int>(ferry::Signals::kKernel),
              "ferry_signals_t");

namespace {

using ferry::capi::enum_in;
using ferry::capi::enum_value;
using ferry::capi::get;
using ferry::capi::guarded;

// A call's own fields, checked before the communicator is looked at, so that
// the checks run (and are tested) without a GPU; make_args and call_args read
// them again as they build the call.
void check_options(const ferry_coll_options_t* options) {
  if (!options) return;
  enum_in(options->algo, FERRY_ALGO_AUTO, FERRY_ALGO_SM, "options->algo is not a ferry_algo_t");
  enum_in(options->local_copy, FERRY_LOCAL_COPY_AUTO, FERRY_LOCAL_COPY_PEER,
          "options->local_copy is not a ferry_local_copy_t");
  enum_in(options->signals, FERRY_SIGNALS_AUTO, FERRY_SIGNALS_KERNEL, "options->signals is not a ferry_signals_t");
}

void check_call(const ferry_call_t* call) {
  FERRY_ARG_CHECK(call, "call must not be NULL");
  const int op = enum_in(call->op, FERRY_OP_ALL_GATHER, FERRY_OP_ALL_REDUCE, "call->op is not a ferry_op_t");
  check_options(&call->options);
  if (op == FERRY_OP_ALL_TO_ALLV)
    FERRY_ARG_CHECK(call->counts, "call->counts must not be NULL for all_to_allv (world * world byte counts)");
  if (op == FERRY_OP_REDUCE_SCATTER || op == FERRY_OP_ALL_REDUCE) {
    FERRY_ARG_CHECK(ferry::dtype_bytes(static_cast<ferry::DType>(enum_value(call->dtype))) > 0,
                    "call->dtype is not a ferry_dtype_t");
    const int red_op = enum_value(call->red_op);
    FERRY_ARG_CHECK(red_op >= FERRY_RED_SUM && red_op <= FERRY_RED_MIN, "call->red_op is not a ferry_red_op_t");
  }
}

ferry::CollectiveArgs make_args(ferry::Communicator& c, ferry::CollOp op, void* const* outs, const void* const* ins,
                                size_t bytes, const ferry_stream_t* streams, const ferry_coll_options_t* options) {
  FERRY_ARG_CHECK(outs && ins, "outs and ins must not be NULL");
  ferry::CollectiveArgs a;
  a.op = op;
  int n = c.local_count();
  a.outs.assign(outs, outs + n);
  a.ins.assign(ins, ins + n);
  a.bytes_per_rank = bytes;
  for (int i = 0; i < n; ++i) a.streams.push_back(streams ? static_cast<cudaStream_t>(streams[i]) : nullptr);
  if (options) {
    const int algo = enum_in(options->algo, FERRY_ALGO_AUTO, FERRY_ALGO_SM, "options->algo is not a ferry_algo_t");
    const int local_copy = enum_in(options->local_copy, FERRY_LOCAL_COPY_AUTO, FERRY_LOCAL_COPY_PEER,
                                   "options->local_copy is not a ferry_local_copy_t");
    const int signals = enum_in(options->signals, FERRY_SIGNALS_AUTO, FERRY_SIGNALS_KERNEL,
                                "options->signals is not a ferry_signals_t");
    a.algo = static_cast<ferry::Algo>(algo);
    a.local_copy = static_cast<ferry::LocalCopy>(local_copy);
    a.signals = static_cast<ferry::Signals>(signals);
  }
  return a;
}

ferry::CollectiveArgs call_args(ferry::Communicator& c, const ferry_call_t* call) {
  FERRY_ARG_CHECK(call, "call must not be NULL");
  const int op = enum_in(call->op, FERRY_OP_ALL_GATHER, FERRY_OP_ALL_REDUCE, "call->op is not a ferry_op_t");
  auto a =
      make_args(c, static_cast<ferry::CollOp>(op), call->outs, call->ins, call->bytes, call->streams, &call->options);
  int w = c.world();
  if (op == FERRY_OP_ALL_TO_ALLV) {
    FERRY_ARG_CHECK(call->counts, "call->counts must not be NULL for all_to_allv (world * world byte counts)");
    a.counts.assign(call->counts, call->counts + static_cast<size_t>(w) * w);
  }
  a.root = call->root;
  a.count = call->count;
  const int red_op = enum_value(call->red_op);
  a.dtype = static_cast<ferry::DType>(enum_value(call->dtype));
  a.red_op = static_cast<ferry::RedOp>(red_op);
  if (op == FERRY_OP_REDUCE_SCATTER || op == FERRY_OP_ALL_REDUCE) {
    FERRY_ARG_CHECK(ferry::dtype_bytes(a.dtype) > 0, "call->dtype is not a ferry_dtype_t");
    FERRY_ARG_CHECK(red_op >= FERRY_RED_SUM && red_op <= FERRY_RED_MIN, "call->red_op is not a ferry_red_op_t");
  }
  return a;
}

// Checked before the communicator is looked at, so that the checks run (and
// are tested) without a GPU. Each refusal names the rule and its field.
std::vector<ferry::SelectorRule> selector_rules(const ferry_tuning_rule_t* rules, size_t n) {
  FERRY_ARG_CHECK(rules || n == 0, "rules is NULL and n is " + std::to_string(n));
  std::vector<ferry::SelectorRule> t;
  for (size_t i = 0; i < n; ++i) {
    const ferry_tuning_rule_t& r = rules[i];
    const std::string at = "rules[" + std::to_string(i) + "]";
    const int op = enum_in(r.op, FERRY_OP_ALL_GATHER, FERRY_OP_ALL_REDUCE, at + ".op is not a ferry_op_t");
    FERRY_ARG_CHECK(r.world >= 0, at + ".world is " + std::to_string(r.world) + "; expected 0 (any) or a world size");
    const int algo = enum_in(r.algo, FERRY_ALGO_PCPY, FERRY_ALGO_SM,
                             at + ".algo must name a variant (FERRY_ALGO_PCPY, _B2B, _SEQ or _SM), not AUTO");
    const int signals =
        enum_in(r.signals, FERRY_SIGNALS_AUTO, FERRY_SIGNALS_KERNEL, at + ".signals is not a ferry_signals_t");
    t.push_back({static_cast<ferry::CollOp>(op), r.world, r.max_bytes, static_cast<ferry::Algo>(algo),
                 static_cast<ferry::Signals>(signals)});
  }
  return t;
}

std::vector<cudaStream_t> stream_list(ferry::Communicator& c, const ferry_stream_t* streams) {
  std::vector<cudaStream_t> out;
  for (int i = 0; i < c.local_count(); ++i) out.push_back(streams ? static_cast<cudaStream_t>(streams[i]) : nullptr);
  return out;
}

}  // namespace

extern "C" {

const char* ferry_last_error(void) { return ferry::capi::last_error().c_str(); }

const char* ferry_result_name(ferry_result_t r) {
  switch (r) {
    case FERRY_SUCCESS:
      return "FERRY_SUCCESS";
    case FERRY_ERROR_INVALID_ARGUMENT:
      return "FERRY_ERROR_INVALID_ARGUMENT";
    case FERRY_ERROR_NO_GPU:
      return "FERRY_ERROR_NO_GPU";
    case FERRY_ERROR_CUDA:
      return "FERRY_ERROR_CUDA";
    case FERRY_ERROR_SYSTEM:
      return "FERRY_ERROR_SYSTEM";
    case FERRY_ERROR_TIMEOUT:
      return "FERRY_ERROR_TIMEOUT";
    case FERRY_ERROR_NOT_REGISTERED:
      return "FERRY_ERROR_NOT_REGISTERED";
    case FERRY_ERROR_CLOSED:
      return "FERRY_ERROR_CLOSED";
    case FERRY_ERROR_UNSUPPORTED:
      return "FERRY_ERROR_UNSUPPORTED";
    case FERRY_ERROR_BROKEN:
      return "FERRY_ERROR_BROKEN";
    case FERRY_ERROR_INTERNAL:
      return "FERRY_ERROR_INTERNAL";
    case FERRY_ERROR_OUT_OF_MEMORY:
      return "FERRY_ERROR_OUT_OF_MEMORY";
  }
  return "FERRY_ERROR_UNKNOWN";
}

ferry_result_t ferry_comm_init(const ferry_comm_config_t* config, ferry_comm_t* comm) {
  return guarded([&] {
    if (comm) *comm = nullptr;  // a caller that destroys it after a failure destroys nothing
    FERRY_ARG_CHECK(config, "config is NULL");
    FERRY_ARG_CHECK(comm, "comm is NULL; expected where to put the communicator");
    FERRY_ARG_CHECK(config->allgather, "config->allgather must not be NULL");
    ferry_allgather_fn fn = config->allgather;
    void* ctx = config->allgather_ctx;
    int world = config->world;
    // Variable-size blobs over a fixed-size all-gather: sizes first, then padded blobs.
    ferry::AllGatherFn ag = [fn, ctx, world](const std::string& mine) {
      uint64_t len = mine.size();
      std::vector<uint64_t> lens(world);
      if (fn(ctx, &len, sizeof(len), lens.data()) != 0)
        ferry::throw_error(FERRY_ERROR_SYSTEM, "the caller's allgather function failed");
      uint64_t width = 0;
      for (auto l : lens) width = std::max(width, l);
      std::string padded = mine;
      padded.resize(width);
      std::string all(width * world, '\0');
      if (width && fn(ctx, padded.data(), width, all.data()) != 0)
        ferry::throw_error(FERRY_ERROR_SYSTEM, "the caller's allgather function failed");
      std::vector<std::string> out;
      for (int p = 0; p < world; ++p) out.push_back(all.substr(p * width, lens[p]));
      return out;
    };
    auto c = std::make_unique<ferry_comm>();
    c->impl = ferry::Communicator::create(config->rank, world, config->device, ag, config->timeout_s);
    *comm = c.release();
  });
}

ferry_result_t ferry_comm_init_local(const int* devices, int n, double timeout_s, ferry_comm_t* comm) {
  return guarded([&] {
    if (comm) *comm = nullptr;  // a caller that destroys it after a failure destroys nothing
    FERRY_ARG_CHECK(devices, "devices is NULL");
    FERRY_ARG_CHECK(n > 0, "n is " + std::to_string(n) + "; expected at least one GPU");
    FERRY_ARG_CHECK(comm, "comm is NULL; expected where to put the communicator");
    auto c = std::make_unique<ferry_comm>();
    c->impl = ferry::Communicator::create_local(std::vector<int>(devices, devices + n), timeout_s);
    *comm = c.release();
  });
}

ferry_result_t ferry_comm_close(ferry_comm_t comm) {
  return guarded([&] { get(comm).close(); });
}

void ferry_comm_destroy(ferry_comm_t comm) {
  if (!comm) return;
  delete comm;
}

// These return a number, not a result: -1 where there is none to give (no
// handle, an index that is no local rank's, as after close).
int ferry_comm_rank(ferry_comm_t comm, int local_index) {
  if (!comm || !comm->impl || local_index < 0 || local_index >= comm->impl->local_count()) return -1;
  return comm->impl->rank(local_index);
}
int ferry_comm_world(ferry_comm_t comm) { return comm && comm->impl ? comm->impl->world() : -1; }
int ferry_comm_local_count(ferry_comm_t comm) { return comm && comm->impl ? comm->impl->local_count() : -1; }

ferry_result_t ferry_comm_alloc(ferry_comm_t comm, size_t bytes, void** ptrs) {
  return guarded([&] {
    FERRY_ARG_CHECK(ptrs, "ptrs must not be NULL");
    auto v = get(comm).alloc(bytes);
    std::memcpy(ptrs, v.data(), v.size() * sizeof(void*));
  });
}

ferry_result_t ferry_comm_free(ferry_comm_t comm, void* const* ptrs) {
  return guarded([&] {
    FERRY_ARG_CHECK(ptrs, "ptrs must not be NULL");
    get(comm).free(std::vector<void*>(ptrs, ptrs + get(comm).local_count()));
  });
}

ferry_result_t ferry_comm_register(ferry_comm_t comm, void* const* ptrs, const size_t* sizes) {
  return guarded([&] {
    FERRY_ARG_CHECK(ptrs && sizes, "ptrs and sizes must not be NULL");
    int n = get(comm).local_count();
    get(comm).register_buffers(std::vector<void*>(ptrs, ptrs + n), std::vector<size_t>(sizes, sizes + n));
  });
}

ferry_result_t ferry_comm_deregister(ferry_comm_t comm, void* const* ptrs) {
  return guarded([&] {
    FERRY_ARG_CHECK(ptrs, "ptrs must not be NULL");
    get(comm).deregister(std::vector<void*>(ptrs, ptrs + get(comm).local_count()));
  });
}

ferry_result_t ferry_comm_set_tuning(ferry_comm_t comm, const ferry_tuning_rule_t* rules, size_t n) {
  return guarded([&] {
    auto table = selector_rules(rules, n);
    get(comm).set_selector_table(table);
  });
}

ferry_result_t ferry_comm_set_tuning_preset(ferry_comm_t comm, const char* preset) {
  return guarded([&] {
    FERRY_ARG_CHECK(preset, "preset must not be NULL; expected \"sm-free\" or \"latency\"");
    get(comm).set_selector_preset(preset);
  });
}

ferry_result_t ferry_comm_choose(ferry_comm_t comm, ferry_op_t op, size_t bytes_per_rank, ferry_algo_t* algo,
                                 ferry_signals_t* signals) {
  return guarded([&] {
    FERRY_ARG_CHECK(algo && signals, "algo and signals must not be NULL");
    const int which = enum_in(op, FERRY_OP_ALL_GATHER, FERRY_OP_ALL_REDUCE, "op is not a ferry_op_t");
    const ferry::Resolved r = get(comm).choose(static_cast<ferry::CollOp>(which), bytes_per_rank);
    *algo = static_cast<ferry_algo_t>(r.algo);
    *signals = r.kernel_signals ? FERRY_SIGNALS_KERNEL : FERRY_SIGNALS_COPY;
  });
}

ferry_result_t ferry_all_gather(ferry_comm_t comm, void* const* outs, const void* const* ins, size_t bytes_per_rank,
                                const ferry_stream_t* streams, const ferry_coll_options_t* options) {
  return guarded([&] {
    check_options(options);
    ferry::Communicator& c = get(comm);
    c.run(make_args(c, ferry::CollOp::kAllGather, outs, ins, bytes_per_rank, streams, options));
  });
}

ferry_result_t ferry_all_to_all(ferry_comm_t comm, void* const* outs, const void* const* ins, size_t bytes_per_rank,
                                const ferry_stream_t* streams, const ferry_coll_options_t* options) {
  return guarded([&] {
    check_options(options);
    ferry::Communicator& c = get(comm);
    c.run(make_args(c, ferry::CollOp::kAllToAll, outs, ins, bytes_per_rank, streams, options));
  });
}

ferry_result_t ferry_run(ferry_comm_t comm, const ferry_call_t* call) {
  return guarded([&] {
    check_call(call);
    ferry::Communicator& c = get(comm);
    c.run(call_args(c, call));
  });
}

ferry_result_t ferry_prepare(ferry_comm_t comm, const ferry_call_t* call, int* handle) {
  return guarded([&] {
    FERRY_ARG_CHECK(handle, "handle must not be NULL");
    check_call(call);
    ferry::Communicator& c = get(comm);
    *handle = c.prepare(call_args(c, call));
  });
}

ferry_result_t ferry_arm(ferry_comm_t comm, int handle, const ferry_stream_t* after) {
  return ferry_arm_gated(comm, handle, after, FERRY_GATE_HOST);
}

ferry_result_t ferry_arm_gated(ferry_comm_t comm, int handle, const ferry_stream_t* after, ferry_gate_t gate) {
  return guarded([&] {
    const int g =
        enum_in(gate, FERRY_GATE_HOST, FERRY_GATE_DEVICE, "gate must be FERRY_GATE_HOST or FERRY_GATE_DEVICE");
    get(comm).arm(handle, stream_list(get(comm), after), g == FERRY_GATE_DEVICE);
  });
}

ferry_result_t ferry_trigger(ferry_comm_t comm, int handle) {
  return guarded([&] { get(comm).trigger(handle); });
}

ferry_result_t ferry_trigger_on(ferry_comm_t comm, int handle, const ferry_stream_t* streams) {
  return guarded([&] {
    FERRY_ARG_CHECK(streams, "streams must not be NULL");
    get(comm).trigger_on(handle, stream_list(get(comm), streams));
  });
}

ferry_result_t ferry_device_trigger(ferry_comm_t comm, int handle, int local_index, ferry_trigger_t* trigger) {
  return guarded([&] {
    FERRY_ARG_CHECK(trigger, "trigger must not be NULL");
    auto [word, value] = get(comm).device_trigger(handle, local_index);
    trigger->word = reinterpret_cast<unsigned long long*>(word);
    trigger->value = value;
  });
}

ferry_result_t ferry_wait(ferry_comm_t comm, int handle, const ferry_stream_t* streams) {
  return guarded([&] { get(comm).wait(handle, stream_list(get(comm), streams)); });
}

ferry_result_t ferry_release(ferry_comm_t comm, int handle) {
  return guarded([&] { get(comm).release_prepared(handle); });
}

ferry_result_t ferry_comm_check(ferry_comm_t comm) {
  return guarded([&] { get(comm).check(); });
}

ferry_result_t ferry_comm_synchronize(ferry_comm_t comm) {
  return guarded([&] { get(comm).synchronize(); });
}

}  // extern "C"
