// A small JSON reader for ferry's own files (the tuning tables that `ferry
// tune` writes and ferry ships), so that the C library reads them without a
// dependency. Whole documents only, UTF-8 passed through, numbers as double
// (tables hold byte counts up to 2^53 exactly; larger ones are refused where
// they are read).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ferry {

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  // The member `key` of an object, or nullptr (also when this is no object).
  const Json* find(const std::string& key) const;
  const char* kind_name() const;
};

// Parses `text`; a malformed document throws FERRY_ERROR_INVALID_ARGUMENT
// naming `what` and the byte offset where it went wrong.
Json parse_json(const std::string& text, const std::string& what);

// The whole file at `path`, or nullopt where there is none to read (the tables
// that FERRY_TUNING and FERRY_KV_TUNING name).
std::optional<std::string> read_text_file(const std::string& path);

}  // namespace ferry
