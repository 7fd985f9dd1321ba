"""VEPO's image perturbations (docs/algorithms/vepo.md#images, [derived] / [code, related method]).

With a vision-language policy the grounding input is the image: the perturbed forward keeps every row's
``input_ids`` and replaces its batch extra ``pixel_values`` by

    x~ = perturb(x, regions, rng(seed, step, row), **args)          x: raw pixels (3, H, W) in [0, 1]

normalised afterwards (perturbing normalised tensors would change the noise scale). Every perturbation keeps
(3, H, W) and the [0, 1] range, so the image-token count and the response positions are unchanged. ``regions``
are boxes ``[x0, y0, x1, y1)`` in pixels: the whole image (``image_regions: whole``, the default) or the queried
object's boxes from ``Example.meta["regions"]`` (``image_regions: meta``). Built-ins:

| name | what | default args | source |
|---|---|---|---|
| ``gaussian`` (default) | clip(x + std * xi, 0, 1), xi ~ N(0, 1) per pixel and channel | std 0.74 | VEPO's "noise-perturbed image"; VPPO's 189/255 |
| ``patch_blacken`` | each ``patch`` x ``patch`` cell set to 0 with probability ``prob`` | patch 8, prob 0.5 | VPPO's default (14 px, 0.5) |
| ``grey`` | set to ``value`` | value 0.5 | VPPO ``complete_masking`` (128/255) |
| ``blur`` | Gaussian blur of standard deviation ``radius`` px (PIL's GaussianBlur radius) | radius 6 | VPPO ``gaussian_blur`` |
| ``resample`` | the scene re-rendered with the queried attribute redrawn (``shapes`` examples) | none | [derived], the image analogue of the text ``shuffle`` |

Any ``module:function`` with the signature ``fn(pixels, regions, rng, **args) -> pixels`` is accepted; a function
that takes a ``meta`` keyword also gets the row's ``Example.meta``. The rng is a ``numpy.random.Generator``
seeded from (run seed, step, row) (:func:`image_rng`), so a rerun perturbs identically (VPPO's is unseeded).
"""
from __future__ import annotations

import hashlib
import inspect
import random
from typing import Any, Callable

import numpy as np
import torch

from credo.methods.vepo.grounding import lookup_callable
from credo.registry import Registry

Boxes = list[list[int]]
ImagePerturbation = Callable[..., torch.Tensor]

IMAGE_PERTURBATIONS: Registry[ImagePerturbation] = Registry("image perturbation")


def register_image_perturbation(name: str) -> Callable[[ImagePerturbation], ImagePerturbation]:
    return IMAGE_PERTURBATIONS.register(name)


def get_image_perturbation(name: str) -> ImagePerturbation:
    """A registered image perturbation, or ``module:function``; an unknown name is a KeyError."""
    return lookup_callable(IMAGE_PERTURBATIONS, name)


def check_image_perturbation_args(name: str, args: dict[str, Any]) -> None:
    """TypeError when ``args`` are not keyword parameters of image perturbation ``name``."""
    params = inspect.signature(get_image_perturbation(name)).parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    known = [k for k in list(params)[3:] if k != "meta"]
    unknown = sorted(set(args) - set(known))
    if unknown:
        raise TypeError(f"image perturbation {name!r} has no parameter(s) {unknown}; it takes: "
                        f"{', '.join(known) or 'none'}")


def image_rng(seed: int, step: int, row: int) -> np.random.Generator:
    """The rng of one row's image perturbation (a SHA-256 of the key: stable across processes)."""
    digest = hashlib.sha256(f"credo/vepo-image/{seed}/{step}/{row}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


def region_mask(regions: Boxes | None, height: int, width: int) -> torch.Tensor:
    """(H, W) bool: the pixels inside any box ``[x0, y0, x1, y1)``; the whole image for None."""
    if regions is None:
        return torch.ones(height, width, dtype=torch.bool)
    mask = torch.zeros(height, width, dtype=torch.bool)
    for x0, y0, x1, y1 in regions:
        mask[max(y0, 0):max(y1, 0), max(x0, 0):max(x1, 0)] = True
    return mask


def _inside(pixels: torch.Tensor, changed: torch.Tensor, regions: Boxes | None) -> torch.Tensor:
    """``changed`` on the regions, ``pixels`` elsewhere, clipped to [0, 1]: (3, H, W)."""
    mask = region_mask(regions, pixels.shape[-2], pixels.shape[-1])
    return torch.where(mask, changed, pixels).clamp(0.0, 1.0)


@register_image_perturbation("gaussian")
def gaussian(pixels: torch.Tensor, regions: Boxes | None, rng: np.random.Generator, *, std: float = 0.74
             ) -> torch.Tensor:
    """clip(x + std * xi, 0, 1) on the regions, xi ~ N(0, 1) per pixel and channel."""
    noise = torch.from_numpy(rng.standard_normal(tuple(pixels.shape))).to(pixels.dtype)  # (3, H, W)
    return _inside(pixels, pixels + std * noise, regions)


@register_image_perturbation("patch_blacken")
def patch_blacken(pixels: torch.Tensor, regions: Boxes | None, rng: np.random.Generator, *, patch: int = 8,
                  prob: float = 0.5) -> torch.Tensor:
    """Each ``patch`` x ``patch`` cell of the grid set to 0 with probability ``prob``, on the regions only."""
    h, w = pixels.shape[-2:]
    cells = torch.from_numpy(rng.random((-(-h // patch), -(-w // patch))) < prob)  # (ceil(H/p), ceil(W/p))
    black = cells.repeat_interleave(patch, 0).repeat_interleave(patch, 1)[:h, :w]  # (H, W)
    return torch.where(black & region_mask(regions, h, w), torch.zeros_like(pixels), pixels)


@register_image_perturbation("grey")
def grey(pixels: torch.Tensor, regions: Boxes | None, rng: np.random.Generator, *, value: float = 0.5
         ) -> torch.Tensor:
    """The regions set to ``value`` (VPPO's flat 128/255 grey)."""
    return _inside(pixels, torch.full_like(pixels, value), regions)


@register_image_perturbation("blur")
def blur(pixels: torch.Tensor, regions: Boxes | None, rng: np.random.Generator, *, radius: float = 6.0
         ) -> torch.Tensor:
    """A separable Gaussian blur of standard deviation ``radius`` px (edges replicated), on the regions."""
    if radius <= 0:
        return pixels.clone()
    half = int(np.ceil(3 * radius))
    x = torch.arange(-half, half + 1, dtype=pixels.dtype)
    kernel = torch.exp(-0.5 * (x / radius) ** 2)
    kernel = kernel / kernel.sum()  # (K,)
    img = pixels.unsqueeze(1)  # (3, 1, H, W): one channel each
    img = torch.nn.functional.pad(img, (half, half, 0, 0), mode="replicate")
    img = torch.nn.functional.conv2d(img, kernel.view(1, 1, 1, -1))
    img = torch.nn.functional.pad(img, (0, 0, half, half), mode="replicate")
    img = torch.nn.functional.conv2d(img, kernel.view(1, 1, -1, 1))
    return _inside(pixels, img.squeeze(1), regions)


@register_image_perturbation("resample")
def resample(pixels: torch.Tensor, regions: Boxes | None, rng: np.random.Generator, *, meta: dict | None = None
             ) -> torch.Tensor:
    """The row's ``shapes`` scene re-rendered with the queried attribute redrawn (the layout kept)."""
    from credo.data.shapes import render, resample_scene

    if not meta or "scene" not in meta or "question" not in meta:
        raise ValueError("image perturbation 'resample' needs a scene spec (Example.meta['scene'] and "
                         "meta['question'], as the shapes task writes)")
    scene = resample_scene(meta["scene"], meta["question"], random.Random(int(rng.integers(2**62))))
    out = torch.from_numpy(render(scene, pixels.shape[-1])).permute(2, 0, 1).to(pixels.dtype) / 255.0
    if out.shape != pixels.shape:
        raise ValueError(f"resample: rendered {tuple(out.shape)}, the image is {tuple(pixels.shape)}")
    return out


def perturb_images(raw: torch.Tensor, metas: list[dict], *, perturb: str, perturb_args: dict, regions: str,
                   seed: int, step: int) -> torch.Tensor:
    """Every row's raw image (B, 3, H, W) in [0, 1] perturbed with its own rng; same shape, same range."""
    fn = get_image_perturbation(perturb)
    takes_meta = "meta" in inspect.signature(fn).parameters
    out = []
    for row, (px, meta) in enumerate(zip(raw, metas)):
        boxes = None if regions == "whole" else meta.get("regions")
        if regions != "whole" and boxes is None:
            raise ValueError("VEPO: token_select.image_regions=meta but a row has no Example.meta['regions']")
        extra = {"meta": meta} if takes_meta else {}
        new = fn(px, boxes, image_rng(seed, step, row), **perturb_args, **extra)
        if new.shape != px.shape:
            raise ValueError(f"image perturbation {perturb!r} changed the image shape {tuple(px.shape)} -> "
                             f"{tuple(new.shape)} (the image-token count and response positions would move)")
        out.append(new.clamp(0.0, 1.0))
    return torch.stack(out)
