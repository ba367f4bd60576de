// Holds: what may keep a stream waiting until the program acts, such as a
// prepared transfer or collective armed behind a gate and not yet triggered.
//
// Freeing GPU or pinned host memory (cudaFree, cudaFreeHost,
// cudaHostUnregister, unmapping VMM memory) waits for every stream of the
// device. A stream held by an armed gate waits for its trigger, and where
// the thread that frees is the one that would trigger, neither wait ends.
// So what arms a gate that user code opens registers a hold while it may
// still hold a stream, and ferry's teardowns ask before they free: a free is
// kept for later, or an explicit close is refused with the hold's name.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace ferry {
namespace sync {

class Hold {
 public:
  // `holding` says whether the stream may still be held. It is called from
  // any thread under the registry's lock: it must be cheap, take no lock of
  // its own and make no CUDA call that can wait. `owner` lets the owner ask
  // about every hold but its own.
  Hold(std::string what, std::function<bool()> holding, const void* owner = nullptr);
  // After it returns, `holding` is not running and is never called again.
  ~Hold();
  // Asks `holding` now (under the registry's lock, as the registry does).
  bool holding() const;
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;

 private:
  uint64_t id_;
};

// The name of the first registered hold that may still hold a stream, or ""
// when none does; holds of `except_owner` are not asked.
std::string holding_now(const void* except_owner = nullptr);

// Throws FERRY_ERROR_INVALID_ARGUMENT naming `what` and the hold while a
// hold (not of `except_owner`) may hold a stream, for a call that would wait
// for every stream of the GPU: `action` says what in it would.
void refuse_while_held(const std::string& what, const std::string& action, const void* except_owner = nullptr);

// The message refuse_while_held() would throw, or "" when nothing holds.
std::string refusal(const std::string& what, const std::string& action, const void* except_owner = nullptr);

// A setup that ranks in several processes make together (a communicator, a
// heap) and that one rank refuses: that rank still sends a record into the
// setup's first exchange, so that its peers fail at once naming it instead
// of waiting for it until the bootstrap's timeout. Pure.
std::string refusal_record(const std::string& message);
// The first rank whose record is a refusal, with its message; {-1, ""} when none is.
std::pair<int, std::string> first_refusal(const std::vector<std::string>& records);

// The two ends of it. The refusing rank: throws `message`
// (FERRY_ERROR_INVALID_ARGUMENT) after sending its record through `tell`,
// the setup's first exchange, where given (a failed exchange is not
// reported: the refusal says more). Its peers, with that exchange's records:
// throw "<what>: rank R refused it: <its message>" if a rank refused.
[[noreturn]] void refuse_setup(const std::string& message,
                               const std::function<std::vector<std::string>(const std::string&)>& tell);
void throw_if_refused(const std::vector<std::string>& records, const std::string& what);

// Runs `release` now when no hold holds a stream. Else keeps it, and the
// first later call of free_when_unheld() or run_kept_frees() that finds
// none holding runs it (frees kept at exit are never run: the process's
// memory goes with it). `what` names it in the debug log.
void free_when_unheld(std::function<void()> release, const std::string& what);

// Runs the kept frees when no hold holds a stream; returns how many are still kept.
size_t run_kept_frees();

}  // namespace sync
}  // namespace ferry
