/*
 * uvmshim: the LD_PRELOAD shim of uvmprefetch.
 *
 *   LD_PRELOAD=$(uvmprefetch shim-path) ./any_cuda_program
 *
 * Interposes the CUDA runtime (libcudart.so.13, dynamically linked by PyTorch's CUDA wheels) so that
 *   - every cudaMalloc becomes cudaMallocManaged (+ optional advice): PyTorch's caching allocator keeps
 *     working on top, its segments are simply managed memory now;
 *   - cudaFree is forwarded (it frees managed memory too) and the shim's byte count goes down;
 *   - every cudaLaunchKernel / cudaLaunchKernelExC it sees is recorded in a lock-free ring that the Python
 *     side reads through ctypes (uvmshim_ring_read). cuBLAS/cuDNN launch through driver entry points and are
 *     not seen here (docs/design.md §3): CUPTI is the way to see those;
 *   - while the copy path holds host mirrors, a launch outside every observed op and any cudaGraphLaunch call
 *     back into the runtime before they are forwarded (runtime/copyout.py).
 *
 * Rules: no CUDA headers are needed to build (the few types are declared below, pinned to the CUDA 13
 * cuda_runtime_api.h / driver_types.h); every intercepted symbol is listed once in UVMSHIM_HOOKS; the real
 * functions are found with dlsym(RTLD_NEXT) and, when libcudart was dlopen'ed RTLD_LOCAL by a Python
 * extension (so RTLD_NEXT cannot see it), through dlopen(RTLD_NOLOAD) of the already loaded library; a hook
 * never aborts: a missing symbol is logged once and answered with an error code.
 *
 * Environment (all optional):
 *   UVMPREFETCH_SHIM_MANAGED  1 (default) redirect to managed memory, 0 only forward and record
 *   UVMPREFETCH_MANAGED_LIMIT most managed bytes to hand out, fixed at the first allocation:
 *                             host (default) what host memory can back (see HOST_RESERVE below), or the
 *                             GPU's free memory - 5 % where that is more; gpu-free the GPU's free memory - 5 %
 *                             (no oversubscription: the rule for shared GPUs, docs/design.md §5); or a
 *                             byte count with an optional unit (512MiB, 20GiB, 1.5GB, 3e9). An invalid value
 *                             ends the program at load time with one line and exit code 2.
 *   UVMPREFETCH_SHIM_SYSROOT  folder put in front of /proc and /sys when the shim reads host memory and
 *                             cgroup limits (tests feed it a fake /proc/meminfo and cgroup tree)
 *   UVMPREFETCH_SHIM_ADVICE   none (default), preferred (PreferredLocation = the device), accessed
 *                             (AccessedBy = the device)
 *   UVMPREFETCH_CUDART        library to forward to when RTLD_NEXT finds nothing (default libcudart.so.13)
 *   UVMPREFETCH_LOG           quiet silences the shim; info/debug print a summary at exit
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define UVMSHIM_ABI 2

/* ---- CUDA 13 types (driver_types.h / vector_types.h), declared here so no CUDA install is needed ---- */
typedef int cudaError_t;                 /* enum cudaError */
typedef void *cudaStream_t;              /* struct CUstream_st * */
typedef struct { unsigned int x, y, z; } dim3;
struct cudaMemLocation { int type; int id; };   /* enum cudaMemLocationType type; int id; */
typedef struct {                         /* struct cudaLaunchConfig_st */
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    void *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;

enum {
    cudaSuccess = 0,
    cudaErrorMemoryAllocation = 2,
    cudaErrorUnknown = 999,
    cudaMemAttachGlobal = 0x01,
    cudaMemAdviseSetPreferredLocation = 3,
    cudaMemAdviseSetAccessedBy = 5,
    cudaMemLocationTypeDevice = 1,
};

/* ---- the one list of intercepted symbols: X(name, return type, parameters, arguments) ---- */
#define UVMSHIM_HOOKS(X)                                                                                  \
    X(cudaMalloc, cudaError_t, (void **devPtr, size_t size), (devPtr, size))                              \
    X(cudaFree, cudaError_t, (void *devPtr), (devPtr))                                                    \
    X(cudaLaunchKernel, cudaError_t,                                                                      \
      (const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem, cudaStream_t stream), \
      (func, gridDim, blockDim, args, sharedMem, stream))                                                 \
    X(cudaLaunchKernelExC, cudaError_t, (const cudaLaunchConfig_t *config, const void *func, void **args), \
      (config, func, args))                                                                               \
    X(cudaGraphLaunch, cudaError_t, (void *graphExec, cudaStream_t stream), (graphExec, stream))

/* Functions we call but do not intercept. */
#define UVMSHIM_CALLS(X)                                                                                  \
    X(cudaMallocManaged, cudaError_t, (void **devPtr, size_t size, unsigned int flags))                   \
    X(cudaMemAdvise, cudaError_t, (const void *devPtr, size_t count, int advice, struct cudaMemLocation location)) \
    X(cudaMemGetInfo, cudaError_t, (size_t *free, size_t *total))                                         \
    X(cudaGetDevice, cudaError_t, (int *device))

#define DECLARE_HOOK(name, ret, params, args) typedef ret(*name##_fn) params; static name##_fn real_##name;
#define DECLARE_CALL(name, ret, params) typedef ret(*name##_fn) params; static name##_fn real_##name;
UVMSHIM_HOOKS(DECLARE_HOOK)
UVMSHIM_CALLS(DECLARE_CALL)

/* ---- logging: once per message kind, never abort ---- */
static int g_log_level = 1; /* 0 quiet, 1 warning, 2 info, 3 debug */
static atomic_int g_logged[16];

static void log_once(int kind, const char *fmt, ...) {
    if (g_log_level == 0 || atomic_exchange(&g_logged[kind & 15], 1))
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("uvmprefetch shim: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ---- resolution of the real functions ---- */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static int g_managed = 1;
static int g_advice = 0; /* 0 none, 1 preferred, 2 accessed */

static void *resolve(const char *name) {
    void *f = dlsym(RTLD_NEXT, name);
    if (f)
        return f;
    /* libcudart loaded RTLD_LOCAL (a Python extension's dependency) is invisible to RTLD_NEXT. */
    const char *lib = getenv("UVMPREFETCH_CUDART");
    if (!lib || !*lib)
        lib = "libcudart.so.13";
    void *h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
    if (!h)
        h = dlopen(lib, RTLD_LAZY | RTLD_LOCAL);
    return h ? dlsym(h, name) : NULL;
}

static void init_env(void) {
    const char *s = getenv("UVMPREFETCH_LOG");
    if (s) {
        if (!strcmp(s, "quiet")) g_log_level = 0;
        else if (!strcmp(s, "info")) g_log_level = 2;
        else if (!strcmp(s, "debug")) g_log_level = 3;
    }
    s = getenv("UVMPREFETCH_SHIM_MANAGED");
    if (s && !strcmp(s, "0"))
        g_managed = 0;
    s = getenv("UVMPREFETCH_SHIM_ADVICE");
    if (s && !strcmp(s, "preferred")) g_advice = 1;
    else if (s && !strcmp(s, "accessed")) g_advice = 2;
}

static void init_real(void) {
    init_env();
#define RESOLVE(name, ...) real_##name = (name##_fn)resolve(#name);
    UVMSHIM_HOOKS(RESOLVE)
    UVMSHIM_CALLS(RESOLVE)
#undef RESOLVE
}

/* Called on every hook: cheap after the first time. Resolution is retried while it fails, because a
 * program may call us before libcudart is loaded. */
static void ensure(void) {
    pthread_once(&g_once, init_real);
    if (!real_cudaMalloc || !real_cudaMallocManaged) {
#define RETRY(name, ...) if (!real_##name) real_##name = (name##_fn)resolve(#name);
        UVMSHIM_HOOKS(RETRY)
        UVMSHIM_CALLS(RETRY)
#undef RETRY
    }
}

/* ---- live managed allocations: open-addressing table (allocation calls are rare: the caching
 * allocator sits above us), protected by a mutex ---- */
#define TABLE_SIZE (1u << 16)
static struct { uintptr_t ptr; size_t size; } g_table[TABLE_SIZE];
static pthread_mutex_t g_table_lock = PTHREAD_MUTEX_INITIALIZER;
#define TOMBSTONE ((uintptr_t)1)

static size_t slot_of(uintptr_t p) { return (size_t)((p >> 9) * 0x9E3779B97F4A7C15ull >> 48) & (TABLE_SIZE - 1); }

static int table_put(uintptr_t p, size_t size) {
    pthread_mutex_lock(&g_table_lock);
    size_t i = slot_of(p);
    for (unsigned n = 0; n < TABLE_SIZE; n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        if (g_table[i].ptr == 0 || g_table[i].ptr == TOMBSTONE) {
            g_table[i].ptr = p;
            g_table[i].size = size;
            pthread_mutex_unlock(&g_table_lock);
            return 1;
        }
    }
    pthread_mutex_unlock(&g_table_lock);
    return 0;
}

static size_t table_take(uintptr_t p) {
    pthread_mutex_lock(&g_table_lock);
    size_t i = slot_of(p), size = 0;
    for (unsigned n = 0; n < TABLE_SIZE && g_table[i].ptr != 0; n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        if (g_table[i].ptr == p) {
            size = g_table[i].size;
            g_table[i].ptr = TOMBSTONE;
            break;
        }
    }
    pthread_mutex_unlock(&g_table_lock);
    return size;
}

/* ---- launch ring: multi-producer (any thread that launches), single consumer (Python), lock-free.
 * A producer claims a slot with fetch_add on the head, fills it and publishes it by storing seq = index + 1
 * (release). The reader checks seq before and after copying (seqlock): a slot overwritten meanwhile is
 * counted as dropped, never returned torn. When the reader falls more than RING_SIZE behind, the oldest
 * records are dropped (counted), producers never wait. ---- */
#define RING_SIZE (1u << 15)
struct uvmshim_launch {
    uint64_t index;     /* 0, 1, 2, ... in claim order */
    uint64_t func;      /* kernel function pointer (host stub address) */
    uint64_t stream;
    uint64_t t_ns;      /* CLOCK_MONOTONIC when the launch was issued */
    uint32_t grid[3];
    uint32_t block[3];
    uint64_t shared_mem;
    int32_t  status;    /* what the real launch returned */
    int32_t  _pad;
};
static struct { atomic_ullong seq; struct uvmshim_launch rec; } g_ring[RING_SIZE];
static atomic_ullong g_ring_head, g_ring_dropped;

static void ring_push(const void *func, dim3 g, dim3 b, size_t shm, cudaStream_t stream, cudaError_t st) {
    uint64_t idx = atomic_fetch_add_explicit(&g_ring_head, 1, memory_order_relaxed);
    __typeof__(g_ring[0]) *slot = &g_ring[idx & (RING_SIZE - 1)];
    atomic_store_explicit(&slot->seq, 0, memory_order_relaxed); /* mark "being written" */
    atomic_thread_fence(memory_order_release);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    slot->rec = (struct uvmshim_launch){.index = idx, .func = (uint64_t)(uintptr_t)func,
                                        .stream = (uint64_t)(uintptr_t)stream,
                                        .t_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
                                        .grid = {g.x, g.y, g.z}, .block = {b.x, b.y, b.z},
                                        .shared_mem = shm, .status = st};
    atomic_store_explicit(&slot->seq, idx + 1, memory_order_release);
}

/* ---- the managed-memory limit (UVMPREFETCH_MANAGED_LIMIT) ---- */
enum { LIMIT_INVALID = 0, LIMIT_HOST = 1, LIMIT_GPU_FREE = 2, LIMIT_BYTES = 3 };

/* GPU_RESERVE_DIV: the part of the device's free memory (at the first allocation) that the gpu-free limit
 * keeps back, 1/20: the CUDA context keeps growing after that (lazily loaded kernel modules, cuBLAS/cuDNN
 * handles, NCCL buffers, allocations outside cudaMalloc) and a shared card has other users.
 * uvmprefetch/runtime/memory.py takes the budget's default with the same fraction. */
#define GPU_RESERVE_DIV 20
/* HOST_RESERVE: the host memory the host limit leaves to everything but managed pages, a tenth of what is
 * available and at least 1 GiB. The driver backs a managed page that leaves the GPU with a host page that it
 * keeps until cudaFree (nvidia-uvm's uvm_va_block.c frees a block's CPU chunks only when the block is
 * destroyed; they are kernel memory charged to the cgroup, never swapped or reclaimed), so after some
 * iterations under eviction most of the managed footprint sits in host memory whatever the GPU holds: the
 * device's memory adds nothing the host need not back. Beside those pages the process needs its interpreter,
 * CPU tensors, pinned buffers, DataLoader workers and the page cache, and MemAvailable is read once, at the
 * first allocation, while that use still grows. */
#define HOST_RESERVE_DIV 10
#define HOST_RESERVE_MIN (1ull << 30)
#define V1_UNLIMITED (1ull << 62) /* cgroup v1 writes "no limit" as PAGE_COUNTER_MAX pages (~2^63) */

/* How the limit was chosen (uvmprefetch/runtime/shim.py mirrors it as LimitInfo). */
struct uvmshim_limit {
    uint64_t limit_bytes;    /* the managed bytes handed out at most */
    uint64_t mode;           /* LIMIT_HOST, LIMIT_GPU_FREE or LIMIT_BYTES */
    uint64_t requested;      /* LIMIT_BYTES: the bytes asked for */
    uint64_t device_free, device_total; /* cudaMemGetInfo at the first allocation; 0: unknown */
    uint64_t gpu_cap;        /* device_free - device_free / GPU_RESERVE_DIV */
    uint64_t host_known;     /* 1 when MemAvailable or a cgroup limit was read */
    uint64_t mem_available;  /* /proc/meminfo MemAvailable */
    uint64_t cgroup_room;    /* least (limit - usage) over the process's memory cgroups; UINT64_MAX: none */
    uint64_t cgroup_version; /* 1 or 2: where cgroup_room came from; 0: no limit set */
    uint64_t host_margin;    /* HOST_RESERVE of min(mem_available, cgroup_room) */
    uint64_t host_backed;    /* min(mem_available, cgroup_room) - host_margin; 0 when below */
};

static int g_limit_mode = LIMIT_HOST;
static uint64_t g_limit_bytes;
static struct uvmshim_limit g_plan;
static pthread_once_t g_limit_once = PTHREAD_ONCE_INIT;

/* The unit rules of uvmprefetch/units.py parse_size: [0-9]*.?[0-9]+ with an optional exponent, then an
 * optional unit (B, k/kB, M/MB, G/GB, T/TB powers of 1000; KiB, MiB, GiB, TiB powers of 1024, any case);
 * tests/unit/test_shim.py checks both parsers on the same strings. Returns 0 when `s` is not a size. */
static int parse_size(const char *s, uint64_t *out) {
    static const struct { const char *name; double mult; } units[] = {
        {"", 1}, {"b", 1}, {"k", 1e3}, {"kb", 1e3}, {"m", 1e6}, {"mb", 1e6}, {"g", 1e9}, {"gb", 1e9},
        {"t", 1e12}, {"tb", 1e12}, {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0},
        {"tib", 1099511627776.0}};
    const char *p = s;
    while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
        p++;
    const char *num = p;
    size_t int_digits = 0, frac_digits = 0;
    while (*p >= '0' && *p <= '9')
        p++, int_digits++;
    if (*p == '.') {
        const char *q = p + 1;
        while (*q >= '0' && *q <= '9')
            q++, frac_digits++;
        if (!frac_digits)
            return 0;
        p = q;
    }
    if (!int_digits && !frac_digits)
        return 0;
    if (*p == 'e' || *p == 'E') {
        const char *q = p + 1;
        if (*q == '+' || *q == '-')
            q++;
        if (*q >= '0' && *q <= '9') {
            while (*q >= '0' && *q <= '9')
                q++;
            p = q;
        }
    }
    char numbuf[64];
    if ((size_t)(p - num) >= sizeof numbuf)
        return 0;
    memcpy(numbuf, num, (size_t)(p - num));
    numbuf[p - num] = 0;
    while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
        p++;
    char unit[8];
    size_t n = 0;
    while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z')) {
        if (n + 1 >= sizeof unit)
            return 0;
        unit[n++] = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
        p++;
    }
    unit[n] = 0;
    while (*p == ' ' || (*p >= '\t' && *p <= '\r'))
        p++;
    if (*p)
        return 0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (!strcmp(unit, units[i].name)) {
            double v = strtod(numbuf, NULL) * units[i].mult;
            if (!(v >= 1.0) || v >= 18446744073709551616.0)
                return 0;
            *out = (uint64_t)v;
            return 1;
        }
    }
    return 0;
}

/* "host" (or unset/empty), "gpu-free", or a size: the mode, and the bytes for a size; LIMIT_INVALID else. */
int uvmshim_parse_limit(const char *s, uint64_t *bytes) {
    if (!s)
        return LIMIT_HOST;
    while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || (s[n - 1] >= '\t' && s[n - 1] <= '\r')))
        n--;
    if (n == 0 || (n == 4 && !strncasecmp(s, "host", 4)))
        return LIMIT_HOST;
    if (n == 8 && !strncasecmp(s, "gpu-free", 8))
        return LIMIT_GPU_FREE;
    return parse_size(s, bytes) ? LIMIT_BYTES : LIMIT_INVALID;
}

/* A bad limit is a start-up error, before main (never inside a hook): one line, exit code 2, like
 * uvmprefetch/config.py for Python programs. */
__attribute__((constructor)) static void uvmshim_check_limit(void) {
    const char *old = getenv("UVMPREFETCH_SHIM_LIMIT");
    if (old && *old) {
        fputs("uvmprefetch shim: UVMPREFETCH_SHIM_LIMIT is not read; set UVMPREFETCH_MANAGED_LIMIT instead (host, "
              "gpu-free, or a byte count with an optional unit: 512MiB, 20GiB, 1.5GB, 3e9)\n", stderr);
        _exit(2);
    }
    const char *s = getenv("UVMPREFETCH_MANAGED_LIMIT");
    g_limit_mode = uvmshim_parse_limit(s, &g_limit_bytes);
    if (g_limit_mode == LIMIT_INVALID) {
        fprintf(stderr, "uvmprefetch shim: UVMPREFETCH_MANAGED_LIMIT='%s' is invalid; accepted: host (default), "
                        "gpu-free, or a byte count with an optional unit: 512MiB, 20GiB, 1.5GB, 3e9\n", s);
        _exit(2);
    }
}

/* ---- host memory: /proc/meminfo and the memory cgroups, under $UVMPREFETCH_SHIM_SYSROOT ---- */
static void host_path(char *out, size_t n, const char *path) {
    const char *root = getenv("UVMPREFETCH_SHIM_SYSROOT");
    snprintf(out, n, "%s%s", root ? root : "", path);
}

/* The first number in the file; "max" (cgroup v2: no limit) gives UINT64_MAX. Returns 0 when unreadable. */
static int read_u64(const char *path, uint64_t *v) {
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char buf[64] = {0};
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok)
        return 0;
    if (!strncmp(buf, "max", 3)) {
        *v = UINT64_MAX;
        return 1;
    }
    char *end;
    *v = strtoull(buf, &end, 10);
    return end != buf;
}

/* Call match(line, ctx) on each line of the host file `proc_path` until it returns 1; returns that 1, or 0 when
 * no line matched or the file is unreadable. */
static int scan_lines(const char *proc_path, int (*match)(char *line, void *ctx), void *ctx) {
    char path[4096];
    host_path(path, sizeof path, proc_path);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char *line = NULL;
    size_t cap = 0;
    int found = 0;
    while (!found && getline(&line, &cap, f) > 0)
        found = match(line, ctx);
    free(line);
    fclose(f);
    return found;
}

static int match_mem_available(char *line, void *out) {
    unsigned long long kb;
    if (sscanf(line, "MemAvailable: %llu kB", &kb) != 1)
        return 0;
    *(uint64_t *)out = (uint64_t)kb * 1024;
    return 1;
}

static int has_token(const char *list, const char *tok) {
    size_t n = strlen(tok);
    for (const char *p = list; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (!strncmp(p, tok, n) && (p[n] == ',' || p[n] == 0 || p[n] == '\n'))
            return 1;
    return 0;
}

struct cgroup_where {
    int version;    /* 2: cgroup2; 1: the cgroup hierarchy of the memory controller */
    char mnt[4096]; /* where the hierarchy is mounted (/proc/self/mountinfo) */
    char root[4096]; /* the part of the hierarchy mounted there */
    char self[4096]; /* the process's cgroup in it (/proc/self/cgroup) */
};

/* A /proc/self/mountinfo line: "id parent dev root mountpoint options [optional...] - fstype source superoptions". */
static int match_mount(char *line, void *ctx) {
    struct cgroup_where *w = ctx;
    char r[4096], m[4096], fstype[64], opts[1024];
    const char *dash = strstr(line, " - ");
    if (!dash || sscanf(line, "%*s %*s %*s %4095s %4095s", r, m) != 2 ||
        sscanf(dash + 3, "%63s %*s %1023s", fstype, opts) != 2)
        return 0;
    if (!(w->version == 2 && !strcmp(fstype, "cgroup2")) &&
        !(w->version == 1 && !strcmp(fstype, "cgroup") && has_token(opts, "memory")))
        return 0;
    strcpy(w->mnt, m);
    strcpy(w->root, r);
    return 1;
}

/* A /proc/self/cgroup line: "0::/path" (v2) or "N:controller,...:/path" (v1). */
static int match_self(char *line, void *ctx) {
    struct cgroup_where *w = ctx;
    char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
        return 0;
    *c2 = 0;
    int v2 = !strncmp(line, "0:", 2) && c1[1] == 0;
    if (!((w->version == 2 && v2) || (w->version == 1 && !v2 && has_token(c1 + 1, "memory"))))
        return 0;
    snprintf(w->self, sizeof w->self, "%s", c2 + 1);
    w->self[strcspn(w->self, "\n")] = 0;
    return 1;
}

/* From the process's cgroup up to the mount point: the least (limit - usage) where a limit is set. */
static uint64_t cgroup_walk(const struct cgroup_where *w) {
    char dir[8192], file[8300], base[4096];
    size_t rl = strlen(w->root);
    const char *rel = "";
    if (!strcmp(w->root, "/"))
        rel = w->self;
    else if (!strncmp(w->self, w->root, rl) && (w->self[rl] == '/' || w->self[rl] == 0))
        rel = w->self + rl; /* else the cgroup lies outside the mounted part: the mount point is the nearest */
    host_path(base, sizeof base, w->mnt);
    snprintf(dir, sizeof dir, "%s%s", base, !strcmp(rel, "/") ? "" : rel);
    size_t base_len = strlen(base);
    const char *lim_name = w->version == 2 ? "memory.max" : "memory.limit_in_bytes";
    const char *use_name = w->version == 2 ? "memory.current" : "memory.usage_in_bytes";
    uint64_t room = UINT64_MAX;
    for (;;) {
        uint64_t lim, use = 0;
        snprintf(file, sizeof file, "%s/%s", dir, lim_name);
        if (read_u64(file, &lim) && lim != UINT64_MAX && !(w->version == 1 && lim >= V1_UNLIMITED)) {
            snprintf(file, sizeof file, "%s/%s", dir, use_name);
            if (!read_u64(file, &use))
                use = 0;
            uint64_t r = lim > use ? lim - use : 0;
            if (r < room)
                room = r;
        }
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= base_len || !slash || (size_t)(slash - dir) < base_len)
            break;
        *slash = 0;
    }
    return room;
}

/* The least (limit - usage) over the process's cgroup and its ancestors up to the mount in hierarchy
 * `version`; UINT64_MAX when none sets a limit. */
static uint64_t cgroup_room(int version) {
    struct cgroup_where *w = calloc(1, sizeof *w); /* 12 KiB: off the stack of the allocating thread */
    if (!w)
        return UINT64_MAX;
    w->version = version;
    uint64_t room = UINT64_MAX;
    if (scan_lines("/proc/self/mountinfo", match_mount, w) && scan_lines("/proc/self/cgroup", match_self, w))
        room = cgroup_walk(w);
    free(w);
    return room;
}

/* The limit for `mode` on a device with `dev_free` of `dev_total` bytes free (0: unknown). */
static void plan_limit(uint64_t dev_free, uint64_t dev_total, int mode, uint64_t bytes, struct uvmshim_limit *o) {
    memset(o, 0, sizeof *o);
    o->mode = (uint64_t)mode;
    o->requested = mode == LIMIT_BYTES ? bytes : 0;
    o->device_free = dev_free;
    o->device_total = dev_total;
    o->gpu_cap = dev_free - dev_free / GPU_RESERVE_DIV;
    o->cgroup_room = UINT64_MAX;
    for (int v = 2; v >= 1; v--) {
        uint64_t r = cgroup_room(v);
        if (r < o->cgroup_room) {
            o->cgroup_room = r;
            o->cgroup_version = (uint64_t)v;
        }
    }
    uint64_t avail = UINT64_MAX;
    if (scan_lines("/proc/meminfo", match_mem_available, &o->mem_available))
        avail = o->mem_available;
    if (o->cgroup_room < avail)
        avail = o->cgroup_room;
    if (avail != UINT64_MAX) {
        o->host_known = 1;
        o->host_margin = avail / HOST_RESERVE_DIV > HOST_RESERVE_MIN ? avail / HOST_RESERVE_DIV : HOST_RESERVE_MIN;
        o->host_backed = avail > o->host_margin ? avail - o->host_margin : 0;
    }
    if (mode == LIMIT_BYTES)
        o->limit_bytes = bytes;
    else if (mode == LIMIT_GPU_FREE)
        o->limit_bytes = o->gpu_cap;
    else
        o->limit_bytes = o->gpu_cap > o->host_backed ? o->gpu_cap : o->host_backed;
}

/* What the limit would be on such a device, for `spec` (NULL: the default); 0 when `spec` is invalid.
 * `uvmprefetch doctor` asks this without a CUDA context. */
int uvmshim_plan_limit(uint64_t dev_free, uint64_t dev_total, const char *spec, struct uvmshim_limit *out) {
    uint64_t bytes = 0;
    int mode = uvmshim_parse_limit(spec, &bytes);
    if (mode == LIMIT_INVALID)
        return 0;
    plan_limit(dev_free, dev_total, mode, bytes, out);
    return 1;
}

/* ---- statistics ---- */
static atomic_ullong g_managed_bytes, g_peak_bytes, g_n_alloc, g_n_free, g_n_refused, g_n_errors, g_limit;

static void compute_limit(void) {
    size_t free_b = 0, total_b = 0;
    if (!real_cudaMemGetInfo || real_cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
        log_once(1, "cudaMemGetInfo failed: the managed limit does not count the GPU's memory");
        free_b = total_b = 0;
    }
    plan_limit(free_b, total_b, g_limit_mode, g_limit_bytes, &g_plan);
    if (!g_plan.limit_bytes) {
        log_once(4, "neither the GPU's nor the host's free memory could be read: managed allocations are not capped");
        g_plan.limit_bytes = UINT64_MAX;
    }
    atomic_store(&g_limit, g_plan.limit_bytes);
}

/* Fixed at the first allocation: later ones must not see a limit that moved with the GPU's or host's use. */
static size_t current_limit(void) {
    pthread_once(&g_limit_once, compute_limit);
    uint64_t lim = atomic_load(&g_limit);
    return lim > SIZE_MAX ? SIZE_MAX : (size_t)lim;
}

void uvmshim_limit_info(struct uvmshim_limit *out) {
    ensure();
    current_limit();
    *out = g_plan;
}

/* ---- the hooks ---- */
static void apply_advice(void *p, size_t size) {
    if (!g_advice || !real_cudaMemAdvise || !real_cudaGetDevice)
        return;
    int dev = 0;
    if (real_cudaGetDevice(&dev) != cudaSuccess)
        return;
    struct cudaMemLocation loc = {cudaMemLocationTypeDevice, dev};
    int advice = g_advice == 1 ? cudaMemAdviseSetPreferredLocation : cudaMemAdviseSetAccessedBy;
    if (real_cudaMemAdvise(p, size, advice, loc) != cudaSuccess)
        log_once(2, "cudaMemAdvise failed: allocations stay without advice");
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
    ensure();
    if (!real_cudaMalloc) {
        log_once(0, "libcudart not found (set UVMPREFETCH_CUDART): cudaMalloc fails");
        return cudaErrorUnknown;
    }
    if (!g_managed || size == 0 || !real_cudaMallocManaged)
        return real_cudaMalloc(devPtr, size);
    size_t limit = current_limit();
    unsigned long long now = atomic_fetch_add(&g_managed_bytes, size) + size;
    if (now > limit) {
        /* Refuse like a full GPU: PyTorch frees its cache and retries, then raises a clean OOM. */
        atomic_fetch_sub(&g_managed_bytes, size);
        atomic_fetch_add(&g_n_refused, 1);
        return cudaErrorMemoryAllocation;
    }
    cudaError_t err = real_cudaMallocManaged(devPtr, size, cudaMemAttachGlobal);
    if (err != cudaSuccess) {
        atomic_fetch_sub(&g_managed_bytes, size);
        atomic_fetch_add(&g_n_errors, 1);
        return err; /* passed through: the caller sees the driver's own error */
    }
    if (!table_put((uintptr_t)*devPtr, size))
        log_once(3, "allocation table full: byte counts may drift");
    atomic_fetch_add(&g_n_alloc, 1);
    unsigned long long peak = atomic_load(&g_peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(&g_peak_bytes, &peak, now)) {
    }
    apply_advice(*devPtr, size);
    return cudaSuccess;
}

cudaError_t cudaFree(void *devPtr) {
    ensure();
    if (!real_cudaFree) {
        log_once(0, "libcudart not found (set UVMPREFETCH_CUDART): cudaFree fails");
        return cudaErrorUnknown;
    }
    size_t size = devPtr ? table_take((uintptr_t)devPtr) : 0;
    cudaError_t err = real_cudaFree(devPtr);
    if (size) {
        if (err == cudaSuccess) {
            atomic_fetch_sub(&g_managed_bytes, size);
            atomic_fetch_add(&g_n_free, 1);
        } else {
            table_put((uintptr_t)devPtr, size); /* still allocated as far as the driver is concerned */
            atomic_fetch_add(&g_n_errors, 1);
        }
    }
    return err;
}

/* The copy path (runtime/copyout.py): while a managed range is mirrored on the host and discarded on the GPU, a
 * kernel no observed op launched could read it. `in_op` (the C++ observer's uvmobs_thread_in_op: is this thread
 * inside an op it records?) tells the launches apart; the first launch outside one calls `on_unattributed` (Python:
 * copy every mirror back, switch the path off) before the kernel is queued. Checked only while mirrors exist. */
static int (*_Atomic g_in_op)(void);
static void (*_Atomic g_on_unattributed)(void);
static atomic_int g_mirrors;
static atomic_ullong g_unattributed;

void uvmshim_set_attribution(int (*in_op)(void), void (*on_unattributed)(void)) {
    atomic_store(&g_in_op, in_op);
    atomic_store(&g_on_unattributed, on_unattributed);
}
void uvmshim_set_mirrors(int on) { atomic_store(&g_mirrors, on); }
uint64_t uvmshim_unattributed(void) { return atomic_load(&g_unattributed); }

/* Unknown kernels: launches no op the C++ observer records accounts for (the run report's unknown_kernels_seen).
 * `attribution` is the observer's uvmobs_launch_attribution: 1 while this thread is inside a recorded op, 0 while the
 * observer records ops and this thread is in none, -1 while it records nothing (dormant, stopped, failed: then
 * nothing is counted, every launch would be). Counted on every launch while it is set: one call through the pointer
 * (a thread-local read in the observer) and an atomic add only for an unknown launch. A cudaGraphLaunch counts
 * apart (one replay of kernels captured earlier: no op sees them run). Launches through the driver API (Triton's
 * cuLaunchKernelEx, cuBLAS, cuDNN) never reach these hooks: the counts are a lower bound. */
static int (*_Atomic g_attribution)(void);
static atomic_ullong g_unknown_launches, g_unknown_graphs;

void uvmshim_set_observer(int (*attribution)(void)) { atomic_store(&g_attribution, attribution); }
void uvmshim_unknown_kernels(uint64_t *out) {
    out[0] = atomic_load(&g_unknown_launches);
    out[1] = atomic_load(&g_unknown_graphs);
}

static void count_unknown(int graph) {
    int (*attribution)(void) = atomic_load_explicit(&g_attribution, memory_order_acquire);
    if (attribution == NULL) return;
    int a = attribution();
    if (a == 0 || (graph && a > 0))
        atomic_fetch_add_explicit(graph ? &g_unknown_graphs : &g_unknown_launches, 1, memory_order_relaxed);
}

static void check_attribution(int never_observed) {
    if (!atomic_load_explicit(&g_mirrors, memory_order_relaxed)) return;
    int (*in_op)(void) = atomic_load(&g_in_op);
    if (in_op == NULL || (!never_observed && in_op())) return;
    atomic_fetch_add(&g_unattributed, 1);
    void (*cb)(void) = atomic_load(&g_on_unattributed);
    if (cb != NULL) cb();
}

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream) {
    ensure();
    check_attribution(0);
    count_unknown(0);
    if (!real_cudaLaunchKernel) {
        log_once(0, "libcudart not found (set UVMPREFETCH_CUDART): cudaLaunchKernel fails");
        return cudaErrorUnknown;
    }
    cudaError_t err = real_cudaLaunchKernel(func, gridDim, blockDim, args, sharedMem, stream);
    ring_push(func, gridDim, blockDim, sharedMem, stream, err);
    return err;
}

cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    ensure();
    check_attribution(0);
    count_unknown(0);
    if (!real_cudaLaunchKernelExC) {
        log_once(0, "libcudart not found (set UVMPREFETCH_CUDART): cudaLaunchKernelExC fails");
        return cudaErrorUnknown;
    }
    cudaError_t err = real_cudaLaunchKernelExC(config, func, args);
    if (config)
        ring_push(func, config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream, err);
    return err;
}

/* A CUDA graph's replay runs kernels captured earlier, none of them seen by an op as it runs: with mirrors, never
 * attributed (CUDA graphs and the copy path do not mix). */
cudaError_t cudaGraphLaunch(void *graphExec, cudaStream_t stream) {
    ensure();
    if (!real_cudaGraphLaunch) {
        log_once(0, "libcudart not found (set UVMPREFETCH_CUDART): cudaGraphLaunch fails");
        return cudaErrorUnknown;
    }
    check_attribution(1);
    count_unknown(1);
    return real_cudaGraphLaunch(graphExec, stream);
}

/* ---- the API the Python side reads through ctypes (uvmprefetch/runtime/shim.py mirrors these) ---- */
struct uvmshim_stats {
    uint64_t abi, managed_enabled, managed_bytes, peak_managed_bytes, limit_bytes;
    uint64_t n_alloc, n_free, n_refused, n_errors, n_launches, n_launches_dropped, cudart_found;
};

int uvmshim_abi(void) { return UVMSHIM_ABI; }

void uvmshim_get_stats(struct uvmshim_stats *out) {
    ensure();
    out->abi = UVMSHIM_ABI;
    out->managed_enabled = (uint64_t)g_managed;
    out->managed_bytes = atomic_load(&g_managed_bytes);
    out->peak_managed_bytes = atomic_load(&g_peak_bytes);
    out->limit_bytes = atomic_load(&g_limit);
    out->n_alloc = atomic_load(&g_n_alloc);
    out->n_free = atomic_load(&g_n_free);
    out->n_refused = atomic_load(&g_n_refused);
    out->n_errors = atomic_load(&g_n_errors);
    out->n_launches = atomic_load(&g_ring_head);
    out->n_launches_dropped = atomic_load(&g_ring_dropped);
    out->cudart_found = real_cudaMalloc != NULL;
}

/* Copy up to `max` launch records from *cursor on; advance *cursor. Returns the number copied. */
size_t uvmshim_ring_read(struct uvmshim_launch *out, size_t max, uint64_t *cursor) {
    uint64_t head = atomic_load_explicit(&g_ring_head, memory_order_acquire);
    uint64_t cur = *cursor;
    if (head - cur > RING_SIZE) {
        atomic_fetch_add(&g_ring_dropped, head - cur - RING_SIZE);
        cur = head - RING_SIZE;
    }
    size_t n = 0;
    while (cur < head && n < max) {
        __typeof__(g_ring[0]) *slot = &g_ring[cur & (RING_SIZE - 1)];
        uint64_t s1 = atomic_load_explicit(&slot->seq, memory_order_acquire);
        if (s1 == 0 || s1 < cur + 1)
            break; /* claimed but not yet published: stop, read it next time */
        struct uvmshim_launch rec = slot->rec;
        atomic_thread_fence(memory_order_acquire);
        uint64_t s2 = atomic_load_explicit(&slot->seq, memory_order_relaxed);
        if (s1 != cur + 1 || s2 != s1) {
            atomic_fetch_add(&g_ring_dropped, 1); /* overwritten by a newer launch */
        } else {
            out[n++] = rec;
        }
        cur++;
    }
    *cursor = cur;
    return n;
}

/* Live managed allocations (ptr, size), up to `max`. Returns how many there are in all. */
size_t uvmshim_segments(uint64_t *ptrs, uint64_t *sizes, size_t max) {
    size_t n = 0;
    pthread_mutex_lock(&g_table_lock);
    for (size_t i = 0; i < TABLE_SIZE; i++) {
        if (g_table[i].ptr > TOMBSTONE) {
            if (n < max) {
                ptrs[n] = g_table[i].ptr;
                sizes[n] = g_table[i].size;
            }
            n++;
        }
    }
    pthread_mutex_unlock(&g_table_lock);
    return n;
}

__attribute__((destructor)) static void uvmshim_summary(void) {
    if (g_log_level < 2)
        return;
    fprintf(stderr, "uvmprefetch shim: %llu managed allocations (%llu freed, %llu refused, %llu errors), "
                    "peak %.1f MiB managed, %llu launches seen\n",
            atomic_load(&g_n_alloc), atomic_load(&g_n_free), atomic_load(&g_n_refused), atomic_load(&g_n_errors),
            atomic_load(&g_peak_bytes) / 1048576.0, atomic_load(&g_ring_head));
}
