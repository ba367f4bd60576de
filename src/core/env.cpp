#include "core/env.hpp"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "core/error.hpp"

namespace ferry {

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> table = {
      {"FERRY_TIMEOUT_S", "float", "300",
       "bound, in seconds, on every wait for a peer (bootstrap and collectives); the error names the peer (more than "
       "0, "
       "at most 1e6)"},
      {"FERRY_BATCH_MAX", "int", "32",
       "most copies in one cudaMemcpyBatchAsync call; larger lists are split (the driver's host time per copy grows "
       "with the batch: on an H200, 4096 scattered 16 KB pages took half the time in calls of 32 as in calls of 128; "
       "0 or less: 1)"},
      {"FERRY_DISABLE_BATCH", "int", "0", "1: issue one cudaMemcpyAsync per copy instead of batched copies"},
      {"FERRY_KV_TUNING", "string", "",
       "page transfers' auto table: a `ferry kv-tune` JSON file; empty: the table shipped for this GPU model, else "
       "the built-in default"},
      {"FERRY_KV_STREAMS", "int", "4", "streams the 'streams' page-transfer strategy spreads its batched copies over",
       1, 64},
      {"FERRY_KV_SLICE_BYTES", "int", "4194304",
       "slice size of page transfers submitted in slices (FERRY_KV_SLICED in C; slice_bytes in Python): at most 2 "
       "slices wait on the copy engine, so an urgent fetch from another stream waits for that much at most",
       1, 1LL << 40},
      {"FERRY_KV_PITCHED_ROW_BYTES", "int", "8192",
       "widest row of a pitched page copy (a page's tensors at one stride as one cudaMemcpy2DAsync); wider pages "
       "go as plain batched copies, which copy engines move faster, unless a page's tensors lie end to end on one "
       "side (a page-first layout), which goes pitched at any width (0: no pitched copies)",
       0, 1LL << 30},
      {"FERRY_KV_ARMED_MAX", "int", "512",
       "most host calls a prepared page transfer may enqueue behind its gate (a batched call of up to "
       "FERRY_BATCH_MAX plain copies, a pitched copy, or with mode='per_page' each copy): a stream's queue is "
       "finite, and 1024 blocked the host until the gate opened on an H200",
       1, 1LL << 20},
      {"FERRY_SOCKET_DIR", "string", "",
       "parent folder of the private (0700) folder holding ferry's Unix sockets; "
       "empty: $TMPDIR or /tmp"},
      {"FERRY_ALGO", "string", "",
       "force a variant for every collective (b2b, seq, pcpy, or sm where a call can take it); empty: the selector "
       "decides"},
      {"FERRY_PORT", "int", "0", "TCP port of ferry's bootstrap store for ferry.init(); 0: MASTER_PORT + 1", 0, 65535},
      {"FERRY_SYMM_HEAP_BYTES", "int", "34359738368",
       "capacity of each rank's symmetric heap when ferry.symm.Heap is given none (address space: physical memory "
       "is mapped only as allocations need it); every rank must use the same",
       1, 1LL << 46},
      {"FERRY_SYMM_CHUNK_BYTES", "int", "268435456",
       "least physical memory a user's symmetric heap (ferry.symm.Heap) maps at a time when an allocation needs more "
       "(one descriptor per "
       "rank and chunk is exchanged)",
       0, LLONG_MAX},
      {"FERRY_WATCHDOG_MS", "int", "10", "how often the watchdog looks at unfinished collectives", 1, 60000},
      {"FERRY_EXIT_AFTER_S", "float", "0",
       "seconds after a communicator failed (a peer died or timed out) with no ferry call raising the error, after "
       "which the watchdog ends the process with status 75 and the error on stderr: a thread stuck inside CUDA "
       "(e.g. a kernel's first launch under lazy loading, or a graph instantiation, waiting for a stream that "
       "waits for the dead peer) hears no error otherwise; 0: never"},
      {"FERRY_TUNING", "string", "",
       "the selector's table: a shipped preset, 'sm-free' (the default: copy engines only) or 'latency' (SMs where "
       "faster), or a `ferry tune` JSON file"},
      {"FERRY_HOST_TRACE", "int", "0",
       "1: time the host's stages of every collective call and print their means to stderr at exit; 2: also print "
       "each stage as it begins and ends (where a stuck host is)"},
      {"FERRY_REPLAY_CALLS", "int", "1",
       "1: an eager call made a second time with the same buffers is captured once into a CUDA graph and then "
       "launched from it (one host operation instead of about a dozen); 0: every call enqueues its commands"},
      {"FERRY_SHARED_GPUS", "int", "0",
       "1 (testing only): ranks may share a GPU (ferry.init_local listing a GPU more than once, or several processes "
       "on one GPU), so that the logic of a larger world runs on fewer GPUs; ranks of one GPU copy to each other on "
       "SMs, give each rank its own stream"},
      {"FERRY_REDUCE_ROUND_BYTES", "int", "0",
       "bytes of each rank's result per round of reduce_scatter and all_reduce (the reduction of one round runs "
       "while the copy engines move the next); 0: ferry's rule (one round below 128 MB, then up to 4); ranks whose "
       "rounds it sets apart get a mismatch error",
       0, LLONG_MAX},
      {"FERRY_REDUCE_BLOCKS", "int", "32",
       "most blocks of the reduction kernel of reduce_scatter and all_reduce (copy-engine variants): more finish "
       "sooner and take more SMs from compute beside (one H200, 8 MB and up: 32 reduce at 2.2-3.6 TB/s, 64 "
       "at 2.8-4.0, 132 at 2.9-4.1)",
       1, 1024},
      {"FERRY_SCRATCH_BYTES", "int", "67108864",
       "bound on the scratch an in-place all_to_all uses per rank (it runs in rounds of scratch / world bytes; ranks "
       "whose rounds it sets apart get a mismatch error)",
       4096, 1LL << 40},
      {"FERRY_SIGNALS", "string", "copy",
       "how the copy-engine variants send and await their ready and done messages: 'copy' (small copy-engine "
       "copies and stream waits, no SM) or 'kernel' (one single-block kernel per round: a few microseconds less per "
       "round, one SM while it waits; 'sm' is its first name); the data moves on copy engines either way"},
      {"FERRY_DEBUG", "int", "0",
       "1: print ferry's decisions and recoveries to stderr as they happen (why a multipath copy runs as one plain "
       "copy, a relay that was left out, a stream wait released past its timeout)"},
      {"FERRY_MULTIPATH_CHUNK_BYTES", "int", "8388608",
       "bytes of each chunk a multipath host<->GPU copy is split into (each relay GPU holds one such "
       "staging buffer per chunk in flight, 3 by default)",
       65536, 1LL << 30},
      {"FERRY_MULTIPATH_MIN_CHUNK_BYTES", "int", "2097152",
       "smallest chunk a multipath copy is split into: a smaller copy gets fewer chunks than its links have room "
       "for (each chunk costs a few microseconds of CUDA calls, events and waits)",
       65536, 1LL << 30},
      {"FERRY_MULTIPATH_MIN_BYTES", "int", "8388608",
       "smallest host<->GPU copy that multipath splits over several GPUs' links; smaller ones run as one plain copy", 0,
       LLONG_MAX},
      {"FERRY_MULTIPATH_HEAD_BYTES", "int", "0",
       "most of a multipath copy's head that the caller's stream copies itself over the target's link while the "
       "engine starts the rest (0: none)",
       0, 1LL << 40},
      {"FERRY_MULTIPATH_KEEP_WARM_MS", "float", "50",
       "for this long after a link last carried a multipath chunk in a direction, it probes that direction again "
       "0.7 ms after its last chunk or probe there landed, while idle, so that a copy after a gap starts at once "
       "instead of waiting for its links' probes (0: off). Meanwhile each such link copies 64 KiB about every "
       "0.7 ms and the engine's thread wakes to send and retire the probes",
       0, LLONG_MAX},
      {"FERRY_MULTIPATH_BOARD", "int", "1",
       "1: multipath engines post the GPUs they copy to or from on a board in shared host memory; where every "
       "GPU an engine could relay through is copied the same way by its own program, the engine relays nothing, "
       "so that programs copying their own GPUs' data at once each keep their own link. 0: other programs' "
       "copies count only as the links' speeds"},
      {"FERRY_MULTIPATH_OWN_SHARE_ON_STREAM", "int", "0",
       "1: the caller's stream copies the target link's share of a multipath copy itself, before the gate, and "
       "the relays carry the rest, so that nothing of the copy reaches the target GPU after the call returns (a "
       "first launch of a kernel there can hold such work behind the gate's wait); the share is sized from the "
       "links' last measured speeds. 0: the engine schedules the own link's chunks too, and that link balances "
       "against foreign copies on it. The LD_PRELOAD library sets 1 where it is unset"},
      {"FERRY_SM_BYTES", "int", "1048576",
       "largest block per peer that algo 'sm' (the SM kernel for small collectives) moves; each rank's window "
       "takes 2 x world x (this + 128 KB) of GPU memory, allocated at creation (up to 8 ranks); 0: no window, no 'sm'"},
      {"FERRY_SM_LL_BLOCK_BYTES", "int", "2048",
       "data bytes per block of algo 'sm' for calls whose largest block is at most 64 KiB (its low-latency "
       "format): fewer bytes, more blocks (at most FERRY_SM_MAX_BLOCKS); a multiple of 8, the same on every rank"},
      {"FERRY_SM_BLOCK_BYTES", "int", "8192",
       "data bytes per block of algo 'sm' for calls whose largest block is over 64 KiB: fewer bytes, more blocks (at "
       "most FERRY_SM_MAX_BLOCKS); a multiple of 16, the same on every rank"},
      {"FERRY_SM_MAX_BLOCKS", "int", "32",
       "most blocks (512 threads each, one SM each for the heaviest kernels) one call of algo 'sm' runs on: more "
       "carry more bytes at once and hold more SMs; 1 to 128, the same on every rank; above 32 also at most the "
       "GPU's resident blocks less 4"},
      {"FERRY_SM_TWO_SHOT_BYTES", "int", "1048576",
       "all_reduce buffers of at least this many bytes on 3 or more ranks take algo 'sm' in two shots (each rank "
       "reduces one part, then sends it to every peer: 2 (world - 1) / world of the buffer per rank instead of "
       "world - 1 buffers, one more round of flags; a part larger than FERRY_SM_BYTES goes in rounds of it, so any "
       "size fits); 0: "
       "never. The same on every rank"},
  };
  return table;
}

static const Knob& find_knob(const char* name) {
  for (const auto& k : knobs())
    if (std::strcmp(k.name, name) == 0) return k;
  throw_error(FERRY_ERROR_INTERNAL, std::string("undeclared environment knob ") + name);
}

std::string knob_string(const char* name) {
  const Knob& k = find_knob(name);
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(k.default_value);
}

long long knob_int(const char* name) {
  std::string v = knob_string(name);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  // Digits with an optional minus, nothing around them; past 64 bits is no value.
  const bool starts = !v.empty() && (std::isdigit(static_cast<unsigned char>(v[0])) || v[0] == '-');
  if (!starts || *end != '\0')
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(name) + "=" + v + " is not an integer");
  if (errno == ERANGE)
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(name) + "=" + v + " is out of range (64 bits)");
  return x;
}

long long knob_int_in(const char* name) {
  const Knob& k = find_knob(name);
  const long long x = knob_int(name);
  FERRY_ARG_CHECK(x >= k.lo && x <= k.hi, std::string(name) + "=" + knob_string(name) + "; expected " + knob_range(k));
  return x;
}

// 2^k for the powers of two from 2^16, where the digits say less.
static std::string bound_text(long long v) {
  if (v >= (1LL << 16) && (v & (v - 1)) == 0) {
    int k = 0;
    while ((1LL << k) != v) ++k;
    return "2^" + std::to_string(k);
  }
  return std::to_string(v);
}

std::string knob_range(const Knob& k) {
  if (k.lo == LLONG_MIN && k.hi == LLONG_MAX) return "";
  if (k.hi == LLONG_MAX) return "at least " + bound_text(k.lo);
  if (k.lo == LLONG_MIN) return "at most " + bound_text(k.hi);
  return bound_text(k.lo) + ".." + bound_text(k.hi);
}

std::string knob_problem(const Knob& k) {
  if (!std::getenv(k.name)) return "";
  try {
    // Knobs without a range are left to their readers, some of which take
    // any value (FERRY_DEBUG: anything but a positive number is off; a float
    // is only parsed).
    const bool ranged = k.lo != LLONG_MIN || k.hi != LLONG_MAX;
    if (std::strcmp(k.type, "int") == 0) {
      if (ranged) knob_int_in(k.name);
    } else if (std::strcmp(k.name, "FERRY_TIMEOUT_S") == 0) {
      timeout_seconds(0, "FERRY_TIMEOUT_S");  // a float with bounds of its own
    } else if (std::strcmp(k.type, "float") == 0) {
      if (ranged)
        knob_float_in(k.name);
      else
        knob_float(k.name);
    }
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

double knob_float(const char* name) {
  std::string v = knob_string(name);
  // Whatever LC_NUMERIC the program set: "0.5" means a half.
  double x = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || end != v.data() + v.size())
    throw_error(FERRY_ERROR_INVALID_ARGUMENT, std::string(name) + "=" + v + " is not a number");
  return x;
}

double knob_float_in(const char* name) {
  const Knob& k = find_knob(name);
  const double x = knob_float(name);
  FERRY_ARG_CHECK(std::isfinite(x) && x >= static_cast<double>(k.lo) && x <= static_cast<double>(k.hi),
                  std::string(name) + "=" + knob_string(name) + "; expected a finite number" +
                      (knob_range(k).empty() ? "" : ", " + knob_range(k)));
  return x;
}

double timeout_seconds(double given, const char* what) {
  FERRY_ARG_CHECK(!std::isnan(given), std::string(what) + " is nan; expected seconds");
  if (given > 0) {
    FERRY_ARG_CHECK(given <= kMaxTimeoutS, std::string(what) + " is " + std::to_string(given) +
                                               " s; expected at most " + std::to_string(kMaxTimeoutS) + " s");
    return given;
  }
  const double knob = knob_float("FERRY_TIMEOUT_S");
  FERRY_ARG_CHECK(knob > 0 && knob <= kMaxTimeoutS, "FERRY_TIMEOUT_S=" + knob_string("FERRY_TIMEOUT_S") +
                                                        "; expected seconds, more than 0 and at most " +
                                                        std::to_string(kMaxTimeoutS));
  return knob;
}

double teardown_timeout_seconds() noexcept {
  const double fallback = std::strtod(find_knob("FERRY_TIMEOUT_S").default_value, nullptr);
  try {
    const double knob = knob_float("FERRY_TIMEOUT_S");
    return knob > 0 ? std::min(knob, kMaxTimeoutS) : fallback;  // (nan > 0 is false)
  } catch (...) {
    return fallback;
  }
}

namespace {

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t end; (end = s.find('\n', at)) != std::string::npos; at = end + 1) out.push_back(s.substr(at, end - at));
  return out;
}

}  // namespace

std::string knob_settings(const std::vector<const char*>& names) {
  std::string record;
  for (const char* name : names) {
    const char* raw = std::getenv(name);
    record += (raw ? std::string("=") + raw : std::string("unset")) + '\n';
  }
  return record;
}

std::string knob_mismatch(const std::vector<const char*>& names, const std::vector<std::string>& records, int me) {
  const std::vector<std::string> mine = lines_of(records.at(static_cast<size_t>(me)));
  for (size_t p = 0; p < records.size(); ++p) {
    const std::vector<std::string> theirs = lines_of(records[p]);
    for (size_t k = 0; k < names.size(); ++k) {
      const std::string a = k < mine.size() ? mine[k] : "?", b = k < theirs.size() ? theirs[k] : "?";
      if (a != b)
        return std::string(names[k]) + " is " + a + " on rank " + std::to_string(me) + " and " + b + " on rank " +
               std::to_string(p) + "; set the same value on every rank";
    }
  }
  return "";
}

}  // namespace ferry
