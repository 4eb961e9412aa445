"""One plugin exec's pipes and wait: cni/communicate.py against Popen.communicate.

    .venv/bin/python3 -m tests.bench.measure_exec [rounds]

Execs /bin/cat (a plugin that answers at once) with a CNI-sized stdin and a 30-variable
env, in its own process group as cni/invoke.py does, and prints the medians, rounds
interleaved: Popen.communicate with a timeout (how invoke.py exec'd plugins before),
without one (no bound on a plugin that hangs), and cni.communicate with the timeout.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from cni.communicate import communicate

ENV = {f"CNI_VAR{i}": "x" * 40 for i in range(30)}
STDIN = b'{"cniVersion":"1.0.0","name":"default","type":"bridge","bridge":"cni0"}' * 20
TIMEOUT = 60.0


def _start() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["/bin/cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        process_group=0,
    )


def _popen_timeout() -> bytes:
    return _start().communicate(STDIN, timeout=TIMEOUT)[0]


def _popen_unbounded() -> bytes:
    return _start().communicate(STDIN)[0]


def _ours() -> bytes:
    return communicate(_start(), STDIN, TIMEOUT)[0]


CONTENDERS: dict[str, Callable[[], bytes]] = {
    "Popen.communicate(timeout)": _popen_timeout,
    "Popen.communicate()": _popen_unbounded,
    "cni.communicate(timeout)": _ours,
}


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    samples: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    for i in range(rounds):
        order = list(CONTENDERS) if i % 2 else list(reversed(CONTENDERS))
        for name in order:
            started = time.perf_counter()
            assert CONTENDERS[name]() == STDIN
            samples[name].append((time.perf_counter() - started) * 1000)
    for name, times in samples.items():
        print(f"{name}: {statistics.median(times):.3f} ms (median of {rounds})")


if __name__ == "__main__":
    main()
