/* LD_PRELOAD=libferry_preload.so: an unmodified program's cudaMemcpy and
 * cudaMemcpyAsync between pinned host memory and a GPU, from
 * FERRY_MULTIPATH_MIN_BYTES up, go through ferry's multipath engine (every
 * visible GPU's host link), in the same stream order. Everything else goes to
 * the program's CUDA runtime untouched. Nothing happens before the first such
 * call: a program that never copies with CUDA is not affected.
 *
 * The engine lives in libferry.so, next to this library; its own CUDA calls
 * bind to the runtime linked into it and never come back here. It is used
 * only under CUDA_MODULE_LOADING=EAGER: a copy holds its stream until the
 * engine's thread lets it go, and a kernel's first launch under lazy loading
 * may wait for that stream. After an engine failure every later copy goes to
 * the runtime. A forked child goes to the runtime only. */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferry/multipath.h"
#include "preload/route.h"

typedef cudaError_t (*memcpy_async_fn)(void*, const void*, size_t, enum cudaMemcpyKind, cudaStream_t);
typedef cudaError_t (*memcpy_fn)(void*, const void*, size_t, enum cudaMemcpyKind);
typedef ferry_result_t (*create_fn)(const int*, int, const ferry_multipath_options_t*, ferry_multipath_t*);
typedef ferry_result_t (*copy_fn)(ferry_multipath_t, void*, const void*, size_t, ferry_stream_t, int*);
typedef ferry_result_t (*copy_sync_fn)(ferry_multipath_t, void*, const void*, size_t, int*);
typedef const char* (*last_error_fn)(void);

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static memcpy_async_fn g_real_async; /* the program's runtime, once found (atomic) */
static memcpy_fn g_real_sync;
static create_fn g_create;
static copy_fn g_copy;
static copy_sync_fn g_copy_sync;
static last_error_fn g_last_error;
static ferry_multipath_t g_engine;
static int g_off; /* atomic. 1: every copy goes to the runtime (no libferry, lazy loading, a failure, a fork) */
static int g_debug;
static size_t g_min_bytes;

static void say(const char* what, const char* detail) {
  if (g_debug) fprintf(stderr, "ferry preload: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
}

static void turn_off(void) { __atomic_store_n(&g_off, 1, __ATOMIC_RELEASE); }
static int is_off(void) { return __atomic_load_n(&g_off, __ATOMIC_ACQUIRE); }

/* The program's `name`: the next definition after this library, else the one
 * the calling library would have bound to (a runtime loaded into a library's
 * local scope), else a CUDA runtime by its usual names. A failed look-up is
 * not remembered: the runtime may load later. */
static void* real(const char* name, void* caller) {
  void* f = dlsym(RTLD_NEXT, name);
  if (f) return f;
  Dl_info info;
  if (caller && dladdr(caller, &info) && info.dli_fname) {
    void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (self) {
      f = dlsym(self, name);
      dlclose(self);
      if (f && dladdr(f, &info) && info.dli_fbase != NULL) {
        Dl_info mine;
        if (!(dladdr((void*)real, &mine) && mine.dli_fbase == info.dli_fbase)) return f; /* not this library */
      }
    }
  }
  static const char* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
    void* rt = dlopen(names[i], RTLD_NOW | RTLD_NOLOAD);
    if (!rt) continue;
    f = dlsym(rt, name);
    dlclose(rt);
    if (f) return f;
  }
  return NULL;
}

static memcpy_async_fn real_async(void* caller) {
  memcpy_async_fn f = __atomic_load_n(&g_real_async, __ATOMIC_ACQUIRE);
  if (!f && (f = (memcpy_async_fn)real("cudaMemcpyAsync", caller)))
    __atomic_store_n(&g_real_async, f, __ATOMIC_RELEASE);
  return f;
}

static memcpy_fn real_sync(void* caller) {
  memcpy_fn f = __atomic_load_n(&g_real_sync, __ATOMIC_ACQUIRE);
  if (!f && (f = (memcpy_fn)real("cudaMemcpy", caller))) __atomic_store_n(&g_real_sync, f, __ATOMIC_RELEASE);
  return f;
}

static void child_after_fork(void) {
  /* CUDA does not carry into a forked child; neither does the engine's thread. */
  g_off = 1;
  g_engine = NULL;
  pthread_mutex_init(&g_mu, NULL);
}

/* Under this library the caller's stream copies the own link's share of a
 * multipath copy (unless the user chose): the program's kernels are not known,
 * and a first launch of one while a copy holds its stream would hold the
 * engine's own-link chunks behind that stream (docs/multipath.md, "Hazards").
 * Set before main, while the process has one thread. */
__attribute__((constructor)) static void own_share_default(void) {
  setenv("FERRY_MULTIPATH_OWN_SHARE_ON_STREAM", "1", 0);
}

static void init(void) {
  pthread_atfork(NULL, NULL, child_after_fork);
  const char* d = getenv("FERRY_DEBUG");
  g_debug = d && *d && strcmp(d, "0") != 0;
  g_min_bytes = ferry_preload_min_bytes(getenv("FERRY_MULTIPATH_MIN_BYTES"), (size_t)8 << 20);
  const char* loading = getenv("CUDA_MODULE_LOADING");
  if (!loading || strcmp(loading, "EAGER") != 0) {
    turn_off();
    say("off: CUDA_MODULE_LOADING is not EAGER (under lazy loading a kernel's first launch may wait for a stream "
        "that a copy holds)",
        NULL);
    return;
  }
  Dl_info info;
  char path[PATH_MAX];
  const char* name = "libferry.so";
  char* slash = NULL;
  if (dladdr((void*)init, &info) && info.dli_fname && strlen(info.dli_fname) < sizeof(path)) {
    strcpy(path, info.dli_fname);
    slash = strrchr(path, '/');
  }
  if (!slash || (size_t)(slash - path) + 1 + strlen(name) >= sizeof(path)) {
    turn_off();
    return;
  }
  strcpy(slash + 1, name);
  void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib) {
    g_create = (create_fn)dlsym(lib, "ferry_multipath_create");
    g_copy = (copy_fn)dlsym(lib, "ferry_multipath_copy");
    g_copy_sync = (copy_sync_fn)dlsym(lib, "ferry_multipath_copy_sync");
    g_last_error = (last_error_fn)dlsym(lib, "ferry_last_error");
  }
  if (!g_create || !g_copy || !g_copy_sync || !g_last_error) {
    turn_off();
    say("off: libferry.so not found next to this library", lib ? NULL : dlerror());
  }
}

static ferry_multipath_t engine(void) {
  pthread_mutex_lock(&g_mu);
  if (!g_engine && !is_off()) {
    if (g_create(NULL, 0, NULL, &g_engine) != FERRY_SUCCESS) {
      turn_off();
      g_engine = NULL;
      say("off: the multipath engine could not be made", g_last_error());
    } else {
      say("routing host<->GPU copies through the multipath engine", NULL);
    }
  }
  ferry_multipath_t e = g_engine;
  pthread_mutex_unlock(&g_mu);
  return e;
}

/* 1: ferry took the copy (*err set); 0: the runtime should run it. `sync`:
 * cudaMemcpy's semantics (the legacy stream, waited for). */
static int through_ferry(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream,
                         int sync, cudaError_t* err) {
  pthread_once(&g_once, init);
  if (is_off() || !ferry_preload_routes(count, kind, g_min_bytes)) return 0;
  ferry_multipath_t e = engine();
  if (!e) return 0;
  int multipath = 0;
  ferry_result_t r = sync ? g_copy_sync(e, dst, src, count, &multipath)
                          : g_copy(e, dst, src, count, (ferry_stream_t)stream, &multipath);
  if (r == FERRY_SUCCESS) {
    *err = cudaSuccess;
    return 1;
  }
  if (r == FERRY_ERROR_INVALID_ARGUMENT) {
    say("left to the runtime", g_last_error()); /* not a copy ferry can take: CUDA's own result */
    return 0;
  }
  /* The engine failed (a CUDA error, a copy that did not land in time): a
   * copy it took before may be incomplete. Said always; from here on every
   * copy goes to the runtime, and this one is reported as failed. */
  fprintf(stderr, "ferry preload: the multipath engine failed; copies go to the CUDA runtime from now on: %s\n",
          g_last_error());
  turn_off();
  *err = ferry_preload_cuda_error(r);
  return 1;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  void* caller = __builtin_return_address(0);
  cudaError_t err = cudaSuccess;
  if (through_ferry(dst, src, count, kind, stream, 0, &err)) return err;
  memcpy_async_fn f = real_async(caller);
  return f ? f(dst, src, count, kind, stream) : cudaErrorNotSupported;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  void* caller = __builtin_return_address(0);
  cudaError_t err = cudaSuccess;
  if (through_ferry(dst, src, count, kind, (cudaStream_t)0, 1, &err)) return err;
  memcpy_fn f = real_sync(caller);
  return f ? f(dst, src, count, kind) : cudaErrorNotSupported;
}
