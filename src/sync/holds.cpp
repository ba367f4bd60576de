#include "sync/holds.hpp"

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/log.hpp"

namespace ferry {
namespace sync {
namespace {

struct Entry {
  std::string what;
  std::function<bool()> holding;
  const void* owner;
};

using Frees = std::vector<std::pair<std::function<void()>, std::string>>;

struct Registry {
  std::mutex mu;
  std::map<uint64_t, Entry> holds;
  uint64_t next_id = 1;
  Frees kept;

  // Under mu.
  const std::string* first_holding(const void* except_owner = nullptr) {
    for (auto& [id, e] : holds)
      if ((!except_owner || e.owner != except_owner) && e.holding()) return &e.what;
    return nullptr;
  }
};

Registry& registry() {
  static auto* r = new Registry;  // never destroyed: holds may be dropped during exit
  return *r;
}

// Outside the registry's lock: a free may wait for the device.
void run_all(Frees& frees) {
  for (auto& [release, what] : frees) {
    try {
      release();
    } catch (...) {  // a teardown's free: nothing to report to
    }
  }
}

void run_kept(Frees& kept) {
  if (kept.empty()) return;
  debug_log("freeing " + std::to_string(kept.size()) + " kept teardown(s) now that nothing holds a stream");
  run_all(kept);
}

}  // namespace

Hold::Hold(std::string what, std::function<bool()> holding, const void* owner) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  id_ = r.next_id++;
  r.holds.emplace(id_, Entry{std::move(what), std::move(holding), owner});
}

Hold::~Hold() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.holds.erase(id_);
}

bool Hold::holding() const {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.holds.at(id_).holding();
}

std::string holding_now(const void* except_owner) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const std::string* w = r.first_holding(except_owner);
  return w ? *w : std::string();
}

std::string refusal(const std::string& what, const std::string& action, const void* except_owner) {
  const std::string held = holding_now(except_owner);
  if (held.empty()) return "";
  return what + ": " + held + ", and " + action +
         " waits for every stream of the GPU, so this would wait for that trigger (forever, if this thread is to "
         "give it); trigger it first";
}

void refuse_while_held(const std::string& what, const std::string& action, const void* except_owner) {
  const std::string message = refusal(what, action, except_owner);
  if (!message.empty()) throw_error(FERRY_ERROR_INVALID_ARGUMENT, message);
}

namespace {

// Control characters no setup record starts with.
constexpr char kRefused[] =
    "\x1f"
    "refused\x1f";
constexpr size_t kRefusedSize = sizeof(kRefused) - 1;

}  // namespace

std::string refusal_record(const std::string& message) { return kRefused + message; }

std::pair<int, std::string> first_refusal(const std::vector<std::string>& records) {
  for (size_t r = 0; r < records.size(); ++r)
    if (records[r].compare(0, kRefusedSize, kRefused) == 0)
      return {static_cast<int>(r), records[r].substr(kRefusedSize)};
  return {-1, ""};
}

void refuse_setup(const std::string& message, const std::function<std::vector<std::string>(const std::string&)>& tell) {
  if (tell) {
    try {
      tell(refusal_record(message));
    } catch (const std::exception&) {  // a peer that never came: this rank's own error says more
    }
  }
  throw_error(FERRY_ERROR_INVALID_ARGUMENT, message);
}

void throw_if_refused(const std::vector<std::string>& records, const std::string& what) {
  const auto [rank, why] = first_refusal(records);
  if (rank >= 0)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, what + ": rank " + std::to_string(rank) + " refused it: " + why);
}

void free_when_unheld(std::function<void()> release, const std::string& what) {
  Registry& r = registry();
  Frees now;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (const std::string* h = r.first_holding()) {
      debug_log(
          what + " is kept, not freed: " + *h +
          " may hold a stream, and freeing waits for every stream of the GPU; it is freed once nothing holds one");
      r.kept.emplace_back(std::move(release), what);
      return;
    }
    now.swap(r.kept);
  }
  run_kept(now);
  try {
    release();
  } catch (...) {  // a teardown's free: nothing to report to
  }
}

size_t run_kept_frees() {
  Registry& r = registry();
  Frees now;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.first_holding()) return r.kept.size();
    now.swap(r.kept);
  }
  run_kept(now);
  return 0;
}

}  // namespace sync
}  // namespace ferry
