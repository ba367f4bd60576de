#include "coll/tuning.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>

#include "core/error.hpp"

namespace ferry {

// Generated at build time from python/ferry/tuning/*.json (CMakeLists.txt).
struct ShippedTuningFile {
  const char* name;
  const char* text;
};
extern const ShippedTuningFile kShippedTuningFiles[];
extern const size_t kShippedTuningFileCount;

namespace {

[[noreturn]] void bad(const std::string& message) { throw_error(FERRY_ERROR_INVALID_ARGUMENT, message); }

const Json* member(const Json& object, const char* key, Json::Kind kind, bool required, const std::string& what) {
  const Json* v = object.find(key);
  if (!v || v->kind == Json::Kind::kNull) {
    if (required) bad(what + ": '" + key + "' is missing");
    return nullptr;
  }
  if (v->kind != kind) {
    Json expected;
    expected.kind = kind;
    bad(what + ": '" + key + "' is " + v->kind_name() + "; expected " + expected.kind_name());
  }
  return v;
}

// A whole number in [0, 2^53] (where a double holds every integer exactly).
size_t whole_number(const Json& v, const std::string& what) {
  constexpr double kExact = 9007199254740992.0;
  if (!(v.number >= 0 && v.number <= kExact && std::floor(v.number) == v.number))
    bad(what + " is " + std::to_string(v.number) + "; expected a whole number of at least 0");
  return static_cast<size_t>(v.number);
}

Algo rule_algo(const std::string& name, const std::string& what) {
  for (Algo a : {Algo::kB2b, Algo::kSeq, Algo::kPcpy, Algo::kSm})
    if (name == algo_name(a)) return a;
  bad(what + " is '" + name + "'; expected one of b2b, seq, pcpy, sm");
}

Signals rule_signals(const std::string& name, const std::string& what) {
  for (Signals s : {Signals::kAuto, Signals::kCopy, Signals::kKernel})
    if (name == signals_name(s)) return s;
  if (name == "sm") return Signals::kKernel;  // the first name of "kernel", in tables written with it
  bad(what + " is '" + name + "'; expected one of auto, copy, kernel");
}

bool is_preset(const std::string& name) {
  const auto& p = tuning_presets();
  return std::find(p.begin(), p.end(), name) != p.end();
}

}  // namespace

std::vector<SelectorRule> rules_from_json(const Json& rules) {
  if (rules.kind != Json::Kind::kArray) bad(std::string("rules is ") + rules.kind_name() + "; expected an array");
  std::vector<SelectorRule> out;
  for (size_t i = 0; i < rules.array.size(); ++i) {
    const Json& r = rules.array[i];
    const std::string what = "rule " + std::to_string(i);
    if (r.kind != Json::Kind::kObject) bad(what + " is " + r.kind_name() + "; expected an object");
    SelectorRule rule{};
    rule.op = parse_coll_op(member(r, "op", Json::Kind::kString, true, what)->string, what + ": op");
    const Json* world = member(r, "world", Json::Kind::kNumber, false, what);
    size_t ranks = world ? whole_number(*world, what + ": world") : 0;
    if (ranks > 4096) bad(what + ": world is " + std::to_string(ranks) + "; expected 0 (any) or a rank count");
    rule.world = static_cast<int>(ranks);
    const Json* max_bytes = member(r, "max_bytes", Json::Kind::kNumber, false, what);
    rule.max_bytes = max_bytes ? whole_number(*max_bytes, what + ": max_bytes") : std::numeric_limits<size_t>::max();
    rule.algo = rule_algo(member(r, "algo", Json::Kind::kString, true, what)->string, what + ": algo");
    const Json* signals = member(r, "signals", Json::Kind::kString, false, what);
    rule.signals = signals ? rule_signals(signals->string, what + ": signals") : Signals::kAuto;
    out.push_back(rule);
  }
  return out;
}

ShippedTable shipped_table_from_json(const std::string& text, const std::string& what) {
  Json doc = parse_json(text, what);
  if (doc.kind != Json::Kind::kObject) bad(what + ": expected an object");
  ShippedTable t;
  t.gpu = member(doc, "gpu", Json::Kind::kString, true, what)->string;
  const Json* preset = member(doc, "preset", Json::Kind::kString, false, what);
  t.preset = preset ? preset->string : tuning_presets()[0];
  if (!is_preset(t.preset)) bad(what + ": preset '" + t.preset + "' is none of sm-free, latency");
  for (const auto& [world, rules] : member(doc, "tables", Json::Kind::kObject, true, what)->object) {
    int w = std::atoi(world.c_str());
    if (w < 1 || std::to_string(w) != world) bad(what + ": table '" + world + "' is not a world size");
    try {
      t.by_world[w] = rules_from_json(rules);
    } catch (const Error& e) {
      bad(what + ", world " + world + ": " + e.what());
    }
  }
  return t;
}

const std::vector<ShippedTable>& shipped_tables() {
  static const std::vector<ShippedTable> tables = [] {
    std::vector<ShippedTable> out;
    for (size_t i = 0; i < kShippedTuningFileCount; ++i)
      out.push_back(shipped_table_from_json(kShippedTuningFiles[i].text, kShippedTuningFiles[i].name));
    return out;
  }();
  return tables;
}

std::optional<std::vector<SelectorRule>> preset_rules(const std::vector<ShippedTable>& tables,
                                                      const std::string& gpu_name, int world,
                                                      const std::string& preset) {
  if (!is_preset(preset)) bad("preset is '" + preset + "'; expected one of sm-free, latency");
  for (const ShippedTable& t : tables) {
    if (t.preset != preset || t.gpu.empty() || gpu_name.find(t.gpu) == std::string::npos || t.by_world.empty())
      continue;
    auto fit = t.by_world.upper_bound(world);  // the first measured world above `world`
    std::vector<SelectorRule> rules = (fit == t.by_world.begin() ? fit : std::prev(fit))->second;
    for (SelectorRule& r : rules) r.world = 0;  // measured for one world size; they apply to this one
    return rules;
  }
  return std::nullopt;
}

std::vector<SelectorRule> shipped_preset(const std::vector<ShippedTable>& tables, const std::string& gpu_name,
                                         int world, const std::string& preset) {
  std::optional<std::vector<SelectorRule>> rules = preset_rules(tables, gpu_name, world, preset);
  if (!rules)
    bad("preset: ferry ships no '" + preset + "' table for " + gpu_name +
        "; measure one with `ferry tune` (--sm for SM paths) and set its rules");
  return *rules;
}

std::vector<SelectorRule> rules_from_tuning_file(const std::string& text, const std::string& what) {
  try {
    Json doc = parse_json(text, "the file");
    const Json* rules = doc.find("rules");
    if (!rules) bad("no \"rules\"");
    return rules_from_json(*rules);
  } catch (const Error& e) {
    bad(what + ": not a `ferry tune` table (" + e.what() + ")");
  }
}

std::optional<std::vector<SelectorRule>> startup_rules(const std::vector<ShippedTable>& tables,
                                                       const std::string& gpu_name, int world,
                                                       const std::string& setting,
                                                       std::optional<std::string> (*read_file)(const std::string&)) {
  if (setting.empty()) return preset_rules(tables, gpu_name, world, tuning_presets()[0]);
  if (is_preset(setting)) return preset_rules(tables, gpu_name, world, setting);
  std::optional<std::string> text = read_file(setting);
  if (!text) bad("FERRY_TUNING='" + setting + "' is neither a preset (sm-free, latency) nor a file");
  return rules_from_tuning_file(*text, "FERRY_TUNING='" + setting + "'");
}

}  // namespace ferry
