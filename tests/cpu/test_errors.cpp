#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "core/env.hpp"
#include "core/error.hpp"

using namespace ferry;

TEST(Knobs, EveryKnobHasDocAndParses) {
  for (const auto& k : knobs()) {
    EXPECT_TRUE(std::string(k.name).rfind("FERRY_", 0) == 0) << k.name;
    EXPECT_GT(std::string(k.doc).size(), 10u) << k.name;
    if (std::string(k.type) == "int") knob_int(k.name);
    if (std::string(k.type) == "float") knob_float(k.name);
  }
}

TEST(Knobs, UndeclaredNameIsAnError) { EXPECT_THROW(knob_string("FERRY_NO_SUCH_KNOB"), Error); }

TEST(Knobs, BadValueNamesTheVariable) {
  setenv("FERRY_BATCH_MAX", "lots", 1);
  try {
    knob_int("FERRY_BATCH_MAX");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERRY_BATCH_MAX=lots"), std::string::npos);
  }
  unsetenv("FERRY_BATCH_MAX");
  EXPECT_EQ(knob_int("FERRY_BATCH_MAX"), 32);
}

TEST(Knobs, TimeoutsThatWouldNeverEndOrEndAtOnceAreRefused) {
  const char* old = std::getenv("FERRY_TIMEOUT_S");
  const std::string saved = old ? old : "";
  unsetenv("FERRY_TIMEOUT_S");
  EXPECT_EQ(timeout_seconds(0, "timeout"), 300);
  EXPECT_EQ(timeout_seconds(-1, "timeout"), 300);  // 0 or less: the knob's
  EXPECT_EQ(timeout_seconds(2.5, "timeout"), 2.5);
  for (const char* bad : {"0", "-5", "inf", "nan", "1e300"}) {
    setenv("FERRY_TIMEOUT_S", bad, 1);
    try {
      timeout_seconds(0, "timeout");
      ADD_FAILURE() << bad << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("FERRY_TIMEOUT_S=") + bad), std::string::npos) << e.what();
    }
  }
  try {
    timeout_seconds(1e300, "timeout_s");
    ADD_FAILURE() << "1e300 s was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("timeout_s is"), std::string::npos) << e.what();
  }
  // A teardown cannot refuse: it waits the default for a knob that is not a bound, at most 1e6 s.
  setenv("FERRY_TIMEOUT_S", "0", 1);
  EXPECT_EQ(teardown_timeout_seconds(), 300);
  setenv("FERRY_TIMEOUT_S", "lots", 1);
  EXPECT_EQ(teardown_timeout_seconds(), 300);
  setenv("FERRY_TIMEOUT_S", "1e7", 1);
  EXPECT_EQ(teardown_timeout_seconds(), kMaxTimeoutS);
  EXPECT_THROW(timeout_seconds(std::nan(""), "timeout_s"), Error);
  if (old)
    setenv("FERRY_TIMEOUT_S", saved.c_str(), 1);
  else
    unsetenv("FERRY_TIMEOUT_S");
}

TEST(Knobs, IntegersPast64BitsOrOutsideTheirRangeAreRefusedByName) {
  setenv("FERRY_KV_STREAMS", "99999999999999999999", 1);
  EXPECT_THROW(knob_int("FERRY_KV_STREAMS"), Error);  // not LLONG_MAX
  for (const char* bad : {" 7", "+7", "7 ", "0x10"}) {
    setenv("FERRY_KV_STREAMS", bad, 1);
    EXPECT_THROW(knob_int("FERRY_KV_STREAMS"), Error) << bad;
  }
  setenv("FERRY_KV_STREAMS", "-1", 1);
  EXPECT_EQ(knob_int("FERRY_KV_STREAMS"), -1);
  try {
    knob_int_in("FERRY_KV_STREAMS");
    ADD_FAILURE() << "-1 was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FERRY_KV_STREAMS=-1; expected 1..64"), std::string::npos) << e.what();
  }
  setenv("FERRY_KV_STREAMS", "8", 1);
  EXPECT_EQ(knob_int_in("FERRY_KV_STREAMS"), 8);
  unsetenv("FERRY_KV_STREAMS");
  EXPECT_EQ(knob_int_in("FERRY_KV_STREAMS"), 4);
}

// Every int knob's default parses and lies in the range the table declares,
// so an unset knob is never refused.
TEST(Knobs, EveryDefaultLiesInItsRange) {
  for (const Knob& k : knobs()) {
    if (std::getenv(k.name)) continue;  // set by whoever runs the tests
    EXPECT_LE(k.lo, k.hi) << k.name;
    if (std::string(k.type) == "string") continue;
    setenv(k.name, k.default_value, 1);  // the default, set: read as a setting is
    EXPECT_EQ(knob_problem(k), "") << k.name;
    if (std::string(k.type) == "int") EXPECT_EQ(knob_int_in(k.name), knob_int(k.name)) << k.name;
    unsetenv(k.name);
  }
}

TEST(Knobs, RangesReadAsTheErrorsAndDoctorWriteThem) {
  auto range_of = [](const char* name) {
    for (const Knob& k : knobs())
      if (std::string(k.name) == name) return knob_range(k);
    return std::string("undeclared");
  };
  EXPECT_EQ(range_of("FERRY_KV_STREAMS"), "1..64");
  EXPECT_EQ(range_of("FERRY_MULTIPATH_CHUNK_BYTES"), "2^16..2^30");
  EXPECT_EQ(range_of("FERRY_REDUCE_ROUND_BYTES"), "at least 0");
  EXPECT_EQ(range_of("FERRY_SCRATCH_BYTES"), "4096..2^40");
  EXPECT_EQ(range_of("FERRY_PORT"), "0..65535");
  EXPECT_EQ(range_of("FERRY_DEBUG"), "");  // any value: anything but a positive number is off
  setenv("FERRY_REDUCE_ROUND_BYTES", "-1", 1);
  try {
    knob_int_in("FERRY_REDUCE_ROUND_BYTES");
    ADD_FAILURE() << "-1 was taken";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "FERRY_REDUCE_ROUND_BYTES=-1; expected at least 0");
  }
  unsetenv("FERRY_REDUCE_ROUND_BYTES");
}

// What ferry doctor flags: a set knob its first reader would refuse.
TEST(Knobs, ProblemsNameTheKnobAndWhatItTakes) {
  auto problem_of = [](const char* name) {
    for (const Knob& k : knobs())
      if (std::string(k.name) == name) return knob_problem(k);
    return std::string("undeclared");
  };
  const char* old_timeout = std::getenv("FERRY_TIMEOUT_S");
  const std::string saved = old_timeout ? old_timeout : "";
  setenv("FERRY_KV_ARMED_MAX", "0", 1);
  setenv("FERRY_WATCHDOG_MS", "ten", 1);
  setenv("FERRY_TIMEOUT_S", "-5", 1);
  setenv("FERRY_MULTIPATH_KEEP_WARM_MS", "fast", 1);
  EXPECT_NE(problem_of("FERRY_KV_ARMED_MAX").find("FERRY_KV_ARMED_MAX=0; expected 1..2^20"), std::string::npos);
  EXPECT_NE(problem_of("FERRY_WATCHDOG_MS").find("FERRY_WATCHDOG_MS=ten is not an integer"), std::string::npos);
  EXPECT_NE(problem_of("FERRY_TIMEOUT_S").find("FERRY_TIMEOUT_S"), std::string::npos);
  EXPECT_NE(problem_of("FERRY_MULTIPATH_KEEP_WARM_MS").find("is not a number"), std::string::npos);
  setenv("FERRY_KV_ARMED_MAX", "1048576", 1);
  EXPECT_EQ(problem_of("FERRY_KV_ARMED_MAX"), "");
  setenv("FERRY_DEBUG", "yes", 1);  // its reader takes anything: not doctor's to flag
  EXPECT_EQ(problem_of("FERRY_DEBUG"), "");
  unsetenv("FERRY_DEBUG");
  setenv("FERRY_EXIT_AFTER_S", "inf", 1);  // a float without a range: parsed only (inf: never)
  EXPECT_EQ(problem_of("FERRY_EXIT_AFTER_S"), "");
  unsetenv("FERRY_EXIT_AFTER_S");
  for (const char* bad : {"-1", "inf", "nan"}) {  // a float with one: finite and in it
    setenv("FERRY_MULTIPATH_KEEP_WARM_MS", bad, 1);
    EXPECT_NE(problem_of("FERRY_MULTIPATH_KEEP_WARM_MS")
                  .find(std::string("FERRY_MULTIPATH_KEEP_WARM_MS=") + bad + "; expected a finite number, at least 0"),
              std::string::npos)
        << bad;
    EXPECT_THROW(knob_float_in("FERRY_MULTIPATH_KEEP_WARM_MS"), Error) << bad;
  }
  setenv("FERRY_MULTIPATH_KEEP_WARM_MS", "0.5", 1);
  EXPECT_EQ(knob_float_in("FERRY_MULTIPATH_KEEP_WARM_MS"), 0.5);
  for (const char* name : {"FERRY_KV_ARMED_MAX", "FERRY_WATCHDOG_MS", "FERRY_MULTIPATH_KEEP_WARM_MS"}) unsetenv(name);
  if (old_timeout)
    setenv("FERRY_TIMEOUT_S", saved.c_str(), 1);
  else
    unsetenv("FERRY_TIMEOUT_S");
  EXPECT_EQ(problem_of("FERRY_KV_ARMED_MAX"), "");  // unset: its default
}

TEST(Errors, CudaErrorsNameTheCall) {
  try {
    FERRY_CUDA_CHECK(2 /* cudaErrorMemoryAllocation */);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_CUDA);
    std::string m = e.what();
    EXPECT_NE(m.find("cudaErrorMemoryAllocation"), std::string::npos);
    EXPECT_NE(m.find("test_errors.cpp"), std::string::npos);
  }
}

TEST(Knobs, SettingsEveryRankMustShareAreComparedRawAndTheFirstDifferenceIsNamed) {
  const std::vector<const char*> names{"FERRY_SM_BYTES", "FERRY_SM_LL_BLOCK_BYTES"};
  unsetenv("FERRY_SM_BYTES");
  setenv("FERRY_SM_LL_BLOCK_BYTES", "2048", 1);
  const std::string mine = knob_settings(names);
  EXPECT_EQ(mine, "unset\n=2048\n");
  EXPECT_EQ(knob_mismatch(names, {mine, mine, mine}, 1), "");
  // Raw text, not parsed values: a malformed setting on one rank is a difference every rank sees.
  const std::string why = knob_mismatch(names, {mine, "unset\n=2k\n"}, 0);
  EXPECT_EQ(why, "FERRY_SM_LL_BLOCK_BYTES is =2048 on rank 0 and =2k on rank 1; set the same value on every rank");
  EXPECT_NE(knob_mismatch(names, {"=1\n=2048\n", mine}, 1).find("FERRY_SM_BYTES is unset on rank 1 and =1 on rank 0"),
            std::string::npos);
  unsetenv("FERRY_SM_LL_BLOCK_BYTES");
}
