// Validating and planning collective calls. Every call is checked on every
// local rank before anything is enqueued (no half-issued collective), then
// turned into a Program of exchanges, reductions and local copies (plan.hpp).
#include "coll/communicator.hpp"
#include "coll/signature.hpp"
#include "coll/tuning.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/host_trace.hpp"
#include "dma/engine.hpp"

namespace ferry {
namespace {

size_t round_up(size_t x, size_t to) { return (x + to - 1) / to * to; }

std::string bytes_str(size_t b) { return std::to_string(b) + " bytes"; }

// Reduce-scatter's data movement and reduction, in rounds (reduce_round_bytes):
// round j pushes bytes [begin, begin + len) of every peer's block into that
// peer's slot for this rank, then reduces the same bytes of this rank's block
// into `result`. Every round's reduction but the last runs beside the next
// round's pushes. `blocks`: the block each rank ends with, as parts of `in`.
void add_reduce_scatter(Program& program, int rank, const std::vector<Block>& blocks, const char* in, char* result,
                        const std::vector<char*>& scratch_by_rank, size_t slot_stride, const CollectiveArgs& a) {
  const int world = static_cast<int>(blocks.size());
  const size_t largest = largest_block(blocks);
  const long long forced = knob_int("FERRY_REDUCE_ROUND_BYTES");
  FERRY_ARG_CHECK(forced >= 0, "FERRY_REDUCE_ROUND_BYTES=" + std::to_string(forced) +
                                   "; expected 0 (ferry's rule) or the bytes of each round");
  const auto rounds = plan_rounds(largest, reduce_round_bytes(largest, static_cast<size_t>(forced)));
  const long long grid = knob_int("FERRY_REDUCE_BLOCKS");
  FERRY_ARG_CHECK(grid >= 1 && grid <= 1024,
                  "FERRY_REDUCE_BLOCKS=" + std::to_string(grid) + "; expected 1..1024 blocks");
  for (size_t j = 0; j < rounds.size(); ++j) {
    std::vector<Block> part;
    std::vector<char*> slots;
    for (int p = 0; p < world; ++p) {
      part.push_back(block_round(blocks[p], rounds[j]));
      slots.push_back(scratch_by_rank[p] + rounds[j].begin);
    }
    program.add_exchange(plan_scatter_to_scratch(rank, world, slots, in, part, slot_stride));
    const Block& mine = part[rank];
    program.add_reduce(ReduceStep{result + rounds[j].begin, in + mine.offset, slots[rank], slot_stride, rank, world,
                                  mine.bytes / dtype_bytes(a.dtype), a.dtype, a.red_op, static_cast<int>(grid)},
                       j + 1 < rounds.size());
  }
}

}  // namespace

size_t Communicator::selection_bytes(const CollectiveArgs& a) const {
  switch (a.op) {
    case CollOp::kAllToAllv: {
      size_t total = 0;
      for (size_t c : a.counts) total += c;
      return total / (static_cast<size_t>(world_) * world_);
    }
    case CollOp::kReduceScatter:
      return a.count * dtype_bytes(a.dtype);
    case CollOp::kAllReduce:
      return a.count * dtype_bytes(a.dtype) / world_;
    default:
      return a.bytes_per_rank;
  }
}

Communicator::Resolved Communicator::choose(CollOp op, size_t bytes_per_rank) const {
  const Selection s =
      select_variant_with_sm(op, world_, bytes_per_rank, bytes_per_rank, sm_path_slot_bytes_, forced_algo_, table_);
  return {s.algo, kernel_signals(Signals::kAuto, s.signals, kernel_signals_default_)};
}

size_t Communicator::sm_largest_block(const CollectiveArgs& a) const {
  const bool reduction = a.op == CollOp::kReduceScatter || a.op == CollOp::kAllReduce;
  return sm_path_largest_block(a.op, reduction ? a.count * dtype_bytes(a.dtype) : a.bytes_per_rank, a.counts);
}

bool Communicator::sm_path_takes(CollOp op, size_t largest_block) const {
  return sm_path_unsupported(op, world_, largest_block, sm_path_slot_bytes_).empty();
}

// An explicit algo wins (build() explains an "sm" the call cannot take),
// and then the table's rule says nothing about signals.
Communicator::Resolved Communicator::resolve(const CollectiveArgs& a) const {
  const Selection s = a.algo != Algo::kAuto
                          ? Selection{a.algo, Signals::kAuto}
                          : select_variant_with_sm(a.op, world_, selection_bytes(a), sm_largest_block(a),
                                                   sm_path_slot_bytes_, forced_algo_, table_);
  return {s.algo, kernel_signals(a.signals, s.signals, kernel_signals_default_)};
}

void Communicator::set_selector_table(const std::vector<SelectorRule>& rules) {
  table_ = rules.empty() ? startup_table_ : rules;
  recent_calls_.clear();  // their variants were chosen with the old table
}

void Communicator::set_selector_preset(const std::string& preset) {
  set_selector_table(shipped_preset(shipped_tables(), gpu_name_, world_, preset));
}

Expectation Communicator::expectation(uint64_t seq, const CollectiveArgs& a, const Built& b) const {
  Expectation x;
  x.seq = seq;
  x.op = a.op;
  x.value = b.value;
  x.record = b.record.host;
  x.targets_mask = b.program.targets_mask;
  x.sources_mask = b.program.sources_mask;
  return x;
}

std::vector<Communicator::Built> Communicator::build(const CollectiveArgs& a, std::vector<uint32_t>* regs_used) {
  const std::string name = coll_op_name(a.op);
  ensure_open(name.c_str());
  const int n = local_count();
  FERRY_ARG_CHECK(static_cast<int>(a.outs.size()) == n && static_cast<int>(a.ins.size()) == n &&
                      static_cast<int>(a.streams.size()) == n,
                  name + ": expected one out, in and stream per local rank (" + std::to_string(n) + ")");
  const size_t W = static_cast<size_t>(world_);
  const bool reduction = a.op == CollOp::kReduceScatter || a.op == CollOp::kAllReduce;
  const size_t esize = reduction ? dtype_bytes(a.dtype) : 1;
  if (reduction) FERRY_ARG_CHECK(esize > 0, name + ": dtype is not one ferry reduces");

  // The shape that must match on every rank (what each rank's `out` and `in`
  // hold: rank_bytes).
  size_t shape = 0;
  uint64_t extra = 0;
  switch (a.op) {
    case CollOp::kAllGather:
    case CollOp::kAllToAll:
      shape = a.bytes_per_rank;
      break;
    case CollOp::kAllToAllv: {
      FERRY_ARG_CHECK(a.counts.size() == W * W, name + ": counts must hold world * world = " + std::to_string(W * W) +
                                                    " entries (bytes from rank s to rank d at [s * world + d]), got " +
                                                    std::to_string(a.counts.size()));
      std::vector<uint64_t> c(a.counts.begin(), a.counts.end());
      extra = hash_values(c.data(), c.size());
      for (size_t x : a.counts) shape += x;
      break;
    }
    case CollOp::kBroadcast:
      FERRY_ARG_CHECK(a.root >= 0 && a.root < world_,
                      name + ": root is " + std::to_string(a.root) + "; expected 0.." + std::to_string(world_ - 1));
      shape = a.bytes_per_rank;
      extra = static_cast<uint64_t>(a.root);
      break;
    case CollOp::kReduceScatter:
    case CollOp::kAllReduce:
      shape = a.count * esize;
      extra = uint64_t(a.dtype) << 8 | uint64_t(a.red_op);
      break;
  }
  // Nothing moves anywhere: nothing to enqueue, so nothing to order in the
  // streams (a prepared call arms and triggers as usual; a capture records nothing).
  if (shape == 0) return {};
  const bool sm = resolve(a).algo == Algo::kSm;
  if (sm) {
    const std::string why = sm_path_unsupported(a.op, world_, sm_largest_block(a), sm_path_slot_bytes_);
    FERRY_ARG_CHECK(why.empty(), name + ": " + why);
  }

  const size_t scratch_cap = static_cast<size_t>(std::max<long long>(4096, knob_int("FERRY_SCRATCH_BYTES")));
  // Scratch, when the call needs it; sized the same on every rank (the call is collective).
  size_t slot_stride = 0, chunk = 0;
  const bool in_place_a2a = a.op == CollOp::kAllToAll && a.ins[0] == a.outs[0];
  if (in_place_a2a && !sm) {
    chunk = in_place_chunk(shape, world_, scratch_cap);
    slot_stride = scratch_slot_stride(chunk);
  } else if (a.op == CollOp::kReduceScatter && !sm) {
    slot_stride = scratch_slot_stride(shape);
  } else if (a.op == CollOp::kAllReduce && !sm) {
    slot_stride = scratch_slot_stride(largest_block(all_reduce_blocks(a.count, esize, world_)));
  }

  // all_to_all(v) out of place: the own block may bounce through the next
  // rank's scratch (own_block_bounce_bytes).
  const bool capturing = dma::is_capturing(a.streams[0]);
  size_t bounce_bytes = 0;
  if (!sm && ((a.op == CollOp::kAllToAll && !in_place_a2a) || a.op == CollOp::kAllToAllv)) {
    const size_t own = a.op == CollOp::kAllToAll ? shape : all_to_allv_largest_own(world_, a.counts);
    bounce_bytes = own_block_bounce_bytes(a.local_copy, own, world_, !capturing || find_scratch(own));
  }
  const size_t scratch_need = slot_stride ? slot_stride * W : bounce_bytes;

  // Before any per-rank check that could fail on one rank only: growing the
  // scratch is itself collective.
  const ScratchBlock* scr = nullptr;
  if (scratch_need) {
    scr = find_scratch(scratch_need);
    if (!scr && capturing)
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  name + ": needs " + bytes_str(scratch_need) +
                      " of scratch per rank, and allocating it is a collective step that must not happen while a "
                      "CUDA graph is being captured; call comm.reserve_scratch(" +
                      std::to_string(scratch_need) + ") on every rank before capturing");
    if (!scr) scr = &scratch(scratch_need);
  }
  std::vector<char*> scratch_by_rank(world_, nullptr);
  if (scr)
    for (int p = 0; p < world_; ++p) scratch_by_rank[p] = heap_->at(p, scr->offset);

  std::vector<Built> out(n);
  for (int i = 0; i < n; ++i) {
    const int r = rank(i);
    char* o = static_cast<char*>(a.outs[i]);
    const char* in = static_cast<const char*>(a.ins[i]);
    // A pointer is checked only where this rank moves bytes through it: an
    // empty part (a zero-element tensor: a null pointer) is fine.
    const RankBytes mine = rank_bytes(a.op, world_, r, a.root, shape, a.counts);
    if (mine.out) check_device_pointer(o, device(i), "out");
    if (mine.in) check_device_pointer(in, device(i), "in");

    // Where peers write: `out` (registered) or ferry's scratch.
    const bool writes_out = a.op != CollOp::kReduceScatter && !in_place_a2a;
    const Registration* reg = nullptr;
    uint64_t offset = 0;
    std::vector<char*> out_by_rank(world_, nullptr);
    if (writes_out) {
      // Only all_to_allv lets a rank's out be empty while others' are not:
      // this rank still writes into its peers' outputs, found at its own
      // out's offset in its registered buffer, which a null pointer lacks.
      if (!o)
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    name + ": out on rank " + std::to_string(r) +
                        " is empty and has no address (a null pointer: a zero-element tensor of its own, not a "
                        "view of a registered buffer); peers' outputs are found at the offset of this rank's out "
                        "in its registered buffer, so pass an empty slice of that buffer (e.g. out_buffer[:0])");
      reg = find_registration(i, o, mine.out);
      if (!reg)
        throw_error(FERRY_ERROR_NOT_REGISTERED,
                    name + ": out (" + bytes_str(mine.out) + " on rank " + std::to_string(r) +
                        ") is not inside a buffer registered with this communicator; allocate it with comm.alloc() "
                        "or register it with comm.register()");
      offset = o - reg->base[r];
      for (int p = 0; p < world_; ++p) {
        const size_t need = rank_bytes(a.op, world_, p, a.root, shape, a.counts).out;
        if (offset + need > reg->size[p])
          throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                      name + ": out needs " + bytes_str(need) + " at offset " + std::to_string(offset) +
                          " of buffer #" + std::to_string(reg->id) + " on rank " + std::to_string(p) +
                          ", but that rank registered only " + bytes_str(reg->size[p]) + " for it");
        out_by_rank[p] = reg->base[p] + offset;
      }
      if (regs_used) regs_used->push_back(reg->id);
    }

    // Overlap between in and out: only the documented in-place forms.
    if (mine.in) {
      bool allowed = false;
      std::string rule;
      switch (a.op) {
        case CollOp::kAllGather:
          allowed = in == o + static_cast<size_t>(r) * shape;
          rule = "in may only be this rank's own block of out (in-place)";
          break;
        case CollOp::kAllToAll:
          allowed = in == o;
          rule = "in may only be out itself (in-place)";
          break;
        case CollOp::kReduceScatter:
          allowed = in + static_cast<size_t>(r) * shape == o;
          rule = "out may only be this rank's own block of in";
          break;
        case CollOp::kBroadcast:
        case CollOp::kAllReduce:
          allowed = in == o;
          rule = "in may only be out itself (in-place)";
          break;
        case CollOp::kAllToAllv:
          rule = "all_to_allv is out-of-place";
          break;
      }
      if (!allowed && ranges_overlap(o, mine.out, in, mine.in))
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    name + ": in and out overlap on rank " + std::to_string(r) + "; " + rule);
    }
    if (in_place_a2a && a.ins[i] != a.outs[i])
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  name + ": in-place on some local ranks and not on others; pass in == out on all or none");

    Built& b = out[i];
    const uint32_t reg_id = reg ? reg->id : 0;
    const uint32_t sig = call_signature(a.op, shape, reg_id, offset, extra);
    b.value = flag_value(sig);
    ReadyRecord s{};
    s.value = b.value;
    s.bytes_per_rank = shape;
    s.offset = offset;
    s.op = static_cast<uint32_t>(a.op);
    s.registration = reg_id;
    b.record = locals_[i]->records->intern(s);
    if (sm) {
      b.program.add_sm_path(plan_sm_path(a.op, r, world_, in, o, shape, a.root, a.counts, sig,
                                         reduction ? static_cast<uint32_t>(a.dtype) : 0,
                                         reduction ? static_cast<uint32_t>(a.red_op) : 0));
      continue;
    }
    switch (a.op) {
      case CollOp::kAllGather:
        b.program.add_exchange(plan_all_gather(r, world_, out_by_rank, in, shape));
        break;
      case CollOp::kAllToAll:
        if (!in_place_a2a) {
          b.program.add_exchange(
              plan_all_to_all(r, world_, out_by_rank, in, shape, bounce_bytes ? &scratch_by_rank : nullptr));
          break;
        }
        for (const auto& round : plan_rounds(shape, chunk)) {
          b.program.add_exchange(plan_in_place_round(r, world_, scratch_by_rank, o, shape, round, slot_stride));
          b.program.add_unpack(plan_in_place_unpack(r, world_, o, scratch_by_rank[r], shape, round, slot_stride));
        }
        break;
      case CollOp::kAllToAllv:
        b.program.add_exchange(
            plan_all_to_allv(r, world_, out_by_rank, in, a.counts, bounce_bytes ? &scratch_by_rank : nullptr));
        break;
      case CollOp::kBroadcast:
        b.program.add_exchange(plan_broadcast(r, world_, a.root, out_by_rank, in, shape));
        break;
      case CollOp::kReduceScatter: {
        std::vector<Block> blocks;
        for (int p = 0; p < world_; ++p) blocks.push_back(Block{static_cast<size_t>(p) * shape, shape});
        add_reduce_scatter(b.program, r, blocks, in, o, scratch_by_rank, slot_stride, a);
        break;
      }
      case CollOp::kAllReduce: {
        // Blocks of the whole buffer (one exchange: nothing left to gather),
        // or one block per rank, reduced by its owner and gathered.
        const auto blocks = all_reduce_blocks(a.count, esize, world_);
        add_reduce_scatter(b.program, r, blocks, in, o + blocks[r].offset, scratch_by_rank, slot_stride, a);
        if (!all_reduce_one_exchange(world_, shape))
          b.program.add_exchange(plan_gather_blocks(r, world_, out_by_rank, blocks));
        break;
      }
    }
  }
  return out;
}

const Communicator::ScratchBlock* Communicator::find_scratch(size_t bytes) const {
  return !scratch_.empty() && scratch_.back().bytes >= bytes ? &scratch_.back() : nullptr;
}

const Communicator::ScratchBlock& Communicator::scratch(size_t bytes) {
  if (const ScratchBlock* s = find_scratch(bytes)) return *s;
  // Grow (collective: every rank makes the same call, the collective that
  // needs it or reserve_scratch()). The old block stays allocated until
  // close: graphs and prepared collectives may still point at it.
  const size_t size = round_up(bytes, size_t(2) << 20);
  scratch_.push_back(ScratchBlock{heap_->alloc(size, size_t(2) << 20, {}), size});
  return scratch_.back();
}

void Communicator::reserve_scratch(size_t bytes) {
  ensure_open("reserve_scratch");
  FERRY_ARG_CHECK(bytes > 0, "reserve_scratch: bytes must be positive");
  scratch(bytes);
}

std::shared_ptr<const Communicator::PlannedCall> Communicator::plan_call(const CollectiveArgs& a, bool capturing) {
  ensure_open(coll_op_name(a.op));
  std::string key = call_key(a, capturing);
  if (auto known = recent_calls_.find(key)) return known;
  auto call = std::make_shared<PlannedCall>();
  call->built = build(a);
  call->how = resolve(a);
  // The replay cache's key, once per distinct call instead of once per call.
  for (int i = 0; i < static_cast<int>(call->built.size()); ++i) {
    const Built& b = call->built[i];
    call->replay_keys.push_back(
        locals_[i]->replays && replayable(b.program)
            ? emission_key(b.program, b.record.mapped, call->how.algo, a.local_copy, call->how.kernel_signals)
            : std::string());
  }
  recent_calls_.put(key, call);
  return call;
}

void Communicator::run(const CollectiveArgs& a) {
  HostTraceScope whole(HostStage::kRun);
  FERRY_ARG_CHECK(
      static_cast<int>(a.streams.size()) == local_count(),
      std::string(coll_op_name(a.op)) + ": expected one stream per local rank (" + std::to_string(local_count()) + ")");
  const bool capturing = dma::is_capturing(a.streams[0]);
  std::shared_ptr<const PlannedCall> call;
  {
    HostTraceScope t(HostStage::kBuild);
    call = plan_call(a, capturing);
  }
  const std::vector<Built>& built = call->built;
  if (built.empty()) return;
  const Resolved how = call->how;
  const uint64_t seq = capturing ? 0 : ++seq_;
  for (int i = 0; i < local_count(); ++i) {
    Local& L = *locals_[i];
    host_trace_rank(coll_op_name(a.op), L.rank, L.device);
    FERRY_CUDA_CHECK(cudaSetDevice(L.device));
    Emission e;
    e.stream = a.streams[i];
    e.algo = how.algo;
    e.local_copy = a.local_copy;
    e.kernel_signals = how.kernel_signals;
    if (capturing) {
      FERRY_ARG_CHECK(dma::is_capturing(a.streams[i]),
                      std::string(coll_op_name(a.op)) + ": some streams are capturing a CUDA graph and others not");
      const uint64_t* state = nullptr;
      {
        std::lock_guard<std::mutex> lock(captured_mu_);
        auto key = std::make_pair(i, static_cast<const ReadyRecord*>(built[i].record.host));
        auto it = captured_.find(key);
        if (it == captured_.end()) {
          Captured c;
          c.local = i;
          c.expect = expectation(0, a, built[i]);
          c.state = L.records->word();
          it = captured_.emplace(key, std::move(c)).first;
        }
        state = it->second.state.device;
      }
      e.state_word = state;
      emit(i, built[i], e);
      continue;
    }
    size_t slot = 0;
    {
      HostTraceScope t(HostStage::kInFlight);
      L.in_flight->order_after_previous(a.streams[i]);
      slot = L.in_flight->begin(expectation(seq, a, built[i]), timeout_s_);
    }
    emit_eager(i, built[i], e, call->replay_keys[i]);
    HostTraceScope t(HostStage::kInFlight);
    L.in_flight->end(slot, a.streams[i]);
    __atomic_store_n(&host_flags(L.rank)->progress.enqueued, seq, __ATOMIC_RELEASE);
  }
}

}  // namespace ferry
