#include "coll/replay_cache.hpp"

#include <type_traits>

namespace ferry {
namespace {

template <typename T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void put_copy(std::string& key, const Copy& c) {
  put(key, c.dst);
  put(key, c.src);
  put(key, c.bytes);
}

}  // namespace

std::string emission_key(const Program& program, const void* record, Algo algo, LocalCopy local_copy,
                         bool kernel_signals) {
  std::string key;
  key.reserve(256);
  put(key, record);
  put(key, algo);
  put(key, local_copy);
  put(key, kernel_signals);
  for (const Step& s : program.steps) {
    put(key, s.kind);
    switch (s.kind) {
      case Step::Kind::kExchange:
        put(key, s.exchange.targets.size());
        for (int t : s.exchange.targets) put(key, t);
        put(key, s.exchange.sources.size());
        for (int q : s.exchange.sources) put(key, q);
        put(key, s.exchange.pushes.size());
        for (const auto& pc : s.exchange.pushes) {
          put(key, pc.peer);
          put_copy(key, pc.copy);
        }
        put_copy(key, s.exchange.local);
        put(key, s.exchange.local_pull.peer);
        put_copy(key, s.exchange.local_pull.copy);
        break;
      case Step::Kind::kReduce: {
        const ReduceStep& r = s.reduce;
        put(key, r.out);
        put(key, r.own);
        put(key, r.scratch);
        put(key, r.slot_stride);
        put(key, r.rank);
        put(key, r.world);
        put(key, r.count);
        put(key, r.dtype);
        put(key, r.op);
        put(key, r.max_blocks);
        put(key, s.beside_next);
        break;
      }
      case Step::Kind::kUnpack:
        put(key, s.unpack.size());
        for (const auto& c : s.unpack) put_copy(key, c);
        break;
      case Step::Kind::kSmPath:
        // Plain data without padding (asserted): its bytes are the key.
        static_assert(std::has_unique_object_representations_v<SmPathStep>, "SmPathStep has padding");
        put(key, s.sm_path);
        break;
    }
  }
  return key;
}

bool worth_capturing(uint64_t times_seen) { return times_seen >= 2; }

bool replayable(const Program& program) {
  return !(program.steps.size() == 1 && program.steps[0].kind == Step::Kind::kSmPath);
}

ReplayCache::~ReplayCache() {
  // A graph still running is freed when it completes (cuGraphExecDestroy).
  for (auto& [key, e] : entries_)
    if (e.exec) cudaGraphExecDestroy(e.exec);
}

ReplayCache::Entry& ReplayCache::touch(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (entries_.size() >= capacity_) evict_oldest();
    it = entries_.emplace(key, Entry{}).first;
  }
  it->second.seen += 1;
  it->second.last_use = ++clock_;
  return it->second;
}

void ReplayCache::evict_oldest() {
  auto oldest = entries_.begin();
  for (auto it = entries_.begin(); it != entries_.end(); ++it)
    if (it->second.last_use < oldest->second.last_use) oldest = it;
  if (oldest == entries_.end()) return;
  if (oldest->second.exec) cudaGraphExecDestroy(oldest->second.exec);
  entries_.erase(oldest);
}

}  // namespace ferry
