#include "coll/prepared_table.hpp"

#include <string>
#include <utility>

#include "coll/program.hpp"
#include "core/error.hpp"

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
  const auto ops = [local](const PreparedCall& c) {
    return static_cast<size_t>(local) < c.ops.size() ? c.ops[static_cast<size_t>(local)] : size_t(0);
  };
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

std::vector<int> PreparedTable::runs_to_wait_for(int handle, int local,
                                                 const std::function<bool(const PreparedCall&)>& unfinished) const {
  const auto ops = [local](const PreparedCall& c) {
    return static_cast<size_t>(local) < c.ops.size() ? c.ops[static_cast<size_t>(local)] : size_t(0);
  };
  size_t queued = 0;
  std::vector<int> handed;
  for (const auto& [id, call] : calls_) {
    if (ops(call) == 0) continue;
    if (call.armed && id != handle) {
      queued += ops(call);
    } else if (call.handed_to_kernels && unfinished(call)) {
      queued += ops(call);
      handed.push_back(id);
    }
  }
  const auto it = calls_.find(handle);
  const size_t mine = it == calls_.end() ? 0 : ops(it->second);
  if (mine == 0 || queued + mine <= kArmedOpsMax) return {};
  return handed;
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
