/* How long a short sleep takes on this host. The multipath engine's thread
 * sleeps 5 us between looks at its chunks' events (std::this_thread::sleep_for,
 * timer slack 1 us, as the engine sets it), so each look can see a landing
 * that much late.
 *
 *   cc -O2 -o /tmp/sleep_latency bench/probes/sleep_latency.c && /tmp/sleep_latency
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static void report(const char* what, double* got, int n) {
  qsort(got, n, sizeof(double), cmp);
  printf("%-22s median %7.2f us, p90 %7.2f, p99 %7.2f, max %8.1f\n", what, got[n / 2], got[n * 9 / 10],
         got[n * 99 / 100], got[n - 1]);
}

int main(void) {
  enum { kN = 20000 };
  static double got[kN];
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  const long wants[] = {5000, 20000, 100000};
  for (int w = 0; w < 3; ++w) {
    for (int i = 0; i < kN; ++i) {
      struct timespec ts = {0, wants[w]};
      const double t = now_us();
      nanosleep(&ts, NULL);
      got[i] = now_us() - t;
    }
    char name[64];
    snprintf(name, sizeof name, "sleep %ld us:", wants[w] / 1000);
    report(name, got, w == 2 ? kN / 10 : kN);
  }
  for (int i = 0; i < kN; ++i) {
    const double t = now_us();
    sched_yield();
    got[i] = now_us() - t;
  }
  report("sched_yield:", got, kN);
  return 0;
}
