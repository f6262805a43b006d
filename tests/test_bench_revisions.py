"""Pinned dataset revisions: the shipped pins have the form of Hub commits, and a
revision the Hub does not have is one clear error (checked against local fakes of the
hub and datasets libraries: these tests never reach the network)."""

from __future__ import annotations

import re
from typing import Any

import datasets
import httpx
import huggingface_hub
import pytest
from datasets.exceptions import DatasetNotFoundError
from huggingface_hub.errors import RevisionNotFoundError

from conductor.bench.spec import load_benchmark
from conductor.datasets import sources
from conductor.datasets.samples import iter_samples
from conductor.datasets.sources import DatasetError

_COMMIT = re.compile(r"[0-9a-f]{40}")
# The GitHub repository's commit that was once pinned for GPQA: not a Hub revision.
_GITHUB_GPQA_COMMIT = "56686c06f5e19865c153de0fdb11be3890014df7"


def _revision_not_found(url: str) -> RevisionNotFoundError:
    response = httpx.Response(404, request=httpx.Request("GET", url))
    return RevisionNotFoundError("404 Client Error: Revision Not Found", response=response)


@pytest.mark.parametrize(
    ("benchmark", "repo"),
    [
        ("gpqa-diamond", "Idavidrein/gpqa"),
        ("livecodebench", "livecodebench/code_generation_lite"),
        ("math500", "HuggingFaceH4/MATH-500"),
    ],
)
def test_shipped_sources_are_pinned_to_hub_commits(benchmark: str, repo: str) -> None:
    spec = load_benchmark(benchmark)
    pinned = [spec.source] + ([spec.train_source] if spec.train_source else [])
    for source in pinned:
        assert source.revision is not None and _COMMIT.fullmatch(source.revision), (
            benchmark,
            source.id,
            source.revision,
        )
    assert spec.source.id == repo
    assert spec.source.revision != _GITHUB_GPQA_COMMIT


def test_a_revision_the_hub_lacks_is_one_error_naming_dataset_revision_and_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = load_benchmark("gpqa-diamond")
    calls: list[dict[str, Any]] = []

    def fake_load_dataset(path: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        # What datasets 4 raises: its own error, raised from the hub library's.
        try:
            raise _revision_not_found(f"https://huggingface.co/api/datasets/{path}")
        except RevisionNotFoundError as exc:
            raise DatasetNotFoundError(
                f"Revision '{kwargs['revision']}' doesn't exist for dataset '{path}' on the Hub."
            ) from exc

    monkeypatch.setattr(sources, "_hub_unreachable", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    with pytest.raises(DatasetError) as info:
        list(iter_samples(spec))
    message = str(info.value)
    assert calls and calls[0]["revision"] == spec.source.revision
    assert message.startswith("cannot load Idavidrein/gpqa: the Hugging Face Hub has no revision")
    assert repr(spec.source.revision) in message
    assert "set source.revision in the benchmark file (gpqa-diamond)" in message
    assert "--data FILE" in message


def test_other_load_failures_keep_their_own_message(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = load_benchmark("gpqa-diamond")

    def fake_load_dataset(*args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the network is down")

    monkeypatch.setattr(sources, "_hub_unreachable", lambda: None)
    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    with pytest.raises(DatasetError, match="ConnectionError: the network is down") as info:
        list(iter_samples(spec))
    assert "has no revision" not in str(info.value)


def test_a_livecodebench_revision_the_hub_lacks_is_the_same_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = load_benchmark("livecodebench")

    def fake_download(repo_id: str, filename: str, **kwargs: Any) -> str:
        raise _revision_not_found(f"https://huggingface.co/datasets/{repo_id}/{filename}")

    monkeypatch.setattr(sources, "_hub_unreachable", lambda: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    with pytest.raises(DatasetError) as info:
        list(iter_samples(spec))
    message = str(info.value)
    assert "cannot load livecodebench/code_generation_lite: the Hugging Face Hub has no" in message
    assert repr(spec.source.revision) in message
    assert "set source.revision in the benchmark file (livecodebench)" in message
