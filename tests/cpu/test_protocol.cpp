// A model check of the flag protocol that src/coll/emitter.cpp emits, run on the
// CPU: random sequences of collectives (the same call repeated, different
// calls, asymmetric ones like broadcast, multi-exchange ones like all_reduce
// and in-place all_to_all), on every rank, executed in random interleavings.
// Each rank runs its commands in stream order, as a GPU stream would:
//   per exchange: ready -> every source; wait every target's ready == value,
//   reset them; push; done -> every target; wait every source's done == value,
//   reset them.
// Flags compare values only, like the GPU; the model also records which call
// instance wrote each value, and fails if a wait is ever satisfied by another
// instance's message (a stale or early value), or if the ranks deadlock.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "coll/plan.hpp"
#include "coll/program.hpp"
#include "coll/signal_round.hpp"
#include "coll/signature.hpp"

using namespace ferry;

namespace {

struct Flag {
  uint64_t value = 0;
  int instance = -1;  // model-only: which call wrote it
};

struct Cmd {
  enum Kind { kSendReady, kWaitReady, kSendDone, kWaitDone } kind;
  std::vector<int> peers;
  uint64_t value;
  int instance;  // index of the call in the sequence
};

// One call of the sequence as every rank plans it.
struct Call {
  std::vector<Program> by_rank;
  uint64_t value;
};

std::vector<char*> fake(int world) {
  std::vector<char*> out;
  for (int p = 0; p < world; ++p) out.push_back(reinterpret_cast<char*>(uintptr_t(1) << 40 | uintptr_t(p) << 32));
  return out;
}

Call make_call(int kind, int world, int root, size_t size) {
  Call c;
  auto bufs = fake(world);
  c.value = flag_value(call_signature(static_cast<CollOp>(kind % 6 + 1), size, 1, 0, root));
  for (int r = 0; r < world; ++r) {
    Program p;
    switch (kind % 6) {
      case 0:
        p.add_exchange(plan_all_gather(r, world, bufs, bufs[r], size));
        break;
      case 1:
        p.add_exchange(plan_all_to_all(r, world, bufs, bufs[r], size));
        break;
      case 2:
        p.add_exchange(plan_broadcast(r, world, root, bufs, bufs[r], size));
        break;
      case 3: {  // all_reduce: scatter and reduce in two rounds, gather
        auto blocks = split_blocks(size, 4, world, 16);
        for (const auto& round : plan_rounds(largest_block(blocks), (largest_block(blocks) + 1) / 2)) {
          std::vector<Block> part;
          for (const auto& b : blocks) part.push_back(block_round(b, round));
          p.add_exchange(plan_scatter_to_scratch(r, world, bufs, bufs[r], part, 256));
        }
        p.add_exchange(plan_gather_blocks(r, world, bufs, blocks));
        break;
      }
      case 4:  // in-place all_to_all in three rounds
        for (const auto& round : plan_rounds(3 * size, size))
          p.add_exchange(plan_in_place_round(r, world, bufs, bufs[r], 3 * size, round, size));
        break;
      default: {  // broadcast from another root with the same size: another value
        p.add_exchange(plan_broadcast(r, world, (root + 1) % world, bufs, bufs[r], size));
        break;
      }
    }
    c.by_rank.push_back(std::move(p));
  }
  return c;
}

std::vector<int> ranks_in(uint64_t mask) {
  std::vector<int> out;
  for (int q = 0; q < 64; ++q)
    if ((mask >> q) & 1) out.push_back(q);
  return out;
}

std::vector<int> sorted(std::vector<int> v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The rounds as the signal-round kernels run them (signal_masks: the same
// ranks as the copy-engine rounds, which message x.sources and x.targets).
std::vector<Cmd> commands(const Program& p, uint64_t value, int instance) {
  std::vector<Cmd> out;
  for (const auto& step : p.steps) {
    if (step.kind != Step::Kind::kExchange) continue;
    const Exchange& x = step.exchange;
    const SignalMasks ready = signal_masks(x.sources, x.targets, false);
    const SignalMasks done = signal_masks(x.sources, x.targets, true);
    EXPECT_EQ(ranks_in(ready.signal), sorted(x.sources));
    EXPECT_EQ(ranks_in(done.signal), sorted(x.targets));
    out.push_back({Cmd::kSendReady, ranks_in(ready.signal), value, instance});
    out.push_back({Cmd::kWaitReady, ranks_in(ready.wait), value, instance});
    out.push_back({Cmd::kSendDone, ranks_in(done.signal), value, instance});
    out.push_back({Cmd::kWaitDone, ranks_in(done.wait), value, instance});
  }
  return out;
}

// Runs the sequence; returns "" or what went wrong.
std::string simulate(const std::vector<Call>& seq, int world, std::mt19937& rng) {
  std::vector<std::vector<Flag>> ready(world, std::vector<Flag>(world)), done(world, std::vector<Flag>(world));
  std::vector<std::vector<Cmd>> prog(world);
  for (size_t i = 0; i < seq.size(); ++i)
    for (int r = 0; r < world; ++r) {
      auto c = commands(seq[i].by_rank[r], seq[i].value, static_cast<int>(i));
      prog[r].insert(prog[r].end(), c.begin(), c.end());
    }
  std::vector<size_t> pc(world, 0);
  for (;;) {
    std::vector<int> runnable;
    for (int r = 0; r < world; ++r) {
      if (pc[r] == prog[r].size()) continue;
      const Cmd& c = prog[r][pc[r]];
      bool ok = true;
      if (c.kind == Cmd::kWaitReady || c.kind == Cmd::kWaitDone) {
        auto& flags = c.kind == Cmd::kWaitReady ? ready[r] : done[r];
        for (int q : c.peers) ok &= flags[q].value == c.value;
      }
      if (ok) runnable.push_back(r);
    }
    if (runnable.empty()) {
      for (int r = 0; r < world; ++r)
        if (pc[r] != prog[r].size())
          return "deadlock: rank " + std::to_string(r) + " stuck at command " + std::to_string(pc[r]) + " of call " +
                 std::to_string(prog[r][pc[r]].instance);
      return "";
    }
    int r = runnable[std::uniform_int_distribution<size_t>(0, runnable.size() - 1)(rng)];
    const Cmd& c = prog[r][pc[r]++];
    switch (c.kind) {
      case Cmd::kSendReady:
        for (int q : c.peers) ready[q][r] = Flag{c.value, c.instance};
        break;
      case Cmd::kSendDone:
        for (int q : c.peers) done[q][r] = Flag{c.value, c.instance};
        break;
      case Cmd::kWaitReady:
      case Cmd::kWaitDone: {
        auto& flags = c.kind == Cmd::kWaitReady ? ready[r] : done[r];
        for (int q : c.peers) {
          if (flags[q].instance != c.instance)
            return "rank " + std::to_string(r) + " passed its wait for rank " + std::to_string(q) + " in call " +
                   std::to_string(c.instance) + " on a message of call " + std::to_string(flags[q].instance);
          flags[q] = Flag{};  // the reset in the same batch of memory operations
        }
        break;
      }
    }
  }
}

}  // namespace

TEST(Protocol, RandomSequencesNeverDeadlockNorPassOnAnotherCallsMessage) {
  std::mt19937 rng(12345);
  for (int world : {2, 3, 4, 8}) {
    for (int trial = 0; trial < 300; ++trial) {
      std::vector<Call> seq;
      int n = 1 + static_cast<int>(rng() % 12);
      for (int i = 0; i < n; ++i) {
        // Few kinds and sizes, so the same call (the same value) often repeats.
        int kind = static_cast<int>(rng() % 6);
        seq.push_back(make_call(kind, world, static_cast<int>(rng() % world), 1 + rng() % 2));
      }
      std::string err = simulate(seq, world, rng);
      ASSERT_EQ(err, "") << "world " << world << " trial " << trial;
    }
  }
}

TEST(Protocol, AMismatchedCallNeverCompletes) {
  // Rank 0 calls all_gather of one size, the others of another: no rank may
  // pass a wait (the watchdog then names the mismatch).
  const int world = 4;
  Call a = make_call(0, world, 0, 1), b = make_call(0, world, 0, 2);
  ASSERT_NE(a.value, b.value);
  auto value_of = [&](int r) { return r == 0 ? a.value : b.value; };
  const Program& any = a.by_rank[0];  // all_gather: every rank's sources and targets are all peers
  ASSERT_EQ(any.steps[0].exchange.targets.size(), size_t(world - 1));
  // Every rank has sent its ready; which ranks could pass their ready wait?
  std::vector<std::vector<uint64_t>> ready(world, std::vector<uint64_t>(world, 0));
  for (int r = 0; r < world; ++r)
    for (int q : cyclic_peers(r, world)) ready[q][r] = value_of(r);
  for (int r = 0; r < world; ++r) {
    bool passes = true;
    for (int t : cyclic_peers(r, world)) passes &= ready[r][t] == value_of(r);
    EXPECT_FALSE(passes) << "rank " << r << " would write past a peer that called with other arguments";
  }
}

TEST(SignalRounds, AKernelsFaultWordNamesThePeerItWaitedFor) {
  EXPECT_FALSE(read_kernel_fault(0).set);
  // The SM path: its call number, no signal-round bit.
  KernelFault f = read_kernel_fault(kernel_fault_word(5, (uint64_t{7} << 32) | 9816, 0));
  EXPECT_TRUE(f.set);
  EXPECT_FALSE(f.signal_round);
  EXPECT_EQ(f.source, 5);
  EXPECT_EQ(f.call, 9816u);  // mod 2^32
  // A signal round: the peer, and the round's mark.
  f = read_kernel_fault(kernel_fault_word(63, 0, kSignalRoundFaultBit));
  EXPECT_TRUE(f.set);
  EXPECT_TRUE(f.signal_round);
  EXPECT_EQ(f.source, 63);
}
