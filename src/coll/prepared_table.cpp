#include "coll/prepared_table.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "coll/program.hpp"
#include "core/error.hpp"
#include "dma/engine.hpp"

namespace ferry {

int PreparedTable::add(PreparedCall call) {
  const int handle = next_handle_++;
  calls_.emplace(handle, std::move(call));
  return handle;
}

PreparedCall& PreparedTable::get(int handle, const char* what) {
  auto it = calls_.find(handle);
  if (it == calls_.end())
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + ": handle " + std::to_string(handle) +
                                                  " is not a prepared collective of this communicator (released "
                                                  "already?)");
  return it->second;
}

bool PreparedTable::armed(int handle) const {
  auto it = calls_.find(handle);
  return it != calls_.end() && it->second.armed;
}

PreparedCall PreparedTable::release(int handle, const char* what) {
  PreparedCall& call = get(handle, what);
  if (call.armed)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + ": handle " + std::to_string(handle) +
                                                  " is armed; trigger it first (its commands already wait in the "
                                                  "stream)");
  PreparedCall out = std::move(call);
  calls_.erase(handle);
  return out;
}

void PreparedTable::refuse_if_armed(const char* what) const {
  for (const auto& [id, call] : calls_)
    if (call.armed)
      throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                  std::string(what) + ": prepared collective " + std::to_string(id) +
                      " is armed and not triggered, so waiting for every collective would wait for its trigger "
                      "until the timeout; trigger it first (from the host, a stream or a kernel)");
}

void PreparedTable::refuse_if_queue_full(int handle, int local, int rank, const char* what) const {
  const auto ops = [local](const PreparedCall& c) { return c.ops_at(local); };
  size_t queued = 0;
  std::string armed;
  for (const auto& [id, call] : calls_)
    if (call.armed && id != handle && ops(call) > 0) {
      queued += ops(call);
      armed += (armed.empty() ? "" : ", ") + std::to_string(id);
    }
  const auto it = calls_.find(handle);
  const size_t mine = it == calls_.end() ? 0 : ops(it->second);
  if (mine == 0 || queued + mine <= kArmedOpsMax) return;
  throw_error(FERRY_ERROR_INVALID_ARGUMENT,
              std::string(what) + ": handle " + std::to_string(handle) + " puts about " + std::to_string(mine) +
                  " operations on rank " + std::to_string(rank) + "'s armed stream, behind about " +
                  std::to_string(queued) + " of handles armed and not yet triggered (" + armed +
                  "); a stream's queue holds about a thousand, so at most " + std::to_string(kArmedOpsMax) +
                  " may wait behind gates: trigger those handles first");
}

PreparedTable::QueueRoom PreparedTable::queue_room(int handle, int local,
                                                   const std::function<bool(const PreparedCall&)>& unfinished,
                                                   const std::vector<PreparedCall>& released) const {
  const auto ops = [local](const PreparedCall& c) { return c.ops_at(local); };
  struct Run {
    uint64_t generation;
    size_t ops;
    int id;
  };
  // Every triggered run may still be on the stream: one handed to a kernel
  // not yet launched holds itself and every later run behind its gate.
  std::vector<std::pair<Run, const PreparedCall*>> ran;
  size_t armed_ops = 0, ran_ops = 0;
  uint64_t first_armed = UINT64_MAX;  // the oldest armed handle's gate value: runs armed later queue behind it
  std::vector<int> armed;
  const auto look = [&](int id, const PreparedCall& c) {
    if (ops(c) == 0 || c.generation == 0) return;
    if (c.armed && id != handle) {
      armed_ops += ops(c);
      first_armed = std::min(first_armed, c.generation);
      armed.push_back(id);
    } else if (!c.armed) {
      ran.push_back({Run{c.generation, ops(c), id}, &c});
      ran_ops += ops(c);
    }
  };
  for (const auto& [id, call] : calls_) look(id, call);
  for (size_t k = 0; k < released.size(); ++k) look(-1 - static_cast<int>(k), released[k]);
  const auto it = calls_.find(handle);
  const size_t mine = it == calls_.end() ? 0 : ops(it->second);
  // Without asking the GPU first: most armings fit even if nothing ran yet.
  if (mine == 0 || armed_ops + ran_ops + mine <= dma::kQueueOpsBehindAWait) return {};
  std::vector<Run> handed;
  size_t total = armed_ops + mine;
  for (const auto& [r, c] : ran)
    if (unfinished(*c)) {
      handed.push_back(r);
      total += r.ops;
    }
  if (total <= dma::kQueueOpsBehindAWait) return {};
  // Runs end in the order they were armed: wait for the oldest, as few as
  // make room. One armed after an armed handle ends only after the host
  // triggers that handle, which it cannot do inside arm().
  std::sort(handed.begin(), handed.end(), [](const Run& x, const Run& y) { return x.generation < y.generation; });
  QueueRoom room;
  for (const Run& r : handed) {
    if (total <= dma::kQueueOpsBehindAWait) break;
    if (r.generation > first_armed) {
      room.wait_for.clear();
      room.armed = armed;
      return room;
    }
    room.wait_for.push_back(r.id);
    total -= r.ops;
  }
  return room;
}

void PreparedTable::refuse_if_uses(uint32_t registration, const char* what) const {
  for (const auto& [id, call] : calls_)
    for (uint32_t r : call.registrations)
      if (r == registration)
        throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(what) + ": buffer #" + std::to_string(registration) +
                                                      " is used by prepared collective " + std::to_string(id) +
                                                      "; release that handle first");
}

}  // namespace ferry
