"""Make (or check) ``benchmarks/smoke-route.jsonl``: 320 easy short-answer questions in
eight categories, for fitting and measuring a router on the embedded pool.

Run:  python benchmarks/route/make_smoke_route.py [--check]

Every answer is computed here (arithmetic, unit conversions, comparisons, Python
expressions, evaluated by Python itself) or taken from a short table of facts a school
child knows (capitals, opposites, animals and colours).  Each row says which side of the
router's split it is on (``split``: ``train`` or ``heldout``), by the rule ``conductor
fit-router`` applies with its defaults (:func:`conductor.router.held_out` of the
question's key, 30%, seed 0), so a router fitted on runs of this benchmark is measured
on exactly the ``heldout`` rows, and ``--exclude-trained`` runs only those.

``--check`` exits 1 when the shipped file is not what this script makes (CI runs it).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "smoke-route.jsonl"
PER_CATEGORY = 40

CAPITALS = {
    "France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin",
    "Spain": "Madrid", "Russia": "Moscow", "China": "Beijing", "Egypt": "Cairo",
    "Greece": "Athens", "Portugal": "Lisbon", "Ireland": "Dublin", "Norway": "Oslo",
    "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen",
    "Austria": "Vienna", "Hungary": "Budapest", "Poland": "Warsaw", "Belgium": "Brussels",
    "the Netherlands": "Amsterdam", "the United Kingdom": "London", "Canada": "Ottawa",
    "Mexico": "Mexico City", "Argentina": "Buenos Aires", "Peru": "Lima", "Chile": "Santiago",
    "Kenya": "Nairobi", "Thailand": "Bangkok", "South Korea": "Seoul", "Cuba": "Havana",
    "Iceland": "Reykjavik", "the Czech Republic": "Prague", "Turkey": "Ankara",
    "Iran": "Tehran", "Iraq": "Baghdad", "Afghanistan": "Kabul", "Nepal": "Kathmandu",
    "the Philippines": "Manila", "Indonesia": "Jakarta", "Vietnam": "Hanoi",
}  # fmt: skip
OPPOSITES = {
    "hot": "cold", "big": "small | little", "up": "down", "fast": "slow", "happy": "sad",
    "old": "young | new", "light": "dark | heavy", "open": "closed | shut", "wet": "dry",
    "hard": "soft | easy", "early": "late", "full": "empty", "high": "low", "rich": "poor",
    "strong": "weak", "tall": "short", "thick": "thin", "near": "far", "loud": "quiet",
    "left": "right", "black": "white", "day": "night", "win": "lose", "in": "out",
    "push": "pull", "buy": "sell", "true": "false", "love": "hate", "begin": "end",
    "clean": "dirty", "cheap": "expensive", "sweet": "sour | bitter", "north": "south",
    "east": "west", "top": "bottom", "first": "last", "always": "never", "yes": "no",
    "friend": "enemy | foe", "inside": "outside",
}  # fmt: skip
FACTS = [
    ("How many legs does a spider have?", "8"), ("How many legs does a dog have?", "4"),
    ("How many legs does a bird have?", "2"), ("How many legs does an insect have?", "6"),
    ("How many legs does a cow have?", "4"), ("How many legs does an octopus have?", "8"),
    ("What colour is a ripe banana?", "yellow"), ("What colour is grass?", "green"),
    ("What colour is the sky on a clear day?", "blue"), ("What colour is snow?", "white"),
    ("What colour is coal?", "black"), ("What colour is a ripe tomato?", "red"),
    ("What do bees make?", "honey"), ("What animal says moo?", "cow"),
    ("What animal says woof?", "dog"), ("What animal says meow?", "cat"),
    ("What animal says oink?", "pig"), ("What is frozen water called?", "ice"),
    ("What is a baby cat called?", "kitten"), ("What is a baby dog called?", "puppy"),
    ("What is a baby cow called?", "calf"), ("What is a baby sheep called?", "lamb"),
    ("How many days are in a week?", "7"), ("How many months are in a year?", "12"),
    ("How many hours are in a day?", "24"), ("How many sides does a triangle have?", "3"),
    ("How many sides does a square have?", "4"), ("How many sides does a hexagon have?", "6"),
    ("Which planet do we live on?", "Earth"), ("What is the largest ocean on Earth?", "Pacific"),
    ("What gas do people need to breathe?", "oxygen"),
    ("What is the closest star to Earth?", "Sun"),
    ("What is the opposite of north?", "south"), ("How many wheels does a bicycle have?", "2"),
    ("How many wheels does a tricycle have?", "3"),
    ("What do cows drink?", "water"),
    ("What is the first month of the year?", "January"),
    ("What is the last month of the year?", "December"),
    ("What day comes after Monday?", "Tuesday"), ("What day comes before Sunday?", "Saturday"),
]  # fmt: skip
UNITS = [
    ("centimetres are in {n} metres", 100), ("minutes are in {n} hours", 60),
    ("grams are in {n} kilograms", 1000), ("days are in {n} weeks", 7),
    ("seconds are in {n} minutes", 60), ("metres are in {n} kilometres", 1000),
    ("millimetres are in {n} centimetres", 10), ("hours are in {n} days", 24),
]  # fmt: skip
WORDS = ["cat", "dog", "apple", "house", "river", "green", "table", "music", "light", "stone"]


def _arithmetic(rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for _ in range(PER_CATEGORY // 2):
        a, b = rng.randint(2, 60), rng.randint(2, 40)
        out.append((f"What is {a} + {b}?", str(a + b)))
    for _ in range(PER_CATEGORY // 2):
        a, b = rng.randint(10, 90), rng.randint(1, 9)
        out.append((f"What is {a} - {b}?", str(a - b)))
    return out


def _times(rng: random.Random) -> list[tuple[str, str]]:
    return [
        (f"What is {a} * {b}?", str(a * b))
        for a, b in ((rng.randint(2, 12), rng.randint(2, 9)) for _ in range(PER_CATEGORY))
    ]


def _units(rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for i in range(PER_CATEGORY):
        text, factor = UNITS[i % len(UNITS)]
        n = rng.randint(2, 9)
        out.append((f"How many {text.format(n=n)}?", str(n * factor)))
    return out


def _compare(rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for _ in range(PER_CATEGORY):
        a, b = rng.sample(range(1, 100), 2)
        out.append((f"Is {a} greater than {b}? Answer yes or no.", "yes" if a > b else "no"))
    return out


def _python(rng: random.Random) -> list[tuple[str, str]]:
    out = []
    for i in range(PER_CATEGORY):
        w = WORDS[rng.randrange(len(WORDS))]
        a, b = rng.randint(2, 9), rng.randint(2, 5)
        expr = [
            f'len("{w}")', f'"{w}".upper()', f"{a} ** {b}", f'"{w}"[0]', f'"{w}"[::-1]',
            f"max({a}, {a + b})", f"{a * b + 1} % {a}", f"{a} * {b} + 1",
        ][i % 8]  # fmt: skip
        value = eval(expr)  # noqa: S307 - our own literal expressions, to compute the answer
        out.append((f"What does the Python expression {expr} evaluate to?", str(value)))
    return out


def rows() -> list[dict[str, Any]]:
    """The benchmark's rows, in a fixed order (seeded)."""
    from conductor.datasets.questions import question_key
    from conductor.router import held_out

    rng = random.Random(20261203)
    categories: dict[str, list[tuple[str, str]]] = {
        "capitals": [(f"What is the capital of {c}?", a) for c, a in CAPITALS.items()],
        "arithmetic": _arithmetic(rng),
        "times": _times(rng),
        "units": _units(rng),
        "compare": _compare(rng),
        "python": _python(rng),
        "opposites": [(f"What is the opposite of {w}?", a) for w, a in OPPOSITES.items()],
        "facts": FACTS,
    }
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for category, items in categories.items():
        assert len(items) == PER_CATEGORY, (category, len(items))
        for i, (question, answer) in enumerate(items, 1):
            if question in seen:  # a repeat would sit on both sides of nothing: skip it
                continue
            seen.add(question)
            side = "heldout" if held_out(question_key(question).full, 0.3, 0) else "train"
            out.append(
                {
                    "id": f"{category}-{i}",
                    "category": category,
                    "question": question,
                    "answer": answer,
                    "split": side,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the shipped file differs")
    args = parser.parse_args()
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows())
    if args.check:
        same = OUT.is_file() and OUT.read_text(encoding="utf-8") == text
        verdict = "as this script makes it" if same else "DIFFERS from what this script makes"
        print(f"{OUT.name}: {verdict}")
        sys.exit(0 if same else 1)
    OUT.write_text(text, encoding="utf-8")
    made = rows()
    held = sum(r["split"] == "heldout" for r in made)
    print(f"wrote {OUT} ({len(made)} questions, {held} held out)")


if __name__ == "__main__":
    main()
