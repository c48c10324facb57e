"""The LD_PRELOAD shim against a fake libcudart (the true boundary), on the CPU.

GIVEN a fake ``libcudart.so.13`` (a tiny C library compiled here that counts calls and fails on request), a
``libuser.so`` linked against it (standing for PyTorch's libc10_cuda) and a small C program that loads
libuser the way Python loads an extension (``dlopen``, RTLD_LOCAL by default),
WHEN the program runs with ``LD_PRELOAD`` = the shim,
THEN device allocations become managed ones, frees are forwarded, launches land in the ring, the fake
library's errors reach the caller unchanged, the managed cap refuses like a full GPU, and nothing aborts.
"""

import os
import shutil
import subprocess

import pytest

from uvmprefetch.runtime.shim import Shim, shim_path

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("make") is None,
                                reason="needs a C compiler and make")

FAKE_CUDART = r"""
#include <stdlib.h>
#include <stdint.h>
typedef struct { unsigned x, y, z; } dim3;
struct loc { int type; int id; };
typedef struct { dim3 g, b; size_t shm; void *stream; void *attrs; unsigned n; } cfg_t;
int fake_n_malloc, fake_n_managed, fake_n_free, fake_n_advise, fake_n_launch, fake_last_flags;
int cudaMalloc(void **p, size_t n) { fake_n_malloc++; *p = malloc(n ? n : 1); return 0; }
int cudaMallocManaged(void **p, size_t n, unsigned flags) {
    if (n == 12345) return 2;            /* the driver says: out of memory */
    fake_n_managed++; fake_last_flags = (int)flags; *p = malloc(n); return 0;
}
int cudaFree(void *p) {
    if (p == (void *)0xdead) return 17;  /* cudaErrorInvalidDevicePointer */
    fake_n_free++; free(p); return 0;
}
int cudaMemGetInfo(size_t *f, size_t *t) { *f = (size_t)64 << 20; *t = (size_t)80 << 20; return 0; }
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


def run_prog(built, mode, **env):
    d, shim = built
    e = dict(os.environ, LD_PRELOAD=str(shim), LD_LIBRARY_PATH=str(d / "fake"), UVMPREFETCH_LOG="quiet")
    e.update(env)
    r = subprocess.run([str(d / "prog"), str(d / "libuser.so"), mode], env=e, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)  # never aborts
    return dict(line.split("=", 1) for line in r.stdout.split())


@pytest.mark.parametrize("mode", ["local", "global"])
def test_allocations_redirected_frees_forwarded_errors_passed(built, mode):
    out = run_prog(built, mode, UVMPREFETCH_SHIM_LIMIT=str(32 << 20))
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


def test_default_limit_is_free_memory_minus_reserve(built):
    out = run_prog(built, "local")  # fake cudaMemGetInfo: 64 MiB free
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
    assert st["abi"] == 1 and st["n_launches"] == 0
    assert s.read_launches() == [] and s.segments() == []


def test_shim_path_cli(built, tmp_path):
    env = dict(os.environ, UVMPREFETCH_SHIM_DIR=str(tmp_path))
    r = subprocess.run(["uvmprefetch", "shim-path", "--no-build"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "not built" in r.stderr
    r = subprocess.run(["uvmprefetch", "shim-path"], env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("libuvmshim.so") and os.path.isfile(r.stdout.strip())


def test_non_python_program_gets_a_summary_at_exit(built):
    d, shim = built
    e = dict(os.environ, LD_PRELOAD=str(shim), LD_LIBRARY_PATH=str(d / "fake"), UVMPREFETCH_LOG="info")
    r = subprocess.run([str(d / "prog"), str(d / "libuser.so"), "local"], env=e, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("uvmprefetch shim:")][-1]
    assert "1 managed allocations (1 freed, 1 refused, 1 errors)" in line and "44001 launches seen" in line
