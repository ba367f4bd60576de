/* ferry: the symmetric heap (C API).
 *
 * A heap over a communicator's ranks: the same allocations, made in the same
 * order on every rank, sit at the same offset of each rank's heap, so a
 * kernel finds a peer's copy of an object by arithmetic (the device API in
 * ferry/device/*.cuh, which takes the handle ferry_heap_handle writes).
 *
 *   ferry_heap_t heap;
 *   ferry_heap_create(comm, 0, &heap);                       // collective
 *   void* x[1];                                              // one per local rank
 *   ferry_heap_alloc(heap, bytes, 256, stream, x);           // collective
 *   ferry::device::Heap h;                                   // include/ferry/device/heap.cuh
 *   ferry_heap_handle(heap, 0, &h, sizeof h);
 *   my_kernel<<<g, b, 0, stream>>>(h, (float*)x[0]);          // by value
 *   ferry_heap_check(heap);                                  // a wait that gave up, named
 *   ferry_heap_free(heap, x[0]);                             // collective
 *   ferry_heap_destroy(heap);
 *
 * Every call returns FERRY_SUCCESS or an error code with ferry_last_error();
 * a full heap is FERRY_ERROR_OUT_OF_MEMORY, ranks that made different calls
 * get FERRY_ERROR_INVALID_ARGUMENT naming the stray rank. See docs/symm.md.
 */
#ifndef FERRY_SYMM_H_
#define FERRY_SYMM_H_

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ferry_heap* ferry_heap_t;

/* Collective over the communicator's ranks. capacity: bytes of each rank's
 * heap (0: FERRY_SYMM_HEAP_BYTES); address space, physical memory is mapped
 * as allocations need it. The heap may outlive the communicator: it keeps
 * the descriptor exchange its collective calls (alloc, free, register) use.
 * With ferry_comm_init, those calls also use the config's allgather function
 * and allgather_ctx, which must stay valid while the heap is used.
 * FERRY_ERROR_INVALID_ARGUMENT, naming it, while a prepared transfer or
 * collective is armed and not yet triggered (setting up waits for every
 * stream of the GPU). */
FERRY_API ferry_result_t ferry_heap_create(ferry_comm_t comm, size_t capacity, ferry_heap_t* heap);
/* Unmaps this process's view (not collective); NULL is ignored. While a
 * prepared transfer or collective is armed and not yet triggered, later, once
 * none is (unmapping waits for every stream of the GPU). */
FERRY_API void ferry_heap_destroy(ferry_heap_t heap);

/* Collective: `bytes` aligned to `align` (a power of two) at the same offset on
 * every rank; ptrs[i] receives local rank i's copy (one entry per local rank).
 * `stream`: the caller's (local rank 0's); while it captures a CUDA graph, an
 * allocation that needs new memory is refused with the size to reserve first. */
FERRY_API ferry_result_t ferry_heap_alloc(ferry_heap_t heap, size_t bytes, size_t align, ferry_stream_t stream,
                                          void** ptrs);
/* Collective: frees the allocation `ptr` (any local rank's copy) starts. */
FERRY_API ferry_result_t ferry_heap_free(ferry_heap_t heap, const void* ptr);
/* Collective: maps memory under the first `bytes` of the heap. */
FERRY_API ferry_result_t ferry_heap_reserve(ferry_heap_t heap, size_t bytes);
/* Collective: maps each local rank's existing buffer buffers[i] of `bytes`
 * into the heap at the same offset on every rank; ptrs[i] receives local rank
 * i's heap address of it (the same memory). The memory must come from CUDA's
 * virtual memory management (cuMemCreate; with one process per rank, made
 * exportable as a POSIX file descriptor) and start at the same offset within
 * its granule on every rank; memory from cudaMalloc is refused
 * (FERRY_ERROR_INVALID_ARGUMENT). The heap holds it until deregistered. */
FERRY_API ferry_result_t ferry_heap_register(ferry_heap_t heap, void* const* buffers, size_t bytes,
                                             ferry_stream_t stream, void** ptrs);
/* Collective: unmaps the registered buffer at `ptr` (what ferry_heap_register
 * wrote); work that uses it must be finished. The owner's mapping stays. */
FERRY_API ferry_result_t ferry_heap_deregister(ferry_heap_t heap, const void* ptr);

/* Writes local rank `local`'s ferry::device::Heap into `handle`; `size` must be
 * at least ferry_heap_handle_size(). */
FERRY_API ferry_result_t ferry_heap_handle(ferry_heap_t heap, int local, void* handle, size_t size);
FERRY_API size_t ferry_heap_handle_size(void);
/* FERRY_ERROR_TIMEOUT naming the rank a bounded wait of the device API or a
 * stream wait gave up on; FERRY_SUCCESS when none did. */
FERRY_API ferry_result_t ferry_heap_check(ferry_heap_t heap);
/* Bytes per rank: the capacity, in live allocations, mapped. Any pointer may be NULL. */
FERRY_API ferry_result_t ferry_heap_sizes(ferry_heap_t heap, size_t* capacity, size_t* used, size_t* mapped);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_SYMM_H_ */
