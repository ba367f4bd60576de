// Which variant runs a collective: a pure function of the call and a tuning
// table, tested on the CPU. The default table comes from measurements on
// H200 machines (bench/results/); FERRY_ALGO or the call's `algo` overrides it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "coll/plan.hpp"

namespace ferry {

enum class Algo { kAuto = 0, kPcpy = 1, kB2b = 2, kSeq = 3 };

const char* algo_name(Algo a);
// "auto", "pcpy", "b2b", "seq"; anything else is an error that names `what`.
Algo parse_algo(const std::string& name, const char* what);

// A rule: for `op` on `world` ranks (0: any), calls of at most `max_bytes`
// per rank use `algo`. Rules are tried in order; the first match wins.
struct SelectorRule {
  CollOp op;
  int world;
  size_t max_bytes;
  Algo algo;
};

std::vector<SelectorRule> default_selector_table();

// pcpy keeps one stream per peer blocked in stream waits, beside the caller's
// stream and ferry's main and side streams. CUDA multiplexes streams onto
// CUDA_DEVICE_MAX_CONNECTIONS hardware queues (default 8); once streams share a
// queue, a ready message can sit behind another stream's wait and the ranks
// deadlock (seen on 8 H200s, 2026-11-22: the first pcpy collective never
// finished). pcpy is therefore refused when its streams exceed the queues.
bool pcpy_fits_hardware_queues(int world, int max_connections);
// CUDA_DEVICE_MAX_CONNECTIONS as CUDA reads it (8 when unset or invalid).
int cuda_max_connections();

// `forced` (from the call or FERRY_ALGO) wins unless it is kAuto.
Algo select_algo(CollOp op, int world, size_t bytes_per_rank, Algo forced, const std::vector<SelectorRule>& table);

}  // namespace ferry
