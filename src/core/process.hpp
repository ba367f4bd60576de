// Whether a peer process is gone, for the watchdog: a dead peer is reported
// at once instead of after the timeout.
#pragma once

namespace ferry {

// True when `pid` no longer runs: gone, a zombie its parent has not reaped,
// or already tearing down (its memory released, which precedes the closing of
// its files, where the GPU driver may take seconds).
bool process_exited(int pid);

}  // namespace ferry
