"""A learned router against its parts, on the shipped smoke-route questions.

Run:  python benchmarks/route/router_demo.py [--smoke] [--embedded]

**Fake complementary pool** (default; on the fake providers, real HTTP): three workers
whose strengths differ by kind of question, each right or wrong by a fixed hash of the
question, so every run is the same:

- ``mathy`` (cheap): right on 95% of the sums, times tables, units, comparisons and
  Python, 10% of the rest;
- ``wordy`` (mid-priced): right on 95% of the capitals, opposites and facts, 30% of the
  rest;
- ``big`` (dear): right on 75% of everything;

and a Conductor (an endpoint of its own) that always gives the question to ``big``.
``bench smoke-route`` runs each worker alone and the Conductor; ``conductor fit-router``
fits a router on them (its default split: 30% of the questions held out), once routing
among the workers with the Conductor as a cascade's fallback; then ``bench --strategy
router:DIR --exclude-trained`` runs the router live on the held-out questions.  Judged
lines (exit 1 when one fails):

1. the router beats the best single worker on the held-out questions, paired
   sign-flip test p < 0.05;
2. the live router run on the held-out questions scores what the fit measured from the
   recorded runs (routing calls nothing, so the two must agree);
3. routing takes under 50 ms a question (the hashed features);
4. a router on the embedded SmolLM2's hidden states (``--features gguf-mean-v1``, one
   forward pass of the small model a question) beats the best single worker too, p <
   0.05 (its routing time is printed, not judged: it is a model's forward pass on
   whatever cores the machine has free).

**Embedded pool** (``--embedded``): the same, on the embedded SmolLM2-135M pool (its
three roles, about two minutes for the singles on two cores; the Conductor about eight
more), judged on nothing: its figures are printed, router against best single against
the per-question oracle, to show how far apart the roles are, with both featurizers.

``--smoke`` is what CI runs: the fake pool only (about a minute).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = REPO / "benchmarks" / "smoke-route.jsonl"
#: The most routing may take a question (features, head and decision).
ROUTE_MS = 50.0
NUMERIC = ("arithmetic", "times", "units", "compare", "python")
#: Each worker's chance of a right answer: on its own kinds, on the others.
SKILL: dict[str, tuple[tuple[str, ...], float, float]] = {
    "mathy": (NUMERIC, 0.95, 0.10),
    "wordy": (("capitals", "opposites", "facts"), 0.95, 0.30),
    "big": ((), 0.75, 0.75),
}
PRICES = {"mathy": (0.1, 0.4), "wordy": (1.0, 4.0), "big": (10.0, 40.0), "conductor": (1.0, 4.0)}
_ASKED = re.compile(r"Question: (.+?)\s*$", re.DOTALL)


def _rows() -> dict[str, dict[str, Any]]:
    rows = [json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines()]
    return {r["question"]: r for r in rows}


def _right(worker: str, question: str, chance: float) -> bool:
    digest = hashlib.sha256(f"{worker}\n{question}".encode()).digest()
    return int.from_bytes(digest[:8], "big") < chance * 2**64


def _responder(worker: str, rows: dict[str, dict[str, Any]]) -> Any:
    kinds, good, other = SKILL[worker]

    def answer(request: Any) -> str:
        # The question is in the prompt wherever the strategy put it (alone, or in a
        # Conductor's step message among the instructions).
        text = "\n".join(str(m.get("content") or "") for m in request.messages)
        found = _ASKED.search(text)
        row = rows.get(found.group(1).strip()) if found else None
        if row is None:
            row = next((r for q, r in rows.items() if q in text), None)
        if row is None:
            return "ANSWER: unknown"
        chance = good if row["category"] in kinds or not kinds else other
        right = _right(worker, row["question"], chance)
        return f"ANSWER: {row['answer'].split(' | ')[0] if right else 'unsure'}"

    return answer


def _pool(path: Path, server: Any) -> None:
    def price(name: str) -> str:
        i, o = PRICES[name]
        return f"{{input_per_mtok: {i}, output_per_mtok: {o}}}"

    bases = {"openai": server.openai_base, "anthropic": server.anthropic_base}
    lines = ["name: complementary", "defaults: {max_tokens: 64}", "workers:"]
    for wid, client in (("mathy", "openai"), ("wordy", "anthropic"), ("big", "openai")):
        lines.append(
            f"  - {{id: {wid}, model: {wid}, client: {client}, api_base: '{bases[client]}', "
            f"price: {price(wid)}}}"
        )
    lines.append(
        f"conductor: {{backend: endpoint, model: conductor, client: openai, "
        f"api_base: '{server.openai_base}', price: {price('conductor')}}}"
    )
    path.write_text("\n".join(lines) + "\n")


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conductor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        check=False,
    )


def _must(done: subprocess.CompletedProcess[str], what: str) -> None:
    if done.returncode != 0:
        print(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        sys.exit(1)


def _table(fit: dict[str, Any], title: str) -> None:
    print(f"\n{title}: {fit['heldout_questions']} held-out questions "
          f"({fit['train_questions']} fitted on, in {fit['fit_seconds']:.2f} s; "
          f"routing {fit['route_ms']:.2f} ms a question)")  # fmt: skip
    print(f"  {'policy':<26}{'accuracy':>9}  {'95% CI':>15}  {'USD/question':>13}  routed to")
    for p in fit["policies"]:
        name = p["name"] + (" (best single)" if p["name"] == fit["best_single"] else "")
        routed = ", ".join(f"{a} {n}" for a, n in (p["routed"] or {}).items() if n)
        print(
            f"  {name:<26}{100 * p['accuracy']:>8.1f}%  "
            f"{100 * p['low']:>6.1f}%-{100 * p['high']:>5.1f}%  {p['cost_usd']:>13.6f}  {routed}"
        )
    for key in ("versus_best_single", "versus_fallback"):
        c = fit.get(key)
        if c:
            print(
                f"  vs {c['against']}: {100 * c['difference']:+.1f} points "
                f"(95% CI {100 * c['low']:+.1f} to {100 * c['high']:+.1f}), p = {c['p_value']:.4f}"
            )
    for f in fit["frontier"]:
        print(
            f"  cost weight {f['cost_weight']:>10.4g}: "
            f"{100 * f['accuracy']:.1f}% at ${f['cost_usd']:.6f}"
        )


def _fit(out: Path, runs: list[str], title: str, env: dict[str, str], *extra: str) -> Any:
    """``conductor fit-router RUNS --out OUT --json EXTRA``'s figures, printed under
    ``title``."""
    done = _cli("fit-router", *runs, "--out", str(out), "--json", *extra, env=env)
    _must(done, f"fit-router ({out.name})")
    fit = json.loads(done.stdout)
    _table(fit, title)
    return fit


def _beats_best(fit: dict[str, Any]) -> tuple[bool, str]:
    """Whether the router beat the best single arm, paired test p < 0.05, and the line
    that says by how much."""
    vs = fit["versus_best_single"]
    ok = vs["difference"] > 0 and vs["p_value"] < 0.05
    said = (
        f"{100 * vs['difference']:+.1f} points over {vs['against']}, "
        f"p = {vs['p_value']:.4f} (< 0.05)"
    )
    return ok, said


def _accuracy(run: Path) -> tuple[float, int]:
    records = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines() if x]
    scores = [float((r.get("grade") or {}).get("score") or 0.0) for r in records]
    return (sum(scores) / len(scores) if scores else 0.0), len(scores)


def fake_pool(tmp: Path) -> int:
    from conductor.testing import FakeLLMServer

    rows = _rows()
    failures = 0
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp / "cache")}
    with FakeLLMServer() as server:
        for wid in SKILL:
            server.script(wid, _responder(wid, rows))
        plan = (
            'One step.\nmodel_id = [2]\nsubtasks = ["Answer the question."]\naccess_list = [[]]\n'
        )
        server.script("conductor", plan)
        _pool(tmp / "pool.yaml", server)
        bench = ["bench", "smoke-route", "--pool", str(tmp / "pool.yaml")]
        t0 = time.perf_counter()
        _must(
            _cli(*bench, "--strategy", "singles", "--out", str(tmp / "singles"), env=env), "singles"
        )
        _must(_cli(*bench, "--out", str(tmp / "conductor"), env=env), "the Conductor's run")
        print(
            f"singles and the Conductor on {len(rows)} questions "
            f"in {time.perf_counter() - t0:.1f} s"
        )

        singles = [str(tmp / "singles")]
        fit = _fit(tmp / "router", singles, "router among the three workers", env)
        _fit(tmp / "cascade", [*singles, str(tmp / "conductor")],
             "the workers and the Conductor, the Conductor as the cascade's fallback", env,
             "--fallback", "conductor")  # fmt: skip

        ok, said = _beats_best(fit)
        failures += not ok
        print(f"\n[1] router {said}  {'PASS' if ok else 'FAIL'}")
        live = tmp / "live"
        # A cache of its own: every held-out question is asked again, of its arm.
        fresh = {**env, "CONDUCTOR_CACHE_DIR": str(tmp / "cache2")}
        router = f"router:{tmp / 'router'}"
        done = _cli(
            *bench, "--strategy", router, "--exclude-trained", "--out", str(live), env=fresh
        )
        _must(done, "the live router run")
        acc, n = _accuracy(live)
        fitted = next(p["accuracy"] for p in fit["policies"] if p["name"] == "router")
        ok = n == fit["heldout_questions"] and abs(acc - fitted) < 1e-9
        failures += not ok
        print(
            f"[2] live router on the {n} held-out questions: {100 * acc:.1f}%, the fit measured "
            f"{100 * fitted:.1f}%  {'PASS' if ok else 'FAIL'}"
        )
        ok = fit["route_ms"] < ROUTE_MS
        failures += not ok
        print(
            f"[3] routing {fit['route_ms']:.2f} ms a question (< {ROUTE_MS:g})  "
            f"{'PASS' if ok else 'FAIL'}"
        )
        hidden = _fit(tmp / "router-hidden", singles,
                      "router among the three workers on SmolLM2's hidden states", env,
                      "--features", "gguf-mean-v1")  # fmt: skip
        ok, said = _beats_best(hidden)
        failures += not ok
        print(
            f"\n[4] router on hidden states {said}; routing {hidden['route_ms']:.1f} ms a "
            f"question  {'PASS' if ok else 'FAIL'}"
        )
    return failures


def embedded(tmp: Path) -> None:
    env = {**os.environ, "CONDUCTOR_CACHE_DIR": str(tmp / "cache-local")}
    t0 = time.perf_counter()
    _must(_cli("bench", "smoke-route", "--strategy", "singles", "--out", str(tmp / "local-singles"),
               env=env), "the embedded singles")  # fmt: skip
    print(f"\nembedded singles in {time.perf_counter() - t0:.0f} s")
    t0 = time.perf_counter()
    _must(_cli("bench", "smoke-route", "--out", str(tmp / "local-conductor"), env=env),
          "the embedded Conductor")  # fmt: skip
    print(f"embedded Conductor in {time.perf_counter() - t0:.0f} s")
    runs = [str(tmp / "local-singles"), str(tmp / "local-conductor")]
    for features in ("hashed-ngrams-v1", "gguf-mean-v1"):
        _fit(tmp / f"local-router-{features}", runs,
             f"embedded pool: its three roles and its Conductor (cascade fallback), {features}",
             env, "--fallback", "conductor", "--features", features)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="the fake pool only (for CI)")
    parser.add_argument("--embedded", action="store_true", help="also the embedded pool")
    parser.add_argument("--keep", type=Path, help="keep the runs and routers in this directory")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = args.keep or Path(tmp_s)
        tmp.mkdir(parents=True, exist_ok=True)
        failures = fake_pool(tmp)
        if args.embedded and not args.smoke:
            embedded(tmp)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
