"""Run by the Python of an MLflow installation (not by the tests' own): prints, as JSON,
every trace an MLflow tracking server at ``argv[1]`` stored in experiment ``argv[2]``,
span by span as MLflow gives them back (names, ids, parents, times, status, attributes,
events and links)."""

from __future__ import annotations

import json
import sys

from mlflow import MlflowClient


def main() -> None:
    client = MlflowClient(sys.argv[1])
    out = []
    for trace in client.search_traces(locations=[sys.argv[2]], max_results=500):
        spans = []
        for s in trace.data.spans:
            spans.append(
                {
                    "name": s.name,
                    "span_id": s.span_id,
                    "parent_id": s.parent_id,
                    "start_ns": s.start_time_ns,
                    "end_ns": s.end_time_ns,
                    "status": str(s.status.status_code).rsplit(".", 1)[-1],
                    "attributes": dict(s.attributes),
                    "events": [
                        {"name": e.name, "timestamp": e.timestamp, "attributes": dict(e.attributes)}
                        for e in s.events
                    ],
                    "links": [
                        {"span_id": link.span_id, "attributes": dict(link.attributes or {})}
                        for link in (getattr(s, "links", None) or [])
                    ],
                }
            )
        out.append({"trace_id": trace.info.trace_id, "spans": spans})
    json.dump(out, sys.stdout, default=str)


if __name__ == "__main__":
    main()
