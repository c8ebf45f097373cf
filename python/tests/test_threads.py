"""Threads: the GIL is released while the library computes, and one module
serves several Python threads at once with the results of serial calls."""
import threading
import time

import numpy as np
import pytest

import multihead


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_four_threads_one_module_equal_serial_calls(dtype):
    mha = multihead.MultiheadAttention(32, 4, add_bias_kv=True, dtype=dtype)
    rng = np.random.default_rng(3)
    jobs = []
    for i in range(16):
        L = 5 + i
        x = rng.standard_normal((L, 2, 32)).astype(dtype)
        kpm = rng.random((2, L)) < 0.2
        jobs.append((x, kpm))
    serial = [mha(x, x, x, key_padding_mask=kpm) for x, kpm in jobs]
    results = [[None] * len(jobs) for _ in range(4)]
    errors = []
    start = threading.Barrier(4)

    def worker(t):
        try:
            start.wait()
            for rep in range(3):
                for j in range(len(jobs)):
                    jj = (j + t * 5) % len(jobs)  # each thread in its own order
                    x, kpm = jobs[jj]
                    results[t][jj] = mha(x, x, x, key_padding_mask=kpm)
        except Exception as e:  # reported below, not lost in the thread
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for t in range(4):
        for j, (out, w) in enumerate(results[t]):
            np.testing.assert_array_equal(out, serial[j][0], err_msg=f"thread {t}, job {j}")
            np.testing.assert_array_equal(w, serial[j][1], err_msg=f"thread {t}, job {j}")


def test_gil_is_released_during_compute():
    """While one thread is inside a long forward, another runs Python code.

    The main thread loops until the call ends and records the longest gap
    between two of its iterations. Had the call kept the GIL, that gap would
    be the whole call; released, it is a scheduler slice (milliseconds, even
    on a loaded machine)."""
    mha = multihead.MultiheadAttention(64, 4)
    kw = dict(need_weights=False, kernel="reference", num_threads=1)  # plain loops: a slow call
    L = 512
    while True:  # a call of at least 100 ms, whatever the machine
        x = np.random.default_rng(4).standard_normal((L, 2, 64)).astype(np.float32)
        t0 = time.perf_counter()
        mha(x, x, x, **kw)
        one_call = time.perf_counter() - t0
        if one_call > 0.1 or L >= 16384:
            break
        L *= 2
    started, done = threading.Event(), threading.Event()

    def compute():
        started.set()
        mha(x, x, x, **kw)
        done.set()

    th = threading.Thread(target=compute)
    th.start()
    started.wait()
    last = time.perf_counter()
    max_gap = 0.0
    while not done.is_set():
        now = time.perf_counter()
        max_gap = max(max_gap, now - last)
        last = now
    th.join()
    assert max_gap < 0.5 * one_call, f"main thread stalled {max_gap * 1e3:.1f} ms during a {one_call * 1e3:.1f} ms call"
