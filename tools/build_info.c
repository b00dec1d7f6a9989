/* Build and machine facts for `moetune --version` and the benchmarks' headers.
 *
 * The commit comes from build_commit.c, which a stamped genrule writes from
 * Bazel's stable workspace status (tools/BUILD); everything else is known to
 * the compiler or asked of the CPU at run time. CPU features are read with
 * cpuid rather than from a list of compile flags because the kernels pick
 * their paths at run time: the line says what they will use here. */
#include "tools/build_info.h"

#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

extern const char mt_build_commit_stamp[];

const char *mt_build_commit(void) {
    return mt_build_commit_stamp[0] ? mt_build_commit_stamp : "unknown";
}

#if defined(__SANITIZE_ADDRESS__)
#define MT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MT_ASAN 1
#endif
#endif

const char *mt_build_kind(void) {
#ifdef MT_ASAN
    return "sanitised (ASan+UBSan)";
#else
    return "optimised";
#endif
}

/* moetune links both backends (tools/BUILD: //kernels/backends:all); which
 * one runs is chosen at run time (a CUDA build without a GPU falls back to
 * the CPU). */
const char *mt_build_backends(void) { return "CPU, CUDA"; }

#if defined(__x86_64__) || defined(__i386__)
/* XCR0: which register states the OS saves, without which a feature the CPU
 * has cannot be used (AMX tiles need bits 17 and 18). */
static unsigned long long xcr0(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

/* Appends " name" (no space when first), dropping what does not fit. */
static void add_feature(char *buf, size_t cap, const char *name) {
    size_t n = strlen(buf);
    const size_t need = (n ? 1 : 0) + strlen(name);
    if (n + need + 1 > cap) return;
    if (n) buf[n++] = ' ';
    memcpy(buf + n, name, strlen(name) + 1);
}

void mt_build_cpu_features(char *buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const bool avx512f = __builtin_cpu_supports("avx512f");
    if (__builtin_cpu_supports("avx2")) add_feature(buf, cap, "AVX2");
    if (avx512f) add_feature(buf, cap, "AVX-512F");
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (avx512f && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5))) add_feature(buf, cap, "AVX512_BF16");
    const unsigned long long amx_state = (1ull << 17) | (1ull << 18);
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 22)) && (xcr0() & amx_state) == amx_state)
        add_feature(buf, cap, "AMX-BF16");
#endif
    if (buf[0] == '\0') snprintf(buf, cap, "none");
}

void mt_build_info_line(char *buf, size_t cap) {
    char cpu[128];
    mt_build_cpu_features(cpu, sizeof cpu);
    snprintf(buf, cap, "moetune %s (commit %s, %s; backends %s; CPU features %s)", MT_VERSION,
             mt_build_commit(), mt_build_kind(), mt_build_backends(), cpu);
}

void mt_build_info_print(FILE *f) {
    char line[256];
    mt_build_info_line(line, sizeof line);
    fprintf(f, "%s\n", line);
}
