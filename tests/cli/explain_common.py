"""Shared by tests/cli/explain.py and tests/data/explain/make_fixtures.py."""
import os
import pty
import subprocess

SENTENCE = "The animal didn't cross the street because it was too tired"


def run_in_terminal(argv, cwd=None, env=None):
    """Runs argv with standard output a pseudo-terminal; returns (exit code, bytes printed).

    The terminal's line discipline would turn "\\n" into "\\r\\n"; the child's
    output is read raw and that one translation is undone, so the bytes are
    what the program wrote."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        os.close(slave)
        slave = -1
        chunks = []
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        proc.wait(timeout=60)
        proc.stderr.close()
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    return proc.returncode, b"".join(chunks).replace(b"\r\n", b"\n")
