// Which strategy `mode="auto"` runs for a page transfer: a table of rules
// measured by `ferry kv-tune` (or shipped for a GPU model), looked up by
// direction, bytes per copy and number of copies. Pure; tested on the CPU.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/json.hpp"
#include "xfer/page_plan.hpp"

namespace ferry {
namespace xfer {

// Applies when the direction matches, the mean bytes per copy (after runs are
// merged) is at most max_copy_bytes and the copies are at most max_copies.
// `strategy` is the fastest measured; `zero_sm` the fastest that launches no
// kernel (what auto runs when the caller forbids SMs).
struct PageRule {
  Direction direction = Direction::kHostToDevice;
  size_t max_copy_bytes = SIZE_MAX;
  size_t max_copies = SIZE_MAX;
  PageStrategy strategy = PageStrategy::kBatched;
  PageStrategy zero_sm = PageStrategy::kBatched;
};

struct PageTable {
  std::string gpu;  // matched as a substring of the GPU's name; empty: any
  std::vector<PageRule> rules;
};

// The first matching rule's choice; the built-in default where none matches.
PageStrategy select_page_strategy(const std::vector<PageRule>& rules, Direction direction, size_t copies, size_t bytes,
                                  bool zero_sm);

// Before any measurement: small copies on a kernel (the copy engines' per-copy
// submission cost dominates them inline), batched copy-engine copies otherwise;
// copies within a GPU on a kernel (a copy engine moves them far slower than
// SMs). Without SMs, batched.
std::vector<PageRule> default_page_rules();

// {"gpu": ..., "rules": [{"direction", "max_copy_bytes", "max_copies", "strategy", "zero_sm"}]}; a bad
// field throws naming `what`, the rule's index and the field.
PageTable page_table_from_json(const std::string& text, const std::string& what);

// Tables compiled into the library (python/ferry/tuning/kv/*.json), parsed once.
const std::vector<PageTable>& shipped_page_tables();

// The rules a process starts with: FERRY_KV_TUNING's file when set (`setting`;
// an unreadable or bad file throws naming the knob), else the shipped table for
// this GPU model, else the default.
std::vector<PageRule> startup_page_rules(const std::vector<PageTable>& tables, const std::string& gpu_name,
                                         const std::string& setting,
                                         std::optional<std::string> (*read_file)(const std::string&) = read_text_file);

}  // namespace xfer
}  // namespace ferry
