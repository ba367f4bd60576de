// Which selector table a communicator starts with: FERRY_TUNING (a preset's
// name, or a file that `ferry tune` wrote), else the table ferry ships for
// this GPU model (python/ferry/tuning/*.json, compiled into the library so
// that C programs get it too), else the built-in default. Pure functions of
// the tables, tested on the CPU; only read_text_file (core/json.hpp) reads files.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "coll/selector.hpp"
#include "core/json.hpp"

namespace ferry {

// "sm-free" (the default: copy engines only) and "latency" (the SM path and
// kernel signals where they were measured faster).
inline const std::vector<std::string>& tuning_presets() {
  static const std::vector<std::string> presets{"sm-free", "latency"};
  return presets;
}

// One shipped file: a preset's rules for one GPU model, per measured world size.
struct ShippedTable {
  std::string gpu;  // matched as a substring of the GPU's name ("H200")
  std::string preset;
  std::map<int, std::vector<SelectorRule>> by_world;
};

// A JSON array of rules ({"op", "world", "max_bytes", "algo", "signals"}),
// checked; a bad rule throws FERRY_ERROR_INVALID_ARGUMENT naming its index
// and field. max_bytes null or absent: no bound (SIZE_MAX).
std::vector<SelectorRule> rules_from_json(const Json& rules);

// A shipped file's text; errors name `what`.
ShippedTable shipped_table_from_json(const std::string& text, const std::string& what);

// The files compiled into this library, parsed once.
const std::vector<ShippedTable>& shipped_tables();

// `preset`'s rules among `tables` for this GPU model, taken from the world
// size measured nearest below `world` (else the smallest), with world set to
// 0 (they apply to this one); nullopt where none matches the GPU. An unknown
// preset throws, naming it.
std::optional<std::vector<SelectorRule>> preset_rules(const std::vector<ShippedTable>& tables,
                                                      const std::string& gpu_name, int world,
                                                      const std::string& preset);

// preset_rules, or an error where ferry ships no such table for this GPU
// (what a communicator's set_selector_preset says).
std::vector<SelectorRule> shipped_preset(const std::vector<ShippedTable>& tables, const std::string& gpu_name,
                                         int world, const std::string& preset);

// The rules of a `ferry tune` file's text ({"rules": [...], ...}); errors name `what`.
std::vector<SelectorRule> rules_from_tuning_file(const std::string& text, const std::string& what);

// The table a communicator of `world` ranks on `gpu_name` starts with, given
// FERRY_TUNING's value `setting` (empty: unset) and a way to read files;
// nullopt: the built-in default (no shipped table for this GPU). A setting
// that is neither a preset nor a readable file, or a bad file, throws naming
// FERRY_TUNING.
std::optional<std::vector<SelectorRule>> startup_rules(
    const std::vector<ShippedTable>& tables, const std::string& gpu_name, int world, const std::string& setting,
    std::optional<std::string> (*read_file)(const std::string&) = read_text_file);

}  // namespace ferry
