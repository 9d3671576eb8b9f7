"""Segmenter: shapes (incl. sizes that are not multiples of the patch), pad-then-crop, decoder PAP via
rpc_attention.nn, encoder init from a classification run, sliding windows, a few training steps."""

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from rpc_attention.models.segmentation import (
    LinearDecoder,
    MaskTransformerDecoder,
    build_segmenter,
    load_encoder_weights,
    sliding_window_logits,
)
from rpc_attention.nn import RPCAttention, SymmetricAttention

TINY = dict(num_classes=5, img_size=32, patch_size=8, in_chans=1, embed_dim=32, depth=2, num_heads=2)


def _seg(**kw):
    torch.manual_seed(0)
    return build_segmenter(dict(TINY, **kw)).eval()


@pytest.mark.parametrize("decoder", ["mask_transformer", "linear"])
def test_output_shapes(decoder):
    m = _seg(decoder=decoder)
    for size in [(32, 32), (40, 24), (30, 45), (7, 9)]:  # incl. sides that are not multiples of 8
        x = torch.randn(2, 1, *size)
        with torch.no_grad():
            out = m(x)
        assert out.shape == (2, 5, *size)
        assert torch.isfinite(out).all()


def test_pad_then_crop_matches_padded_input():
    m = _seg()
    x = torch.randn(1, 1, 30, 45)
    padded = F.pad(x, (0, 48 - 45, 0, 32 - 30))
    with torch.no_grad():
        a = m(x)
        b = m(padded)[..., :30, :45]
    torch.testing.assert_close(a, b)


def test_decoder_types_and_pap_placement():
    m = _seg(decoder="mask_transformer")
    assert isinstance(m.decoder, MaskTransformerDecoder)
    assert all(type(b.attn) is SymmetricAttention for b in m.decoder.blocks)
    assert all(type(b.attn) is SymmetricAttention for b in m.encoder.blocks)
    assert len(m.decoder.blocks) == 2
    # PAP in decoder layer 0 only (official RPC Segmenter), encoder untouched
    m = _seg(decoder_rpc=True, decoder_n_iter=3, decoder_lambd=2.0)
    assert isinstance(m.decoder.blocks[0].attn, RPCAttention)
    assert m.decoder.blocks[0].attn.n_iter == 3 and m.decoder.blocks[0].attn.lambd == 2.0
    assert type(m.decoder.blocks[1].attn) is SymmetricAttention
    assert all(type(b.attn) is SymmetricAttention for b in m.encoder.blocks)
    # PAP in the encoder only
    m = _seg(name="rpc_symvit_tiny_patch16_224", rpc_layers=[0], n_iter=2)
    assert isinstance(m.encoder.blocks[0].attn, RPCAttention)
    assert all(type(b.attn) is SymmetricAttention for b in m.decoder.blocks)
    assert isinstance(_seg(decoder="linear").decoder, LinearDecoder)
    with pytest.raises(ValueError, match="decoder_rpc"):
        _seg(decoder="linear", decoder_rpc=True)
    with pytest.raises(ValueError, match="out of range"):
        _seg(decoder_rpc=[5])
    with pytest.raises(ValueError, match="unknown encoder"):
        _seg(name="no_such_model")


def test_mask_transformer_masks_are_normalised_over_classes():
    dec = MaskTransformerDecoder(16, 4, depth=1).eval()
    with torch.no_grad():
        out = dec(torch.randn(2, 6, 16), (2, 3))
    assert out.shape == (2, 4, 2, 3)
    # LayerNorm over classes with its initial affine (1, 0): zero mean, unit variance per pixel
    torch.testing.assert_close(out.mean(1), torch.zeros(2, 2, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.var(1, unbiased=False), torch.ones(2, 2, 3), atol=2e-2, rtol=0)


def _classifier(tmp_path, **kw):
    torch.manual_seed(1)
    cls = timm.create_model("symvit_tiny_patch16_224", num_classes=10, img_size=28, patch_size=4, in_chans=1,
                            embed_dim=32, depth=2, num_heads=2, **kw)
    run = tmp_path / "cls_run"
    run.mkdir()
    save_file({k: v.contiguous() for k, v in cls.state_dict().items()}, str(run / "model.safetensors"))
    return cls, run


def test_encoder_init_loads_every_encoder_weight(tmp_path):
    from timm.layers import resample_abs_pos_embed

    cls, run = _classifier(tmp_path)
    torch.manual_seed(2)
    seg = build_segmenter(dict(num_classes=11, img_size=64, patch_size=4, in_chans=1, embed_dim=32, depth=2,
                               num_heads=2, encoder_init=str(run)))
    src = cls.state_dict()
    enc = seg.encoder.state_dict()
    for k, v in enc.items():
        if k == "pos_embed":
            want = resample_abs_pos_embed(src[k], new_size=(16, 16), old_size=(7, 7), num_prefix_tokens=1)
            assert v.shape == (1, 1 + 16 * 16, 32)
            torch.testing.assert_close(v, want)
            torch.testing.assert_close(v[:, :1], src[k][:, :1])  # class token position kept
        else:
            assert k in src, k
            torch.testing.assert_close(v, src[k], rtol=0, atol=0)
    # same image size: no resampling, every tensor identical
    seg2 = build_segmenter(dict(num_classes=11, img_size=28, patch_size=4, in_chans=1, embed_dim=32, depth=2,
                                num_heads=2))
    info = load_encoder_weights(seg2.encoder, run)
    assert info["loaded"] == len(seg2.encoder.state_dict()) and info["resized"] == []
    assert set(info["dropped"]) == {"head.weight", "head.bias"}
    for k, v in seg2.encoder.state_dict().items():
        assert torch.equal(v, src[k])


def test_encoder_init_errors(tmp_path):
    _, run = _classifier(tmp_path)
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        build_segmenter(dict(num_classes=3, img_size=28, patch_size=4, in_chans=1, embed_dim=32, depth=2,
                             num_heads=2, encoder_init=str(tmp_path)))
    with pytest.raises(ValueError, match="shape"):  # different width
        build_segmenter(dict(num_classes=3, img_size=28, patch_size=4, in_chans=1, embed_dim=64, depth=2,
                             num_heads=2, encoder_init=str(run)))
    with pytest.raises(ValueError, match="missing"):  # deeper encoder than the classifier
        build_segmenter(dict(num_classes=3, img_size=28, patch_size=4, in_chans=1, embed_dim=32, depth=3,
                             num_heads=2, encoder_init=str(run)))


class _PixelModel(torch.nn.Module):
    """Per-pixel model (1x1 conv): sliding windows must reproduce whole-image inference exactly."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.conv = torch.nn.Conv2d(3, 4, 1)
        self.num_classes = 4

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("size,window,stride", [((20, 33), 8, 8), ((20, 33), 8, 5), ((5, 6), 8, 8)])
def test_sliding_window_equals_whole_image_for_pixelwise_model(size, window, stride):
    # A float64 model: every window computes the same per-pixel values as the whole image; the function
    # returns float32 logits, and averaging overlapping copies of one float32 value adds at most a few
    # float32 roundings.
    m = _PixelModel().double()
    x = torch.randn(2, 3, *size, dtype=torch.float64)
    out = sliding_window_logits(m, x, window, stride, batch_size=3)
    assert out.shape == (2, 4, *size)
    whole = m(x).detach().float()
    torch.testing.assert_close(out, whole, rtol=0, atol=4 * torch.finfo(torch.float32).eps * float(whole.abs().max()))


def test_a_few_training_steps_lower_the_loss():
    from rpc_attention.data.segmentation import FashionMNISTSegmentation
    from rpc_attention.train.task_segmentation import SegmentationTask

    ds = FashionMNISTSegmentation("train", num_images=8, size=32, n_items=(1, 2), scale=(0.7, 1.0),
                                  mean=(0.27,), std=(0.26,))
    x = torch.stack([ds[i][0] for i in range(8)])
    y = torch.stack([ds[i][1] for i in range(8)])
    torch.manual_seed(0)
    model = build_segmenter(dict(num_classes=11, img_size=32, patch_size=8, in_chans=1, embed_dim=32, depth=1,
                                 num_heads=2, decoder_layers=1, decoder_drop=0.0)).train()
    task = SegmentationTask()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(10):
            loss, stats = task.loss(model, (x, y), {})
            assert 0.0 <= float(stats["pixel_acc"]) <= 100.0
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        torch.set_num_threads(threads)
    assert losses[-1] < 0.7 * losses[0], losses


def test_encoder_init_from_a_trainer_classification_run(tmp_path):
    """A real `classification` run's model.safetensors initialises every encoder weight of a
    `segmentation` run (pos_embed resampled from the 4x4 grid of 28/7 to the 9x9 grid of 64//7;
    at run time 64 is padded to 70 and the 9x9 grid resampled again to 10x10)."""
    from safetensors.torch import load_file
    from timm.layers import resample_abs_pos_embed

    from rpc_attention.train import load_run, resolve_config, run_training

    enc = {"patch_size": 7, "embed_dim": 32, "depth": 1, "num_heads": 2, "drop_path_rate": 0.0}
    cls_cfg = resolve_config(base={
        "task": "classification", "model": {"name": "symvit_tiny_patch16_224", "kwargs": dict(enc)},
        "data": {"name": "fashion_mnist", "train_subset": 32, "test_subset": 16, "val_size": 0},
        "train": {"epochs": 1, "batch_size": 16, "threads": 1, "save_every": 0, "log_every": 1},
        "eval": {"batch_size": 16, "final_split": None}})
    cls_run = run_training(cls_cfg, tmp_path / "cls")
    src = load_file(str(cls_run / "model.safetensors"))
    seg_cfg = resolve_config(base={
        "task": "segmentation", "model": {"name": "symvit_tiny_patch16_224", "kwargs": dict(enc, img_size=64),
                                          "decoder_layers": 1},
        "data": {"name": "fmnist_seg", "train_images": 16, "val_images": 4, "test_images": 4},
        "train": {"epochs": 1, "batch_size": 8, "threads": 1, "save_every": 0, "log_every": 1},
        "eval": {"batch_size": 4, "final_split": None}}, overrides=[f"model.encoder_init={cls_run}"])
    from rpc_attention.train.tasks import get_task

    seg = get_task("segmentation").build_model(seg_cfg)
    own = seg.encoder.state_dict()
    assert set(own) == set(src) - {"head.weight", "head.bias"}
    for k, v in own.items():
        want = src[k]
        if k == "pos_embed":
            want = resample_abs_pos_embed(want, new_size=(9, 9), old_size=(4, 4), num_prefix_tokens=1)
        torch.testing.assert_close(v, want, rtol=0, atol=0)
    # the segmentation run trains, saves, and reloads through load_run
    seg_run = run_training(seg_cfg, tmp_path / "seg")
    model, cfg = load_run(seg_run)
    assert cfg["task"] == "segmentation"
    with torch.no_grad():
        assert model(torch.zeros(1, 1, 64, 64)).shape == (1, 11, 64, 64)
