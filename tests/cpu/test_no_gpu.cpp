// On a machine with no driver (CI), the library loads and every GPU entry
// point fails with a message that says what is missing. Skipped where a GPU is.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "coll/communicator.hpp"
#include "core/driver.hpp"
#include "core/error.hpp"
#include "ferry/ferry.h"
#include "ferry/kv.h"
#include "ferry/multipath.h"
#include "ferry/symm.h"
#include "topo/topology.hpp"

using namespace ferry;

class NoGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (driver_available()) GTEST_SKIP() << "a CUDA driver is present";
  }
};

TEST_F(NoGpu, DriverLookupExplainsItself) {
  try {
    driver();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_NO_GPU);
    EXPECT_NE(std::string(e.what()).find("NVIDIA driver"), std::string::npos);
  }
}

TEST_F(NoGpu, TopologyProbeExplainsItself) {
  try {
    probe_topology();
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_NO_GPU);
  }
}

TEST_F(NoGpu, CApiReturnsCodeAndMessage) {
  int devices[2] = {0, 1};
  ferry_comm_t comm = nullptr;
  EXPECT_EQ(ferry_comm_init_local(devices, 2, 1.0, &comm), FERRY_ERROR_NO_GPU);
  EXPECT_NE(std::string(ferry_last_error()).find("driver"), std::string::npos);
  EXPECT_EQ(comm, nullptr);
}

TEST(CApi, NullArgumentsAreNamed) {
  EXPECT_EQ(ferry_comm_init(nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("config"), std::string::npos);
  EXPECT_STREQ(ferry_result_name(FERRY_ERROR_TIMEOUT), "FERRY_ERROR_TIMEOUT");
  // A call's own fields are named before the communicator is looked at.
  ferry_call_t call{};
  int handle = 0;
  int op = 99;
  std::memcpy(&call.op, &op, sizeof op);
  EXPECT_EQ(ferry_run(nullptr, &call), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("call->op is not a ferry_op_t"), std::string::npos)
      << ferry_last_error();
  call.op = FERRY_OP_REDUCE_SCATTER;
  call.dtype = FERRY_FLOAT32;
  std::memcpy(&call.red_op, &op, sizeof op);
  EXPECT_EQ(ferry_prepare(nullptr, &call, &handle), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("call->red_op is not a ferry_red_op_t"), std::string::npos)
      << ferry_last_error();
  call.op = FERRY_OP_ALL_TO_ALLV;
  EXPECT_EQ(ferry_run(nullptr, &call), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("call->counts must not be NULL"), std::string::npos)
      << ferry_last_error();
  ferry_coll_options_t options{};
  std::memcpy(&options.signals, &op, sizeof op);
  EXPECT_EQ(ferry_all_gather(nullptr, nullptr, nullptr, 0, nullptr, &options), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("options->signals is not a ferry_signals_t"), std::string::npos)
      << ferry_last_error();
  // The collective and prelaunch entry points refuse a null communicator by name.
  call = ferry_call_t{};
  call.op = FERRY_OP_ALL_GATHER;
  ferry_trigger_t trig{};
  EXPECT_EQ(ferry_run(nullptr, &call), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("comm"), std::string::npos);
  EXPECT_EQ(ferry_prepare(nullptr, &call, &handle), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_arm(nullptr, 1, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_arm_gated(nullptr, 1, nullptr, FERRY_GATE_DEVICE), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_trigger(nullptr, 1), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_device_trigger(nullptr, 1, 0, &trig), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_release(nullptr, 1), FERRY_ERROR_INVALID_ARGUMENT);
}

TEST(CApi, TuningRulesAreCheckedAndTheBadOneNamed) {
  auto refused = [](const ferry_tuning_rule_t* rules, size_t n, const char* needle) {
    EXPECT_EQ(ferry_comm_set_tuning(nullptr, rules, n), FERRY_ERROR_INVALID_ARGUMENT) << needle;
    EXPECT_NE(std::string(ferry_last_error()).find(needle), std::string::npos) << ferry_last_error();
  };
  const ferry_tuning_rule_t good = {FERRY_OP_ALL_GATHER, 0, size_t(1) << 20, FERRY_ALGO_SM, FERRY_SIGNALS_AUTO};
  ferry_tuning_rule_t rules[2] = {good, good};
  rules[1].algo = FERRY_ALGO_AUTO;
  refused(rules, 2, "rules[1].algo must name a variant");
  rules[1] = good;
  rules[1].op = static_cast<ferry_op_t>(9);
  refused(rules, 2, "rules[1].op is not a ferry_op_t");
  rules[1] = good;
  rules[1].world = -2;
  refused(rules, 2, "rules[1].world is -2");
  rules[1] = good;
  rules[1].signals = static_cast<ferry_signals_t>(5);
  refused(rules, 2, "rules[1].signals");
  refused(nullptr, 3, "rules is NULL and n is 3");
  // Good rules (and the empty table, the built-in default) get as far as the communicator.
  refused(rules, 1, "comm");
  refused(nullptr, 0, "comm");
  ferry_algo_t algo;
  ferry_signals_t signals;
  EXPECT_EQ(ferry_comm_choose(nullptr, FERRY_OP_ALL_GATHER, 4096, &algo, &signals), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("comm"), std::string::npos);
}

TEST(CApi, PreparedKvTransfersRefuseWhatTheyCannotRunByName) {
  // Checked before any GPU call, so on any machine.
  char page[64];
  const ferry_kv_region_t side = {page, sizeof page, sizeof page, 1};
  const int64_t ids[1] = {0};
  auto refused = [&](ferry_kv_mode_t mode, unsigned flags, ferry_kv_prepared_t* out, const char* needle) {
    EXPECT_EQ(ferry_kv_prepare(0, &side, &side, 1, ids, ids, 1, mode, flags, out), FERRY_ERROR_INVALID_ARGUMENT)
        << needle;
    EXPECT_NE(std::string(ferry_last_error()).find(needle), std::string::npos) << ferry_last_error();
  };
  ferry_kv_prepared_t t = reinterpret_cast<ferry_kv_prepared_t>(&t);  // set to NULL by a refusal
  refused(FERRY_KV_KERNEL, 0, &t, "mode is FERRY_KV_KERNEL; a prepared transfer runs on copy engines");
  EXPECT_EQ(t, nullptr);
  refused(FERRY_KV_AUTO, 0, &t, "mode is FERRY_KV_AUTO");
  refused(static_cast<ferry_kv_mode_t>(7), 0, &t, "mode is not a ferry_kv_mode_t");
  refused(FERRY_KV_BATCHED, FERRY_KV_URGENT, &t, "flags has bits a prepared transfer does not take (2)");
  refused(FERRY_KV_BATCHED, FERRY_KV_SLICED | FERRY_KV_ZERO_SM, &t, "(8)");
  refused(FERRY_KV_BATCHED, 0, nullptr, "prepared is NULL");
  ferry_trigger_t trig{};
  EXPECT_EQ(ferry_kv_prepared_arm(nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("prepared is NULL"), std::string::npos);
  EXPECT_EQ(ferry_kv_prepared_trigger(nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_kv_prepared_trigger_on(nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_kv_prepared_device_trigger(nullptr, &trig), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_kv_prepared_wait(nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(ferry_kv_prepared_synchronize(nullptr, 1.0), FERRY_ERROR_INVALID_ARGUMENT);
  // A timeout that is no bound (nan, infinity, past 1e6 s) is named before the handle.
  for (double t : {std::nan(""), HUGE_VAL, 1e300, -1.0}) {
    EXPECT_EQ(ferry_kv_prepared_synchronize(nullptr, t), FERRY_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ferry_last_error()).find("timeout_s is"), std::string::npos) << ferry_last_error();
  }
  EXPECT_EQ(ferry_kv_prepared_sizes(nullptr, nullptr, nullptr), FERRY_ERROR_INVALID_ARGUMENT);
  // Destroying NULL is no call (as free(NULL)): the last error stays.
  const std::string before = ferry_last_error();
  EXPECT_EQ(ferry_kv_prepared_destroy(nullptr), FERRY_SUCCESS);
  EXPECT_EQ(ferry_host_pool_destroy(nullptr), FERRY_SUCCESS);
  EXPECT_EQ(ferry_multipath_destroy(nullptr), FERRY_SUCCESS);
  ferry_comm_destroy(nullptr);
  ferry_pool_destroy(nullptr);
  ferry_heap_destroy(nullptr);
  EXPECT_EQ(ferry_last_error(), before);
}

TEST(CApi, ArgumentsCheckedBeforeAnyGpuIsTouched) {
  // Numbers, not results: -1 where there is none to give, not a crash.
  EXPECT_EQ(ferry_comm_rank(nullptr, 0), -1);
  EXPECT_EQ(ferry_comm_world(nullptr), -1);
  EXPECT_EQ(ferry_comm_local_count(nullptr), -1);
  // A gate outside the enumeration, read as its integer.
  ferry_gate_t gate;
  const int two = 2;
  static_assert(sizeof(gate) == sizeof(two), "a C enum is an int here");
  std::memcpy(&gate, &two, sizeof gate);
  EXPECT_EQ(ferry_arm_gated(nullptr, 1, nullptr, gate), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("gate must be"), std::string::npos) << ferry_last_error();
  // A negative device is no GPU's, not the current one.
  ferry_host_pool_t pool = nullptr;
  EXPECT_EQ(ferry_host_pool_create(4096, -7, &pool), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("device must be"), std::string::npos) << ferry_last_error();
  // Flags of 0 or 1 are 0 or 1.
  ferry_multipath_options_t o{};
  o.relay_first = 7;
  ferry_multipath_t engine = nullptr;
  EXPECT_EQ(ferry_multipath_create(nullptr, 0, &o, &engine), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("options->relay_first is 7"), std::string::npos) << ferry_last_error();
  o.relay_first = 0;
  o.relays_idle = -1;
  EXPECT_EQ(ferry_multipath_create(nullptr, 0, &o, &engine), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("options->relays_idle is -1"), std::string::npos)
      << ferry_last_error();
  // A multipath engine's options and a negative GPU, named before CUDA is asked.
  o = ferry_multipath_options_t{};
  o.outstanding = 99;
  const int gpus[2] = {0, 1};
  EXPECT_EQ(ferry_multipath_create(gpus, 2, &o, &engine), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("outstanding is 99; expected 1..16"), std::string::npos)
      << ferry_last_error();
  o.outstanding = 0;
  o.timeout_s = std::nan("");
  EXPECT_EQ(ferry_multipath_create(gpus, 2, &o, &engine), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("timeout is nan"), std::string::npos) << ferry_last_error();
  const int minus[1] = {-1};
  EXPECT_EQ(ferry_multipath_create(minus, 1, nullptr, &engine), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("link_devices: -1 is no GPU ordinal"), std::string::npos)
      << ferry_last_error();
  EXPECT_EQ(engine, nullptr);
  // Destroying the NULL a failed create left keeps that failure's message.
  EXPECT_EQ(ferry_multipath_destroy(engine), FERRY_SUCCESS);
  EXPECT_NE(std::string(ferry_last_error()).find("link_devices: -1"), std::string::npos) << ferry_last_error();
  // A negative GPU or a timeout that is no bound is named before CUDA is asked (it would say: no GPU).
  const int negative[2] = {0, -2};
  ferry_comm_t none = nullptr;
  EXPECT_EQ(ferry_comm_init_local(negative, 2, 0, &none), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("devices[1] is -2; expected a GPU ordinal"), std::string::npos)
      << ferry_last_error();
  EXPECT_EQ(ferry_comm_init_local(negative, 1, std::nan(""), &none), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("timeout_s is nan"), std::string::npos) << ferry_last_error();
  // Handles a failed create leaves NULL, so that destroying them after the
  // failure destroys nothing.
  const int dev = 0;
  ferry_comm_t comm = reinterpret_cast<ferry_comm_t>(&comm);
  EXPECT_EQ(ferry_comm_init_local(&dev, 0, 0, &comm), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("n is 0; expected at least one GPU"), std::string::npos)
      << ferry_last_error();
  EXPECT_EQ(comm, nullptr);
  comm = reinterpret_cast<ferry_comm_t>(&comm);
  EXPECT_EQ(ferry_comm_init_local(nullptr, 1, 0, &comm), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("devices is NULL"), std::string::npos) << ferry_last_error();
  EXPECT_EQ(comm, nullptr);
  comm = reinterpret_cast<ferry_comm_t>(&comm);
  EXPECT_EQ(ferry_comm_init(nullptr, &comm), FERRY_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ferry_last_error()).find("config is NULL"), std::string::npos) << ferry_last_error();
  EXPECT_EQ(comm, nullptr);
  ferry_pool_t spool = reinterpret_cast<ferry_pool_t>(&spool);
  EXPECT_NE(ferry_pool_create(nullptr, 0, &spool), FERRY_SUCCESS);
  EXPECT_EQ(spool, nullptr);
  ferry_heap_t heap = reinterpret_cast<ferry_heap_t>(&heap);
  EXPECT_NE(ferry_heap_create(nullptr, 0, &heap), FERRY_SUCCESS);
  EXPECT_EQ(heap, nullptr);
}
