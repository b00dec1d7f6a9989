// The CPU emulator's scheduler (see include/cuda_emu.h): coroutines for the
// threads of one block, switched by a few lines of x86-64 assembly, with
// block and warp barriers and the shuffle exchange.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <set>
#include <utility>
#include <vector>

#include "cuda_emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator switches stacks with x86-64 assembly"
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

// emu_switch(save, to): saves the callee-saved registers and the stack
// pointer into *save, then resumes the context whose stack pointer is `to`.
extern "C" void emu_switch(void **save, void *to);
asm(R"(
    .pushsection .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
    .popsection
)");

namespace {

enum state_t { READY, WAIT_BLOCK, WAIT_WARP, DONE };

constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 4096;
constexpr size_t kMaxDynamicSmem = 227 * 1024; // sm_90's opt-in maximum
constexpr size_t kDefaultSmem = 48 * 1024;

struct thread_t {
    void *sp;
    char *stack; // lowest usable byte (a guard page lies below)
    state_t state;
    uint3 tid;
    int linear;
    unsigned shfl_count;
    void *fake_stack; // ASan's bookkeeping while switched out
};

struct emu_t {
    std::vector<thread_t> th;
    std::vector<char *> stacks;
    void *sched_sp = nullptr;
    thread_t *cur = nullptr;
    void (*body)(void *) = nullptr;
    void *ctx = nullptr;
    std::vector<unsigned char> smem;
    std::vector<uint64_t> shfl_val;     // [warp][2 phases][32 lanes]
    std::vector<unsigned> shfl_stamp;   // which shuffle wrote each slot
    std::set<std::pair<const void *, size_t>> optin;
    const void *sched_stack_bottom = nullptr; // ASan: the scheduler's own stack
    size_t sched_stack_size = 0;
    bool in_kernel = false;
};

emu_t E;

[[noreturn]] void emu_fail(const char *fmt, const char *what = "", long a = 0, long b = 0) {
    fprintf(stderr, "CUDA emulator: ");
    fprintf(stderr, fmt, what, a, b);
    fprintf(stderr, " (block %u,%u,%u)\n", blockIdx.x, blockIdx.y, blockIdx.z);
    abort();
}

char *new_stack() {
    void *p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) emu_fail("%scannot map a thread stack", "");
    mprotect(p, kGuardBytes, PROT_NONE); // overflow faults instead of corrupting
    return static_cast<char *>(p) + kGuardBytes;
}

// Switching out of the running thread to the scheduler.
void to_scheduler(thread_t *t, bool finished) {
#if EMU_ASAN
    __sanitizer_start_switch_fiber(finished ? nullptr : &t->fake_stack, E.sched_stack_bottom,
                                   E.sched_stack_size);
#else
    (void)finished;
#endif
    emu_switch(&t->sp, E.sched_sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(t->fake_stack, nullptr, nullptr);
#endif
}

void yield(state_t s) {
    thread_t *t = E.cur;
    t->state = s;
    to_scheduler(t, false);
}

__attribute__((no_sanitize_address)) void trampoline() {
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &E.sched_stack_bottom, &E.sched_stack_size);
#endif
    E.body(E.ctx);
    thread_t *t = E.cur;
    t->state = DONE;
    to_scheduler(t, true);
    __builtin_unreachable();
}

void resume(thread_t *t) {
    E.cur = t;
    threadIdx = t->tid;
#if EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, t->stack, kStackBytes);
#endif
    emu_switch(&E.sched_sp, t->sp);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void start(thread_t *t) {
    // No ASan unpoisoning needed when a stack is reused: a thread's previous
    // life ended with every instrumented frame returned (the trampoline's
    // frame is not instrumented), which leaves the stack unpoisoned.
    // Entered as if called: after the 6 register pops and `ret`, rsp is
    // 8 mod 16, the ABI's state at a function's first instruction.
    uintptr_t top = (reinterpret_cast<uintptr_t>(t->stack) + kStackBytes) & ~uintptr_t(15);
    void **sp = reinterpret_cast<void **>(top);
    *--sp = nullptr;                                   // trampoline's return address (never used)
    *--sp = reinterpret_cast<void *>(&trampoline);      // popped by `ret`
    for (int i = 0; i < 6; i++) *--sp = nullptr;        // rbp rbx r12 r13 r14 r15
    t->sp = sp;
    t->state = READY;
    t->shfl_count = 0;
    t->fake_stack = nullptr;
}

void run_block(bool reverse) {
    const int n = (int)E.th.size();
    const int nwarps = (n + 31) / 32;
    for (int i = 0; i < n; i++) start(&E.th[i]);
    int live = n;
    while (live > 0) {
        for (int k = 0; k < n; k++) {
            thread_t *t = &E.th[reverse ? n - 1 - k : k];
            if (t->state != READY) continue;
            resume(t);
            if (t->state == DONE) live--;
        }
        if (live == 0) break;
        // Release every warp whose live lanes all wait at a warp barrier.
        bool released = false;
        for (int w = 0; w < nwarps; w++) {
            int waiting = 0, at_block = 0, alive = 0;
            for (int l = w * 32; l < n && l < w * 32 + 32; l++) {
                const state_t s = E.th[l].state;
                if (s == DONE) continue;
                alive++;
                waiting += s == WAIT_WARP;
                at_block += s == WAIT_BLOCK;
            }
            if (waiting && at_block)
                emu_fail("%swarp %ld: some lanes wait at __syncthreads, %ld at a shuffle/__syncwarp "
                         "(deadlock on a GPU)", "", w, waiting);
            if (waiting && waiting == alive) {
                for (int l = w * 32; l < n && l < w * 32 + 32; l++)
                    if (E.th[l].state == WAIT_WARP) E.th[l].state = READY;
                released = true;
            }
        }
        if (released) continue;
        // Otherwise every live thread waits at __syncthreads: release them.
        for (int i = 0; i < n; i++)
            if (E.th[i].state == WAIT_BLOCK) E.th[i].state = READY;
    }
}

} // namespace

void __syncthreads(void) { yield(WAIT_BLOCK); }
void __syncwarp(unsigned) { yield(WAIT_WARP); }

int emu_lane(void) { return E.cur->linear & 31; }

const void *emu_shfl_exchange(const void *v, size_t size, int src) {
    thread_t *t = E.cur;
    const int warp = t->linear / 32, lane = t->linear & 31;
    const size_t base = ((size_t)warp * 2 + (t->shfl_count & 1)) * 32;
    memcpy(&E.shfl_val[base + lane], v, size);
    E.shfl_stamp[base + lane] = t->shfl_count;
    yield(WAIT_WARP);
    const int src_linear = warp * 32 + src;
    if (src_linear >= (int)E.th.size() || E.shfl_stamp[base + src] != t->shfl_count)
        emu_fail("%slane %ld reads lane %ld in a shuffle that lane did not take part in", "", lane, src);
    t->shfl_count++;
    return &E.shfl_val[base + src];
}

void *emu_dynamic_smem_ptr(void) { return E.smem.empty() ? nullptr : E.smem.data(); }

void emu_note_smem_optin(const void *kernel, size_t bytes) { E.optin.insert({kernel, bytes}); }

void emu_run(const emu_cfg &c, void (*body)(void *), void *ctx) {
    if (E.in_kernel) emu_fail("%sa kernel launched another kernel");
    const size_t threads = (size_t)c.block.x * c.block.y * c.block.z;
    if (c.grid.x == 0 || c.grid.y == 0 || c.grid.z == 0)
        emu_fail("%sinvalid configuration: empty grid (%ld x %ld x ...)", "", c.grid.x, c.grid.y);
    if (c.grid.y > 65535 || c.grid.z > 65535 || c.grid.x > 0x7fffffffu)
        emu_fail("%sinvalid configuration: grid %ld x %ld", "", c.grid.x, c.grid.y);
    if (threads == 0 || threads > 1024 || c.block.z > 64)
        emu_fail("%sinvalid configuration: %ld threads per block", "", (long)threads);
    if (c.smem > kMaxDynamicSmem)
        emu_fail("%s%ld bytes of dynamic shared memory exceed the device maximum %ld", "", (long)c.smem,
                 (long)kMaxDynamicSmem);
    if (c.smem > kDefaultSmem) {
        bool ok = false;
        for (const auto &o : E.optin) ok |= o.first == c.kernel && o.second >= c.smem;
        if (!ok)
            emu_fail("%s%ld bytes of dynamic shared memory without cudaFuncSetAttribute opt-in "
                     "(launch fails on a GPU)", "", (long)c.smem);
    }
    E.th.resize(threads);
    while (E.stacks.size() < threads) E.stacks.push_back(new_stack());
    E.shfl_val.assign(((threads + 31) / 32) * 64, 0);
    E.shfl_stamp.assign(((threads + 31) / 32) * 64, ~0u);
    for (size_t i = 0; i < threads; i++) {
        thread_t &t = E.th[i];
        t.stack = E.stacks[i];
        t.linear = (int)i;
        t.tid = uint3{(unsigned)(i % c.block.x), (unsigned)((i / c.block.x) % c.block.y),
                      (unsigned)(i / ((size_t)c.block.x * c.block.y))};
    }
    E.body = body;
    E.ctx = ctx;
    blockDim = c.block;
    gridDim = c.grid;
    E.in_kernel = true;
    for (unsigned z = 0; z < c.grid.z; z++)
        for (unsigned y = 0; y < c.grid.y; y++)
            for (unsigned x = 0; x < c.grid.x; x++) {
                blockIdx = uint3{x, y, z};
                E.smem.assign(c.smem, 0xFF);
                run_block(((x + y + z) & 1) != 0);
            }
    E.in_kernel = false;
}
