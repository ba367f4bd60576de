#include "coll/call_memo.hpp"

namespace ferry {
namespace {

template <typename T>
void put(std::string& key, const T& v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

template <typename T>
void put_all(std::string& key, const std::vector<T>& v) {
  put(key, v.size());
  key.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

}  // namespace

std::string call_key(const CollectiveArgs& a, bool capturing) {
  std::string key;
  key.reserve(96 + 16 * a.outs.size() + 8 * a.counts.size());
  put(key, a.op);
  put(key, capturing);
  put(key, a.bytes_per_rank);
  put(key, a.root);
  put(key, a.count);
  put(key, a.dtype);
  put(key, a.red_op);
  put(key, a.algo);
  put(key, a.local_copy);
  put(key, a.signals);
  put_all(key, a.outs);
  put_all(key, a.ins);
  put_all(key, a.counts);
  return key;
}

}  // namespace ferry
