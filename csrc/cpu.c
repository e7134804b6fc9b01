/*
 * cpu.c — probe the CPU once (CPUID + XGETBV, and on Linux ask for AMX tile state), pick the ISA
 * level, fill the kernel table. Generic entries first, then each level up to the one in effect
 * overrides what it implements, so every entry always has a kernel.
 */
#include "llmrt/amx.h"
#include "llmrt/llmrt.h"
#include "llmrt/gemm.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define LLMRT_X86 1
#endif

#if defined(__linux__) && defined(LLMRT_X86)
#include <sys/syscall.h>
#include <unistd.h>
#define ARCH_GET_XCOMP_PERM 0x1022
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#endif

static llmrt_cpu_features features;
static int features_probed = 0;
static int isa_current = -1;
static int isa_emulated = 0;
static llmrt_kernel_table kernel_table;

static const char *isa_names[LLMRT_ISA_COUNT] = { "generic", "avx2", "avx512", "avx512_vnni", "amx" };

const char *llmrt_isa_name(int level) {
    if (level < 0 || level >= LLMRT_ISA_COUNT) return "unknown";
    return isa_names[level];
}

int llmrt_isa_from_name(const char *name) {
    if (name == NULL) return -1;
    for (int i = 0; i < LLMRT_ISA_COUNT; i++) {
        if (strcasecmp(name, isa_names[i]) == 0) return i;
    }
    return -1;
}

#ifdef LLMRT_X86
static uint64_t read_xcr0(void) {
    uint32_t eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((uint64_t)edx << 32) | eax;
}

static int request_amx_permission(void) {
#if defined(__linux__)
    /* Linux >= 5.16 requires each process to ask for the AMX tile data state. A refusal (old
     * kernel, seccomp, hypervisor) means "no AMX". */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    unsigned long bitmask = 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &bitmask) != 0) return 0;
    return (bitmask & (1ul << XFEATURE_XTILEDATA)) != 0;
#else
    return 0;
#endif
}
#endif

static void probe(void) {
    memset(&features, 0, sizeof(features));
#ifdef LLMRT_X86
    unsigned int eax, ebx, ecx, edx;
    unsigned int max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf >= 1) {
        __cpuid_count(1, 0, eax, ebx, ecx, edx);
        features.sse3 = (ecx >> 0) & 1;
        features.ssse3 = (ecx >> 9) & 1;
        features.fma = (ecx >> 12) & 1;
        int osxsave = (ecx >> 27) & 1;
        features.avx = (ecx >> 28) & 1;
        features.f16c = (ecx >> 29) & 1;
        if (osxsave) {
            uint64_t xcr0 = read_xcr0();
            features.os_avx = (xcr0 & 0x6) == 0x6;            /* XMM | YMM */
            features.os_avx512 = (xcr0 & 0xe6) == 0xe6;       /* + opmask, ZMM_Hi256, Hi16_ZMM */
            features.os_amx = (xcr0 & 0x60000) == 0x60000;    /* XTILECFG | XTILEDATA */
        }
    }
    if (max_leaf >= 7) {
        __cpuid_count(7, 0, eax, ebx, ecx, edx);
        const unsigned int max_sub = eax;
        features.avx2 = (ebx >> 5) & 1;
        features.avx512f = (ebx >> 16) & 1;
        features.avx512dq = (ebx >> 17) & 1;
        features.avx512cd = (ebx >> 28) & 1;
        features.avx512bw = (ebx >> 30) & 1;
        features.avx512vl = (ebx >> 31) & 1;
        features.avx512_vnni = (ecx >> 11) & 1;
        features.amx_bf16 = (edx >> 22) & 1;
        features.amx_tile = (edx >> 24) & 1;
        features.amx_int8 = (edx >> 25) & 1;
        if (max_sub >= 1) {
            __cpuid_count(7, 1, eax, ebx, ecx, edx);
            features.avx_vnni = (eax >> 4) & 1;
            features.avx512_bf16 = (eax >> 5) & 1;
        }
    }
    if (!features.os_avx) {
        features.avx = features.avx2 = features.fma = features.f16c = 0;
        features.avx_vnni = 0;
    }
    if (!features.os_avx512) {
        features.avx512f = features.avx512bw = features.avx512vl = features.avx512dq = 0;
        features.avx512cd = features.avx512_vnni = features.avx512_bf16 = 0;
    }
    if (features.amx_tile && features.os_amx) {
        features.amx_granted = request_amx_permission();
    }
#endif
    features_probed = 1;
}

const llmrt_cpu_features *llmrt_cpu_features_get(void) {
    if (!features_probed) probe();
    return &features;
}

int llmrt_isa_max_supported(void) {
    const llmrt_cpu_features *f = llmrt_cpu_features_get();
    int level = LLMRT_ISA_GENERIC;
    if (f->avx2 && f->fma && f->f16c) level = LLMRT_ISA_AVX2; else return level;
    if (f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq) level = LLMRT_ISA_AVX512; else return level;
    if (f->avx512_vnni) level = LLMRT_ISA_AVX512_VNNI; else return level;
    if (f->amx_tile && f->amx_int8 && f->amx_granted) level = LLMRT_ISA_AMX;
    return level;
}

int llmrt_set_isa(int level) {
    const int max_level = llmrt_isa_max_supported();
    if (level < 0) level = 0;
    if (level > max_level) level = max_level;
    llmrt_kernel_table kt;
    memset(&kt, 0, sizeof(kt));
    llmrt_register_kernels_generic(&kt);
    llmrt_register_dot_kernels_generic(&kt);
    llmrt_register_gemm_kernels_generic(&kt);
    llmrt_register_gemm_k_kernels_generic(&kt);
    llmrt_register_attn_kernels_generic(&kt);
    llmrt_register_wq_kernels_generic(&kt);
    if (level >= LLMRT_ISA_AVX2) {
        llmrt_register_kernels_avx2(&kt);
        llmrt_register_dot_kernels_avx2(&kt);
        llmrt_register_gemm_kernels_avx2(&kt);
        llmrt_register_gemm_k_kernels_avx2(&kt);
        llmrt_register_attn_kernels_avx2(&kt);
        llmrt_register_wq_kernels_avx2(&kt);
    }
    if (level >= LLMRT_ISA_AVX512) {
        llmrt_register_kernels_avx512(&kt);
        llmrt_register_gemm_f_kernels_avx512(&kt);
        if (llmrt_cpu_features_get()->avx512_bf16) {
            llmrt_register_gemm_f_bf16_kernels_avx512(&kt);
            llmrt_register_wq_bf16_kernels_avx512(&kt);
        }
    }
    if (level >= LLMRT_ISA_AVX512_VNNI) {
        llmrt_register_kernels_avx512_vnni(&kt);
        llmrt_register_gemm_kq_kernels_avx512_vnni(&kt);
        llmrt_register_gemm_q32_kernels_avx512_vnni(&kt);
    }
    if (level >= LLMRT_ISA_AMX) llmrt_register_kernels_amx(&kt);
    /* prefill matmuls on AMX tiles at the amx level (a forced software model stays on) */
    if (level >= LLMRT_ISA_AMX) llmrt_amx_set_matmul(LLMRT_AMX_HW);
    else if (llmrt_amx_matmul() == LLMRT_AMX_HW) llmrt_amx_set_matmul(-1);
    kernel_table = kt;
    isa_current = level;
    isa_emulated = 0;
    return level;
}

int llmrt_set_isa_emulated(int level, int bf16) {
    if (level != LLMRT_ISA_AVX512 && level != LLMRT_ISA_AVX512_VNNI) return LLMRT_EUNSUPPORTED;
    if (llmrt_isa_max_supported() < LLMRT_ISA_AVX2) return LLMRT_EUNSUPPORTED;
    llmrt_kernel_table kt;
    memset(&kt, 0, sizeof(kt));
    llmrt_register_kernels_generic(&kt);
    llmrt_register_dot_kernels_generic(&kt);
    llmrt_register_gemm_kernels_generic(&kt);
    llmrt_register_gemm_k_kernels_generic(&kt);
    llmrt_register_attn_kernels_generic(&kt);
    llmrt_register_wq_kernels_generic(&kt);
    llmrt_register_kernels_avx2(&kt);
    llmrt_register_dot_kernels_avx2(&kt);
    llmrt_register_gemm_kernels_avx2(&kt);
    llmrt_register_gemm_k_kernels_avx2(&kt);
    llmrt_register_attn_kernels_avx2(&kt);
    llmrt_register_wq_kernels_avx2(&kt);
    llmrt_register_kernels_emu512(&kt, level, bf16 != 0);
    if (llmrt_amx_matmul() == LLMRT_AMX_HW) llmrt_amx_set_matmul(-1);
    kernel_table = kt;
    isa_current = level;
    isa_emulated = 1;
    return level;
}

int llmrt_isa_emulated(void) {
    return isa_emulated;
}

int llmrt_cpu_init(int *capped_from, int *bad_env) {
    if (capped_from) *capped_from = -1;
    if (bad_env) *bad_env = 0;
    const int max_level = llmrt_isa_max_supported();
    int want = max_level;
    const char *env = getenv("LLMRT_ISA");
    if (env != NULL && env[0] != '\0') {
        int parsed = llmrt_isa_from_name(env);
        if (parsed < 0) {
            if (bad_env) *bad_env = 1;
        } else {
            want = parsed;
            if (want > max_level && capped_from) *capped_from = want;
        }
    }
    return llmrt_set_isa(want);
}

int llmrt_isa_current(void) {
    if (isa_current < 0) llmrt_cpu_init(NULL, NULL);
    return isa_current;
}

const llmrt_kernel_table *llmrt_kernels(void) {
    if (isa_current < 0) llmrt_cpu_init(NULL, NULL);
    return &kernel_table;
}
