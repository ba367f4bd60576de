// All-gather and all-to-all on copy engines. Both are pushes: every rank copies
// its blocks straight into its peers' registered outputs. Per peer, one
// collective is a handshake in three small copy-engine messages:
//   ready: "you may write into my output" (a 32-byte record into the peer's flags)
//   data:  the pushes themselves
//   done:  "my data for you has landed" (an 8-byte tag into the peer's flags)
// and the stream waits (cuStreamWaitValue64 on local, host-pinned flags) for
// every peer's ready before pushing and every peer's done before moving on.
// No kernel runs unless the local block is copied with the SM kernel.
#include "coll/communicator.hpp"
#include "coll/local_copy.hpp"
#include "coll/signature.hpp"
#include "core/error.hpp"

namespace ferry {

void Communicator::run(CollOp op, const CollectiveArgs& a) {
  const std::string name = coll_op_name(op);
  ensure_open(name.c_str());
  int n = local_count();
  FERRY_ARG_CHECK(static_cast<int>(a.outs.size()) == n && static_cast<int>(a.ins.size()) == n &&
                      static_cast<int>(a.streams.size()) == n,
                  name + ": expected one out, in and stream per local rank (" + std::to_string(n) + ")");
  const size_t bytes = a.bytes_per_rank;
  const size_t out_bytes = bytes * world_;
  const size_t in_bytes = op == CollOp::kAllGather ? bytes : bytes * world_;
  if (bytes == 0) return;

  // Validate every local rank before enqueueing anything: no half-issued collective.
  struct Call {
    const Registration* reg;
    uint64_t offset;
  };
  std::vector<Call> calls(n);
  for (int i = 0; i < n; ++i) {
    int r = rank(i);
    check_device_pointer(a.outs[i], device(i), "out");
    check_device_pointer(a.ins[i], device(i), "in");
    const Registration* reg = find_registration(i, a.outs[i], out_bytes);
    if (!reg)
      throw_error(FERRY_ERROR_NOT_REGISTERED,
                  name + ": out (" + std::to_string(out_bytes) + " bytes on rank " + std::to_string(r) +
                      ") is not inside a buffer registered with this communicator; allocate it with comm.alloc() "
                      "or register it with comm.register()");
    uint64_t offset = static_cast<const char*>(a.outs[i]) - reg->base[r];
    for (int p = 0; p < world_; ++p)
      if (offset + out_bytes > reg->size[p])
        throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                    name + ": out needs " + std::to_string(out_bytes) + " bytes at offset " + std::to_string(offset) +
                        " of buffer #" + std::to_string(reg->id) + ", but rank " + std::to_string(p) +
                        " registered only " + std::to_string(reg->size[p]) + " bytes for it");
    const char* own_block = static_cast<const char*>(a.outs[i]) + static_cast<size_t>(r) * bytes;
    bool in_place = op == CollOp::kAllGather && a.ins[i] == own_block;
    if (!in_place && ranges_overlap(a.outs[i], out_bytes, a.ins[i], in_bytes))
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  name + ": in and out overlap; " +
                      (op == CollOp::kAllGather ? "in may only be this rank's own block of out (in-place)"
                                                : "all_to_all is out-of-place"));
    calls[i] = Call{reg, offset};
  }

  Algo algo = select_algo(op, world_, bytes, a.algo != Algo::kAuto ? a.algo : forced_algo_, table_);
  if (algo == Algo::kPcpy && !pcpy_fits_hardware_queues(world_, cuda_max_connections()))
    throw_error(FERRY_ERROR_UNSUPPORTED,
                name + ": algo 'pcpy' needs " + std::to_string(world_ + 2) + " streams per GPU but CUDA has " +
                    std::to_string(cuda_max_connections()) +
                    " hardware queues (CUDA_DEVICE_MAX_CONNECTIONS); streams sharing a queue can deadlock in stream "
                    "waits. Use 'b2b' or 'seq', or raise CUDA_DEVICE_MAX_CONNECTIONS before CUDA starts");
  uint64_t seq = ++seq_;
  for (int i = 0; i < n; ++i) {
    Local& L = *locals_[i];
    int r = L.rank;
    FERRY_CUDA_CHECK(cudaSetDevice(L.device));
    L.in_flight->order_after_previous(a.streams[i]);
    size_t slot = L.in_flight->begin(seq, op, timeout_s_);
    uint64_t tag = make_tag(seq, call_signature(op, bytes, calls[i].reg->id, calls[i].offset));
    SourceSlot* s = L.in_flight->source_host(slot);
    s->ready.tag = tag;
    s->ready.bytes_per_rank = bytes;
    s->ready.offset = calls[i].offset;
    s->ready.op = static_cast<uint32_t>(op);
    s->ready.registration = calls[i].reg->id;
    s->done.tag = tag;
    std::vector<char*> out_by_rank(world_);
    for (int p = 0; p < world_; ++p) out_by_rank[p] = calls[i].reg->base[p] + calls[i].offset;
    const char* in = static_cast<const char*>(a.ins[i]);
    Copy local = plan_local(op, r, out_by_rank[r], in, bytes);
    if (algo == Algo::kB2b || algo == Algo::kSeq)
      enqueue_one_stream(i, op, out_by_rank, in, bytes, a.streams[i], slot, tag, local, a.local_copy,
                         algo == Algo::kB2b);
    else
      enqueue_pcpy(i, op, out_by_rank, in, bytes, a.streams[i], slot, tag, local, a.local_copy);
    L.in_flight->end(slot, a.streams[i]);
  }
}

void Communicator::enqueue_one_stream(int local, CollOp op, const std::vector<char*>& out_by_rank, const char* in,
                                      size_t bytes, cudaStream_t stream, size_t slot, uint64_t tag,
                                      const Copy& local_copy, LocalCopy how, bool batched) {
  Local& L = *locals_[local];
  const int r = L.rank;
  // Batched copies are not allowed on the legacy default stream: run on our own.
  const bool own_stream = dma::is_legacy_default(stream);
  cudaStream_t s = own_stream ? L.engines->main() : stream;
  if (own_stream) L.engines->order(stream, s);
  const bool side = local_copy.bytes > 0 && local_copy_on_side_stream(local_copy.bytes);
  if (side) {
    L.engines->order(s, L.engines->side());
    copy_local(local_copy, how, L.engines->side());
  } else {
    copy_local(local_copy, how, s);
  }
  const SourceSlot* src = L.in_flight->source_device(slot);
  std::vector<Copy> ready, done;
  std::vector<ValueWait> ready_waits, done_waits;
  for (int k = 1; k < world_; ++k) {
    int p = (r + k) % world_;
    ready.push_back(Copy{&flags_device(p)->ready[r], &src->ready, kReadyCopyBytes});
    done.push_back(Copy{&flags_device(p)->done[r].tag, &src->done.tag, sizeof(uint64_t)});
    ready_waits.push_back(ValueWait{&flags_device(r)->ready[p].tag, tag});
    done_waits.push_back(ValueWait{&flags_device(r)->done[p].tag, tag});
  }
  std::vector<Copy> data;
  for (const auto& pc : plan_pushes(op, r, world_, out_by_rank, in, bytes)) data.push_back(pc.copy);
  dma::copy_batch(s, ready);
  dma::wait_values(s, ready_waits);
  if (batched) {
    dma::copy_batch(s, data);
  } else {
    // Stream order makes the steps of the cyclic shift happen one at a time:
    // at each step every GPU sends to a different peer (DESIGN.md: 374 GB/s
    // busbw at 256 MB this way, against about 200 with all peers at once).
    for (const auto& c : data) dma::copy(s, c);
  }
  dma::copy_batch(s, done);
  dma::wait_values(s, done_waits);
  if (side) L.engines->order(L.engines->side(), s);
  if (own_stream) L.engines->order(s, stream);
}

void Communicator::enqueue_pcpy(int local, CollOp op, const std::vector<char*>& out_by_rank, const char* in,
                                size_t bytes, cudaStream_t stream, size_t slot, uint64_t tag, const Copy& local_copy,
                                LocalCopy how) {
  Local& L = *locals_[local];
  const int r = L.rank;
  const int peers = world_ - 1;
  const SourceSlot* src = L.in_flight->source_device(slot);
  L.engines->fork(stream, peers);
  auto pushes = plan_pushes(op, r, world_, out_by_rank, in, bytes);
  for (int k = 0; k < peers; ++k) {
    cudaStream_t e = L.engines->peer(k);
    int p = pushes[k].peer;
    dma::copy(e, Copy{&flags_device(p)->ready[r], &src->ready, kReadyCopyBytes});
    dma::wait_values(e, {ValueWait{&flags_device(r)->ready[p].tag, tag}});
    dma::copy(e, pushes[k].copy);
    dma::copy(e, Copy{&flags_device(p)->done[r].tag, &src->done.tag, sizeof(uint64_t)});
    dma::wait_values(e, {ValueWait{&flags_device(r)->done[p].tag, tag}});
  }
  copy_local(local_copy, how, stream);
  L.engines->join(stream, peers);
}

}  // namespace ferry
