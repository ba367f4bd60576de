#include "core/process.hpp"

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <string>

namespace ferry {

bool process_exited(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string proc = "/proc/" + std::to_string(pid);
  if (FILE* f = std::fopen((proc + "/stat").c_str(), "r")) {
    char state = 0;
    int got = std::fscanf(f, "%*d (%*[^)]) %c", &state);
    std::fclose(f);
    if (got == 1 && (state == 'Z' || state == 'X')) return true;
  }
  // A process whose address space is gone is exiting: its command line reads empty.
  if (FILE* f = std::fopen((proc + "/cmdline").c_str(), "r")) {
    int c = std::fgetc(f);
    std::fclose(f);
    return c == EOF;
  }
  return false;
}

}  // namespace ferry
