"""ADD latency: Plexus (shim + daemon, thin) vs Multus thin vs the raw delegates.

Every contender attaches the same networks: reference `bridge` + host-local as the
default network, plus N macvlan secondaries (host-local) on a veth master, in a
private "node" namespace; the two "default only" columns attach the default network
alone (raw, and through Plexus: its own overhead without secondaries). Rounds
interleave the contenders; each ADD is followed by an untimed DEL on a fresh pod
namespace. Prints a markdown table of medians.

    sudo .venv/bin/python3 -m tests.bench.bench_add --runs 30 --extras 1,2,4,8
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tests.bench.common import Bench, arguments, baseline, one_add, raw_add


def shim_round_trip(runs: int) -> dict[str, float]:
    """VERSION through shim + daemon, and the daemon's idle RSS, against an empty exec."""
    root = Path(tempfile.mkdtemp(prefix="plexus-bench-"))
    bench = Bench(root)
    try:
        conf = bench.start_daemon(1)
        shim, thin = str(bench.bin / "plexus"), str(bench.bin / "plexus-thin")
        rounds = [
            (
                baseline(bench),
                bench.call("VERSION", shim, conf, "v", ""),
                bench.call("VERSION", thin, conf, "v", ""),
            )
            for _ in range(runs)
        ]
        status = Path(f"/proc/{bench.daemons[0].pid}/status").read_text()
        rss = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
        )
        base = statistics.median(r[0] for r in rounds)
        return {
            "shim+daemon VERSION (ms)": statistics.median(r[1] for r in rounds) - base,
            "plexus-thin VERSION (ms)": statistics.median(r[2] for r in rounds) - base,
            "daemon idle RSS (MiB)": rss / 1024,
        }
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)


def measure(runs: int, extras_list: list[int]) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="plexus-bench-"))
    bench = Bench(root)
    rows = []
    try:
        for extras in extras_list:
            default_only = bench.start_daemon(0, "run-default")
            full = bench.start_daemon(extras)
            shim, thin = str(bench.bin / "plexus"), str(bench.bin / "plexus-thin")
            contenders: dict[str, Callable[[], float]] = {
                "raw default only": partial(raw_add, bench, 0),
                "raw delegates": partial(raw_add, bench, extras),
                "plexus default only": partial(one_add, bench, shim, default_only),
                "plexus shim+daemon": partial(one_add, bench, shim, full),
                "plexus thin": partial(one_add, bench, thin, bench.meta("plexus", extras)),
            }
            if (bench.bin / "multus").exists():
                contenders["multus thin"] = partial(
                    one_add, bench, str(bench.bin / "multus"), bench.meta("multus", extras)
                )
            samples: dict[str, list[float]] = {name: [] for name in contenders}
            samples["exec baseline"] = []
            for run in contenders.values():
                run()  # warm-up, not counted
            for _ in range(runs):
                samples["exec baseline"].append(baseline(bench))
                for name, run in contenders.items():
                    samples[name].append(run())
            base = statistics.median(samples.pop("exec baseline"))
            medians = {name: statistics.median(v) - base for name, v in samples.items()}
            rows.append({"extras": extras, "runs": runs, "baseline_ms": base, **medians})
            bench.stop_daemons()
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    names = [k for k in rows[0] if k not in ("extras", "runs", "baseline_ms")]
    lines = [
        "| secondary macvlans | "
        + " | ".join(f"{n} (ms)" for n in names)
        + " | plexus/multus | plexus over raw default |",
        "|---" * (len(names) + 3) + "|",
    ]
    for row in rows:
        cells = [f"{row[n]:.1f}" for n in names]
        ratio = (
            f"{row['plexus shim+daemon'] / row['multus thin']:.2f}x"
            if "multus thin" in row
            else "n/a"
        )
        overhead = f"{row['plexus shim+daemon'] - row['raw default only']:+.1f} ms"
        lines.append(f"| {row['extras']} | " + " | ".join(cells) + f" | {ratio} | {overhead} |")
    return "\n".join(lines)


def main() -> None:
    args = arguments(__doc__)
    rows = measure(args.runs, args.extras)
    print(render(rows))
    print(
        f"\nmedians of {args.runs} runs; `ip netns exec` baseline "
        f"({rows[0]['baseline_ms']:.1f} ms) subtracted\n"
    )
    for name, value in shim_round_trip(args.runs).items():
        print(f"- {name}: {value:.1f}")


if __name__ == "__main__":
    main()
