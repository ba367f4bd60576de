/* Test-only: a hung fuzzer process prints each thread's native stack.
 * Loaded into the fuzzer's children (tests/gpu/fuzz.py --native-stacks);
 * the parent sends SIGUSR2 to every thread of a process it gives up on.
 * Without symbols (libcuda) a frame is library+offset, which still says
 * which runtime call a thread is in. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void dump(int sig) {
  (void)sig;
  void* frames[48];
  int n = backtrace(frames, 48);
  char head[64];
  int len = snprintf(head, sizeof head, "native stack of thread %ld:\n", (long)syscall(SYS_gettid));
  write(2, head, (size_t)len);
  backtrace_symbols_fd(frames, n, 2);
}

__attribute__((constructor)) static void install(void) {
  void* warm[1];
  backtrace(warm, 1); /* loads the unwinder now, not inside the handler */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = dump;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &sa, NULL);
}
