/* ferry: copy-engine (DMA) collectives for multi-GPU machine learning.
 *
 * The C API. Every function returns a ferry_result_t; on failure,
 * ferry_last_error() returns a message for the calling thread that names the
 * argument, the rank or the CUDA call that failed.
 *
 * Threading: a communicator may be used from one thread at a time. Collective
 * calls are collective: every rank makes the same calls in the same order.
 * Memory order: a collective is ordered in the caller's stream; work enqueued on
 * that stream after it sees all of the collective's writes on this rank.
 */
#ifndef FERRY_FERRY_H_
#define FERRY_FERRY_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FERRY_API __attribute__((visibility("default")))
#else
#define FERRY_API
#endif

typedef enum {
  FERRY_SUCCESS = 0,
  FERRY_ERROR_INVALID_ARGUMENT = 1, /* an argument is wrong; the message names it */
  FERRY_ERROR_NO_GPU = 2,           /* no driver or no device: the message says what is missing */
  FERRY_ERROR_CUDA = 3,             /* a CUDA call failed */
  FERRY_ERROR_SYSTEM = 4,           /* an OS call failed (sockets, memfd, ...) */
  FERRY_ERROR_TIMEOUT = 5,          /* a peer did not arrive in time; the message names it */
  FERRY_ERROR_NOT_REGISTERED = 6,   /* a buffer that must be peer-visible is not registered */
  FERRY_ERROR_CLOSED = 7,           /* the communicator is closed */
  FERRY_ERROR_UNSUPPORTED = 8,      /* the driver or device lacks a needed feature */
  FERRY_ERROR_BROKEN = 9,           /* an earlier collective failed; close the communicator */
  FERRY_ERROR_INTERNAL = 10,
  FERRY_ERROR_OUT_OF_MEMORY = 11 /* the symmetric heap is full; the message names the knob that sizes it */
} ferry_result_t;

/* Message for the last failure on this thread ("" if none). */
FERRY_API const char* ferry_last_error(void);
FERRY_API const char* ferry_result_name(ferry_result_t result);

/* A cudaStream_t, passed opaquely so this header needs no CUDA headers. NULL is
 * the legacy default stream. */
typedef void* ferry_stream_t;

typedef struct ferry_comm* ferry_comm_t;

/* Out-of-band all-gather the caller provides (MPI_Allgather, a store, ...):
 * gathers `nbytes` from every rank into `all` (world * nbytes, rank order).
 * Returns 0 on success; must itself be bounded in time. */
typedef int (*ferry_allgather_fn)(void* ctx, const void* mine, size_t nbytes, void* all);

typedef struct {
  int rank;   /* this process's rank, 0 <= rank < world */
  int world;  /* number of ranks (one GPU each) */
  int device; /* CUDA device ordinal this rank drives */
  ferry_allgather_fn allgather;
  void* allgather_ctx;
  double timeout_s; /* bound on every wait, at most 1e6 s; <= 0 takes FERRY_TIMEOUT_S */
} ferry_comm_config_t;

/* One process per GPU. Collective over all ranks. Setting up a communicator
 * maps memory and loads kernels, which waits for every stream of the GPU:
 * while a prepared transfer or collective elsewhere in the process is armed
 * and not yet triggered, init and init_local return
 * FERRY_ERROR_INVALID_ARGUMENT naming it (call again after its trigger), and
 * close keeps the memory until none is. The caller's allgather may go through
 * a GPU, so a rank that refuses returns at once without an exchange: its
 * peers wait for it until the timeout. */
FERRY_API ferry_result_t ferry_comm_init(const ferry_comm_config_t* config, ferry_comm_t* comm);
/* One process driving `n` GPUs: rank i is devices[i]. */
FERRY_API ferry_result_t ferry_comm_init_local(const int* devices, int n, double timeout_s, ferry_comm_t* comm);
/* Marks the communicator closed and releases every mapping and buffer it owns.
 * A second close returns FERRY_ERROR_CLOSED. The handle stays valid until destroy. */
FERRY_API ferry_result_t ferry_comm_close(ferry_comm_t comm);
FERRY_API void ferry_comm_destroy(ferry_comm_t comm);

/* -1 for a NULL handle or a local_index that is no local rank's; a closed
 * communicator keeps no local ranks (local_count 0, rank -1). */
FERRY_API int ferry_comm_rank(ferry_comm_t comm, int local_index);
FERRY_API int ferry_comm_world(ferry_comm_t comm);
FERRY_API int ferry_comm_local_count(ferry_comm_t comm); /* 1, or n for init_local */

/* Buffers. Arrays below have one entry per local rank (ferry_comm_local_count). */

/* Allocates `bytes` of peer-visible device memory per local rank (CUDA VMM,
 * shared with peer processes as POSIX file descriptors). Collective. */
FERRY_API ferry_result_t ferry_comm_alloc(ferry_comm_t comm, size_t bytes, void** ptrs);
FERRY_API ferry_result_t ferry_comm_free(ferry_comm_t comm, void* const* ptrs);
/* Registers existing device allocations (cudaMalloc memory, through CUDA IPC;
 * or memory from ferry_comm_alloc). Collective. Collectives then accept any
 * range inside a registered buffer, at the same offset on every rank. */
FERRY_API ferry_result_t ferry_comm_register(ferry_comm_t comm, void* const* ptrs, const size_t* sizes);
FERRY_API ferry_result_t ferry_comm_deregister(ferry_comm_t comm, void* const* ptrs);

/* A symmetric pool: buffers collectives accept as outputs, from a few large
 * chunks of ferry_comm_alloc memory instead of one collective alloc each.
 * Every rank makes the same requests in the same order, so a buffer sits at
 * the same offset on every rank. A request that does not fit adds a chunk
 * (then the call is collective); a freed buffer is reused only by later
 * requests on the stream it was asked for on (local rank 0's stream stands
 * for all local ranks). Destroying the pool frees its chunks (collective).
 * Closing or destroying the communicator frees them too; the pool then
 * refuses requests with FERRY_ERROR_CLOSED, reports 0 bytes, and can still be
 * destroyed. */
typedef struct ferry_pool* ferry_pool_t;
FERRY_API ferry_result_t ferry_pool_create(ferry_comm_t comm, size_t chunk_bytes, ferry_pool_t* pool);
FERRY_API ferry_result_t ferry_pool_alloc(ferry_pool_t pool, size_t bytes, ferry_stream_t stream, void** ptrs);
FERRY_API ferry_result_t ferry_pool_free(ferry_pool_t pool, const void* ptr); /* local rank 0's pointer */
FERRY_API ferry_result_t ferry_pool_sizes(ferry_pool_t pool, size_t* reserved, size_t* in_use);
FERRY_API void ferry_pool_destroy(ferry_pool_t pool);

typedef enum {
  FERRY_ALGO_AUTO = 0, /* the selector picks from size and world */
  FERRY_ALGO_PCPY = 1, /* one copy engine stream per peer, in parallel */
  FERRY_ALGO_B2B = 2,  /* all copies in one batched submission on one stream */
  FERRY_ALGO_SEQ = 3,  /* copies one after another on one stream, in cyclic-shift order */
  FERRY_ALGO_SM = 4    /* NOT copy engines: one SM kernel (up to FERRY_SM_MAX_BLOCKS, 32) stores into peers' windows and
                          signals with stores; small all_gather, all_to_all(v), broadcast on up to 8 GPUs */
} ferry_algo_t;

typedef enum {
  /* A copy within one GPU runs on SMs whatever call makes it (docs/architecture.md). */
  FERRY_LOCAL_COPY_AUTO = 0,   /* PEER where the collective allows it and the block is at most 1 MiB, else SM */
  FERRY_LOCAL_COPY_DRIVER = 1, /* cudaMemcpyAsync: CUDA's copy kernel, every SM for a shorter time */
  FERRY_LOCAL_COPY_SM = 2,     /* ferry's copy kernel, 32 blocks */
  FERRY_LOCAL_COPY_PEER = 3    /* no SM: through a peer on copy engines (all_to_all: via the next rank's scratch) */
} ferry_local_copy_t;

typedef enum {
  /* Who sends and awaits a copy-engine exchange's two rounds of signals ("may write", "written"). */
  FERRY_SIGNALS_AUTO = 0,   /* the communicator's setting: FERRY_SIGNALS, "copy" unless set */
  FERRY_SIGNALS_COPY = 1,   /* small copy-engine copies into peers' flags and stream waits: no SM */
  FERRY_SIGNALS_KERNEL = 2, /* NOT SM-free: one single-block kernel per round; 5-13 us less per call on 2 H200s,
                               but beside a GPU-filling kernel each round waits for an SM */
  FERRY_SIGNALS_SM = FERRY_SIGNALS_KERNEL /* its first name, kept for programs written with it */
} ferry_signals_t;

/* Zero-initialized options are the defaults (auto everywhere). */
typedef struct {
  ferry_algo_t algo;
  ferry_local_copy_t local_copy;
  ferry_signals_t signals;
} ferry_coll_options_t;

/* all_gather: out (world * bytes_per_rank, registered) receives every rank's
 * `in` (bytes_per_rank) in rank order. Out-of-place; `in` may alias this rank's
 * slot of `out`, which skips the local copy. `options` may be NULL. */
FERRY_API ferry_result_t ferry_all_gather(ferry_comm_t comm, void* const* outs, const void* const* ins,
                                          size_t bytes_per_rank, const ferry_stream_t* streams,
                                          const ferry_coll_options_t* options);
/* all_to_all: in and out hold world blocks of bytes_per_rank; block j of rank
 * i's in lands in block i of rank j's out. out registered; out and in must not overlap. */
FERRY_API ferry_result_t ferry_all_to_all(ferry_comm_t comm, void* const* outs, const void* const* ins,
                                          size_t bytes_per_rank, const ferry_stream_t* streams,
                                          const ferry_coll_options_t* options);

typedef enum {
  FERRY_OP_ALL_GATHER = 1,
  FERRY_OP_ALL_TO_ALL = 2,     /* in == out: in place, through bounded scratch */
  FERRY_OP_ALL_TO_ALLV = 3,    /* counts: world * world bytes, [src * world + dst]; in packed by
                                  destination, out packed by source; the same counts on every rank */
  FERRY_OP_BROADCAST = 4,      /* root's in (bytes) into every out; ins of other ranks ignored */
  FERRY_OP_REDUCE_SCATTER = 5, /* in: world * count elements, out: count; data on copy engines, the
                                  reduction in a small SM kernel */
  FERRY_OP_ALL_REDUCE = 6      /* count elements; out registered; in == out allowed; copy engines +
                                  a small SM reduction kernel */
} ferry_op_t;

typedef enum {
  FERRY_FLOAT32 = 1,
  FERRY_FLOAT16 = 2,
  FERRY_BFLOAT16 = 3,
  FERRY_INT32 = 4,
  FERRY_FLOAT64 = 5,
  FERRY_INT64 = 6
} ferry_dtype_t;

typedef enum { FERRY_RED_SUM = 1, FERRY_RED_MAX = 2, FERRY_RED_MIN = 3 } ferry_red_op_t;

/* Any collective. Arrays have one entry per local rank. */
typedef struct {
  ferry_op_t op;
  void* const* outs;
  const void* const* ins;
  size_t bytes;         /* all_gather/all_to_all: per rank's block; broadcast: in all */
  const size_t* counts; /* all_to_allv */
  int root;             /* broadcast */
  size_t count;         /* reduce_scatter: elements per output; all_reduce: elements in all */
  ferry_dtype_t dtype;  /* reductions */
  ferry_red_op_t red_op;
  const ferry_stream_t* streams; /* NULL: the legacy default streams */
  ferry_coll_options_t options;
} ferry_call_t;

/* Enqueues `call` in its streams; captured into a CUDA graph when they capture. */
FERRY_API ferry_result_t ferry_run(ferry_comm_t comm, const ferry_call_t* call);

/* Prelaunch. ferry_prepare validates and plans once; ferry_arm enqueues the
 * commands on ferry's armed stream (after the work so far on `after`, one
 * stream per local rank; NULL: the legacy default streams) behind a wait on a trigger word, with the
 * ready handshake done ahead; a trigger releases them: from the host, from a
 * stream (ferry_trigger_on: a stream memory write, no kernel), or from a
 * kernel (ferry_device_trigger + ferry/device.cuh). Re-arm after each trigger.
 * Runs handed to kernels whose kernels have not fired them still wait on the
 * armed stream: where they and this arming would pass what its queue takes,
 * ferry_arm waits for them first, and returns FERRY_ERROR_TIMEOUT naming
 * them at the timeout (launch those kernels before arming again).
 * ferry_arm_gated with FERRY_GATE_DEVICE puts the trigger word in GPU memory:
 * stream and kernel triggers release the collective sooner there, and
 * ferry_trigger (the host) cannot release it. */
typedef enum { FERRY_GATE_HOST = 0, FERRY_GATE_DEVICE = 1 } ferry_gate_t;
typedef struct {
  unsigned long long* word; /* device-visible */
  unsigned long long value;
} ferry_trigger_t;
FERRY_API ferry_result_t ferry_prepare(ferry_comm_t comm, const ferry_call_t* call, int* handle);
FERRY_API ferry_result_t ferry_arm(ferry_comm_t comm, int handle, const ferry_stream_t* after);
FERRY_API ferry_result_t ferry_arm_gated(ferry_comm_t comm, int handle, const ferry_stream_t* after, ferry_gate_t gate);
FERRY_API ferry_result_t ferry_trigger(ferry_comm_t comm, int handle);
FERRY_API ferry_result_t ferry_trigger_on(ferry_comm_t comm, int handle, const ferry_stream_t* streams);
FERRY_API ferry_result_t ferry_device_trigger(ferry_comm_t comm, int handle, int local_index, ferry_trigger_t* trigger);
/* Makes each stream wait for the handle's last armed run. */
FERRY_API ferry_result_t ferry_wait(ferry_comm_t comm, int handle, const ferry_stream_t* streams);
FERRY_API ferry_result_t ferry_release(ferry_comm_t comm, int handle);

/* The selector's table, what "auto" runs: rules tried in order; the first whose
 * op and world (0: any) match and whose max_bytes is at least the call's bytes
 * per rank (all_to_all(v): one block; reduce_scatter: the output) wins. algo
 * names a variant (not AUTO); FERRY_ALGO_SM rules are skipped for calls the SM
 * path cannot take. signals: who sends that variant's two signal rounds (AUTO:
 * FERRY_SIGNALS).
 *
 * A communicator starts with FERRY_TUNING's table (a preset's name, or the path
 * of a file `ferry tune` wrote), else the "sm-free" table ferry ships for its
 * GPU model (the JSON files in python/ferry/tuning, compiled into this
 * library), else a built-in default (b2b up to 2 MiB, seq above). n == 0
 * restores that start. */
typedef struct {
  ferry_op_t op;
  int world;        /* 0: any world size */
  size_t max_bytes; /* SIZE_MAX: no bound */
  ferry_algo_t algo;
  ferry_signals_t signals;
} ferry_tuning_rule_t;
FERRY_API ferry_result_t ferry_comm_set_tuning(ferry_comm_t comm, const ferry_tuning_rule_t* rules, size_t n);
/* The table of a shipped preset for this GPU model: "sm-free" (copy engines
 * only) or "latency" (the SM path and kernel signals where they were measured
 * faster; those wait for SMs beside compute). FERRY_ERROR_INVALID_ARGUMENT for
 * another name, or where ferry ships no such table for this GPU. */
FERRY_API ferry_result_t ferry_comm_set_tuning_preset(ferry_comm_t comm, const char* preset);
/* What a call of `op` with algo and signals AUTO runs at this size on `comm`:
 * the variant, and FERRY_SIGNALS_COPY or FERRY_SIGNALS_KERNEL. */
FERRY_API ferry_result_t ferry_comm_choose(ferry_comm_t comm, ferry_op_t op, size_t bytes_per_rank, ferry_algo_t* algo,
                                           ferry_signals_t* signals);

/* Returns the first asynchronous error (a peer that timed out), or FERRY_SUCCESS. */
FERRY_API ferry_result_t ferry_comm_check(ferry_comm_t comm);
/* Waits, bounded by the communicator's timeout, until every collective enqueued
 * so far has finished; returns its asynchronous error if any. Returns
 * FERRY_ERROR_INVALID_ARGUMENT at once while a prepared collective is armed and
 * not triggered (so do ferry_comm_free and ferry_comm_deregister, also for a
 * prepared transfer or another communicator's collective: freeing waits for
 * every stream of the GPU). */
FERRY_API ferry_result_t ferry_comm_synchronize(ferry_comm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_H_ */
