# Checks gpumem's in-process Python stack capture in a real interpreter: names, files and lines of
# known call sites, interning, threads with and without the GIL, code objects whose addresses come
# back, the depth limit, and GPUMEM_STACKS=all's two limits (native and Python frames each).
# Runs under any CPython 3.10 to 3.13 (3.10 has no qualified names: bare ones are expected there).
import ctypes
import json
import os
import subprocess
import sys
import threading
from stack_checks import check, finish

probe_path = sys.argv[1]
# A second argument runs one case in its own process (the probe's table is one per process): a
# depth, or "all" or "all256" (run with PROBE_STACKS=all).
case = sys.argv[2] if len(sys.argv) > 2 else ""
depth = int(case) if case.isdigit() else 64
here = os.path.abspath(__file__)
with_gil = ctypes.PyDLL(probe_path)      # PyDLL keeps the GIL during the call
without_gil = ctypes.CDLL(probe_path)    # CDLL releases it, as most extensions do around C work
with_gil.probe_record.argtypes = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_int]


def record(stack_id):
    buf = ctypes.create_string_buffer(1 << 20)
    n = with_gil.probe_record(stack_id, buf, len(buf))
    check(n > 0, f"record for stack {stack_id}")
    line = buf.value.decode()
    check(line.endswith("\n"), "record ends with a newline")
    rec = json.loads(line)
    check(rec["ev"] == "stack" and rec["id"] == stack_id, f"record header {rec}")
    return rec["frames"]


def qual(qualified):
    """A function's name as a frame gives it: 3.10's code objects have no co_qualname."""
    return qualified if sys.version_info >= (3, 11) else qualified.rsplit(".", 1)[-1]


def is_native(frame):
    return "module" in frame


def line_of(marker):
    with open(here) as f:
        for i, text in enumerate(f, 1):
            if text.rstrip().endswith("# " + marker):
                return i
    raise AssertionError(marker)


def alpha():
    return with_gil.probe_capture()  # site-alpha


def beta():
    return with_gil.probe_capture()  # site-beta


class Klass:
    def method(self):
        return with_gil.probe_capture()  # site-method


def recurse(n):
    if n == 0:
        return with_gil.probe_capture()  # site-deep
    return recurse(n - 1)


class Link:
    """One of a chain of objects calling each other through __call__, as nn.Module levels do: each
    call goes through C (slot_tp_call), so it adds native frames as well as a Python one."""

    def __init__(self, nxt):
        self.nxt = nxt

    def __call__(self):
        if self.nxt is None:
            return with_gil.probe_capture()  # site-link
        return self.nxt()


def chain(n):
    link = None
    for _ in range(n):
        link = Link(link)
    return link


def split(frames):
    """(native, python) frames of an `all` stack, checking that the native ones come first."""
    k = next((i for i, f in enumerate(frames) if not is_native(f)), len(frames))
    native, python = frames[:k], frames[k:]
    check(not any(is_native(f) for f in python), "all: native frames first, then Python ones")
    return native, python


def all_case():
    """GPUMEM_STACKS=all: native and Python frames have a limit of the depth each."""
    check(with_gil.probe_init(64) == 1, "all: capture active")
    # The reviewer's case: 8 levels of __call__ put more than 64 native frames below the first
    # Python one, and the Python frames were all cut.
    native, python = split(record(chain(8)()))
    check(len(native) > 16 and len(native) <= 64, f"all: {len(native)} native frames, at most 64")
    check(len(python) >= 10, f"all, 8 levels of __call__: {len(python)} Python frames kept")
    check(python and python[0]["function"] == qual("Link.__call__") and python[0]["line"] == line_of("site-link"),
          f"all: innermost Python frame {python[:1]}")
    check(python and python[-1]["function"] == "<module>", f"all: outermost Python frame {python[-1:]}")
    # 80 levels: both limits reached at once, 64 + 64 frames.
    native, python = split(record(chain(80)()))
    check((len(native), len(python)) == (64, 64), f"all, 80 levels: {len(native)} native + {len(python)} Python frames")
    check(python and python[0]["line"] == line_of("site-link"), "all, 80 levels: innermost Python frame kept")


def all_max_case():
    """GPUMEM_STACKS=all at the largest depth, 256: up to 512 frames, none written past the buffer."""
    check(with_gil.probe_init(256) == 1, "all 256: capture active")
    native, python = split(record(chain(300)()))
    check((len(native), len(python)) == (256, 256), f"all 256, 300 levels: {len(native)} native + {len(python)} Python frames")


def reused_code_case():
    """Cells compiled and run one after another, as a notebook does: each code object (and its file
    name) is freed after its run, and the next one's often gets the same addresses and first line.
    Each cell must still get its own file and line, not an earlier cell's stack."""
    wrong = []
    for n in range(20):
        file = f"/tmp/ipykernel_1/{n}.py"
        cell = {"probe": with_gil.probe_capture}
        exec(compile("\n" * n + "x = probe()", file, "exec"), cell)
        f = record(cell["x"])[0]
        if (f["file"], f["line"]) != (file, n + 1):
            wrong.append((n, f["file"], f["line"]))
    check(not wrong, f"compiled cells with their own file: {len(wrong)} of 20 got another's: {wrong[:4]}")
    # The same file name each time: only the code (its line table) tells the cells apart.
    wrong = []
    for n in range(20):
        cell = {"probe": with_gil.probe_capture}
        exec(compile("\n" * (n + 3) + "x = probe()", "/tmp/cell.py", "exec"), cell)
        f = record(cell["x"])[0]
        if (f["file"], f["line"]) != ("/tmp/cell.py", n + 4):
            wrong.append((n, f["file"], f["line"]))
    check(not wrong, f"compiled cells of one file: {len(wrong)} of 20 got another's line: {wrong[:4]}")


def main():
    if case == "all":
        return all_case()
    if case == "all256":
        return all_max_case()
    if depth != 64:  # the depth case, in its own process
        check(with_gil.probe_init(depth) == 1, "capture active")
        frames = record(recurse(20))
        check(len(frames) == depth, f"depth {depth}: got {len(frames)} frames")
        check(frames[0]["line"] == line_of("site-deep"), "innermost frame kept")
        return
    check(with_gil.probe_init(64) == 1, "capture active in CPython %d.%d" % sys.version_info[:2])

    a1, a2, b = alpha(), alpha(), beta()
    check(a1 != 0 and a1 == a2, f"one site, one id: {a1} {a2}")
    check(b != 0 and b != a1, f"another site, another id: {b}")
    fa = record(a1)
    check(fa[0] == {"function": "alpha", "file": here, "line": line_of("site-alpha")}, f"alpha frame {fa[0]}")
    check(fa[1]["function"] == "main" and fa[1]["file"] == here, f"caller frame {fa[1]}")
    check(fa[-1]["function"] == "<module>", f"outermost frame {fa[-1]}")
    fb = record(b)
    check(fb[0]["function"] == "beta" and fb[0]["line"] == line_of("site-beta"), f"beta frame {fb[0]}")
    fm = record(Klass().method())
    check(fm[0]["function"] == qual("Klass.method") and fm[0]["line"] == line_of("site-method"),
          f"qualified name {fm[0]}")

    # A thread gets its own stack, with the GIL or without it (PyTorch releases it around every
    # operator); a native thread with no Python thread state gets none.
    got = {}

    def worker():
        got["with"] = with_gil.probe_capture()  # site-thread
        got["without"] = without_gil.probe_capture()  # site-nogil

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    fn = record(got["without"])
    check(fn[0]["function"] == qual("main.<locals>.worker") and fn[0]["line"] == line_of("site-nogil"),
          f"thread without the GIL: frame {fn[0]}")
    ft = record(got["with"])
    check(ft[0]["function"] == qual("main.<locals>.worker") and ft[0]["line"] == line_of("site-thread"),
          f"thread frame {ft[0]}")
    check(any(f["function"] == qual("Thread.run") for f in ft), "thread stack reaches threading.Thread.run")
    check(not any(f["function"] == "main" for f in ft), "thread stack is the thread's own")
    fm = record(without_gil.probe_capture())  # site-main-nogil
    check(fm[0]["function"] == "main" and fm[0]["line"] == line_of("site-main-nogil"),
          f"main thread without the GIL: frame {fm[0]}")
    check(with_gil.probe_capture_native_thread() == 0, "a native thread has no Python stack")
    check(with_gil.probe_size() == 6, f"6 unique stacks interned, got {with_gil.probe_size()}")

    reused_code_case()

    r = subprocess.run([sys.executable, here, probe_path, "3"])
    check(r.returncode == 0, "depth limit case")
    for c in ("all", "all256"):
        r = subprocess.run([sys.executable, here, probe_path, c], env=dict(os.environ, PROBE_STACKS="all"))
        check(r.returncode == 0, f"GPUMEM_STACKS=all case {c}")


main()
finish()
