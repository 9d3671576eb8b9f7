"""Softmax attention kernels (asymmetric, symmetric, scaled) against float64 references.

Tolerances: see tests/functional/reference.py.
"""


import pytest
import torch

from rpc_attention import functional as RF

from .reference import rand, ref_softmax_attention


def test_symmetric_attention_matches_reference():
    k, v = rand(2, 3, 8, 4, seed=9), rand(2, 3, 8, 5, seed=10)
    out = RF.symmetric_attention(k, v)
    for b in range(2):
        for h in range(3):
            ref = ref_softmax_attention(k[b, h], k[b, h], v[b, h], 0.5)
            torch.testing.assert_close(out[b, h], ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("fused", [True, False])
def test_causal_with_fewer_queries_than_keys_is_end_aligned(fused):
    """Query i of nq sees keys 0..nk-nq+i (a decoding step over a cache), in both paths."""
    q, k, v = rand(2, 2, 3, 4, seed=43), rand(2, 2, 7, 4, seed=44), rand(2, 2, 7, 5, seed=45)
    out = RF.attention(q, k, v, is_causal=True, fused=fused)
    expected = torch.empty_like(out)
    for b in range(2):
        for h in range(2):
            for i in range(3):
                keys = slice(0, 7 - 3 + i + 1)
                expected[b, h, i] = ref_softmax_attention(q[b, h, i:i + 1], k[b, h, keys], v[b, h, keys], 0.5)[0]
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


def test_scaled_attention_s_matches_reference():
    q, k, v = rand(2, 3, 6, 4, seed=33), rand(2, 3, 6, 4, seed=34), rand(2, 3, 6, 4, seed=35)
    S = rand(3, 6, 6, seed=36) * 0.1
    out = RF.scaled_attention_s(q, k, v, S)
    eye = torch.eye(6, dtype=torch.float64)
    for b in range(2):
        for h in range(3):
            ref = torch.softmax(q[b, h] @ k[b, h].T / 2, -1) @ (eye - S[h]) @ v[b, h]
            torch.testing.assert_close(out[b, h], ref, rtol=0, atol=1e-12)
    # S = 0 is plain attention
    torch.testing.assert_close(RF.scaled_attention_s(q, k, v, torch.zeros(3, 6, 6, dtype=torch.float64)),
                               RF.attention(q, k, v))


def test_scaled_attention_alpha_matches_reference():
    q, k, v = rand(2, 3, 6, 4, seed=37), rand(2, 3, 6, 4, seed=38), rand(2, 3, 6, 4, seed=39)
    alpha = 0.7
    out = RF.scaled_attention_alpha(q, k, v, torch.tensor(alpha, dtype=torch.float64))
    eye = torch.eye(6, dtype=torch.float64)
    for b in range(2):
        for h in range(3):
            kk = torch.softmax(k[b, h] @ k[b, h].T / 2, -1)
            ref = torch.softmax(q[b, h] @ k[b, h].T / 2, -1) @ (eye - alpha * kk) @ v[b, h]
            torch.testing.assert_close(out[b, h], ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(RF.scaled_attention_alpha(q, k, v, 0.0), RF.attention(q, k, v))



def test_as_bool_mask_is_the_one_mask_normaliser():
    """bool passes through; additive 0 / -inf (or the dtype minimum) becomes True / False; an
    attention bias (any other value) is refused, naming the bool-mask fix."""
    add = torch.tensor([[0.0, float("-inf")], [torch.finfo(torch.float32).min, 0.0]])
    assert torch.equal(RF.as_bool_mask(add), torch.tensor([[True, False], [False, True]]))
    b = torch.tensor([True, False])
    assert RF.as_bool_mask(b) is b
    assert RF.as_bool_mask(None) is None
    with pytest.raises(ValueError, match="bool mask"):
        RF.as_bool_mask(torch.tensor([0.0, -1.0]))
    with pytest.raises(ValueError, match="bool"):
        RF.as_bool_mask(torch.tensor([0, 1]))
    four = RF.as_bool_mask(add, ndim=4)  # leading singleton dimensions, what the integrations and analysis use
    assert four.shape == (1, 1, 2, 2) and torch.equal(four[0, 0], RF.as_bool_mask(add))
    assert RF.as_bool_mask(torch.ones(1, 2, 3, 3, dtype=torch.bool), ndim=2).shape == (1, 2, 3, 3)
    k = rand(1, 1, 2, 3, seed=3)
    torch.testing.assert_close(RF.symmetric_attention(k, k, attn_mask=add),
                               RF.symmetric_attention(k, k, attn_mask=RF.as_bool_mask(add)), rtol=0, atol=0)


_ACCEPTED = "must be floating-point tensors (float16, bfloat16, float32 or float64) of one dtype on one device"
_S = torch.zeros(8, 8)  # scaled_attention_s's S for 8 tokens


def _entry_points():
    """Each public kernel with its tensors as keywords: the test swaps one of them for a bad one."""
    return {
        "attention": (lambda q, k, v, **kw: RF.attention(q, k, v, **kw), ("q", "k", "v")),
        "symmetric_attention": (lambda q, k, v, **kw: RF.symmetric_attention(k, v, **kw), ("k", "v")),
        "scaled_attention_s": (lambda q, k, v, **kw: RF.scaled_attention_s(q, k, v, _S, **kw), ("q", "k", "v")),
        "scaled_attention_alpha": (lambda q, k, v, **kw: RF.scaled_attention_alpha(q, k, v, 0.5, **kw),
                                   ("q", "k", "v")),
        "pap_attention": (lambda q, k, v, **kw: RF.pap_attention(k, v, **kw), ("k", "v")),
        "pap_decompose": (lambda q, k, v, **kw: RF.pap_decompose(k, v, **kw), ("k", "v")),
        "pap_prefill": (lambda q, k, v, **kw: RF.pap_prefill(k, v, **kw), ("k", "v")),
    }


@pytest.mark.parametrize("where", list(_entry_points()))
def test_an_integer_tensor_is_one_message_naming_it(where):
    fn, names = _entry_points()[where]
    bad = names[-1]
    tensors = {n: rand(1, 2, 8, 4, seed=i) for i, n in enumerate("qkv")}
    tensors[bad] = tensors[bad].long()
    listed = ", ".join(names[:-1]) + f" and {bad}"
    with pytest.raises(TypeError) as err:
        fn(**tensors)
    assert str(err.value) == f"{where}: {bad} is torch.int64 on cpu; {listed} {_ACCEPTED}"


@pytest.mark.parametrize("where", list(_entry_points()))
def test_mixed_dtypes_are_one_message_naming_both(where):
    fn, names = _entry_points()[where]
    tensors = {n: rand(1, 2, 8, 4, seed=i) for i, n in enumerate("qkv")}
    tensors[names[-1]] = tensors[names[-1]].float()
    with pytest.raises(TypeError, match=rf"^{where}: {names[-1]} is torch.float32 but {names[0]} is torch.float64; "):
        fn(**tensors)


@pytest.mark.parametrize("where", list(_entry_points()))
def test_tensors_on_two_devices_are_one_message_naming_both(where):
    """The meta device stands for a second device: the check reads devices only, so no kernel runs."""
    fn, names = _entry_points()[where]
    tensors = {n: rand(1, 2, 8, 4, seed=i) for i, n in enumerate("qkv")}
    tensors[names[-1]] = tensors[names[-1]].to("meta")
    with pytest.raises(ValueError, match=rf"^{where}: {names[-1]} is on meta but {names[0]} is on cpu; "):
        fn(**tensors)
    tensors = {n: rand(1, 2, 8, 4, seed=i) for i, n in enumerate("qkv")}
    mask = torch.ones(8, 8, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match=rf"^{where}: attn_mask is on meta but {names[0]} is on cpu; it must be on "):
        fn(**tensors, attn_mask=mask)


def test_s_matrix_on_another_device_is_named():
    q = k = v = rand(1, 2, 8, 4, seed=1)
    with pytest.raises(ValueError, match=r"^scaled_attention_s: s_matrix is on meta but q is on cpu; it must be on "
                                         r"the device of q, k and v$"):
        RF.scaled_attention_s(q, k, v, _S.to("meta", torch.float64))


def test_mixed_dtypes_under_autocast_are_accepted():
    """autocast casts the inputs to one dtype itself (a float32 q/k norm beside bfloat16 values)."""
    k, v = rand(1, 2, 8, 4, seed=1).float(), rand(1, 2, 8, 4, seed=2).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert RF.attention(k, k, v).dtype == torch.bfloat16
        assert RF.pap_attention(k, v, n_iter=2).shape == v.shape
    with pytest.raises(TypeError, match="v is torch.bfloat16 but k is torch.float32"):
        RF.pap_attention(k, v, n_iter=2)  # without autocast, nothing would cast them


def test_the_input_check_traces_under_torch_compile_without_a_graph_break():
    """The check reads dtypes and devices only, which torch.compile folds into the graph's guards."""
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    q, k, v = (rand(1, 2, 8, 4, seed=i) for i in range(3))
    fn = torch.compile(lambda a, b, c: RF.attention(a, b, c), backend=counter, fullgraph=True)
    torch.testing.assert_close(fn(q, k, v), RF.attention(q, k, v), rtol=0, atol=0)
    assert counter.frame_count == 1
