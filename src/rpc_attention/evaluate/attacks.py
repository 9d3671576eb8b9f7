"""Adversarial attacks in two input spaces, on any classifier ``nn.Module``.

Spaces (docs/method.md#adversarial-attacks):

* ``pixel`` (default, correct): the model is wrapped with its normalisation
  (:class:`~rpc_attention.evaluate.inputs.Normalized`), inputs live in ``[0, 1]`` and adversarial
  inputs are clipped to ``[0, 1]``; ``eps`` is in pixel units (``1/255`` = one grey level).
* ``official``: as the official code, the attack works on the already-normalised tensor with no
  clipping to the valid image range; ``eps`` is in normalised units.

torchattacks implements FGSM, PGD, SPSA, CW, Square and the AutoAttack components and always clamps
to ``[0, 1]``.  For the ``official`` space we hand torchattacks an affine re-parameterisation of the
normalised tensor, ``x_n = lo + s * u`` with ``u`` in ``[0, 1]``, where ``[lo, lo + s]`` is the
normalised image of ``[0, 1]`` widened by a margin (default ``max(1, 2 eps)`` normalised units).  All
L_p norms scale by the same ``s``, so an attack with budget ``eps / s`` on ``u`` is exactly the
unclipped attack with budget ``eps`` on ``x_n`` as long as the box never binds, which it cannot for
L-inf attacks (the eps-ball lies inside the box).  Carlini-Wagner (unbounded L2, tanh box) is the one
attack for which the box can bind; it is then "no clipping within margin".

Written here because no installed library offers them: sparse L1 descent (SLD, the cleverhans
algorithm) and uniform L-inf noise; and PGD, because torchattacks' PGD returns the last iterate, which
can leave an example that an earlier iterate misclassified correctly classified again (on a tiny
trained ViT this made PGD-20 score above FGSM at 2/255). All three take explicit bounds (``None`` = no
clipping).

Gradients are taken through the whole model, i.e. through every PAP iteration (nothing is detached).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .inputs import Normalized

__all__ = ["SPACES", "InputSpace", "pgd_linf", "sparse_l1_descent", "uniform_noise", "make_attack"]

SPACES = ("pixel", "official")


class _Affine(nn.Module):
    """``model(lo + scale * u)``: torchattacks' ``[0, 1]`` box mapped onto normalised inputs."""

    def __init__(self, model: nn.Module, lo: float, scale: float) -> None:
        super().__init__()
        self.model = model
        self.lo = float(lo)
        self.scale = float(scale)

    def forward(self, u: Tensor) -> Tensor:
        return self.model(self.lo + self.scale * u)


@dataclass
class InputSpace:
    """Where an attack operates.  ``model`` is the classifier on *normalised* inputs.

    * :attr:`image_model` takes ``[0, 1]`` images (used to score clean and adversarial images).
    * :meth:`for_torchattacks` returns ``(box_model, to_box, from_box, scale)`` for an attack
      library that works on ``[0, 1]``; budgets in this space's units are divided by ``scale``.
    * :meth:`for_own` returns ``(model, to_space, from_space, (lo, hi))`` for our attacks, which take
      explicit bounds.
    """

    model: nn.Module
    mean: Tensor  # [C]
    std: Tensor  # [C]
    name: str = "pixel"

    def __post_init__(self) -> None:
        if self.name not in SPACES:
            raise ValueError(f"unknown input space {self.name!r}; choose from {', '.join(SPACES)}")
        self.image_model = Normalized(self.model, self.mean, self.std)

    # normalised <-> pixel
    def _c(self, t: Tensor, x: Tensor) -> Tensor:
        return t.to(device=x.device, dtype=x.dtype).view(1, -1, 1, 1)

    def normalise(self, x01: Tensor) -> Tensor:
        return (x01 - self._c(self.mean, x01)) / self._c(self.std, x01)

    def denormalise(self, xn: Tensor) -> Tensor:
        return xn * self._c(self.std, xn) + self._c(self.mean, xn)

    def normalised_range(self, margin: float) -> Tuple[float, float]:
        lo = float(((0.0 - self.mean) / self.std).min()) - margin
        hi = float(((1.0 - self.mean) / self.std).max()) + margin
        return lo, hi

    def for_torchattacks(self, margin: float = 1.0):
        """``(box_model, to_box, from_box, scale)``; ``from_box`` returns attack-space tensors
        (pixels for ``pixel``, normalised tensors for ``official``)."""
        if self.name == "pixel":
            return self.image_model, (lambda x01: x01), (lambda u: u), 1.0
        lo, hi = self.normalised_range(margin)
        scale = hi - lo
        box = _Affine(self.model, lo, scale)
        return box, (lambda x01: (self.normalise(x01) - lo) / scale), (lambda u: lo + scale * u), scale

    def for_own(self):
        """``(model_in_space, to_space, bounds)``: bounds ``(0, 1)`` in pixel space, ``None`` in official."""
        if self.name == "pixel":
            return self.image_model, (lambda x01: x01), (0.0, 1.0)
        return self.model, self.normalise, None

    def to_space(self, x01: Tensor) -> Tensor:
        return x01 if self.name == "pixel" else self.normalise(x01)

    def space_model(self) -> nn.Module:
        """The classifier on this space's tensors (pixels or normalised)."""
        return self.image_model if self.name == "pixel" else self.model


# ---------------------------------------------------------------------------------------------
# attacks written here


def _clip(x: Tensor, bounds: Optional[Tuple[float, float]]) -> Tensor:
    return x if bounds is None else x.clamp(bounds[0], bounds[1])


def uniform_noise(x: Tensor, eps: float, bounds: Optional[Tuple[float, float]] = (0.0, 1.0),
                  generator: Optional[torch.Generator] = None) -> Tensor:
    """``x + U(-eps, eps)`` independently per element, clipped to ``bounds`` (``None``: no clipping)."""
    noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype) * 2 - 1
    return _clip(x + eps * noise, bounds).detach()


def pgd_linf(model: nn.Module, x: Tensor, y: Tensor, eps: float, steps: int = 20, step_size: Optional[float] = None,
             random_start: bool = True, bounds: Optional[Tuple[float, float]] = (0.0, 1.0), keep_best: bool = True,
             generator: Optional[torch.Generator] = None) -> Tensor:
    """L-inf PGD on the cross-entropy (Madry et al. 2018): from ``x`` (plus ``U(-eps, eps)`` noise with
    ``random_start``), ``steps`` steps ``adv + step_size * sign(grad)``, each projected onto the eps-ball
    around ``x`` and clipped to ``bounds``. ``step_size`` defaults to ``0.15 eps``.

    ``keep_best``: an example is broken as soon as one iterate is misclassified, and that first
    misclassified iterate is returned for it (the logits come from the forward each step makes anyway);
    the others get the last iterate. Without it, the last iterate for every example (torchattacks).
    """
    x = x.detach()
    alpha = 0.15 * eps if step_size is None else float(step_size)
    adv = x.clone()
    if random_start:
        noise = torch.rand(x.shape, generator=generator, device=x.device, dtype=x.dtype) * 2 - 1
        adv = _clip(x + eps * noise, bounds)
    best = adv.clone()
    broken = torch.zeros(x.shape[0], dtype=torch.bool, device=x.device)
    for _ in range(int(steps)):
        adv.requires_grad_(True)
        logits = model(adv)
        if keep_best:
            first = (logits.detach().argmax(-1) != y) & ~broken
            best[first] = adv.detach()[first]
            broken |= first
        (grad,) = torch.autograd.grad(F.cross_entropy(logits, y), adv)
        adv = adv.detach() + alpha * grad.sign()
        adv = _clip(x + (adv - x).clamp(-eps, eps), bounds).detach()
    if not keep_best:
        return adv
    best[~broken] = adv[~broken]
    return best


def _l1_scale(eta: Tensor, eps: float) -> Tensor:
    """Shrink each example's perturbation onto the L1 ball of radius ``eps`` (cleverhans ``clip_eta``)."""
    norm = eta.flatten(1).abs().sum(1).clamp_min(1e-12)
    factor = torch.clamp(eps / norm, max=1.0)
    return eta * factor.view(-1, *([1] * (eta.ndim - 1)))


def sparse_l1_descent(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    eps: float = 10.0,
    steps: int = 20,
    step_size: float = 1.0,
    grad_sparsity: float = 99.0,
    bounds: Optional[Tuple[float, float]] = (0.0, 1.0),
    rand_init: bool = False,
    clip_grad: bool = False,
) -> Tensor:
    """Sparse L1 descent (Tramer & Boneh 2019; the cleverhans ``SparseL1Descent`` algorithm).

    Each step moves along the sign of the gradient restricted to its coordinates at or above the
    ``grad_sparsity`` percentile of ``|grad|`` (per example), normalised to L1 norm 1 and scaled by
    ``step_size``; the total perturbation is shrunk onto the L1 ball of radius ``eps`` and the image
    clipped to ``bounds``.  ``clip_grad`` ignores gradient coordinates that point out of the box.
    """
    if not 0 <= grad_sparsity < 100:
        raise ValueError(f"grad_sparsity must be in [0, 100), got {grad_sparsity}")
    x = x.detach()
    if rand_init:
        # uniform direction on the L1 sphere scaled by a uniform radius (Laplace sample, normalised)
        lap = torch.distributions.Laplace(0.0, 1.0).sample(x.shape).to(x)
        lap = lap / lap.flatten(1).abs().sum(1).clamp_min(1e-12).view(-1, *([1] * (x.ndim - 1)))
        r = torch.rand(x.shape[0], device=x.device, dtype=x.dtype).view(-1, *([1] * (x.ndim - 1)))
        adv = _clip(x + eps * r * lap, bounds)
    else:
        adv = x.clone()
    n_feat = x[0].numel()
    k = max(1, int(round(n_feat * grad_sparsity / 100.0)))  # kth smallest |g| = the percentile
    for _ in range(int(steps)):
        adv.requires_grad_(True)
        loss = F.cross_entropy(model(adv), y, reduction="sum")
        (grad,) = torch.autograd.grad(loss, adv)
        adv = adv.detach()
        if clip_grad and bounds is not None:
            at_min = (adv <= bounds[0]) & (grad < 0)
            at_max = (adv >= bounds[1]) & (grad > 0)
            grad = grad.masked_fill(at_min | at_max, 0.0)
        g = grad.flatten(1)
        a = g.abs()
        thresh = a.kthvalue(min(k, n_feat), dim=1, keepdim=True).values
        mask = (a >= thresh) & (a > 0)
        count = mask.sum(1, keepdim=True).clamp_min(1)
        step = (torch.sign(g) * mask / count).view_as(adv)
        eta = _l1_scale(adv + step_size * step - x, eps)
        adv = _clip(x + eta, bounds).detach()
    return adv


# ---------------------------------------------------------------------------------------------
# one factory for every attack suite


def _ta():
    import torchattacks  # imported here: it is slow to import and only the attacks need it

    return torchattacks


def _autoattack(ta, model, eps: float, n_classes: int, seed: int, steps: int, n_queries: int, targets: int = 9,
                norm: str = "Linf"):
    """AutoAttack 'standard' (Croce & Hein 2020): APGD-CE, APGD-T, FAB-T, Square(5000), each run on
    the points the previous ones did not break.  Built from torchattacks' components so that the
    step counts follow the original (100), which torchattacks' ``AutoAttack`` wrapper leaves at 10;
    targeted attacks use the top ``min(9, n_classes - 1)`` classes as in the original."""
    nc = min(int(targets) + 1, int(n_classes))  # torchattacks targets the top n_classes - 1 classes
    attacks = [
        ta.APGD(model, norm=norm, eps=eps, steps=steps, n_restarts=1, seed=seed, loss="ce"),
        ta.APGDT(model, norm=norm, eps=eps, steps=steps, n_restarts=1, seed=seed, n_classes=nc),
        ta.FAB(model, norm=norm, eps=eps, steps=steps, n_restarts=1, seed=seed, multi_targeted=True, n_classes=nc),
        ta.Square(model, norm=norm, eps=eps, n_queries=n_queries, n_restarts=1, seed=seed),
    ]
    return ta.MultiAttack(attacks)


@dataclass(frozen=True)
class Attack:
    """One attack of the table :func:`make_attack` reads.

    ``build(space, eps, opts, n_classes, seed)`` returns ``attack(x01, y) -> adversarial tensor in the
    space's units``. ``protocol(opts)`` names a protocol that differs from the suite's description
    (a reduced budget), or returns None.
    """

    build: Callable[[InputSpace, Optional[float], Mapping[str, Any], int, int], Callable[[Tensor, Tensor], Tensor]]
    protocol: Callable[[Mapping[str, Any]], Optional[str]] = lambda opts: None


def _own_noise(space: InputSpace, eps, opts, n_classes: int, seed: int):
    _, to_space, bounds = space.for_own()
    gen_holder: Dict[str, torch.Generator] = {}

    def attack_noise(x01: Tensor, y: Tensor) -> Tensor:
        g = gen_holder.get("g")
        if g is None:
            g = gen_holder["g"] = torch.Generator(device=x01.device).manual_seed(seed)
        return uniform_noise(to_space(x01), float(eps), bounds, generator=g)

    return attack_noise


def _own_sld(space: InputSpace, eps, opts, n_classes: int, seed: int):
    model, to_space, bounds = space.for_own()

    def attack_sld(x01: Tensor, y: Tensor) -> Tensor:
        return sparse_l1_descent(model, to_space(x01), y, eps=float(eps), steps=int(opts["steps"]),
                                 step_size=float(opts["step_size"]), grad_sparsity=float(opts["grad_sparsity"]),
                                 bounds=bounds, rand_init=bool(opts.get("rand_init", False)),
                                 clip_grad=bool(opts.get("clip_grad", False)))

    return attack_sld


def _own_pgd(space: InputSpace, eps, opts, n_classes: int, seed: int):
    model, to_space, bounds = space.for_own()
    gen_holder: Dict[str, torch.Generator] = {}

    def attack_pgd(x01: Tensor, y: Tensor) -> Tensor:
        if "g" not in gen_holder:  # one stream over the batches, seeded: the same starts every run
            gen_holder["g"] = torch.Generator(device=x01.device).manual_seed(seed)
        return pgd_linf(model, to_space(x01), y, float(eps), steps=int(opts["steps"]),
                        step_size=float(opts["step_ratio"]) * float(eps), random_start=bool(opts.get("random_start", True)),
                        bounds=bounds, keep_best=bool(opts.get("keep_best", True)), generator=gen_holder["g"])

    return attack_pgd


def _torchattack(make, interior: bool = False):
    """An :class:`Attack` from torchattacks: ``make(ta, box_model, eps_in_box, scale, opts, seed,
    n_classes)`` builds it on the space's ``[0, 1]`` box; ``interior`` keeps inputs off the box's faces."""

    def build(space: InputSpace, eps, opts, n_classes: int, seed: int):
        ta = _ta()
        margin = max(float(opts.get("official_margin") or 1.0), 2.0 * float(eps or 0.0))
        box, to_box, from_box, s = space.for_torchattacks(margin)
        e = None if eps is None else float(eps) / s
        atk = make(ta, box, e, s, opts, seed, n_classes)

        def attack(x01: Tensor, y: Tensor) -> Tensor:
            u = to_box(x01)
            if interior:
                u = u.clamp(1e-6, 1 - 1e-6)
            return from_box(atk(u, y)).detach()

        return attack

    return build


_AUTOATTACK_STANDARD = {"steps": 100, "targets": 9, "n_queries": 5000}


def _autoattack_protocol(opts: Mapping[str, Any]) -> Optional[str]:
    cut = {k: opts.get(k) for k in _AUTOATTACK_STANDARD if opts.get(k) != _AUTOATTACK_STANDARD[k]}
    if not cut:
        return None
    return ("reduced-budget AutoAttack (APGD-CE, APGD-T, FAB-T, Square; "
            + ", ".join(f"{k}={v} instead of {_AUTOATTACK_STANDARD[k]}" for k, v in cut.items()) + ")")


_ATTACKS: Dict[str, Attack] = {
    "noise": Attack(_own_noise),
    "sld": Attack(_own_sld),
    "fgsm": Attack(_torchattack(lambda ta, box, e, s, o, seed, nc: ta.FGSM(box, eps=e))),
    "pgd": Attack(_own_pgd),
    "spsa": Attack(_torchattack(lambda ta, box, e, s, o, seed, nc: ta.SPSA(
        box, eps=e, delta=float(o["delta"]) / s, lr=float(o["lr"]) / s, nb_iter=int(o["steps"]),
        nb_sample=int(o["n_samples"]), max_batch_size=int(o["max_batch_size"])))),
    # torchattacks' CW starts from atanh(2u - 1): pixels at exactly 0 or 1 (Fashion-MNIST's black
    # background) would sit at +-inf with zero gradient and could never move.
    "cw": Attack(_torchattack(lambda ta, box, e, s, o, seed, nc: ta.CW(
        box, c=float(o["c"]), kappa=float(o["kappa"]), steps=int(o["steps"]), lr=float(o["lr"])), interior=True)),
    "square": Attack(_torchattack(lambda ta, box, e, s, o, seed, nc: ta.Square(
        box, norm="Linf", eps=e, n_queries=int(o["n_queries"]), n_restarts=1, p_init=float(o.get("p_init", 0.8)),
        seed=seed))),
    "autoattack": Attack(_torchattack(lambda ta, box, e, s, o, seed, nc: _autoattack(
        ta, box, e, nc, seed, int(o["steps"]), int(o["n_queries"]), int(o.get("targets", 9)))),
        protocol=_autoattack_protocol),
}


def register_attack(name: str, attack: Attack) -> None:
    """Add ``attack`` to the table under ``name`` (its suite is registered with the same name)."""
    _ATTACKS[name] = attack


def get_attack(name: str) -> Attack:
    if name not in _ATTACKS:
        raise ValueError(f"unknown attack {name!r}; available: {', '.join(sorted(_ATTACKS))}")
    return _ATTACKS[name]


def make_attack(name: str, space: InputSpace, eps: Optional[float], opts: Mapping[str, Any],
                n_classes: int = 10) -> Callable[[Tensor, Tensor], Tensor]:
    """Return ``attack(x01, y) -> adversarial tensor in the space's units`` (pixels or normalised).

    ``opts`` holds the suite's settings (steps, step ratio, ...); ``eps`` is in the space's units.
    """
    return get_attack(name).build(space, eps, opts, n_classes, int(opts.get("seed") or 0))
