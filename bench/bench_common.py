"""bench/bench_common.py: what the side-by-side benchmark scripts share.

- run_child: one measurement in its own process, with its peak RSS;
- field: a key=value number from a child's output;
- TUNED_ENV / TUNED_UNSET: the best PyTorch 1.13 setup found on this
  machine (bench_vs_pytorch.py's header says how it was found).
"""
import os
import re
import subprocess
import tempfile
import time

TUNED_ENV = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736",
    "OMP_WAIT_POLICY": "PASSIVE",
    "ATEN_CPU_CAPABILITY": "avx512",
}
TUNED_UNSET = ["OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"]


def run_child(cmd, env_set=None, env_unset=()):
    """Runs cmd in its own process; returns (stdout, peak RSS in MiB, seconds).

    stderr goes to a file, so that reading stdout to its end cannot block on
    a full stderr pipe; then wait4 reaps the child and gives its peak RSS
    (ru_maxrss, the whole process's). Raises RuntimeError with both outputs
    if the child fails.
    """
    env = dict(os.environ)
    for k in env_unset:
        env.pop(k, None)
    env.update(env_set or {})
    t0 = time.time()
    with tempfile.TemporaryFile("w+") as errf:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=errf, text=True)
        out = p.stdout.read()
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        errf.seek(0)
        err = errf.read()
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d):\n%s\n%s" % (" ".join(cmd[:3]), p.returncode, out, err))
    return out, usage.ru_maxrss / 1024.0, time.time() - t0


def field(text, name):
    """The number after `name=` in text; RuntimeError if absent."""
    m = re.search(r"\b%s=([0-9.eE+-]+)" % name, text)
    if not m:
        raise RuntimeError("no %s= in output:\n%s" % (name, text))
    return float(m.group(1))
