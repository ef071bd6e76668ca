// tt-serve mock-box trace shim: lets ttnn 0.81.1 capture and replay traces on a *mock* box
// (TT_METAL_MOCK_CLUSTER_DESC_PATH set). Test and plan environments only: scripts/setup-ttnn-venv
// builds it into the ttnn venv (lib/tt-serve-mock-trace.so) and plan/mock.py preloads it into
// the mock child (LD_PRELOAD). It never reaches a host; `tt-serve doctor` fails when it is
// preloaded.
//
// Why 0.81.1 crashes without it (gdb and the disassembly of libtt_metal.so 0.81.1; the source as
// in tt-metal's tt_metal/impl/program/dispatch.cpp and system_memory_manager.cpp):
//
// 1. Capture. Mock mode gives a program no kernel binaries on purpose (finalize_kernel_bins:
//    "Mock devices don't have real binaries", kernel_text_size = 0), so its kernel-binary DRAM
//    buffer is never allocated. assemble_device_commands reads that buffer's address only when
//    the prefetcher cache is used. The eager path turns the cache on only for a nonzero kernel
//    size; the trace-capture path (FDMeshCommandQueue::enqueue_mesh_workload) tests
//    `size <= cache size` alone, true for 0, and calls Buffer::address() on a null Buffer:
//    SIGSEGV on the first op inside begin_trace_capture. Newer tt-metal tests the size != 0.
//    Here: Buffer::address() of a null Buffer is 0 (the command is never executed: mock).
//
// 2. Replay. Under mock, SystemMemoryManager::issue_queue_reserve hands out a thread-local
//    64 KiB scratch array that is not 16-byte aligned; eager command writers get away with it,
//    the trace replay (issue_trace_commands) writes it with aligned non-temporal stores
//    (vmovntdq) and faults. Here: under mock, a misaligned reservation is replaced by a
//    64-byte-aligned scratch buffer (its contents are discarded either way: no card reads them).
//
// What tt-metal then checks that an eager run cannot: each trace's capture (no host reads,
// writes or allocations on the way), its buffers in the real trace region (mesh_trace.cpp:
// "Creating trace buffers of size ... but only ... is allocated for trace region"), replay and
// release. A mock trace carries no kernel-binary commands, so its size is a lower bound of a
// card's: the trace region is still sized on the virtual device.
//
// Both symbols are internal to libtt_metal.so 0.81.1 (exported, called through the PLT); the
// real ones are found with dlopen(RTLD_NOLOAD) because Python loads ttnn RTLD_LOCAL (so
// RTLD_NEXT does not see them). A version other than 0.81.1 may not have them: the shim then
// aborts with their names instead of misbehaving.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define BUFFER_ADDRESS "_ZNK2tt8tt_metal6Buffer7addressEv"
#define ISSUE_QUEUE_RESERVE "_ZN2tt8tt_metal19SystemMemoryManager19issue_queue_reserveEjh"
#define MOCK_ENV "TT_METAL_MOCK_CLUSTER_DESC_PATH"

static void *real_symbol(const char *name, void *self) {
    void *lib = dlopen("libtt_metal.so", RTLD_NOW | RTLD_NOLOAD);
    void *fn = lib ? dlsym(lib, name) : NULL;
    if (!fn || fn == self) {
        fprintf(stderr, "tt-serve mock trace shim: libtt_metal.so has no %s (not ttnn 0.81.1?)\n",
                name);
        abort();
    }
    return fn;
}

uint64_t _ZNK2tt8tt_metal6Buffer7addressEv(const void *self);
uint64_t _ZNK2tt8tt_metal6Buffer7addressEv(const void *self) {
    static uint64_t (*real)(const void *);
    if (!self) return 0;  // the kernel-binary buffer mock mode never allocates
    if (!real) real = real_symbol(BUFFER_ADDRESS, (void *)_ZNK2tt8tt_metal6Buffer7addressEv);
    return real(self);
}

void *_ZN2tt8tt_metal19SystemMemoryManager19issue_queue_reserveEjh(void *self, uint32_t size,
                                                                   uint8_t cq_id);
void *_ZN2tt8tt_metal19SystemMemoryManager19issue_queue_reserveEjh(void *self, uint32_t size,
                                                                   uint8_t cq_id) {
    static void *(*real)(void *, uint32_t, uint8_t);
    static __thread void *scratch;
    static __thread size_t capacity;
    if (!real)
        real = real_symbol(ISSUE_QUEUE_RESERVE,
                           (void *)_ZN2tt8tt_metal19SystemMemoryManager19issue_queue_reserveEjh);
    void *p = real(self, size, cq_id);
    if (((uintptr_t)p & 63) == 0 || !getenv(MOCK_ENV)) return p;
    size_t need = size < 65536 ? 65536 : ((size_t)size + 4095) & ~(size_t)4095;
    if (need > capacity) {
        free(scratch);
        scratch = aligned_alloc(64, need);
        if (!scratch) abort();
        capacity = need;
    }
    return scratch;
}
