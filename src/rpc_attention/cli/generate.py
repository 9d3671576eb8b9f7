"""``rpc-attention generate``: continue a prompt with a trained language model (task ``lm``)."""

from __future__ import annotations

import argparse

HELP = "generate text with a trained language-model run (key/value cache; RPC layers exact)"
EXTRA = "train"  # the extra this command needs: pip install "rpc-attention[train]"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run", required=True, metavar="DIR", help="run directory of an 'lm' training run")
    parser.add_argument("--prompt", required=True, help="text to continue (tokenised the WikiText way)")
    parser.add_argument("--max-new-tokens", type=int, default=50, metavar="N", help="words to generate (default 50)")
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="sampling temperature; 0 = greedy decoding (default 1.0)")
    parser.add_argument("--top-k", type=int, default=0, metavar="K", help="sample from the K most likely words (0 = all)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole window for every word")
    parser.add_argument("--no-unk", action="store_true", help="never generate <unk>")
    parser.add_argument("--ema", action="store_true", help="use the EMA weights (model_ema.safetensors)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--tokens", action="store_true", help="print the generated tokens, not detokenised text")


def run(args: argparse.Namespace) -> int:
    import time

    import torch

    from . import UserError

    if args.max_new_tokens < 0:
        raise UserError("--max-new-tokens must be >= 0")
    if args.temperature < 0:
        raise UserError("--temperature must be >= 0")
    if args.top_k < 0:
        raise UserError("--top-k must be >= 0")
    try:
        from ..train import load_run

        model, cfg = load_run(args.run, device=args.device, ema=args.ema)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    if cfg.get("task") != "lm":
        raise UserError(f"run {args.run} is a {cfg.get('task')!r} run; generate needs a language model (task 'lm')")
    from ..data.text import EOS, UNK, detokenize, wiki_tokenize
    from ..evaluate.lm import corpus_for_run
    from ..models.lm import generate

    try:
        vocab = corpus_for_run(cfg, args.run).vocab
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(f"cannot load the run's vocabulary: {exc}") from None
    if len(vocab) != model.config.vocab_size:
        raise UserError(f"the corpus vocabulary ({len(vocab)} words) does not match the model ({model.config.vocab_size})")
    words = wiki_tokenize(args.prompt) if args.prompt.strip() else [EOS]
    ids = vocab.encode(words)
    n_unk = sum(1 for i in ids if i == vocab.unk_id)
    idx = torch.tensor([ids], dtype=torch.long, device=args.device)
    gen = torch.Generator(device=args.device).manual_seed(args.seed)
    t0 = time.perf_counter()
    out = generate(model, idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k or None,
                   use_cache=not args.no_cache, generator=gen, ban=[vocab.unk_id] if args.no_unk else ())
    dt = time.perf_counter() - t0
    new = vocab.decode(out[0, len(ids):].tolist())
    prompt_words = vocab.decode(ids)
    if args.tokens:
        print(" ".join(prompt_words) + " || " + " ".join(new))
    else:
        print(detokenize(prompt_words) + " " + detokenize(new))
    import sys

    note = f"; {n_unk} prompt word(s) unknown -> {UNK}" if n_unk else ""
    print(f"[{args.max_new_tokens} words in {dt:.2f} s ({dt / max(1, args.max_new_tokens) * 1000:.1f} ms/word), "
          f"{'no cache' if args.no_cache else 'kv cache'}{note}]", file=sys.stderr)
    return 0
