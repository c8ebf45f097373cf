"""bench/bench_common.py: what the side-by-side benchmark scripts share.

- run_child: one measurement in its own process, with its peak RSS;
- field: a key=value number from a child's output;
- TUNED_ENV / TUNED_UNSET: the best PyTorch 1.13 setup found on this
  machine (bench_vs_pytorch.py's header says how it was found);
- machine_probe: multihead_fma_peak's fields (the FMA, vdpbf16ps and fp16
  FMA peaks, the L3 and the read bandwidth), measured in the caller's run;
- alternated: programs measured round by round in a rotating order, the
  per-program list of results (the median is the caller's);
- ORT_VERSION / ensure_ort / run_node / onnx_missing: ONNX Runtime through
  the npm package onnxruntime-node, installed into a cache folder, and the
  onnx Python package (Debian's python3-onnx) that writes its model files.
"""
import importlib.util
import os
import re
import subprocess
import tempfile
import time

ORT_VERSION = "1.30.0"

def _cpu_has_avx512():
    """True if /proc/cpuinfo lists the AVX-512 subsets ATen's avx512 kernels need (F, BW, VL, DQ)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return all(x in flags for x in ("avx512f", "avx512bw", "avx512vl", "avx512dq"))


TUNED_ENV = {
    "GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736",
    "OMP_WAIT_POLICY": "PASSIVE",
}
# ATen's avx512 kernels were the faster on the AVX-512 hosts measured; on a
# CPU without AVX-512, forcing them kills the child (illegal instruction),
# so ATen then keeps its own run-time choice.
if _cpu_has_avx512():
    TUNED_ENV["ATEN_CPU_CAPABILITY"] = "avx512"
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


def machine_probe(probe, threads, extra=()):
    """Runs multihead_fma_peak (bench/fma_peak.cpp); returns (fields, lines).

    fields maps each key=value of its output to a float, or None where the
    value is n/a (an instruction this CPU lacks); lines are its output lines
    as printed, to show beside a table."""
    out, _, _ = run_child([probe, "--threads", str(threads)] + list(extra))
    fields = {}
    for key, value in re.findall(r"\b([a-z0-9_]+)=(\S+)", out):
        try:
            fields.setdefault(key, float(value))
        except ValueError:
            fields.setdefault(key, None if value.startswith("n/a") else value)
    return fields, out.strip().splitlines()


def alternated(programs, rounds, measure):
    """{name: [result of each round]}: round r measures every program once, in
    the order of `programs` rotated by r, so that none always runs first (on
    a colder machine) or right after the same neighbour. measure(name) gives
    one result; an exception is kept as that round's result (the caller
    reports it), so one failing program does not stop the others."""
    results = {name: [] for name in programs}
    n = len(programs)
    for r in range(rounds):
        for i in range(n):
            name = programs[(i + r) % n]
            try:
                results[name].append(measure(name))
            except Exception as e:  # noqa: BLE001  (reported in the table)
                results[name].append(e)
    return results


def ensure_ort(cache):
    """onnxruntime-node in `cache` (npm install, install scripts off: the CPU
    binaries ship inside the package); returns `cache`."""
    marker = os.path.join(cache, "node_modules", "onnxruntime-node", "package.json")
    if not os.path.exists(marker):
        os.makedirs(cache, exist_ok=True)
        # npm trusts only Node.js's bundled roots; add the system's store
        # (tests/explain/run_browser_test.sh does the same).
        env = dict(os.environ)
        if not env.get("NODE_EXTRA_CA_CERTS") and os.path.exists("/etc/ssl/certs/ca-certificates.crt"):
            env["NODE_EXTRA_CA_CERTS"] = "/etc/ssl/certs/ca-certificates.crt"
        r = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix", cache,
                            f"onnxruntime-node@{ORT_VERSION}"], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise RuntimeError("npm install onnxruntime-node failed: " + r.stderr.strip().splitlines()[-1])
    return cache


def onnx_missing():
    """None if the onnx Python package imports, else the line saying how to get it."""
    if importlib.util.find_spec("onnx") is None:
        return "the onnx Python package is missing (apt-get install python3-onnx)"
    return None


def run_node(code, argv, cache, workdir, name):
    """Runs JavaScript `code` (written to workdir/name) under node with the
    onnxruntime-node of `cache`; returns its stdout. RuntimeError with its
    stderr's first line on failure."""
    script = os.path.join(workdir, name)
    with open(script, "w") as f:
        f.write(code)
    env = dict(os.environ, NODE_PATH=os.path.join(cache, "node_modules"))
    r = subprocess.run(["node", script] + [str(a) for a in argv], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip() or f"exit {r.returncode}")
    return r.stdout
