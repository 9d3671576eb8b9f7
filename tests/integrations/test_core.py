"""asymmetric_rpc_attention: the definition shared by the HF and timm integrations."""

import pytest
import torch
import torch.nn.functional as F

from rpc_attention import functional as RF
from rpc_attention.integrations import asymmetric_rpc_attention
from rpc_attention.integrations._core import check_options, resolve_layers

OPTS = dict(n_iter=3, lambd=0.3, threshold="lambda_over_mu")


def test_gradients_flow_through_pap_into_queries_keys_values():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 1, 4, 2, dtype=torch.float64, requires_grad=True) for _ in range(3))
    fn = lambda a, b, c: asymmetric_rpc_attention(a, b, c, n_iter=2, lambd=0.3, threshold="lambda_over_mu")  # noqa: E731
    _, st = RF.pap_attention(k, v, n_iter=2, lambd=0.3, threshold="lambda_over_mu", return_state=True)
    assert (st.sparse != 0).any()  # the gradient check covers the shrinkage branch
    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_definition_matches_pap_state_with_masks():
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 2, 6, 4).unbind(0)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool).tril()
    mask[0, :, :, :2] = False  # left padding in batch 0
    out = asymmetric_rpc_attention(q, k, v, attn_mask=mask, is_causal=True, **OPTS)
    _, st = RF.pap_attention(k, v, attn_mask=mask, is_causal=True, return_state=True, **OPTS)
    ref = F.scaled_dot_product_attention(q - st.sparse, k - st.sparse, v, attn_mask=mask)
    torch.testing.assert_close(out[0, :, 2:], ref[0, :, 2:])
    torch.testing.assert_close(out[1], ref[1])
    pap = asymmetric_rpc_attention(q, k, v, key_mode="pap", **OPTS)
    _, st = RF.pap_attention(k, v, return_state=True, **OPTS)
    torch.testing.assert_close(pap, F.scaled_dot_product_attention(q - st.sparse, st.cleaned_keys, v))


def test_option_validation():
    assert resolve_layers("0, 2") == (0, 2) and resolve_layers("all") == "all" and resolve_layers(None) == ()
    with pytest.raises(ValueError, match=">= 0"):
        resolve_layers([-1])
    with pytest.raises(ValueError, match="n_iter"):
        check_options({"n_iter": 0})
    with pytest.raises(ValueError, match="clean_queries"):
        check_options({"clean_queries": "yes"})
    q = torch.randn(1, 3, 4, 2)
    with pytest.raises(ValueError, match="multiple"):
        asymmetric_rpc_attention(q, torch.randn(1, 2, 4, 2), torch.randn(1, 2, 4, 2))
    with pytest.raises(ValueError, match="d_v == d_k"):
        asymmetric_rpc_attention(q, q, torch.randn(1, 3, 4, 5))
    with pytest.raises(ValueError, match="not an attention bias"):
        asymmetric_rpc_attention(q, q, q, attn_mask=torch.randn(4, 4))


def test_cached_queries_use_rows_of_s_at_their_positions_static_cache_layout():
    """A static cache: 8 slots, 5 filled (the last 3 unfilled, zero keys), the 2 queries are tokens 3
    and 4, batch 0 left-padded by one. Equal to the uncached pass over the 5 real tokens."""
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 2, 2, 5, 4, dtype=torch.float64).unbind(0)
    k[..., 1, 0] = 20.0  # an outlier, so S is not 0
    pad = torch.ones(2, 5, dtype=torch.bool)
    pad[0, 0] = False
    full_mask = torch.ones(5, 5, dtype=torch.bool).tril() & pad[:, None, None, :]
    full = asymmetric_rpc_attention(q, k, v, attn_mask=full_mask, is_causal=True, **OPTS)
    slots = lambda t: torch.cat([t, torch.zeros(2, 2, 3, 4, dtype=t.dtype)], dim=2)  # noqa: E731
    cache_mask = torch.zeros(2, 1, 2, 8, dtype=torch.bool)
    cache_mask[..., :5] = full_mask[:, :, 3:]
    got = asymmetric_rpc_attention(q[:, :, 3:], slots(k), slots(v), attn_mask=cache_mask, is_causal=True, **OPTS)
    # float64; the two computations differ only in reduction lengths (5 vs 8 keys, the extra ones masked)
    torch.testing.assert_close(got, full[:, :, 3:], rtol=0, atol=1e-12)
    plain = asymmetric_rpc_attention(q[:, :, 3:], slots(k), slots(v), attn_mask=cache_mask, is_causal=True,
                                     clean_queries=False, **OPTS)
    assert (plain - got).abs().max() > 1e-3  # the cleaning of the queries matters here
