"""The router's parts in process: features, head, split, fit and measures, and the router
directory as a hostile author may have written it."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")

from conductor.errors import UsageError  # noqa: E402
from conductor.router import (  # noqa: E402
    FitSettings,
    RouterFileError,
    RouterFit,
    RoutingData,
    fit_router,
    held_out,
    load_router,
    save_router,
)
from conductor.router.features import HashedNgrams, featurizer_from  # noqa: E402
from conductor.router.head import fit_head  # noqa: E402

KINDS = (
    "What is {a} * {b}?",
    "What is the capital of {c}?",
    "Convert {a} km to metres.",
    "Is {a} an even number?",
)
COUNTRIES = ("France", "Peru", "Japan", "Kenya", "Chile", "Norway", "Egypt", "India")


def complementary(
    n: int, seed: int = 0, costs: tuple[float, ...] = (0.001, 0.002, 0.0005)
) -> RoutingData:
    """Arm a is right 90% of the time on arithmetic and units and 30% on the rest, arm b
    the other way round, arm c 55% everywhere: no arm alone passes about 60%, the
    right arm for each kind about 90%."""
    rng = np.random.default_rng(seed)
    prompts, scores = [], []
    for i in range(n):
        kind = i % 4
        q = KINDS[kind].format(a=rng.integers(2, 99), b=rng.integers(2, 99), c=COUNTRIES[i % 8])
        prompts.append(f"Answer briefly. Question: {q} (item {i})")
        good_a = kind in (0, 2)
        scores.append(
            [
                rng.random() < (0.9 if good_a else 0.3),
                rng.random() < (0.3 if good_a else 0.9),
                rng.random() < 0.55,
            ]
        )
    keys = tuple(hashlib.sha256(p.encode()).hexdigest() for p in prompts)
    return RoutingData(
        arms=("single:a", "single:b", "single:c"),
        benchmarks=("synthetic",) * n,
        sample_ids=tuple(str(i) for i in range(n)),
        prompts=tuple(prompts),
        keys=keys,
        scores=np.asarray(scores, dtype=float),
        costs=np.tile(np.asarray(costs), (n, 1)),
        unpriced=(),
        sources=("runs/x",),
        pool_sha256=("f" * 64,),
        dropped=0,
    )


# -- features ---------------------------------------------------------------------------


@pytest.mark.process
def test_hashed_features_are_the_same_in_another_process() -> None:
    text = "What is the capital of Peru? Answer in one word."
    here = HashedNgrams(dim=256).row(text)
    code = (
        "import json,sys; from conductor.router.features import HashedNgrams;"
        "print(json.dumps(HashedNgrams(dim=256).row(sys.argv[1])))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code, text], capture_output=True, text=True, env=env, check=True
    )
    there = {int(k): v for k, v in json.loads(out.stdout).items()}
    assert here == there
    assert abs(sum(v * v for v in here.values()) - 1.0) < 1e-9


def test_questions_of_one_kind_are_closer_than_questions_of_two() -> None:
    f = HashedNgrams(dim=4096)
    x = f.transform(["What is 12 * 7?", "What is 91 * 3?", "What is the capital of Chile?", ""])
    assert x[0] @ x[1] > x[0] @ x[2] + 0.1
    assert not x[3].any()  # the empty question is a row of zeros, not NaN


def test_what_every_training_question_shares_weighs_nothing_once_learned() -> None:
    wrapper = 'Answer the question. End with a line "ANSWER: <answer>".\n\nQuestion: {}'
    asked = [
        "Multiply 12 by 7.",
        "Multiply 91 by 3.",
        "Name Chile's capital.",
        "Name Peru's capital.",
    ]
    texts = [wrapper.format(q) for q in asked]
    plain = HashedNgrams(dim=4096)
    rows = plain.transform(texts)
    learned, weighted = plain.learned(rows, [0, 1, 2, 3])
    assert learned.settings()["idf"] == list(learned.idf)  # type: ignore[attr-defined]
    # The shared instructions made every pair alike; weighted, only the questions count.
    assert rows[0] @ rows[2] > 0.5
    assert weighted[0] @ weighted[2] < 0.1 < weighted[0] @ weighted[1]
    # transform() with the learned weights gives the rows the fit saw, a new one alike.
    assert np.allclose(learned.transform(texts), weighted)
    alone = learned.transform([wrapper.format("Multiply 5 by 6.")])[0]
    assert np.isclose(np.linalg.norm(alone), 1.0) and alone @ weighted[0] > alone @ weighted[2]
    assert featurizer_from("hashed-ngrams-v1", learned.settings()) == learned


def test_a_huge_question_is_read_by_its_two_ends() -> None:
    from conductor.router.features import READ_CHARS

    f = HashedNgrams(dim=1024)
    huge = "What is the capital of Peru? " + "blah " * 200_000 + "Answer in one word."
    half = READ_CHARS // 2
    clipped = f"{huge[:half]} {huge[-half:]}"
    assert f.row(huge) == f.row(clipped)
    assert f.row(huge) != f.row("blah " * 20)


@pytest.mark.parametrize("dim", [0, 8, 2**21, "64", True, 12.5])
def test_a_featurizer_setting_out_of_range_is_refused(dim: object) -> None:
    with pytest.raises(UsageError, match="dim must be"):
        featurizer_from("hashed-ngrams-v1", {"dim": dim})


def test_an_unknown_featurizer_is_named_with_the_known_ones() -> None:
    with pytest.raises(UsageError, match="no featurizer 'bert'.*hashed-ngrams-v1"):
        featurizer_from("bert")


# -- head and split ---------------------------------------------------------------------


def test_the_head_learns_which_arm_answers_which_kind() -> None:
    data = complementary(200)
    x = HashedNgrams().transform(data.prompts)
    head = fit_head(x, data.scores)
    test = complementary(40, seed=7)
    chances = head.predict(HashedNgrams().transform(test.prompts))
    kinds = np.arange(40) % 4
    a_better = chances[:, 0] > chances[:, 1]
    assert a_better[np.isin(kinds, (0, 2))].mean() > 0.9
    assert (~a_better)[np.isin(kinds, (1, 3))].mean() > 0.9


def test_features_that_say_nothing_leave_each_arm_at_its_accuracy() -> None:
    # Every question the same text: the head can only learn the arms' overall rates.
    rng = np.random.default_rng(3)
    scores = np.column_stack([rng.random(120) < 0.7, rng.random(120) < 0.4]).astype(float)
    x = HashedNgrams().transform(["the same question"] * 120)
    head = fit_head(x, scores)
    chances = head.predict(x[:1])[0]
    assert chances == pytest.approx(scores.mean(axis=0), abs=0.02)


def test_the_split_is_by_question_and_stable() -> None:
    keys = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(2000)]
    held = [held_out(k, 0.3, 0) for k in keys]
    assert 0.26 < sum(held) / len(held) < 0.34
    assert held == [held_out(k, 0.3, 0) for k in reversed(keys)][::-1]  # order does not matter
    assert held != [held_out(k, 0.3, 1) for k in keys]  # the seed does


# -- fit and measures -------------------------------------------------------------------


# Fitted once per module: a fit is a second of numpy, and the tests only read it.
@pytest.fixture(scope="module")
def fit400() -> RouterFit:
    return fit_router(complementary(400))


def test_the_router_beats_the_best_single_arm_on_held_out_questions(fit400: RouterFit) -> None:
    fit = fit400
    by = {p.name: p for p in fit.policies}
    assert set(by) == {"single:a", "single:b", "single:c", "router", "oracle"}
    best = by[fit.best_single]
    assert by["router"].accuracy > best.accuracy + 0.15
    assert by["oracle"].accuracy >= by["router"].accuracy
    for p in fit.policies:
        assert p.low <= p.accuracy <= p.high
    vs = fit.versus_best
    assert vs is not None and vs.against == fit.best_single
    assert vs.low > 0 and vs.p_value < 0.01
    assert vs.router_only > vs.other_only
    assert sum((by["router"].routed or {}).values()) == len(fit.heldout_rows)
    assert not set(fit.train_rows) & set(fit.heldout_rows)
    assert fit.route_seconds < 0.05


def test_the_best_single_arm_is_chosen_on_the_training_questions(fit400: RouterFit) -> None:
    data, fit = fit400.data, fit400
    train_acc = data.scores[list(fit.train_rows)].mean(axis=0)
    assert fit.best_single == data.arms[int(np.argmax(train_acc))]


def test_a_cost_weight_trades_accuracy_for_cost_along_the_frontier(fit400: RouterFit) -> None:
    fit = fit400
    costs = [p.cost_usd for p in fit.frontier]
    assert costs == sorted(costs, reverse=True)  # dearer weight, cheaper routes
    assert fit.frontier[0].cost_weight == 0
    assert fit.frontier[-1].cost_usd == pytest.approx(0.0005)  # all to the cheapest arm
    cheap = fit_router(complementary(400), FitSettings(cost_weight=1e6))
    assert cheap.router.route("What is 3 * 4?").arm == "single:c"


def test_a_cascade_falls_back_when_no_arm_is_likely_right() -> None:
    # Arm c (the fallback, dear) is right on everything; a and b only on their kinds.
    data = complementary(400)
    scores = data.scores.copy()
    scores[:, 2] = 1.0
    data = RoutingData(**{**data.__dict__, "scores": scores})
    fit = fit_router(data, FitSettings(fallback="single:c"))
    assert fit.router.threshold is not None and fit.router.threshold > 0
    by = {p.name: p for p in fit.policies}
    assert "single:c" not in (by["router"].routed or {}) or by["router"].routed["single:c"] == 0
    assert by["cascade"].accuracy >= by["router"].accuracy
    assert fit.versus_fallback is not None and fit.versus_fallback.against == "single:c"


def test_a_split_that_leaves_a_side_empty_is_refused() -> None:
    with pytest.raises(UsageError, match="each side needs at least one"):
        fit_router(complementary(1))
    with pytest.raises(UsageError, match="--holdout must be between 0 and 1"):
        fit_router(complementary(40), FitSettings(holdout=1.0))
    with pytest.raises(UsageError, match="--fallback conductor: no run of that strategy"):
        fit_router(complementary(40), FitSettings(fallback="conductor"))


def test_smoke_route_ships_its_questions_marked_with_the_default_split() -> None:
    from conductor.bench.spec import load_benchmark
    from conductor.datasets.questions import question_key
    from conductor.datasets.samples import iter_samples

    spec = load_benchmark("smoke-route")
    assert spec.source.kind == "file" and spec.grader == "short"
    samples = list(iter_samples(spec))
    assert len(samples) == 290
    assert len({s.input["question"] for s in samples}) == 290
    path_rows = _smoke_route_rows()
    sides = {r["split"] for r in path_rows}
    assert sides == {"train", "heldout"}
    for row in path_rows:
        assert held_out(question_key(row["question"]).full, 0.3, 0) == (row["split"] == "heldout")
    assert sum(r["split"] == "heldout" for r in path_rows) == 81


def _smoke_route_rows() -> list[dict[str, object]]:
    from conductor.bench.spec import builtin_benchmarks_dir

    text = (builtin_benchmarks_dir() / "smoke-route.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


# -- the router directory ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fit200() -> RouterFit:
    return fit_router(complementary(200))


@pytest.fixture
def saved(tmp_path: Path, fit200: RouterFit) -> Path:
    """The module's router saved afresh for this test (which may spoil it)."""
    out = tmp_path / "router"
    save_router(fit200, out)
    return out


def test_a_saved_router_routes_as_the_fitted_one_and_is_private(
    tmp_path: Path, fit200: RouterFit
) -> None:
    fit = fit200
    out = tmp_path / "r"
    save_router(fit, out)
    loaded = load_router(out)
    for q in ("What is 5 * 6?", "What is the capital of Japan?", "Is 4 an even number?"):
        assert loaded.router.route(q) == fit.router.route(q)
    assert loaded.training_keys == frozenset(fit.training_keys)
    assert not loaded.training_keys & {fit.data.keys[i] for i in fit.heldout_rows}
    assert (out.stat().st_mode & 0o777) == 0o700
    for f in out.iterdir():
        assert (f.stat().st_mode & 0o777) == 0o600


def _edit(saved: Path, change: object) -> None:
    path = saved / "router.json"
    data = json.loads(path.read_text())
    change(data)  # type: ignore[operator]
    path.write_text(json.dumps(data))


def _many_arms(data: dict[str, object], arms: int, dim: int) -> None:
    """``router.json`` asking for a head of ``arms`` arms of ``dim`` features: more than
    a router may read."""
    template = data["arms"][0]  # type: ignore[index]
    data["arms"] = [{**template, "strategy": f"single:w{i}"} for i in range(arms)]
    data["features"]["settings"] = {"dim": dim}  # type: ignore[index]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(format="something"), "format: expected 'conductor-router'"),
        (
            lambda d: d.update(format_version=2),
            "format_version: 2, which this conductor does not read",
        ),
        (lambda d: d.update(arms=d["arms"][:1]), "arms: expected a list of 2 to 256"),
        (lambda d: d["arms"].append(d["arms"][0]), r"arms\[3\]\.strategy: 'single:a' twice"),
        (lambda d: d["arms"][0].update(cost_usd=-1), r"arms\[0\]\.cost_usd: expected a number"),
        (lambda d: d["arms"][0].update(cost_usd=float("nan")), r"arms\[0\]\.cost_usd"),
        (lambda d: d["arms"][1].update(train_accuracy=1.5), r"arms\[1\]\.train_accuracy"),
        (lambda d: d["decision"].update(margin="0.1"), r"decision\.margin: expected a number"),
        (lambda d: d["features"].update(name="bert"), "no featurizer 'bert'"),
        (lambda d: d["features"]["settings"].update(dim=512), "idf is a list of 512"),
        (
            lambda d: (
                d["features"]["settings"].update(dim=512),
                d["features"]["settings"].pop("idf"),
            ),
            "more than a head of",
        ),
        (lambda d: d["features"]["settings"]["idf"].__setitem__(5, -1.0), "non-negative finite"),
        (lambda d: d["features"]["settings"].update(idf="all"), "idf is a list of 4096"),
        (lambda d: d["features"]["settings"].update(ngrams=7), "no setting 'ngrams'"),
        (lambda d: _many_arms(d, 20, 1 << 20), r"\(1048577, 20\) is more than 16,777,216"),
        (
            lambda d: d["decision"].update(fallback="conductor"),
            "decision.fallback: 'conductor' is not one of",
        ),
        (lambda d: d["decision"].update(threshold=2), "decision.threshold"),
        (lambda d: d["head"].update(file="../../etc/passwd"), "head.file: expected 'head.npy'"),
        (lambda d: d["training_questions"].update(sha256=["x"]), "expected a list of SHA-256"),
        (lambda d: d.update(training=[]), "training: expected an object"),
    ],
)
def test_a_hostile_router_json_is_refused_naming_the_field(
    saved: Path, change: object, message: str
) -> None:
    _edit(saved, change)
    with pytest.raises(RouterFileError, match=message):
        load_router(saved)


def _rewrite_head(saved: Path, raw: bytes) -> None:
    (saved / "head.npy").write_bytes(raw)
    _edit(saved, lambda d: d["head"].update(sha256=hashlib.sha256(raw).hexdigest()))


def test_a_head_changed_after_the_fit_is_refused(saved: Path) -> None:
    raw = bytearray((saved / "head.npy").read_bytes())
    raw[-1] ^= 1
    (saved / "head.npy").write_bytes(bytes(raw))
    with pytest.raises(RouterFileError, match="SHA-256 is not the one router.json records"):
        load_router(saved)


def test_a_pickled_head_is_not_unpickled(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    np.save(buf, np.array([_Boom(str(marker))], dtype=object), allow_pickle=True)
    _rewrite_head(saved, buf.getvalue())
    with pytest.raises(RouterFileError, match="not a numpy array file"):
        load_router(saved)
    assert not marker.exists()


class _Boom:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (open, (self.path, "w"))


@pytest.mark.parametrize("bad", ["nan", "shape", "ints", "big", "garbage"])
def test_a_head_of_the_wrong_shape_or_values_is_refused(saved: Path, bad: str) -> None:
    good = np.load(saved / "head.npy")
    arrays = {
        "nan": np.where(np.arange(good.size).reshape(good.shape) == 5, np.nan, good),
        "shape": good[:-1],
        "ints": good.astype(np.int64),
        "big": np.zeros((good.shape[0] * 4, good.shape[1])),
    }
    if bad == "garbage":
        raw = b"\x93NUMPY not really"
    else:
        buf = io.BytesIO()
        np.save(buf, arrays[bad], allow_pickle=False)
        raw = buf.getvalue()
    _rewrite_head(saved, raw)
    with pytest.raises(RouterFileError):
        load_router(saved)


@pytest.mark.parametrize("name", ["head.npy", "router.json"])
@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_router_file_that_is_not_a_regular_file_is_refused_unread(
    saved: Path, name: str, kind: str
) -> None:
    target = saved / name
    target.unlink()
    if kind == "device":
        target.symlink_to("/dev/zero")  # endless: read whole, it would take all memory
    else:
        os.mkfifo(target)  # opened for reading, it would wait for a writer forever
    with pytest.raises(RouterFileError, match="not a regular file"):
        load_router(saved)


def test_a_directory_without_a_router_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(RouterFileError, match="not a router directory.*conductor fit-router"):
        load_router(tmp_path)
    (tmp_path / "router.json").write_text("{not json")
    with pytest.raises(RouterFileError, match=r"router.json:1: not valid JSON"):
        load_router(tmp_path)
    (tmp_path / "router.json").write_text("[" * 100000)
    with pytest.raises(RouterFileError, match="not valid JSON"):
        load_router(tmp_path)


# -- gguf-mean-v1: a small model's hidden states ----------------------------------------

_SHA = "a" * 64


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"model": "models/small.gguf"}, "the absolute path of a GGUF file"),
        ({"model": 7}, "the absolute path"),
        ({"sha256": "ABC"}, "64 lower-case hexadecimal"),
        ({"dim": True}, "dim must be an integer"),
        ({"dim": 1 << 17}, "dim must be an integer"),
        ({"dim": 2, "center": [0.0, 1.0]}, "center and scale come together"),
        ({"dim": 2, "center": [0.0], "scale": [1.0]}, "center is a list of 2 finite"),
        ({"dim": 2, "center": [0.0, float("nan")], "scale": [1, 1]}, "center is a list"),
        ({"dim": 2, "center": [0.0, 1.0], "scale": [1.0, 0.0]}, "scale is a list of 2 positive"),
        ({"dim": 2, "center": [0.0, True], "scale": [1.0, 1.0]}, "center is a list"),
        ({"layer": 3}, "no setting 'layer'"),
    ],
)
def test_hidden_state_settings_a_router_file_may_hold_are_checked(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        featurizer_from("gguf-mean-v1", settings)


def test_hidden_states_of_another_model_file_are_refused_before_it_loads(tmp_path: Path) -> None:
    model = tmp_path / "other.gguf"
    model.write_bytes(b"GGUF not the fitted weights")
    featurizer = featurizer_from("gguf-mean-v1", {"model": str(model), "sha256": _SHA})
    with pytest.raises(UsageError, match="not the file this router was fitted with"):
        featurizer.transform(["What is 2 + 2?"])
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        featurizer = featurizer_from("gguf-mean-v1", {"model": str(path)})
        with pytest.raises(UsageError, match="is not a model file"):
            featurizer.transform(["What is 2 + 2?"])


@pytest.fixture(scope="module")
def hidden_fit() -> object:
    from kit.poolkit import embedded_model_or_skip

    embedded_model_or_skip()
    try:
        return fit_router(complementary(120), FitSettings(features="gguf-mean-v1"))
    finally:
        from conductor.localmodel import models

        models.stop_all()


@pytest.mark.process
def test_a_router_on_hidden_states_learns_the_kinds_and_survives_its_directory(
    hidden_fit: object, tmp_path: Path
) -> None:
    from conductor.localmodel.models import embedded_model_path
    from conductor.router.features import HiddenStates

    fit = hidden_fit
    featurizer = fit.router.featurizer  # type: ignore[attr-defined]
    assert isinstance(featurizer, HiddenStates) and featurizer.dim == 576
    assert featurizer.sha256 == hashlib.sha256(embedded_model_path().read_bytes()).hexdigest()
    assert featurizer.center is not None and len(featurizer.center) == 576
    by = {p.name: p for p in fit.policies}  # type: ignore[attr-defined]
    assert by["router"].accuracy > by[fit.best_single].accuracy + 0.15  # type: ignore[attr-defined]
    out = tmp_path / "r"
    save_router(fit, out)  # type: ignore[arg-type]
    loaded = load_router(out)
    assert loaded.router.featurizer == featurizer
    for q in ("What is 5 * 6?", "What is the capital of Japan?", "Is 4 an even number?"):
        assert loaded.router.route(q) == fit.router.route(q)  # type: ignore[attr-defined]
    # A router file whose settings name other weights is refused, naming the field.
    _edit(out, lambda d: d["features"]["settings"].update(sha256=_SHA))
    with pytest.raises(UsageError, match="not the file this router was fitted with"):
        load_router(out).router.route("What is 5 * 6?")
    _edit(out, lambda d: d["features"]["settings"].update(dim=512))
    with pytest.raises(RouterFileError, match="features"):
        load_router(out)


# -- the head against scikit-learn's LogisticRegression -----------------------------------


def _reference_chances(x: object, y: object, test: object, penalty: float) -> object:
    """scikit-learn's L2 logistic regression (lbfgs, the intercept unpenalised) on
    fractional scores: each question twice, as right and as wrong, weighted by its score.

    With more features than questions (the ``dual`` shape: 4,096 hashed features, 160
    questions) it is fitted in the span of the questions' rows, where the optimum of an
    L2 penalty lies (a weight's part outside the span changes no question's score and
    only adds to the penalty): the same chances, a 160-column problem that lbfgs solves
    in a fraction of a second instead of a minute.
    :func:`test_the_reference_in_the_rows_span_is_the_full_one` keeps the two equal."""
    if x.shape[1] > x.shape[0]:  # type: ignore[attr-defined]
        span = np.linalg.svd(x, full_matrices=False)[2].T  # orthonormal columns
        return _sklearn_chances(x @ span, y, test @ span, penalty)  # type: ignore[operator]
    return _sklearn_chances(x, y, test, penalty)


def _sklearn_chances(x: object, y: object, test: object, penalty: float) -> object:
    sklearn = pytest.importorskip("sklearn.linear_model")
    n = x.shape[0]  # type: ignore[attr-defined]
    out = []
    for j in range(y.shape[1]):  # type: ignore[attr-defined]
        s = y[:, j]  # type: ignore[index]
        ref = sklearn.LogisticRegression(C=1.0 / (n * penalty), tol=1e-12, max_iter=100_000)
        ref.fit(
            np.vstack([x, x]),
            np.r_[np.ones(n), np.zeros(n)],
            sample_weight=np.r_[s, 1.0 - s],
        )
        out.append(ref.predict_proba(test)[:, 1])
    return np.stack(out, axis=1)


def _dual_problem() -> tuple[object, object, object]:
    """Fewer questions than features: hashed n-grams of 160 questions, and 40 others."""
    data = complementary(160)
    x = HashedNgrams().transform(data.prompts)
    test = HashedNgrams().transform(complementary(40, seed=7).prompts)
    return x, data.scores, test


@pytest.mark.parametrize("penalty", [1e-4, 1e-3, 1e-2, 1e-1, 1.0])
@pytest.mark.parametrize("shape", ["dual", "primal"])
def test_the_heads_chances_are_scikit_learns(penalty: float, shape: str) -> None:
    rng = np.random.default_rng(3)
    if shape == "dual":  # fewer questions than features: the descent in the rows' span
        x, y, test = _dual_problem()
    else:  # dense features, more questions than features (as gguf-mean-v1's)
        w = rng.normal(size=(24, 3))
        x = rng.normal(size=(300, 24)) / np.sqrt(24)
        test = rng.normal(size=(50, 24)) / np.sqrt(24)
        chance = 1 / (1 + np.exp(-(x @ w) * 2))
        # Two epochs a question: scores of 0, 0.5 and 1.
        y = ((rng.random((300, 3)) < chance) + (rng.random((300, 3)) < chance)) / 2.0
    head = fit_head(x, y, penalties=(penalty,))
    gap = np.abs(head.predict(test) - _reference_chances(x, y, test, penalty)).max()
    assert gap < 1e-4, gap


def test_the_reference_in_the_rows_span_is_the_full_one() -> None:
    """The reference fitted in the rows' span gives the chances of the one fitted on all
    4,096 features (at the penalty where the full fit is quick)."""
    x, y, test = _dual_problem()
    full = _sklearn_chances(x, y, test, 1.0)
    assert np.abs(_reference_chances(x, y, test, 1.0) - full).max() < 1e-6  # type: ignore[operator]


# -- routing that waits on a model ---------------------------------------------------------


async def test_routing_that_waits_on_a_model_runs_off_the_loop_and_its_executor() -> None:
    """A blocking featurizer (gguf-mean-v1 waits on its host) routes on threads of its
    own: the event loop keeps running, and a burst of questions does not take the
    default executor's threads that SDK imports and cache writes need."""
    import asyncio
    import threading
    import time
    from types import SimpleNamespace

    from conductor.record import RunRecord
    from conductor.router import Route
    from conductor.strategies.router import RouterStrategy

    seen: list[str] = []
    finished: list[str] = []

    def route(question: str) -> Route:
        seen.append(threading.current_thread().name)
        time.sleep(0.5)  # a forward pass, as the host takes it
        finished.append(question)
        return Route(arm="single:a", chances={"single:a": 0.9}, fell_back=False)

    class Arm:
        async def run(self, question: str, **_: object) -> RunRecord:
            return RunRecord(question=question, pool={}, conductor={}, settings={})

    router = SimpleNamespace(featurizer=SimpleNamespace(blocking=True), route=route)
    strategy = RouterStrategy("router:x", SimpleNamespace(router=router), {"single:a": Arm()})  # type: ignore[arg-type]
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    ticker = asyncio.create_task(tick())
    # More questions than the default executor has threads: routed there, they would
    # hold every one of them for a whole forward pass.
    threads = min(32, (os.cpu_count() or 1) + 4)
    routed = [
        asyncio.create_task(strategy.run(f"q{i}", sample_index=i)) for i in range(threads + 2)
    ]
    await asyncio.sleep(0.05)
    # Routed on the default executor, this would wait for a thread: for two questions
    # to take the next ones queued, and a third to finish before it.
    assert await asyncio.to_thread(len, finished) < 2
    records = await asyncio.gather(*routed)
    ticker.cancel()
    assert all(r.route is not None and r.route.arm == "single:a" for r in records)
    assert seen and all(name.startswith("route") for name in seen), seen
    assert ticks > 20  # the loop ran while the questions were routed
