"""Hugging Face ``generate()`` with RPC attention: ``attn_implementation="rpc"``.

``rpc_attention.integrations.transformers.register(...)`` adds an attention backend named ``"rpc"`` to
transformers (``pip install 'rpc-attention[hf]'``): the layers named by ``rpc_layers`` run Principal
Attention Pursuit on their keys (and clean the queries with the same sparse part) before the model's own
softmax attention, the other layers run ``sdpa``. The options are written into ``model.config``, so
``save_pretrained`` keeps them (docs/integrations.md).

This script builds a tiny randomly initialised Llama from a local config (nothing is downloaded) and shows:

1. greedy ``generate()`` with the KV cache, without it and with a static cache give the same tokens,
   on a batch with a left-padded prompt;
2. the same weights with ``attn_implementation="eager"`` generate other tokens (PAP changed the model);
3. with ``lambd=inf`` (the sparse part S = 0) an RPC layer is the model's own attention: its logits
   equal ``sdpa``'s, and ``eager``'s up to eager's float32 softmax;
4. with ``--out OUT``: ``save_pretrained(OUT)``, and the reloaded model generates the same tokens.
   Without ``--out`` nothing is written.

Run (seconds)::

    python examples/hf_generate.py
    python examples/hf_generate.py --layers 0 --n-iter 6 --lambd 4 --threshold lambda_mu   # the paper's setting
    python examples/hf_generate.py --dtype float64 --out /tmp/rpc-llama
    python examples/hf_generate.py --tiny                  # the size the test runs
"""

import argparse
from typing import Any, Dict

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import rpc_attention.integrations.transformers as rpc_hf


def prompts(batch: int, length: int, vocab: int, pad: int, gen: torch.Generator):
    """Random prompts, the first one left-padded with two ``pad`` tokens (batched generation pads on the left)."""
    ids = torch.randint(1, vocab, (batch, length), generator=gen)
    mask = torch.ones_like(ids)
    ids[0, :2], mask[0, :2] = pad, 0
    return ids, mask


def tiny_llama(args) -> torch.nn.Module:
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.num_layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                      # a wide initialisation makes the random model's attention peaked, so that PAP's sparse
                      # part has something to take
                      initializer_range=0.3, pad_token_id=0)
    torch.manual_seed(args.seed)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="rpc", dtype=getattr(torch, args.dtype)).eval()


def logits_with(model, impl: str, ids, mask) -> torch.Tensor:
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(ids, attention_mask=mask).logits


def compare_with_plain_attention(model, ids, mask, greedy, rpc_tokens) -> Dict[str, Any]:
    """Steps 2 and 3 (they switch the model's attention; it ends on RPC with ``lambd=inf``)."""
    model.set_attn_implementation("eager")
    eager_tokens = model.generate(ids, **greedy)
    # eager attention computes a fully padded query row as NaN in float64, so the logits are compared
    # on the prompts without padding
    full = mask.bool().all(dim=1)
    ids, mask = ids[full], mask[full]
    eager, sdpa = logits_with(model, "eager", ids, mask), logits_with(model, "sdpa", ids, mask)
    rpc_hf.configure(model, lambd=float("inf"))  # S = 0 in every RPC layer; also switches back to "rpc"
    with torch.no_grad():
        inf = model(ids, attention_mask=mask).logits
    return {"eager_tokens": eager_tokens, "tokens_changed": int((eager_tokens != rpc_tokens).sum()),
            "inf_vs_sdpa": float((inf - sdpa).abs().max()), "inf_vs_eager": float((inf - eager).abs().max()),
            "logit_scale": float(eager.abs().max())}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", default="all", help="rpc_layers: 'all', '0', '0,1'")
    p.add_argument("--n-iter", type=int, default=3)
    p.add_argument("--lambd", type=float, default=0.5)
    p.add_argument("--threshold", default="lambda_over_mu", help="lambda_mu (official) or lambda_over_mu")
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2, help="grouped-query attention: fewer k/v heads than heads")
    p.add_argument("--vocab", type=int, default=100)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt-len", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=8)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=None, help="save_pretrained folder (default: nothing is written)")
    p.add_argument("--tiny", action="store_true", help="width 16, 4 new tokens (a second)")
    args = p.parse_args(argv)
    if args.tiny:
        args.hidden, args.new_tokens, args.prompt_len = 16, 4, 5
    return args


def main(argv=None) -> Dict[str, Any]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    # main() may run inside a larger program (the test runs it in pytest): leave transformers as found
    registered_before = rpc_hf.is_registered()
    rpc_hf.register(rpc_layers=args.layers, n_iter=args.n_iter, lambd=args.lambd, threshold=args.threshold)
    try:
        return run(args)
    finally:
        if not registered_before:
            rpc_hf.unregister()


def run(args) -> Dict[str, Any]:
    model = tiny_llama(args)
    c = model.config
    print(f"tiny Llama ({c.num_hidden_layers} layers, width {c.hidden_size}, {args.dtype}), RPC in layers "
          f"{c.rpc_layers}: n_iter={c.rpc_n_iter}, lambd={c.rpc_lambd:g}, threshold={c.rpc_threshold}")
    ids, mask = prompts(args.batch, args.prompt_len, args.vocab, 0, torch.Generator().manual_seed(args.seed))
    greedy = dict(attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
    res: Dict[str, Any] = {"cached": model.generate(ids, **greedy),
                           "uncached": model.generate(ids, use_cache=False, **greedy),
                           "static": model.generate(ids, cache_implementation="static", **greedy)}
    print("generated:", res["cached"][:, ids.shape[1]:].tolist())
    print(f"same tokens without the cache: {torch.equal(res['cached'], res['uncached'])}, "
          f"with a static cache: {torch.equal(res['cached'], res['static'])}")
    if args.out:
        model.save_pretrained(args.out)  # config.json holds every rpc_* option
        again = AutoModelForCausalLM.from_pretrained(args.out, attn_implementation="rpc").eval()
        res["reloaded"] = again.generate(ids, **greedy)
        print(f"saved to {args.out}; the reloaded model generates the same tokens: "
              f"{torch.equal(res['reloaded'], res['cached'])}")
    res.update(compare_with_plain_attention(model, ids, mask, greedy, res["cached"]))
    n = res["cached"].shape[1] - ids.shape[1]
    print(f"eager attention, same weights: {res['tokens_changed']} of {args.batch * n} generated tokens differ")
    print(f"lambd=inf: max |logits - sdpa| = {res['inf_vs_sdpa']:.3g}, max |logits - eager| = "
          f"{res['inf_vs_eager']:.3g} (logits up to {res['logit_scale']:.3g})")
    return res


if __name__ == "__main__":
    main()
