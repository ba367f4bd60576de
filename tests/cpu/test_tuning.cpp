// The tables a communicator starts with: the JSON reader, the rules of a
// `ferry tune` file, the shipped tables compiled into the library, and
// FERRY_TUNING's choices, all without a GPU.
#include <gtest/gtest.h>

#include <clocale>
#include <cstdlib>
#include <limits>
#include <map>
#include <vector>

#include "coll/tuning.hpp"
#include "core/env.hpp"
#include "core/error.hpp"
#include "core/json.hpp"

using namespace ferry;

namespace {

constexpr size_t kNoBound = std::numeric_limits<size_t>::max();
const CollOp kOps[] = {CollOp::kAllGather, CollOp::kAllToAll,      CollOp::kAllToAllv,
                       CollOp::kBroadcast, CollOp::kReduceScatter, CollOp::kAllReduce};

// The message of the InvalidArgument error `f` throws ("" if none).
template <typename F>
std::string refusal(F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_ERROR_INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

// A file system of one file, for startup_rules.
std::optional<std::string> one_file(const std::string& path) {
  if (path == "/t.json") return std::string(R"({"rules": [{"op": "all_gather", "max_bytes": null, "algo": "pcpy"}]})");
  return std::nullopt;
}

ShippedTable table_of(const char* gpu, const char* preset, std::map<int, Algo> algo_by_world) {
  ShippedTable t{gpu, preset, {}};
  for (auto [w, a] : algo_by_world) t.by_world[w] = {{CollOp::kAllGather, w, kNoBound, a}};
  return t;
}

}  // namespace

TEST(Json, ReadsEveryKind) {
  Json v = parse_json(R"( {"a": [1, -2.5e3, true, false, null], "s": "q\"\\\n\u00e9", "o": {}} )", "t");
  ASSERT_EQ(v.kind, Json::Kind::kObject);
  const Json* a = v.find("a");
  ASSERT_TRUE(a && a->kind == Json::Kind::kArray && a->array.size() == 5);
  EXPECT_EQ(a->array[0].number, 1);
  EXPECT_EQ(a->array[1].number, -2500);
  EXPECT_TRUE(a->array[2].boolean);
  EXPECT_EQ(a->array[3].kind, Json::Kind::kBool);
  EXPECT_FALSE(a->array[3].boolean);
  EXPECT_EQ(a->array[4].kind, Json::Kind::kNull);
  EXPECT_EQ(v.find("s")->string, "q\"\\\n\xc3\xa9");
  EXPECT_EQ(parse_json(R"("\u00d7 \ud83d\ude80")", "t").string, "\xc3\x97 \xf0\x9f\x9a\x80");  // U+00D7, U+1F680
  EXPECT_EQ(v.find("o")->object.size(), 0u);
  EXPECT_EQ(v.find("missing"), nullptr);
  EXPECT_EQ(a->find("a"), nullptr);  // not an object
}

TEST(Json, NumbersMeanTheSameWhateverDecimalPointTheProgramSet) {
  auto read = [] {
    Json v = parse_json("[0.5, -2.25e3, 7]", "t");
    return std::vector<double>{v.array[0].number, v.array[1].number, v.array[2].number};
  };
  const std::vector<double> want = {0.5, -2250, 7};
  EXPECT_EQ(read(), want);
  ::setenv("FERRY_EXIT_AFTER_S", "0.25", 1);
  EXPECT_EQ(knob_float("FERRY_EXIT_AFTER_S"), 0.25);
  // A locale whose decimal point is a comma, where this machine has one.
  for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "fr_FR.utf8", "ru_RU.UTF-8"}) {
    if (!std::setlocale(LC_NUMERIC, name)) continue;
    EXPECT_EQ(read(), want) << name;
    EXPECT_EQ(knob_float("FERRY_EXIT_AFTER_S"), 0.25) << name;
    std::setlocale(LC_NUMERIC, "C");
    break;
  }
  ::setenv("FERRY_EXIT_AFTER_S", "0,25", 1);
  EXPECT_THROW(knob_float("FERRY_EXIT_AFTER_S"), Error);
  ::unsetenv("FERRY_EXIT_AFTER_S");
}

TEST(Json, MalformedDocumentsNameTheirPlace) {
  EXPECT_NE(refusal([] { parse_json("{\"a\": 1,}", "f.json"); }).find("f.json: not valid JSON at byte 8"),
            std::string::npos);
  EXPECT_NE(refusal([] { parse_json("[1, 2", "x"); }).find("expected ']'"), std::string::npos);
  EXPECT_NE(refusal([] { parse_json("\"abc", "x"); }).find("unterminated string"), std::string::npos);
  EXPECT_NE(refusal([] { parse_json("{} {}", "x"); }).find("after the document"), std::string::npos);
  EXPECT_NE(refusal([] { parse_json("-", "x"); }).find("expected a number"), std::string::npos);
  EXPECT_NE(refusal([] { parse_json("", "x"); }).find("unexpected end"), std::string::npos);
  EXPECT_NE(refusal([] { parse_json(R"("\u12g4")", "x"); }).find("four hex digits"), std::string::npos);
  EXPECT_NE(refusal([] { parse_json(R"("\ud83d\u0041")", "x"); }).find("unpaired surrogate"), std::string::npos);
  EXPECT_NE(refusal([] { parse_json(std::string(100, '['), "x"); }).find("nested too deeply"), std::string::npos);
}

TEST(Tuning, RulesFromJsonCheckEveryField) {
  auto rules = rules_from_json(parse_json(R"([
      {"op": "all_gather", "world": 2, "max_bytes": 1048576, "algo": "sm"},
      {"op": "reduce_scatter", "max_bytes": null, "algo": "pcpy", "signals": "sm"}])",
                                          "t"));
  ASSERT_EQ(rules.size(), 2u);
  EXPECT_EQ(rules[0].op, CollOp::kAllGather);
  EXPECT_EQ(rules[0].world, 2);
  EXPECT_EQ(rules[0].max_bytes, size_t(1) << 20);
  EXPECT_EQ(rules[0].algo, Algo::kSm);
  EXPECT_EQ(rules[0].signals, Signals::kAuto);
  EXPECT_EQ(rules[1].world, 0);
  EXPECT_EQ(rules[1].max_bytes, kNoBound);
  EXPECT_EQ(rules[1].signals, Signals::kKernel);

  auto why = [](const char* text) { return refusal([&] { rules_from_json(parse_json(text, "t")); }); };
  EXPECT_EQ(why(R"([{"op": "all_gather", "algo": "ring"}])"),
            "rule 0: algo is 'ring'; expected one of b2b, seq, pcpy, sm");
  EXPECT_EQ(why(R"([{"op": "all_gather", "algo": "auto"}])"),
            "rule 0: algo is 'auto'; expected one of b2b, seq, pcpy, sm");
  EXPECT_NE(why(R"([{"algo": "seq"}])").find("rule 0: 'op' is missing"), std::string::npos);
  EXPECT_NE(why(R"([{"op": "gather", "algo": "seq"}])").find("rule 0: op is 'gather'; expected all_gather"),
            std::string::npos);
  EXPECT_EQ(why(R"([{"op": "all_gather", "algo": "seq", "signals": "rounds"}])"),
            "rule 0: signals is 'rounds'; expected one of auto, copy, kernel");
  EXPECT_NE(why(R"([{"op": "all_gather", "algo": "seq", "max_bytes": -1}])").find("rule 0: max_bytes is -1"),
            std::string::npos);
  EXPECT_NE(why(R"([{"op": "all_gather", "algo": "seq", "max_bytes": 1.5}])").find("expected a whole number"),
            std::string::npos);
  EXPECT_EQ(why(R"([{"op": "all_gather", "algo": "seq", "world": "2"}])"),
            "rule 0: 'world' is a string; expected a number");
  EXPECT_NE(why(R"([{"op": "all_gather", "algo": "seq"}, 3])").find("rule 1 is a number; expected an object"),
            std::string::npos);
  EXPECT_EQ(why(R"({"rules": []})"), "rules is an object; expected an array");
}

TEST(Tuning, PresetTakesTheNearestSmallerMeasuredWorld) {
  std::vector<ShippedTable> tables = {table_of("H200", "sm-free", {{2, Algo::kPcpy}, {4, Algo::kSeq}}),
                                      table_of("H200", "latency", {{2, Algo::kSm}})};
  auto algo = [&](int world, const char* preset) {
    auto rules = preset_rules(tables, "NVIDIA H200", world, preset);
    EXPECT_TRUE(rules.has_value());
    EXPECT_EQ(rules->at(0).world, 0);  // measured for one size, applied to this one
    return rules->at(0).algo;
  };
  EXPECT_EQ(algo(2, "sm-free"), Algo::kPcpy);
  EXPECT_EQ(algo(3, "sm-free"), Algo::kPcpy);
  EXPECT_EQ(algo(4, "sm-free"), Algo::kSeq);
  EXPECT_EQ(algo(8, "sm-free"), Algo::kSeq);
  EXPECT_EQ(algo(1, "sm-free"), Algo::kPcpy);  // below the smallest: the smallest
  EXPECT_EQ(algo(8, "latency"), Algo::kSm);
  EXPECT_FALSE(preset_rules(tables, "NVIDIA H100 80GB HBM3", 2, "sm-free").has_value());
  EXPECT_EQ(refusal([&] { preset_rules(tables, "NVIDIA H200", 2, "fast"); }),
            "preset is 'fast'; expected one of sm-free, latency");
  // What set_tuning_preset says: the same rules, or why there are none.
  EXPECT_EQ(shipped_preset(tables, "NVIDIA H200", 2, "latency").at(0).algo, Algo::kSm);
  EXPECT_EQ(refusal([&] { shipped_preset(tables, "NVIDIA H100 80GB HBM3", 2, "latency"); }),
            "preset: ferry ships no 'latency' table for NVIDIA H100 80GB HBM3; measure one with `ferry tune` (--sm "
            "for SM paths) and set its rules");
  EXPECT_EQ(refusal([&] { shipped_preset(tables, "NVIDIA H200", 2, "fast"); }),
            "preset is 'fast'; expected one of sm-free, latency");
}

TEST(Tuning, FerryTuningPicksPresetFileOrShippedDefault) {
  std::vector<ShippedTable> tables = {table_of("H200", "sm-free", {{2, Algo::kPcpy}}),
                                      table_of("H200", "latency", {{2, Algo::kSm}})};
  auto first = [&](const char* gpu, const char* setting) {
    auto rules = startup_rules(tables, gpu, 2, setting, one_file);
    return rules ? rules->at(0).algo : Algo::kAuto;
  };
  EXPECT_EQ(first("NVIDIA H200", ""), Algo::kPcpy);  // unset: the shipped sm-free table
  EXPECT_EQ(first("NVIDIA H200", "sm-free"), Algo::kPcpy);
  EXPECT_EQ(first("NVIDIA H200", "latency"), Algo::kSm);
  EXPECT_EQ(first("Another GPU", ""), Algo::kAuto);         // nothing shipped: the built-in default
  EXPECT_EQ(first("Another GPU", "/t.json"), Algo::kPcpy);  // a file applies to any GPU
  EXPECT_EQ(refusal([&] { first("NVIDIA H200", "fast"); }),
            "FERRY_TUNING='fast' is neither a preset (sm-free, latency) nor a file");
  auto bad_file = [](const std::string&) -> std::optional<std::string> {
    return std::string(R"({"rules": [{"op": "all_gather", "algo": "ring"}]})");
  };
  EXPECT_EQ(refusal([&] { startup_rules(tables, "NVIDIA H200", 2, "/b.json", bad_file); }),
            "FERRY_TUNING='/b.json': not a `ferry tune` table (rule 0: algo is 'ring'; expected one of b2b, seq, "
            "pcpy, sm)");
  auto not_json = [](const std::string&) -> std::optional<std::string> { return std::string("rules"); };
  EXPECT_NE(refusal([&] {
              startup_rules(tables, "NVIDIA H200", 2, "/n.json", not_json);
            }).find("FERRY_TUNING='/n.json': not a `ferry tune` table (the file: not valid JSON at byte 0"),
            std::string::npos);
}

TEST(Tuning, ShippedFilesAreReadAndCoverEveryOpAndSize) {
  const auto& tables = shipped_tables();
  ASSERT_GE(tables.size(), 2u);  // python/ferry/tuning: the sm-free table and the latency preset
  for (const char* preset : {"sm-free", "latency"}) {
    for (int world : {2, 4, 8}) {
      auto rules = preset_rules(tables, "NVIDIA H200", world, preset);
      ASSERT_TRUE(rules.has_value()) << preset << " " << world;
      for (CollOp op : kOps)
        for (size_t bytes : {size_t(1), size_t(1) << 20, size_t(1) << 30, size_t(1) << 40}) {
          bool matched = false;
          for (const auto& r : *rules) matched |= r.op == op && bytes <= r.max_bytes;
          EXPECT_TRUE(matched) << preset << " " << world << " " << coll_op_name(op) << " " << bytes;
        }
      for (const auto& r : *rules) {
        // The default never takes SMs; the latency preset's SM path stays within its 1 MiB window,
        // but for the reductions on 4 or more GPUs (a larger window holds their results and parts).
        if (std::string(preset) == "sm-free") EXPECT_TRUE(r.algo != Algo::kSm && r.signals == Signals::kAuto);
        const bool reduction = r.op == CollOp::kReduceScatter || r.op == CollOp::kAllReduce;
        if (r.algo == Algo::kSm) EXPECT_LE(r.max_bytes, size_t(world >= 4 && reduction ? 4 : 1) << 20);
      }
    }
  }
  // 2 GPUs: the measured sm-free table takes parallel engines for large all_gathers.
  auto rules = startup_rules(tables, "NVIDIA H200", 2, "");
  ASSERT_TRUE(rules.has_value());
  EXPECT_EQ(select_variant(CollOp::kAllGather, 2, size_t(1) << 30, Algo::kAuto, *rules).algo, Algo::kPcpy);
}

TEST(Tuning, ShippedFileErrorsNameTheFile) {
  EXPECT_NE(refusal([] { shipped_table_from_json(R"({"tables": {}})", "x.json"); }).find("x.json: 'gpu' is missing"),
            std::string::npos);
  EXPECT_NE(refusal([] {
              shipped_table_from_json(R"({"gpu": "H200", "preset": "fast", "tables": {}})", "x.json");
            }).find("x.json: preset 'fast'"),
            std::string::npos);
  EXPECT_NE(refusal([] {
              shipped_table_from_json(R"({"gpu": "H200", "tables": {"2": [{"op": "all_gather"}]}})", "x.json");
            }).find("x.json, world 2: rule 0: 'algo' is missing"),
            std::string::npos);
  EXPECT_NE(refusal([] {
              shipped_table_from_json(R"({"gpu": "H200", "tables": {"two": []}})", "x.json");
            }).find("table 'two' is not a world size"),
            std::string::npos);
}
