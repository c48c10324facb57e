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
 *     not seen here (DESIGN.md section 3): CUPTI is the way to see those.
 *
 * Rules: no CUDA headers are needed to build (the few types are declared below, pinned to the CUDA 13
 * cuda_runtime_api.h / driver_types.h); every intercepted symbol is listed once in UVMSHIM_HOOKS; the real
 * functions are found with dlsym(RTLD_NEXT) and, when libcudart was dlopen'ed RTLD_LOCAL by a Python
 * extension (so RTLD_NEXT cannot see it), through dlopen(RTLD_NOLOAD) of the already loaded library; a hook
 * never aborts: a missing symbol is logged once and answered with an error code.
 *
 * Environment (all optional):
 *   UVMPREFETCH_SHIM_MANAGED  1 (default) redirect to managed memory, 0 only forward and record
 *   UVMPREFETCH_SHIM_LIMIT    most managed bytes to hand out (default: device free memory at the first
 *                             allocation minus a 5 % reserve: never allocate more managed memory than the
 *                             card has free, DESIGN.md section 5)
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
#include <time.h>

#define UVMSHIM_ABI 1

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
      (config, func, args))

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
static size_t g_limit_env = 0;

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
    s = getenv("UVMPREFETCH_SHIM_LIMIT");
    if (s && *s)
        g_limit_env = (size_t)strtoull(s, NULL, 10);
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

/* ---- statistics ---- */
static atomic_ullong g_managed_bytes, g_peak_bytes, g_n_alloc, g_n_free, g_n_refused, g_n_errors, g_limit;

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

/* ---- the hooks ---- */
static size_t current_limit(void) {
    size_t lim = (size_t)atomic_load(&g_limit);
    if (lim)
        return lim;
    if (g_limit_env) {
        lim = g_limit_env;
    } else {
        size_t free_b = 0, total_b = 0;
        if (real_cudaMemGetInfo && real_cudaMemGetInfo(&free_b, &total_b) == cudaSuccess && free_b) {
            lim = free_b - free_b / 20; /* keep 5 % of what is free for the context, cuBLAS, other users */
        } else {
            log_once(1, "cudaMemGetInfo failed: managed allocations are not capped");
            lim = SIZE_MAX;
        }
    }
    unsigned long long expected = 0;
    atomic_compare_exchange_strong(&g_limit, &expected, (unsigned long long)lim);
    return (size_t)atomic_load(&g_limit);
}

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

cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args, size_t sharedMem,
                             cudaStream_t stream) {
    ensure();
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
    if (!real_cudaLaunchKernelExC) {
        log_once(0, "libcudart not found (set UVMPREFETCH_CUDART): cudaLaunchKernelExC fails");
        return cudaErrorUnknown;
    }
    cudaError_t err = real_cudaLaunchKernelExC(config, func, args);
    if (config)
        ring_push(func, config->gridDim, config->blockDim, config->dynamicSmemBytes, config->stream, err);
    return err;
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
