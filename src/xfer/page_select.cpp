#include "xfer/page_select.hpp"

#include <cmath>

#include "core/error.hpp"
#include "core/json.hpp"

namespace ferry {
namespace xfer {

// Generated at build time from python/ferry/tuning/kv/*.json (CMakeLists.txt).
struct ShippedPageTableFile {
  const char* name;
  const char* text;
};
extern const ShippedPageTableFile kShippedPageTableFiles[];
extern const size_t kShippedPageTableFileCount;

namespace {

[[noreturn]] void bad(const std::string& message) { throw_error(FERRY_ERROR_INVALID_ARGUMENT, message); }

size_t bound(const Json* v, const std::string& what) {
  if (!v || v->kind == Json::Kind::kNull) return SIZE_MAX;
  if (v->kind != Json::Kind::kNumber || !(v->number >= 0 && v->number <= 9007199254740992.0) ||
      std::floor(v->number) != v->number)
    bad(what + " must be a whole number of at least 0, or null for no bound");
  return static_cast<size_t>(v->number);
}

Direction direction_of(const Json* v, const std::string& what) {
  if (v && v->kind == Json::Kind::kString)
    for (auto d :
         {Direction::kHostToDevice, Direction::kDeviceToHost, Direction::kDeviceToDevice, Direction::kHostToHost})
      if (v->string == direction_name(d)) return d;
  bad(what + " must be one of \"h2d\", \"d2h\", \"d2d\", \"h2h\"");
}

PageStrategy strategy_of(const Json* v, const std::string& what) {
  if (!v || v->kind != Json::Kind::kString) bad(what + " must be a strategy name (per_page, batched, streams, kernel)");
  return parse_strategy(v->string, what.c_str());
}

}  // namespace

PageStrategy select_page_strategy(const std::vector<PageRule>& rules, Direction direction, size_t copies, size_t bytes,
                                  bool zero_sm) {
  const size_t per_copy = copies ? bytes / copies : 0;
  static const std::vector<PageRule> fallback = default_page_rules();
  for (const std::vector<PageRule>* table : {&rules, &fallback})
    for (const auto& r : *table)
      if (r.direction == direction && per_copy <= r.max_copy_bytes && copies <= r.max_copies)
        return zero_sm ? r.zero_sm : r.strategy;
  return PageStrategy::kBatched;
}

std::vector<PageRule> default_page_rules() {
  using D = Direction;
  using S = PageStrategy;
  static const std::vector<PageRule> rules = {
      {D::kHostToDevice, 64 << 10, SIZE_MAX, S::kKernel, S::kBatched},
      {D::kHostToDevice, SIZE_MAX, SIZE_MAX, S::kBatched, S::kBatched},
      {D::kDeviceToHost, 64 << 10, SIZE_MAX, S::kKernel, S::kBatched},
      {D::kDeviceToHost, SIZE_MAX, SIZE_MAX, S::kBatched, S::kBatched},
      {D::kDeviceToDevice, SIZE_MAX, SIZE_MAX, S::kKernel, S::kBatched},
      {D::kHostToHost, SIZE_MAX, SIZE_MAX, S::kBatched, S::kBatched},
  };
  return rules;
}

PageTable page_table_from_json(const std::string& text, const std::string& what) {
  Json doc = parse_json(text, what);
  PageTable t;
  if (doc.kind != Json::Kind::kObject) bad(what + ": expected an object with \"rules\"");
  if (const Json* g = doc.find("gpu")) {
    // A table whose gpu is no string would match no GPU, and say nothing.
    if (g->kind != Json::Kind::kString) bad(what + ": \"gpu\" must be a string (the GPU model the table is for)");
    t.gpu = g->string;
  }
  const Json* rules = doc.find("rules");
  if (!rules || rules->kind != Json::Kind::kArray) bad(what + ": \"rules\" must be an array");
  for (size_t i = 0; i < rules->array.size(); ++i) {
    const Json& r = rules->array[i];
    std::string at = what + ": rules[" + std::to_string(i) + "]";
    if (r.kind != Json::Kind::kObject) bad(at + " must be an object");
    // A misspelt bound would be no bound: the rule would match every size.
    for (const auto& [key, value] : r.object) {
      (void)value;
      if (key != "direction" && key != "max_copy_bytes" && key != "max_copies" && key != "strategy" && key != "zero_sm")
        bad(at + "." + key + " is not a rule's field (direction, max_copy_bytes, max_copies, strategy, zero_sm)");
    }
    PageRule rule;
    rule.direction = direction_of(r.find("direction"), at + ".direction");
    rule.max_copy_bytes = bound(r.find("max_copy_bytes"), at + ".max_copy_bytes");
    rule.max_copies = bound(r.find("max_copies"), at + ".max_copies");
    rule.strategy = strategy_of(r.find("strategy"), at + ".strategy");
    rule.zero_sm = strategy_of(r.find("zero_sm"), at + ".zero_sm");
    if (uses_sm(rule.zero_sm)) bad(at + ".zero_sm is '" + strategy_name(rule.zero_sm) + "', which launches a kernel");
    t.rules.push_back(rule);
  }
  return t;
}

const std::vector<PageTable>& shipped_page_tables() {
  static const std::vector<PageTable> tables = [] {
    std::vector<PageTable> out;
    for (size_t i = 0; i < kShippedPageTableFileCount; ++i)
      out.push_back(page_table_from_json(kShippedPageTableFiles[i].text, kShippedPageTableFiles[i].name));
    return out;
  }();
  return tables;
}

std::vector<PageRule> startup_page_rules(const std::vector<PageTable>& tables, const std::string& gpu_name,
                                         const std::string& setting,
                                         std::optional<std::string> (*read_file)(const std::string&)) {
  if (!setting.empty()) {
    std::optional<std::string> text = read_file(setting);
    if (!text) bad("FERRY_KV_TUNING='" + setting + "' is not a readable file");
    return page_table_from_json(*text, "FERRY_KV_TUNING='" + setting + "'").rules;
  }
  for (const auto& t : tables)
    if (!t.gpu.empty() && gpu_name.find(t.gpu) != std::string::npos) return t.rules;
  return default_page_rules();
}

}  // namespace xfer
}  // namespace ferry
