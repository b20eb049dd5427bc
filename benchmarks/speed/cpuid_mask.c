/* Answers CPUID for one patched library as an AVX2-only CPU would, so ONNX Runtime picks its AVX2 kernels
 * and runs them natively on a CPU that also has AVX-512, VNNI or AMX.
 *
 * benchmarks/speed/avx2_path.py replaces each `cpuid` (0f a2) in a copy of ONNX Runtime's extension with
 * `ud2` (0f 0b), which traps. This library, preloaded, handles the SIGILL: it runs the real CPUID with the
 * trapped thread's EAX and ECX, clears the bits of every extension an AVX2-only CPU lacks, and steps over
 * the two bytes. Only the patched offsets are answered (CPUID_MASK_OFFSETS, hex, comma-separated, relative
 * to the library's load base); any other SIGILL goes to the handler the process installed, or ends it.
 * Used because the kernel here refuses CPUID faulting (arch_prctl(ARCH_SET_CPUID) gives ENODEV).
 */
#define _GNU_SOURCE
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define MAX_OFFSETS 256
static uintptr_t offsets[MAX_OFFSETS];
static int n_offsets;
static char library[256];

#define BIT(n) (1u << (n))

static void mask(uint32_t leaf, uint32_t subleaf, uint32_t *a, uint32_t *b, uint32_t *c, uint32_t *d) {
    if (leaf == 7 && subleaf == 0) {
        /* EBX: AVX512F, DQ, IFMA, PF, ER, CD, BW, VL */
        *b &= ~(BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) | BIT(30) | BIT(31));
        /* ECX: AVX512_VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
        *c &= ~(BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14));
        /* EDX: AVX512_4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16, AMX_TILE, AMX_INT8 */
        *d &= ~(BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) | BIT(25));
    } else if (leaf == 7 && subleaf == 1) {
        /* EAX: AVX_VNNI, AVX512_BF16, AMX_FP16, AVX_IFMA; EDX: AVX_VNNI_INT8, AVX_NE_CONVERT, AMX_COMPLEX,
         * AVX_VNNI_INT16, AVX10 */
        *a &= ~(BIT(4) | BIT(5) | BIT(21) | BIT(23));
        *d &= ~(BIT(4) | BIT(5) | BIT(8) | BIT(10) | BIT(19));
    } else if (leaf == 0x1d || leaf == 0x1e || leaf == 0x24) {
        /* AMX tile and TMUL information, AVX10: absent on an AVX2-only CPU */
        *a = *b = *c = *d = 0;
    }
}

static int patched(uintptr_t ip) {
    Dl_info info;
    if (!dladdr((void *)ip, &info) || !info.dli_fname || !strstr(info.dli_fname, library)) return 0;
    uintptr_t offset = ip - (uintptr_t)info.dli_fbase;
    for (int i = 0; i < n_offsets; i++)
        if (offsets[i] == offset) return 1;
    return 0;
}

/* Read by avx2_path's probe (ctypes): how many CPUIDs were answered here. Zero means the patched copy
 * was not the onnxruntime that ran, whatever the kernels' results looked like. */
volatile int cpuid_mask_hits;

/* A SIGILL handler installed after ours (Python's faulthandler: -X faulthandler, -X dev, pytest) would
 * replace it, and the next patched CPUID would end the process. So sigaction() and signal() for SIGILL
 * are answered here: ours stays installed, theirs is kept and called for any SIGILL that is not ours. */
typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
static sigaction_fn real_sigaction;
static struct sigaction theirs; /* what the process believes is installed; SIG_DFL at first */
static int installed;

static void pass_on(int sig, siginfo_t *si, void *context) {
    if (theirs.sa_flags & SA_SIGINFO) {
        if (theirs.sa_sigaction) {
            theirs.sa_sigaction(sig, si, context);
            return;
        }
    } else if (theirs.sa_handler != SIG_DFL && theirs.sa_handler != SIG_IGN) {
        theirs.sa_handler(sig);
        return;
    }
    /* the default action (an ignored SIGILL from a real fault would only trap again) */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    real_sigaction(sig, &dfl, NULL);
    raise(sig);
}

static void on_sigill(int sig, siginfo_t *si, void *context) {
    ucontext_t *uc = context;
    greg_t *r = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)r[REG_RIP];
    if (si->si_code != ILL_ILLOPN || ip[0] != 0x0f || ip[1] != 0x0b || !patched((uintptr_t)ip)) {
        pass_on(sig, si, context);
        return;
    }
    uint32_t leaf = (uint32_t)r[REG_RAX], subleaf = (uint32_t)r[REG_RCX], a, b, c, d;
    __cpuid_count(leaf, subleaf, a, b, c, d);
    mask(leaf, subleaf, &a, &b, &c, &d);
    /* CPUID writes the low 32 bits and clears the upper 32 of each register */
    r[REG_RAX] = a;
    r[REG_RBX] = b;
    r[REG_RCX] = c;
    r[REG_RDX] = d;
    r[REG_RIP] += 2;
    cpuid_mask_hits++;
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (sig != SIGILL || !installed) return real_sigaction(sig, act, old);
    if (old) *old = theirs;
    if (act) theirs = *act;
    return 0;
}

sighandler_t signal(int sig, sighandler_t handler) {
    static sighandler_t (*real_signal)(int, sighandler_t);
    if (!real_signal) real_signal = (sighandler_t(*)(int, sighandler_t))dlsym(RTLD_NEXT, "signal");
    if (sig != SIGILL || !installed) return real_signal(sig, handler);
    sighandler_t before = theirs.sa_handler; /* shares its storage with sa_sigaction */
    memset(&theirs, 0, sizeof theirs);
    theirs.sa_handler = handler;
    return before;
}

__attribute__((constructor)) static void install(void) {
    const char *list = getenv("CPUID_MASK_OFFSETS"), *name = getenv("CPUID_MASK_LIBRARY");
    if (!list || !name) return;
    strncpy(library, name, sizeof library - 1);
    for (const char *p = list; *p && n_offsets < MAX_OFFSETS;) {
        char *end;
        offsets[n_offsets++] = strtoull(p, &end, 16);
        p = *end == ',' ? end + 1 : end;
        if (end == p && *p) break;
    }
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigill;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    real_sigaction(SIGILL, &sa, &theirs);
    installed = 1;
}
