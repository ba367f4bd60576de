// Every environment knob ferry reads, declared once. `ferry doctor` prints the table.
#pragma once

#include <string>
#include <vector>

namespace ferry {

struct Knob {
  const char* name;
  const char* type;  // "int", "float", "string"
  const char* default_value;
  const char* doc;
};

const std::vector<Knob>& knobs();

// Value of a declared knob (the environment's, else its default). Throws on
// an undeclared name, so every read goes through the table.
std::string knob_string(const char* name);
long long knob_int(const char* name);
double knob_float(const char* name);

}  // namespace ferry
