"""What the stack tests' scripts share: check() collects failures, run_gpumem() runs the real binary, finish() ends the run."""
import subprocess
import sys

failures = []


def check(cond, what):
    """A failed expectation is printed and kept, and the script goes on: one run shows them all."""
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run_gpumem(gpumem, *args):
    """gpumem's standard output; a non-zero exit is a failure."""
    r = subprocess.run([gpumem, *args], capture_output=True, text=True)
    check(r.returncode == 0, f"gpumem {' '.join(args)}: exit {r.returncode}: {r.stderr[-400:]}")
    return r.stdout


def finish():
    """Exit 1 with the count of failures, or print ok."""
    if failures:
        print(f"{len(failures)} failed")
        sys.exit(1)
    print("ok")
