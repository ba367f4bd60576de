// The watchdog's judgements, as pure functions tested on the CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry {

// A ready flag holds another call's value while this rank's collective number
// `seq` waits on it. True when that means the peer called this collective with
// other arguments (and the watchdog should say so), false when it is a peer
// legitimately ahead or it is too early to tell:
// - seq == 0 is a replay of a captured graph: a peer may be a whole replay
//   ahead and publishes no count of replays, so a foreign value proves
//   nothing there (a stuck replay is still caught by the timeout). Taking it
//   as a mismatch broke back-to-back replays once peers ran ahead.
// - peer_completed >= seq: the peer finished this collective; its value is
//   its next call's.
// - otherwise a mismatch once the grace period is over (or the timeout).
bool foreign_ready_is_mismatch(uint64_t seq, uint64_t peer_completed, bool late, bool grace_over);

// What a peer published for the call this rank waits in (the same call
// number; Progress::called) says, against what this rank published: values
// carry the flag value and, in kSmPathTag, the path.
enum class CalledApart {
  kSame,            // the same call, or too early to tell
  kOtherPath,       // one on the SM path, the other on copy engines
  kOtherArguments,  // the same path, another flag value
};
// Another path is said at once: the SM path writes no ready flag, so nothing
// else would show it before the timeout. Other arguments only once a
// snapshot of the ready flags found none from that peer
// (`peer_ready_read_empty`): where one came, it names both calls in full
// (foreign_ready_is_mismatch).
CalledApart called_apart(uint64_t theirs, uint64_t ours, uint64_t sm_path_tag, bool peer_ready_read_empty);

// What one look of the watchdog does with an armed collective whose trigger it
// has not seen after `age_s`.
enum class ArmedLook {
  kNothing,
  kReadGate,  // a gate in GPU memory: copy it out to see whether it opened
  kOpenGate,  // past the timeout: report it and open the gate
};
// Past the timeout the gate is opened and not read in the same look: both go
// through the one rescue stream, and a read queued just before the opening
// kept that stream busy at every look, so the gate stayed shut (the GPU test
// saw this once).
ArmedLook look_at_armed(bool gate_on_device, double age_s, double read_after_s, double timeout_s);

// Whether the watchdog ends the process: the communicator failed
// `since_failure_s` ago and no ferry call has raised the error yet
// (`raised`), which happens when the thread that would make the next call is
// stuck where no error reaches it, e.g. inside a CUDA call that waits for the
// GPU to go idle while a stream waits for a dead peer. `exit_after_s` is
// FERRY_EXIT_AFTER_S; 0 never ends it.
bool exit_undelivered_failure(double exit_after_s, bool failed, bool raised, double since_failure_s);

// Whether the process ends because the watchdog's current look has lasted
// `stuck_s`: longer than the timeout plus FERRY_EXIT_AFTER_S means one of its
// CUDA calls waits behind another thread that waits for the GPU, and nothing
// will name a peer or release a stream any more.
bool exit_stuck_watchdog(double exit_after_s, double timeout_s, double stuck_s);

// What the host alone knows of a rank: whether its process has exited, and
// its collective counts from the shared host words.
struct RankSeen {
  int rank = 0;
  int pid = 0;
  bool exited = false;
  uint64_t called = 0;    // its last collective called (enqueued)
  uint64_t finished = 0;  // its last collective completed
  bool here = false;      // a rank of this process
};
// The ranks named for a message the watchdog writes when it cannot use CUDA
// (its look is stuck inside a CUDA call): exited processes first, then ranks
// behind the furthest caller, then the rest. Empty for no ranks.
std::string describe_ranks_without_cuda(const std::vector<RankSeen>& ranks);

}  // namespace ferry
