"""The LD_PRELOAD shim against a fake libcudart (the true boundary), on the CPU.

GIVEN a fake ``libcudart.so.13`` (a tiny C library compiled here that counts calls and fails on request), a
``libuser.so`` linked against it (standing for PyTorch's libc10_cuda) and a small C program that loads
libuser the way Python loads an extension (``dlopen``, RTLD_LOCAL by default),
WHEN the program runs with ``LD_PRELOAD`` = the shim,
THEN device allocations become managed ones, frees are forwarded, launches land in the ring, the fake
library's errors reach the caller unchanged, the managed limit refuses like a full GPU, and nothing aborts.
The fake device's free and total memory come from ``FAKE_FREE_MIB`` / ``FAKE_TOTAL_MIB``; host memory and cgroup
limits come from a fake ``/proc`` and ``/sys`` tree under ``UVMPREFETCH_SHIM_SYSROOT``.
"""

import os
import shutil
import subprocess

import pytest

from uvmprefetch.config import parse_managed_limit
from uvmprefetch.errors import ConfigError
from uvmprefetch.runtime.shim import LimitInfo, Shim, shim_path

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

FAKE_CUDART = r"""
#include <stdlib.h>
#include <stdint.h>
#include <sys/mman.h>
typedef struct { unsigned x, y, z; } dim3;
struct loc { int type; int id; };
typedef struct { dim3 g, b; size_t shm; void *stream; void *attrs; unsigned n; } cfg_t;
int fake_n_malloc, fake_n_managed, fake_n_free, fake_n_advise, fake_n_launch, fake_last_flags;
static void *fake_managed[1024];
int cudaMalloc(void **p, size_t n) { fake_n_malloc++; *p = malloc(n ? n : 1); return 0; }
/* managed memory: address space only (MAP_NORESERVE), so that tests can hand out more than this machine has;
 * the size sits in the page before the pointer for the free */
int cudaMallocManaged(void **p, size_t n, unsigned flags) {
    if (n == 12345) return 2;            /* the driver says: out of memory */
    char *m = mmap(NULL, n + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return 2;
    *(size_t *)m = n;
    for (int i = 0; i < 1024; i++) if (!fake_managed[i]) { fake_managed[i] = m + 4096; break; }
    fake_n_managed++; fake_last_flags = (int)flags; *p = m + 4096; return 0;
}
int cudaFree(void *p) {
    if (p == (void *)0xdead) return 17;  /* cudaErrorInvalidDevicePointer */
    fake_n_free++;
    for (int i = 0; i < 1024; i++)
        if (p && fake_managed[i] == p) {
            char *m = (char *)p - 4096;
            fake_managed[i] = NULL;
            munmap(m, *(size_t *)m + 4096);
            return 0;
        }
    free(p);
    return 0;
}
static size_t mib_env(const char *name, size_t dflt) {
    const char *s = getenv(name);
    return (size_t)(s ? atoll(s) : (long long)dflt) << 20;
}
int cudaMemGetInfo(size_t *f, size_t *t) {
    *f = mib_env("FAKE_FREE_MIB", 64);
    *t = mib_env("FAKE_TOTAL_MIB", 80);
    return 0;
}
int cudaGetDevice(int *d) { *d = 0; return 0; }
int cudaMemAdvise(const void *p, size_t n, int advice, struct loc l) {
    (void)p; (void)n; (void)advice; (void)l; fake_n_advise++; return 0;
}
int cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t s, void *st) {
    (void)g; (void)b; (void)a; (void)s; (void)st; fake_n_launch++; return f ? 0 : 98;
}
int cudaLaunchKernelExC(const cfg_t *c, const void *f, void **a) { (void)c; (void)a; fake_n_launch++; return f ? 0 : 98; }
"""

USER_LIB = r"""
#include <stddef.h>
typedef struct { unsigned x, y, z; } dim3;
int cudaMalloc(void **p, size_t n);
int cudaFree(void *p);
int cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **a, size_t s, void *st);
int user_malloc(void **p, size_t n) { return cudaMalloc(p, n); }
int user_free(void *p) { return cudaFree(p); }
int user_launch(const void *f, void *stream) {
    dim3 g = {2, 1, 1}, b = {128, 1, 1};
    return cudaLaunchKernel(f, g, b, NULL, 0, stream);
}
"""

PROGRAM = r"""
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);
typedef int (*launch_fn)(const void *, void *);
static launch_fn user_launch;
static void *launcher(void *arg) {
    for (int i = 0; i < 1000; i++) user_launch((const void *)0x1234, arg);
    return NULL;
}
int main(int argc, char **argv) {
    const char *mode = argc > 2 ? argv[2] : "local";
    if (!strcmp(mode, "sizes")) {  /* allocate argv[3..] MiB in turn, report each result and the limit */
        void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        malloc_fn um = (malloc_fn)dlsym(h, "user_malloc");
        for (int i = 3; i < argc; i++) {
            void *p = NULL;
            printf("rc%d=%d\n", i - 3, um(&p, (size_t)atoll(argv[i]) << 20));
        }
        uint64_t lim[12];
        ((void (*)(uint64_t *))dlsym(RTLD_DEFAULT, "uvmshim_limit_info"))(lim);
        const char *names[12] = {"limit", "mode", "requested", "device_free", "device_total", "gpu_cap", "host_known",
                                 "mem_available", "cgroup_room", "cgroup_version", "host_margin", "host_backed"};
        for (int i = 0; i < 12; i++) printf("%s=%llu\n", names[i], (unsigned long long)lim[i]);
        return 0;
    }
    if (!strcmp(mode, "none")) {  /* no libcudart anywhere: the shim must answer, not abort */
        malloc_fn m = (malloc_fn)dlsym(RTLD_DEFAULT, "cudaMalloc");
        free_fn f = (free_fn)dlsym(RTLD_DEFAULT, "cudaFree");
        void *p = NULL;
        int mrc = m(&p, 1 << 20);
        printf("malloc_rc=%d\nfree_rc=%d\n", mrc, f(p));
        return 0;
    }
    void *h = dlopen(argv[1], RTLD_NOW | (strcmp(mode, "global") ? RTLD_LOCAL : RTLD_GLOBAL));
    if (!h) { printf("dlopen_error=%s\n", dlerror()); return 3; }
    malloc_fn um = (malloc_fn)dlsym(h, "user_malloc");
    free_fn uf = (free_fn)dlsym(h, "user_free");
    user_launch = (launch_fn)dlsym(h, "user_launch");
    int *n_managed = dlsym(h, "fake_n_managed"), *n_malloc = dlsym(h, "fake_n_malloc");
    int *n_free = dlsym(h, "fake_n_free"), *n_advise = dlsym(h, "fake_n_advise");
    int *flags = dlsym(h, "fake_last_flags");
    void *p = NULL, *q = NULL;
    printf("malloc_rc=%d\n", um(&p, 1 << 20));
    printf("managed_calls=%d\nplain_calls=%d\nflags=%d\nadvise_calls=%d\n", *n_managed, *n_malloc, *flags, *n_advise);
    printf("oom_rc=%d\n", um(&q, 12345));
    printf("over_limit_rc=%d\n", um(&q, (size_t)100 << 20));
    printf("managed_calls_after=%d\n", *n_managed);
    void (*stats)(uint64_t *) = (void (*)(uint64_t *))dlsym(RTLD_DEFAULT, "uvmshim_get_stats");
    uint64_t s[12];
    stats(s);
    printf("managed_bytes=%llu\nrefused=%llu\nerrors=%llu\nlimit=%llu\n", (unsigned long long)s[2],
           (unsigned long long)s[7], (unsigned long long)s[8], (unsigned long long)s[4]);
    int free_rc = uf(p);  /* own statement: argument evaluation order is unspecified */
    printf("free_rc=%d\nfree_calls=%d\n", free_rc, *n_free);
    printf("bad_free_rc=%d\n", uf((void *)0xdead));
    stats(s);
    printf("managed_bytes_after_free=%llu\n", (unsigned long long)s[2]);
    pthread_t t[4];
    for (int i = 0; i < 4; i++) pthread_create(&t[i], NULL, launcher, (void *)(uintptr_t)(0x70 + i));
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    printf("null_launch_rc=%d\n", user_launch(NULL, (void *)0x99));
    /* read the ring the way the Python side does */
    struct rec { uint64_t index, func, stream, t_ns; uint32_t grid[3], block[3]; uint64_t shm; int32_t status, pad; };
    size_t (*ring_read)(struct rec *, size_t, uint64_t *) = (size_t (*)(struct rec *, size_t, uint64_t *))dlsym(RTLD_DEFAULT, "uvmshim_ring_read");
    static struct rec buf[8192];
    uint64_t cursor = 0;
    size_t n = ring_read(buf, 8192, &cursor);
    int ok = 1, per_stream[4] = {0};
    for (size_t i = 0; i + 1 < n; i++) {
        if (buf[i].index != i || buf[i].func != 0x1234 || buf[i].grid[0] != 2 || buf[i].block[0] != 128) ok = 0;
        if (buf[i].stream >= 0x70 && buf[i].stream < 0x74) per_stream[buf[i].stream - 0x70]++;
    }
    printf("ring_n=%zu\nring_ok=%d\nper_stream=%d,%d,%d,%d\nlast_status=%d\n", n, ok, per_stream[0], per_stream[1],
           per_stream[2], per_stream[3], n ? buf[n - 1].status : -1);
    for (int i = 0; i < 40000; i++) user_launch((const void *)0x5678, NULL);
    n = 0;
    size_t got;
    while ((got = ring_read(buf, 8192, &cursor)) > 0) n += got;
    stats(s);
    printf("overflow_read=%zu\ndropped=%llu\nlaunches=%llu\n", n, (unsigned long long)s[10], (unsigned long long)s[9]);
    return 0;
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("shim")
    os.environ["UVMPREFETCH_SHIM_DIR"] = str(d / "cache")
    try:
        shim = shim_path()
    finally:
        del os.environ["UVMPREFETCH_SHIM_DIR"]
    fake = d / "fake"
    fake.mkdir()
    for name, text in (("fake.c", FAKE_CUDART), ("user.c", USER_LIB), ("prog.c", PROGRAM)):
        (d / name).write_text(text)
    cc = lambda *a: subprocess.run(["cc", *a], check=True, capture_output=True)  # noqa: E731
    cc("-shared", "-fPIC", "-o", str(fake / "libcudart.so.13"), "-Wl,-soname,libcudart.so.13", str(d / "fake.c"))
    cc("-shared", "-fPIC", "-o", str(d / "libuser.so"), str(d / "user.c"), str(fake / "libcudart.so.13"))
    cc("-o", str(d / "prog"), str(d / "prog.c"), "-ldl", "-pthread")
    return d, shim


MiB, GiB = 1 << 20, 1 << 30


def fake_root(path, mem_available, files=None):
    """A fake ``/proc`` + ``/sys`` tree: ``MemAvailable`` in bytes, plus ``{relative path: text}``."""
    files = {"proc/meminfo": f"MemTotal:       99999999 kB\nMemAvailable:   {mem_available // 1024} kB\n",
             "proc/self/cgroup": "0::/\n", "proc/self/mountinfo": "", **(files or {})}
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    return str(path)


def start(built, args, **env):
    d, shim = built
    e = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    e.update({"LD_PRELOAD": str(shim), "LD_LIBRARY_PATH": str(d / "fake"), "UVMPREFETCH_LOG": "quiet", **env})
    return subprocess.run([str(d / "prog"), str(d / "libuser.so"), *args], env=e, capture_output=True, text=True,
                          timeout=60)


def run_prog(built, mode, *args, **env):
    r = start(built, [mode, *map(str, args)], **env)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)  # never aborts
    return dict(line.split("=", 1) for line in r.stdout.split())


@pytest.mark.parametrize("mode", ["local", "global"])
def test_allocations_redirected_frees_forwarded_errors_passed(built, mode):
    out = run_prog(built, mode, UVMPREFETCH_MANAGED_LIMIT="32MiB")
    assert out["malloc_rc"] == "0"
    assert out["managed_calls"] == "1" and out["plain_calls"] == "0"  # cudaMalloc -> cudaMallocManaged
    assert out["flags"] == "1"  # cudaMemAttachGlobal
    assert out["advise_calls"] == "0"  # advice is opt-in
    assert out["oom_rc"] == "2"  # the driver's error reaches the caller unchanged
    assert out["over_limit_rc"] == "2" and out["managed_calls_after"] == "1"  # refused before the driver
    assert out["managed_bytes"] == str(1 << 20) and out["refused"] == "1" and out["errors"] == "1"
    assert out["limit"] == str(32 << 20)
    assert out["free_rc"] == "0" and out["free_calls"] == "1"
    assert out["bad_free_rc"] == "17"
    assert out["managed_bytes_after_free"] == "0"


def test_launches_recorded_from_all_threads(built):
    out = run_prog(built, "local")
    assert out["ring_n"] == "4001" and out["ring_ok"] == "1"
    assert out["per_stream"] == "1000,1000,1000,1000"
    assert out["null_launch_rc"] == "98" and out["last_status"] == "98"  # error passed through and recorded
    # 40000 launches with nobody reading: the ring keeps the newest 32768, counts the rest as dropped
    assert out["overflow_read"] == str(1 << 15)
    assert int(out["dropped"]) == 40000 - (1 << 15)
    assert out["launches"] == str(4001 + 40000)


def test_gpu_free_limit_is_free_memory_minus_reserve(built):
    out = run_prog(built, "local", UVMPREFETCH_MANAGED_LIMIT="gpu-free")  # fake cudaMemGetInfo: 64 MiB free
    assert int(out["limit"]) == (64 << 20) - (64 << 20) // 20
    assert out["over_limit_rc"] == "2"  # 100 MiB > 60.8 MiB


def test_advice_and_forward_only_modes(built):
    assert run_prog(built, "local", UVMPREFETCH_SHIM_ADVICE="preferred")["advise_calls"] == "1"
    out = run_prog(built, "local", UVMPREFETCH_SHIM_MANAGED="0")
    assert out["managed_calls"] == "0" and out["plain_calls"] == "1"


def test_no_cudart_answers_an_error_without_abort(built):
    out = run_prog(built, "none", UVMPREFETCH_CUDART="/nonexistent/libcudart.so.13")
    assert out["malloc_rc"] == "999" and out["free_rc"] == "999"


def test_python_reader_sees_the_same_library(built):
    _, shim = built
    s = Shim(shim)
    st = s.stats()
    assert st["abi"] == 2 and st["n_launches"] == 0
    assert s.read_launches() == [] and s.segments() == []


def test_shim_path_cli(built, tmp_path):
    env = dict(os.environ, UVMPREFETCH_SHIM_DIR=str(tmp_path))
    r = subprocess.run(["uvmprefetch", "shim-path", "--no-build"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "not built" in r.stderr
    r = subprocess.run(["uvmprefetch", "shim-path"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("libuvmshim.so") and os.path.isfile(r.stdout.strip())


def test_non_python_program_gets_a_summary_at_exit(built):
    r = start(built, ["local"], UVMPREFETCH_LOG="info", UVMPREFETCH_MANAGED_LIMIT="gpu-free")
    assert r.returncode == 0
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("uvmprefetch shim:")][-1]
    assert "1 managed allocations (1 freed, 1 refused, 1 errors)" in line and "44001 launches seen" in line


# ------------------------------------------------------------------------------- the managed-memory limit


def test_default_limit_lets_a_model_bigger_than_the_gpu_allocate_up_to_what_the_host_backs(built, tmp_path):
    # GIVEN a GPU with 64 MiB free and a host with 4 GiB available (margin: max(1/10, 1 GiB) = 1 GiB)
    root = fake_root(tmp_path, 4 * GiB)
    # WHEN the program allocates 100 MiB (beyond the GPU), then up to 3000 MiB, then 100 MiB more
    out = run_prog(built, "sizes", 100, 2900, 100, UVMPREFETCH_SHIM_SYSROOT=root)
    # THEN what the host can back is handed out and the allocation beyond it is refused like a full GPU
    assert (out["rc0"], out["rc1"], out["rc2"]) == ("0", "0", "2")
    assert int(out["limit"]) == 3 * GiB and out["mode"] == "1"
    assert int(out["device_free"]) == 64 * MiB and int(out["device_total"]) == 80 * MiB
    assert int(out["mem_available"]) == 4 * GiB and int(out["host_margin"]) == GiB
    assert int(out["host_backed"]) == 3 * GiB and out["cgroup_version"] == "0"
    # "host" is the same as unset; the margin is a tenth once that exceeds 1 GiB
    out = run_prog(built, "sizes", 36000, 900, UVMPREFETCH_SHIM_SYSROOT=fake_root(tmp_path, 40 * GiB),
                   UVMPREFETCH_MANAGED_LIMIT="host")
    assert (out["rc0"], out["rc1"]) == ("0", "2") and int(out["limit"]) == 36 * GiB


def test_a_gpu_with_more_free_memory_than_the_host_can_back_keeps_the_gpu_free_limit(built, tmp_path):
    out = run_prog(built, "sizes", 1500, 500, UVMPREFETCH_SHIM_SYSROOT=fake_root(tmp_path, 2 * GiB),
                   FAKE_FREE_MIB="2048", FAKE_TOTAL_MIB="4096")
    assert int(out["host_backed"]) == GiB and int(out["limit"]) == 2048 * MiB - 2048 * MiB // 20
    assert (out["rc0"], out["rc1"]) == ("0", "2")


CGROUP2_MOUNTINFO = "25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
CGROUP1_MOUNTINFO = ("30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
                     "33 25 0:29 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n")


def test_cgroup_v2_memory_max_bounds_the_host_part_its_parent_included(built, tmp_path):
    # GIVEN 16 GiB available but a job cgroup with 3 GiB max (0.5 used) under a slice with 2 GiB max (0.25 used)
    cg = "sys/fs/cgroup/user.slice"
    root = fake_root(tmp_path, 16 * GiB, {
        "proc/self/mountinfo": CGROUP2_MOUNTINFO, "proc/self/cgroup": "0::/user.slice/job\n",
        f"{cg}/job/memory.max": f"{3 * GiB}\n", f"{cg}/job/memory.current": f"{GiB // 2}\n",
        f"{cg}/memory.max": f"{2 * GiB}\n", f"{cg}/memory.current": f"{GiB // 4}\n",
        "sys/fs/cgroup/memory.max": "max\n"})
    out = run_prog(built, "sizes", 700, 100, UVMPREFETCH_SHIM_SYSROOT=root)
    # THEN the tightest room (1.75 GiB) less the 1 GiB margin is the limit
    assert int(out["cgroup_room"]) == 7 * GiB // 4 and out["cgroup_version"] == "2"
    assert int(out["limit"]) == 3 * GiB // 4 and (out["rc0"], out["rc1"]) == ("0", "2")


def test_cgroup_v1_memory_limit_bounds_the_host_part_and_unlimited_is_ignored(built, tmp_path):
    cg = "sys/fs/cgroup/memory/process_api"
    files = {"proc/self/mountinfo": CGROUP1_MOUNTINFO,
             "proc/self/cgroup": "5:cpu:/\n4:memory:/process_api/abc\n0::/\n",
             f"{cg}/abc/memory.limit_in_bytes": "9223372036854771712\n", f"{cg}/abc/memory.usage_in_bytes": "5\n",
             f"{cg}/memory.limit_in_bytes": f"{3 * GiB}\n", f"{cg}/memory.usage_in_bytes": f"{GiB}\n"}
    out = run_prog(built, "sizes", 1000, 100, UVMPREFETCH_SHIM_SYSROOT=fake_root(tmp_path, 16 * GiB, files))
    assert int(out["cgroup_room"]) == 2 * GiB and out["cgroup_version"] == "1"
    assert int(out["limit"]) == GiB and (out["rc0"], out["rc1"]) == ("0", "2")
    # no limit anywhere (as on this kind of host): MemAvailable alone
    files[f"{cg}/memory.limit_in_bytes"] = "9223372036854771712\n"
    out = run_prog(built, "sizes", 1, UVMPREFETCH_SHIM_SYSROOT=fake_root(tmp_path / "u", 16 * GiB, files))
    assert out["cgroup_version"] == "0" and int(out["cgroup_room"]) == 2**64 - 1
    assert int(out["limit"]) == 16 * GiB - 16 * GiB // 10


def test_explicit_and_gpu_free_limits(built, tmp_path):
    root = fake_root(tmp_path, 4 * GiB)
    out = run_prog(built, "sizes", 60, 10, UVMPREFETCH_SHIM_SYSROOT=root, UVMPREFETCH_MANAGED_LIMIT="gpu-free")
    assert (out["rc0"], out["rc1"]) == ("0", "2") and out["mode"] == "2"  # 60.8 MiB: the old cap holds
    out = run_prog(built, "sizes", 5000, 300, UVMPREFETCH_SHIM_SYSROOT=root, UVMPREFETCH_MANAGED_LIMIT="5.1GiB")
    assert (out["rc0"], out["rc1"]) == ("0", "2") and int(out["limit"]) == int(5.1 * GiB) and out["mode"] == "3"


def test_no_host_figures_keeps_the_gpu_free_limit(built, tmp_path):
    out = run_prog(built, "sizes", 60, 10, UVMPREFETCH_SHIM_SYSROOT=str(tmp_path / "empty"))
    assert out["host_known"] == "0" and int(out["limit"]) == 64 * MiB - 64 * MiB // 20
    assert (out["rc0"], out["rc1"]) == ("0", "2")


@pytest.mark.parametrize("env,word", [({"UVMPREFETCH_MANAGED_LIMIT": "lots"}, "UVMPREFETCH_MANAGED_LIMIT"),
                                      ({"UVMPREFETCH_MANAGED_LIMIT": "0.5"}, "UVMPREFETCH_MANAGED_LIMIT"),
                                      ({"UVMPREFETCH_SHIM_LIMIT": "1000000"}, "UVMPREFETCH_MANAGED_LIMIT")])
def test_bad_limit_is_one_line_and_exit_2_before_main(built, env, word):
    r = start(built, ["local"], **env)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and word in r.stderr and ("accepted" in r.stderr or "instead" in r.stderr)


SPECS = ["", "host", " HOST ", "gpu-free", "GPU-Free", "20GiB", "20 gib", "512MB", "1.5GB", "3e9", "3E+2MiB", ".5MiB",
         "1048576", "1k", "1KiB", "2t", "7b", "0.5", "0", "5.", "-1GiB", "1e30", "20GiBs", "lots", "1 2", "e9", "1e",
         "gpu", "1.5e-3GiB", "18446744073709551615"]


def test_shim_and_config_read_every_limit_the_same(built):
    # differential: the C parser against uvmprefetch.config (which reuses units.parse_size)
    shim = Shim(built[1])
    for spec in SPECS:
        try:
            lim = parse_managed_limit(spec)
            want = (lim.mode, lim.nbytes or 0)
        except ConfigError:
            want = None
        assert shim.parse_limit(spec) == want, spec


def test_python_view_of_the_limit(built, tmp_path, monkeypatch):
    shim = Shim(built[1])
    monkeypatch.setenv("UVMPREFETCH_SHIM_SYSROOT", fake_root(tmp_path, 8 * GiB))
    d = shim.plan_limit(40 * GiB, 80 * GiB, None)
    assert d["mode"] == "host" and d["limit_bytes"] == 40 * GiB - 2 * GiB  # the GPU's free memory - 5 % is more
    assert d["host_backed"] == 7 * GiB and d["cgroup_room"] is None and d["host_known"]
    assert shim.plan_limit(0, 0, "host")["limit_bytes"] == 7 * GiB  # no GPU figures (doctor without a GPU)
    assert shim.plan_limit(0, 0, "1TiB")["limit_bytes"] == 1 << 40
    assert len(LimitInfo._fields_) == 12
    with pytest.raises(Exception, match="UVMPREFETCH_MANAGED_LIMIT"):
        shim.plan_limit(0, 0, "lots")


def test_this_machines_host_memory_is_read(built):
    # the real /proc/meminfo (no sysroot): the shim's MemAvailable matches Python's reading within 1 GiB
    shim = Shim(built[1])
    d = shim.plan_limit(0, 0, None)
    with open("/proc/meminfo") as f:
        avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable:"))
    assert d["host_known"] and abs(d["mem_available"] - avail) < GiB
    room = min(d["mem_available"], d["cgroup_room"] or 2**64)
    assert d["host_margin"] == max(room // 10, GiB) and d["host_backed"] == max(room - d["host_margin"], 0)
