"""The one WikiText-style corpus writer of the tests (data/test_text.py, evaluate/test_lm.py,
evaluate/test_determinism.py, train/test_bf16_cpu.py): a directory of ``wiki.{train,valid,test}.tokens``,
each line written as WikiText writes it (a space either side), and the settings that point a trainer
config at it. Imported by name (``from corpora import ...``): ``tests/`` is on ``sys.path`` through
``tests/conftest.py``, as ``suite_run`` and ``test_launchers`` are for their folders."""

import random
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

# the vocabulary of the small random corpora (11 words)
WORDS = "the a big small cat dog sees likes city king .".split()
SIZES = (("train", 200), ("valid", 20), ("test", 20))


def write_wikitext(root: Path, splits: Dict[str, Sequence[str]]) -> Path:
    """``root/wiki.<split>.tokens`` for each ``split: lines`` of ``splits``; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    for split, lines in splits.items():
        (root / f"wiki.{split}.tokens").write_text("".join(f" {line} \n" for line in lines), encoding="utf-8")
    return root


def random_words(rng: random.Random, n: int = 12) -> str:
    """``n`` words of ``WORDS``, drawn with ``rng``."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


def random_wikitext(root: Path, line: Callable[[random.Random], str] = random_words,
                    sizes: Sequence[Tuple[str, int]] = SIZES, seed: int = 0) -> Path:
    """A corpus of ``n`` lines ``line(rng)`` for each ``(split, n)`` of ``sizes``, drawn in that order from
    one RNG seeded with ``seed`` (the same corpus every time)."""
    rng = random.Random(seed)
    return write_wikitext(root, {split: [line(rng) for _ in range(n)] for split, n in sizes})


def wikitext_settings(root: Path, cache: Path) -> List[str]:
    """The trainer settings that read the corpus at ``root`` (every word kept) with its cache in ``cache``."""
    return ["data.source=wikitext", f"data.root={root}", f"data.cache_dir={cache}", "data.min_freq=1"]
