#include "core/json.hpp"

#include <charconv>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <system_error>

#include "core/error.hpp"

namespace ferry {

const Json* Json::find(const std::string& key) const {
  if (kind != Kind::kObject) return nullptr;
  auto it = object.find(key);
  return it == object.end() ? nullptr : &it->second;
}

const char* Json::kind_name() const {
  switch (kind) {
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return "a boolean";
    case Kind::kNumber:
      return "a number";
    case Kind::kString:
      return "a string";
    case Kind::kArray:
      return "an array";
    case Kind::kObject:
      return "an object";
  }
  return "unknown";
}

namespace {

// Recursive descent over the text; `at` is the next byte to read.
class Parser {
 public:
  Parser(const std::string& text, const std::string& what) : text_(text), what_(what) {}

  Json document() {
    Json v = value(0);
    skip_space();
    if (at_ != text_.size()) fail("unexpected text after the document");
    return v;
  }

 private:
  // Deep enough for any table; bounded so that a hostile file cannot overflow the stack.
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const std::string& why) const {
    throw_error(FERRY_ERROR_INVALID_ARGUMENT,
                what_ + ": not valid JSON at byte " + std::to_string(at_) + " (" + why + ")");
  }

  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t'))
      ++at_;
  }

  bool take(char c) {
    skip_space();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }

  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }

  bool take_word(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (text_.compare(at_, n, word) != 0) return false;
    at_ += n;
    return true;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    skip_space();
    if (at_ == text_.size()) fail("unexpected end");
    Json v;
    char c = text_[at_];
    if (c == '{') {
      ++at_;
      v.kind = Json::Kind::kObject;
      if (take('}')) return v;
      do {
        skip_space();
        std::string key = string_literal();
        expect(':');
        v.object[key] = value(depth + 1);
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++at_;
      v.kind = Json::Kind::kArray;
      if (take(']')) return v;
      do v.array.push_back(value(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = Json::Kind::kString;
      v.string = string_literal();
    } else if (take_word("null")) {
      v.kind = Json::Kind::kNull;
    } else if (take_word("true")) {
      v.kind = Json::Kind::kBool;
      v.boolean = true;
    } else if (take_word("false")) {
      v.kind = Json::Kind::kBool;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      v.kind = Json::Kind::kNumber;
      // std::from_chars, not strtod: the C locale's decimal point (a program
      // may set LC_NUMERIC) must not change what a file means.
      const char* begin = text_.data() + at_;
      const auto [end, ec] = std::from_chars(begin, text_.data() + text_.size(), v.number);
      if (ec != std::errc() || end == begin) fail("expected a number");
      at_ += static_cast<size_t>(end - begin);
    } else {
      fail(std::string("unexpected '") + c + "'");
    }
    return v;
  }

  // A string literal; \uXXXX escapes outside ASCII are written as UTF-8.
  std::string string_literal() {
    if (at_ >= text_.size() || text_[at_] != '"') fail("expected a string");
    ++at_;
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c != '\\') {
        out += c;
        continue;
      }
      if (at_ == text_.size()) break;
      char e = text_[at_++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          unsigned code = hex4();
          // A UTF-16 surrogate pair (what Python's json writes for characters past U+FFFF).
          if (code >= 0xD800 && code < 0xDC00 && text_.compare(at_, 2, "\\u") == 0) {
            at_ += 2;
            unsigned low = hex4();
            if (low < 0xDC00 || low >= 0xE000) fail("unpaired surrogate");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default:
          out += e;  // \" \\ \/
      }
    }
    if (at_ == text_.size()) fail("unterminated string");
    ++at_;
    return out;
  }

  // The four hex digits of a \u escape.
  unsigned hex4() {
    unsigned code = 0;
    for (int i = 0; i < 4; ++i, ++at_) {
      char c = at_ < text_.size() ? text_[at_] : '\0';
      int digit = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
      if (digit < 0) fail("expected four hex digits after \\u");
      code = code * 16 + static_cast<unsigned>(digit);
    }
    return code;
  }

  static void append_utf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  const std::string& text_;
  const std::string& what_;
  size_t at_ = 0;
};

}  // namespace

Json parse_json(const std::string& text, const std::string& what) { return Parser(text, what).document(); }

std::optional<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace ferry
