"""A record as text for other tools: a Mermaid flowchart and escaped, indented JSON."""

from __future__ import annotations

import re

from ..record import RunRecord, record_to_dict
from ..redact import masked_json
from ..shapes import round_plan, topology_kind
from .format import EXCERPT, one_line, shown

_MERMAID_ENTITIES = {
    "#": "#35;",
    '"': "#quot;",
    "[": "#91;",
    "]": "#93;",
    "{": "#123;",
    "}": "#125;",
    "<": "#lt;",
    ">": "#gt;",
    "|": "#124;",
    "`": "#96;",
}
_MERMAID_RE = re.compile("|".join(re.escape(c) for c in _MERMAID_ENTITIES))


def _mermaid_text(text: str, limit: int = EXCERPT) -> str:
    """Text safe inside a quoted Mermaid label (one line, entity-escaped)."""
    flat = one_line(text, limit)
    return _MERMAID_RE.sub(lambda m: _MERMAID_ENTITIES[m.group(0)], flat)


def to_mermaid(record: RunRecord) -> str:
    """A Mermaid ``flowchart TD`` of the run: rounds as subgraphs, steps as nodes."""
    record = shown(record)
    lines = ["flowchart TD", f'  Q["Question: {_mermaid_text(record.question)}"]']
    prev_last: str | None = None  # the node holding the previous round's answer
    for pos, rnd in enumerate(record.rounds, 1):
        kind = topology_kind(rnd)
        plan = round_plan(rnd, record.pool)
        lines.append(f'  subgraph R{pos}["Round {pos}: {_mermaid_text(kind)}"]')
        if not plan:
            lines.append(f'    K{pos}["{_mermaid_text(kind)}"]')
            lines.append("  end")
            if prev_last is not None:
                lines.append(f"  {prev_last} -.-> K{pos}")
            continue
        for p in plan:
            label = f"S{pos}.{p.index}: {p.worker_id}"
            lines.append(
                f'    S{pos}.{p.index}["{_mermaid_text(label)}<br/>{_mermaid_text(p.subtask)}"]'
            )
        lines.append("  end")
        for p in plan:
            if not p.visible:
                lines.append(f"  Q --> S{pos}.{p.index}")
            for j in p.visible:
                lines.append(f"  S{pos}.{j} --> S{pos}.{p.index}")
        if prev_last is not None:
            lines.append(f"  {prev_last} -.->|previous answer| R{pos}")
        # The answer of a round is its last step that produced something.
        ok = [p for p in plan if p.status == "ok"]
        prev_last = f"S{pos}.{(ok or plan)[-1].index}"
    answer = record.final_answer if record.status != "failed" else f"failed: {record.error}"
    lines.append(f'  A(["Answer: {_mermaid_text(answer or "(empty)", 80)}"])')
    if prev_last is not None:
        lines.append(f"  {prev_last} --> A")
    return "\n".join(lines) + "\n"


def to_json(record: RunRecord) -> str:
    """The record as indented JSON (the format ``--out`` writes).

    JSON already escapes the C0 controls; DEL, the C1 controls and the bidirectional
    overrides are escaped too (``\\u009b``), so printing it cannot drive a terminal.
    """
    # Masked as data, so that a number holding a secret becomes a string, not bad JSON.
    text = masked_json(record_to_dict(record), indent=2, ensure_ascii=False)
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


_JSON_UNSAFE = re.compile(r"[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
