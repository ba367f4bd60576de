"""LD_PRELOAD=libferry_preload.so has no effect on a program that never copies
with CUDA (no GPU needed: it runs in CI)."""

import os
import subprocess
import sys

import ferry.multipath as mp
import pytest


def _library():
    try:
        return mp.preload_library()
    except FileNotFoundError:
        pytest.skip("libferry_preload.so is not built here")


@pytest.mark.parametrize(
    "cmd",
    [
        [sys.executable, "-c", "import json, sys; print(json.dumps({'ok': 1})); sys.stderr.write('')"],
        ["sh", "-c", "echo ok"],
    ],
)
def test_no_effect_without_cuda_copies(cmd):
    env = dict(os.environ, LD_PRELOAD=_library(), FERRY_DEBUG="1")
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "ok" in run.stdout
    assert "ferry" not in run.stderr, run.stderr  # nothing was opened or said


@pytest.mark.parametrize("chosen", [None, "0", "1"])
def test_the_own_share_on_the_stream_is_the_default_unless_chosen(chosen):
    """The library makes FERRY_MULTIPATH_OWN_SHARE_ON_STREAM 1 for the
    program's engines where the user left it unset, and keeps a choice."""
    env = dict(os.environ, LD_PRELOAD=_library())
    env.pop("FERRY_MULTIPATH_OWN_SHARE_ON_STREAM", None)
    if chosen is not None:
        env["FERRY_MULTIPATH_OWN_SHARE_ON_STREAM"] = chosen
    code = "import os; print(os.environ.get('FERRY_MULTIPATH_OWN_SHARE_ON_STREAM'))"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (chosen or "1"), run.stdout


FAKE_RUNTIME = r"""
#include <stddef.h>
int cudaMemcpyAsync(void* d, const void* s, size_t n, int k, void* st) { return RESULT; }
int cudaMemcpy(void* d, const void* s, size_t n, int k) { return RESULT + 100; }
"""
PROGRAM = r"""
#include <stdio.h>
#include <stddef.h>
int cudaMemcpyAsync(void* d, const void* s, size_t n, int k, void* st);
int cudaMemcpy(void* d, const void* s, size_t n, int k);
int main(void) {
  static char a[1], b[1];
  printf("%d %d %d\n", cudaMemcpyAsync(a, b, 1, 1, 0), cudaMemcpyAsync(a, b, 64 << 20, 1, 0),
         cudaMemcpy(a, b, 64 << 20, 2));
  return 0;
}
"""
PLUGIN = r"""
#include <stddef.h>
int cudaMemcpyAsync(void* d, const void* s, size_t n, int k, void* st);
int cudaMemcpy(void* d, const void* s, size_t n, int k);
int small(void) { static char a[1], b[1]; return cudaMemcpyAsync(a, b, 1, 1, 0); }
int big(void) { static char a[1], b[1]; return cudaMemcpyAsync(a, b, 64 << 20, 1, 0); }
int sync(void) { static char a[1], b[1]; return cudaMemcpy(a, b, 64 << 20, 2); }
"""
HOST = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char** argv) {
  void* h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);  /* the only runtime is the plugin's, in its local scope */
  if (!h) { printf("%s\n", dlerror()); return 1; }
  int (*f[3])(void) = {(int (*)(void))dlsym(h, "small"), (int (*)(void))dlsym(h, "big"), (int (*)(void))dlsym(h, "sync")};
  printf("%d %d %d\n", f[0](), f[1](), f[2]());
  return 0;
}
"""


def _driver_present() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


@pytest.mark.parametrize("loading", ["", "EAGER"])
def test_copies_reach_the_programs_runtime_without_a_gpu(tmp_path, loading):
    """Fake CUDA runtimes answer 78/178 (linked by a program) and 79/179 (a
    renamed one, only in a plugin's local scope): every call, small or large,
    reaches the runtime its caller would have reached, whether the preload is
    off (lazy loading) or on and finds no GPU for its engine."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lib = _library()
    for name, text in (("main.c", PROGRAM), ("plug.c", PLUGIN), ("host.c", HOST)):
        (tmp_path / name).write_text(text)
    (tmp_path / "rt78.c").write_text(FAKE_RUNTIME.replace("RESULT", "78"))
    (tmp_path / "rt79.c").write_text(FAKE_RUNTIME.replace("RESULT", "79"))
    sh = [cc, "-shared", "-fPIC", "-o"]
    t = str(tmp_path)
    for cmd in (
        sh + [f"{t}/libcudart.so.13", f"{t}/rt78.c", "-Wl,-soname,libcudart.so.13"],
        sh + [f"{t}/libcudart-a1b2.so.12", f"{t}/rt79.c", "-Wl,-soname,libcudart-a1b2.so.12"],
        sh + [f"{t}/libplug.so", f"{t}/plug.c", f"{t}/libcudart-a1b2.so.12"],
        [cc, "-o", f"{t}/main", f"{t}/main.c", f"{t}/libcudart.so.13"],
        [cc, "-o", f"{t}/host", f"{t}/host.c", "-ldl"],
    ):
        subprocess.run(cmd, check=True, capture_output=True)
    env = dict(os.environ, LD_PRELOAD=lib, LD_LIBRARY_PATH=t, FERRY_DEBUG="1")
    env.pop("CUDA_MODULE_LOADING", None)
    if loading:
        env["CUDA_MODULE_LOADING"] = loading
    for program, want in (([f"{t}/main"], "78 78 178"), ([f"{t}/host", f"{t}/libplug.so"], "79 79 179")):
        run = subprocess.run(program, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stdout.strip() == want, (program, run.stdout, run.stderr)
        # Off where no driver can be loaded; with eager loading on a machine that
        # has one, the preload finds the real driver and says it routes.
        assert "ferry preload: off" in run.stderr or (
            loading == "EAGER" and _driver_present() and "routing host<->GPU copies" in run.stderr
        ), run.stderr


FAKE_FERRY = r"""
#include <stddef.h>
static int calls;
static int engine;
int ferry_multipath_create(const int* d, int n, const void* o, void** e) { *e = &engine; return 0; }
/* First a copy ferry refuses (an argument error), then a copy the engine fails. */
int ferry_multipath_copy(void* e, void* dst, const void* src, size_t n, void* s, int* mp) { return ++calls == 1 ? 1 : 3; }
int ferry_multipath_copy_sync(void* e, void* dst, const void* src, size_t n, int* mp) { return 3; }
const char* ferry_last_error(void) { return calls == 1 ? "src: not a copy ferry takes" : "a relay failed"; }
"""
FAILING_PROGRAM = r"""
#include <stdio.h>
#include <stddef.h>
int cudaMemcpyAsync(void* d, const void* s, size_t n, int k, void* st);
int main(void) {
  static char a[1], b[1];
  int r1 = cudaMemcpyAsync(a, b, 64 << 20, 1, 0);
  int r2 = cudaMemcpyAsync(a, b, 64 << 20, 1, 0);
  int r3 = cudaMemcpyAsync(a, b, 64 << 20, 1, 0);
  printf("%d %d %d\n", r1, r2, r3);
  return 0;
}
"""


def test_an_engine_failure_is_the_copys_error_and_later_copies_go_to_the_runtime(tmp_path):
    """With a stand-in libferry.so beside the library: a copy ferry refuses as
    an argument error goes to the program's runtime (its answer, 78); a copy
    the engine fails is reported failed (cudaErrorUnknown, 999) with the
    reason on stderr, and from then on every copy goes to the runtime."""
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    t = str(tmp_path)
    shutil.copy(_library(), f"{t}/libferry_preload.so")
    (tmp_path / "ferry.c").write_text(FAKE_FERRY)
    (tmp_path / "rt78.c").write_text(FAKE_RUNTIME.replace("RESULT", "78"))
    (tmp_path / "main.c").write_text(FAILING_PROGRAM)
    for cmd in (
        [cc, "-shared", "-fPIC", "-o", f"{t}/libferry.so", f"{t}/ferry.c"],
        [cc, "-shared", "-fPIC", "-o", f"{t}/libcudart.so.13", f"{t}/rt78.c", "-Wl,-soname,libcudart.so.13"],
        [cc, "-o", f"{t}/main", f"{t}/main.c", f"{t}/libcudart.so.13"],
    ):
        subprocess.run(cmd, check=True, capture_output=True)
    env = dict(
        os.environ, LD_PRELOAD=f"{t}/libferry_preload.so", LD_LIBRARY_PATH=t, CUDA_MODULE_LOADING="EAGER",
        FERRY_DEBUG="1",
    )  # fmt: skip
    run = subprocess.run([f"{t}/main"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "78 999 78", (run.stdout, run.stderr)
    assert "left to the runtime" in run.stderr and "not a copy ferry takes" in run.stderr, run.stderr
    assert (
        "the multipath engine failed; copies go to the CUDA runtime from now on: a relay failed" in run.stderr
    )
