"""Can one structured-output request stall `conductor serve`?  Measured, printed as numbers.

Run:  python benchmarks/perf/serve_stall.py [--attacks NAME,...] [--window-s 400]
      [--src DIR]   (the server's source tree, e.g. an older checkout's ``src``)

The fake provider runs in a child process and `conductor serve` is the real CLI in
another (``--no-cache``).  For each attack, one request is sent to ``single:w0`` with a
JSON schema whose worker's reply (scripted on the fake provider) is expensive to check,
while ``GET /health`` is probed every 0.1 s (each probe given 1 s).  Printed per attack:
the request's status and time, the probes' latency (max, p99; a probe that got no answer
within 1 s counts as 1 s and as failed), the longest time ``/health`` went unanswered,
and the CPU seconds the server (its checker processes included) spent on the request.

The two attacks of issue 37:

- ``unique``: ``uniqueItems`` over a reply of 6,000 distinct objects (a pairwise check is
  18 million comparisons);
- ``enum``: an ``enum`` of 10,000 numbers over a reply of 3,000 items, the client giving
  up after 5 s (the server should stop working for it).

and variants that stay inside the schema limits, so that they reach the reply check:
``enum1k`` (1,000 numbers over 30,000 items), ``patterns`` (9 catastrophic
``patternProperties`` against 400 keys, each match stopped only by its 50 ms time-out),
``fanout`` (``anyOf`` whose first branch fails after following a ``$ref`` that the
second follows again, 24 levels deep: 2^24 walks of a 10-character string), and
``plain``, the same kind of request without a schema (what any request costs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: How long a probe of ``/health`` may take before it counts as failed.
PROBE_TIMEOUT_S = 1.0
PROBE_EVERY_S = 0.1


@dataclass(frozen=True)
class Attack:
    name: str
    schema: dict[str, Any]
    reply: str
    client_timeout_s: float = 600.0


def attacks() -> dict[str, Attack]:
    def array_of(items: dict[str, Any], **more: Any) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {"v": {"type": "array", "items": items, **more}},
            "required": ["v"],
        }

    unique = json.dumps({"v": [{"i": k, "name": f"item {k}"} for k in range(6000)]})
    fan: dict[str, Any] = {"$defs": {"l24": {"type": "string"}}}
    for level in range(23, -1, -1):
        ref = {"$ref": f"#/$defs/l{level + 1}"}
        fan["$defs"][f"l{level}"] = {"anyOf": [{**ref, "minLength": 99}, ref]}
    fan.update({"type": "object", "properties": {"v": {"$ref": "#/$defs/l0"}}})
    keys = {f"{'a' * 28}{k}!": k for k in range(400)}
    return {
        a.name: a
        for a in (
            Attack("unique", array_of({"type": "object"}, uniqueItems=True), unique),
            Attack(
                "enum",
                array_of({"enum": list(range(10_000))}),
                json.dumps({"v": [9999] * 3000}),
                client_timeout_s=5.0,
            ),
            Attack(
                "enum1k",
                array_of({"enum": list(range(1000))}),
                json.dumps({"v": [999] * 30_000}),
                client_timeout_s=5.0,
            ),
            Attack(
                "patterns",
                {
                    "type": "object",
                    "patternProperties": {
                        f"^(a|aa)+{c}$": {"type": "integer"} for c in "bcdefghij"
                    },
                },
                json.dumps(keys),
            ),
            Attack("fanout", fan, json.dumps({"v": "x" * 10})),
            Attack("plain", {}, unique),
        )
    }


def fake_provider(queue: multiprocessing.Queue, reply: str, stop: Event) -> None:  # type: ignore[type-arg]
    from conductor.testing import FakeLLMServer

    with FakeLLMServer() as server:
        server.script("w0", lambda request: reply)
        queue.put(server.openai_base)
        stop.wait()


def pool_text(base: str) -> str:
    common = f"client: openai, api_base: {base}, max_retries: 0, timeout_s: 600"
    free = "price: {input_per_mtok: 0, output_per_mtok: 0}"
    return (
        "name: stall\n"
        f"workers:\n  - {{id: w0, model: w0, {common}, {free}}}\n"
        f"conductor: {{backend: endpoint, model: conductor, {common}, {free}}}\n"
    )


def cpu_tree_s(pid: int) -> float:
    """User + system CPU seconds of ``pid``, its reaped children and its live ones."""
    tick = os.sysconf("SC_CLK_TCK")

    def fields(p: int | str) -> list[str]:
        return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()

    own = fields(pid)
    total = sum(int(own[i]) for i in (11, 12, 13, 14))
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == pid:
            continue
        try:
            f = fields(entry)
        except OSError:
            continue
        if int(f[1]) == pid:  # its parent is the server
            total += int(f[11]) + int(f[12])
    return total / tick


class Server:
    def __init__(self, pool: Path, src: str | None) -> None:
        env = dict(os.environ)
        if src:
            env["PYTHONPATH"] = src
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conductor", "serve", "--pool", str(pool), "--port", "0",
             "--no-cache"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )  # fmt: skip
        self.url = ""
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                m = re.search(r"http://\S+/v1", line)
                if m and not self.url:
                    self.url = m.group(0)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(120)
        if not self.url:
            self.close()
            raise SystemExit("conductor serve did not start")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_attack(attack: Attack, src: str | None, window_s: float) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    queue, stop = ctx.Queue(), ctx.Event()
    provider = ctx.Process(target=fake_provider, args=(queue, attack.reply, stop), daemon=True)
    provider.start()
    try:
        base = queue.get(timeout=60)
        with tempfile.TemporaryDirectory() as tmp:
            pool = Path(tmp) / "pool.yaml"
            pool.write_text(pool_text(base))
            server = Server(pool, src)
            try:
                return measure(attack, server, window_s)
            finally:
                server.close()
    finally:
        stop.set()
        provider.join(10)


def measure(attack: Attack, server: Server, window_s: float) -> dict[str, Any]:
    root = server.url.removesuffix("/v1")
    with httpx.Client() as probe:  # warm: the first requests pay for imports
        for _ in range(3):
            probe.get(f"{root}/health", timeout=30)
    time.sleep(1.0)
    cpu0 = cpu_tree_s(server.proc.pid)
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def send() -> None:
        body: dict[str, Any] = {
            "model": "single:w0",
            "messages": [{"role": "user", "content": "Give the list."}],
        }
        if attack.schema:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "A", "schema": attack.schema},
            }
        t0 = time.monotonic()
        try:
            resp = httpx.post(f"{server.url}/chat/completions", json=body,
                              timeout=attack.client_timeout_s)  # fmt: skip
            outcome["status"] = resp.status_code
            message = resp.json().get("error", {}).get("message") if resp.status_code != 200 else ""
            outcome["message"] = (message or "")[:200]
        except httpx.TimeoutException:
            outcome["status"] = "client left"
        except httpx.HTTPError:  # the server was stopped at the end of the window
            outcome["status"] = "no answer"
        outcome["request_s"] = round(time.monotonic() - t0, 2)
        done.set()

    latencies: list[float] = []
    failed = 0
    longest_gap = 0.0
    last_ok = time.monotonic()
    start = time.monotonic()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    ok_after_done = 0
    with httpx.Client() as probe:
        while time.monotonic() - start < window_s:
            t0 = time.monotonic()
            try:
                probe.get(f"{root}/health", timeout=PROBE_TIMEOUT_S).raise_for_status()
                latencies.append(time.monotonic() - t0)
                longest_gap = max(longest_gap, time.monotonic() - last_ok)
                last_ok = time.monotonic()
                if done.is_set():
                    ok_after_done += 1
                    if ok_after_done >= 10:
                        break
            except httpx.HTTPError:
                latencies.append(PROBE_TIMEOUT_S)
                failed += 1
            time.sleep(max(0.0, PROBE_EVERY_S - (time.monotonic() - t0)))
    longest_gap = max(longest_gap, time.monotonic() - last_ok)
    cpu = cpu_tree_s(server.proc.pid) - cpu0
    ordered = sorted(latencies)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {
        "attack": attack.name,
        **outcome,
        "window_s": round(time.monotonic() - start, 1),
        "probes": len(latencies),
        "failed": failed,
        "max_ms": round(max(latencies) * 1000, 1),
        "p99_ms": round(p99 * 1000, 1),
        "median_ms": round(statistics.median(latencies) * 1000, 1),
        "unanswered_s": round(longest_gap, 2),
        "server_cpu_s": round(cpu, 2),
    }


#: What a probe of /health may take while an attack runs (issue 37: half a second).
PROBE_BOUND_MS = 500.0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--attacks", default="plain,unique,enum,enum1k,patterns,fanout")
    parser.add_argument("--window-s", type=float, default=400.0)
    parser.add_argument("--src", default=None, help="PYTHONPATH for the server")
    parser.add_argument(
        "--smoke", action="store_true", help="CI: the issue's two attacks, a short window"
    )
    args = parser.parse_args()
    if args.smoke:
        args.attacks, args.window_s = "unique,enum", 60.0
    table = attacks()
    ok = True
    for name in args.attacks.split(","):
        result = run_attack(table[name], args.src, args.window_s)
        print(json.dumps(result), flush=True)
        if name != "plain":
            held = result["failed"] == 0 and result["max_ms"] <= PROBE_BOUND_MS
            ok = ok and held
            verdict = "PASS" if held else "FAIL"
            print(
                f"judged: /health answered every probe within {PROBE_BOUND_MS:.0f} ms "
                f"while {name} ran (max {result['max_ms']} ms, load "
                f"{os.getloadavg()[0]:.1f}): {verdict}",
                flush=True,
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
