"""Each sample's decisions in torchvision's terms: the ops the server ran
after the crop, as ``(name, kwargs)`` pairs such that
``getattr(torchvision.transforms.v2.functional, name)(image, **kwargs)``
replays each on a CHW ``uint8`` tensor, in the order applied.

The server reports the decisions per sample (``Batch.crops``: the policy's
ops with their signed magnitudes, the jitter's factors in order, the
grayscale coin, the erased box) and the stream's parameters once per batch
(``Batch.augmentation``); this module turns the two into calls, as
torchvision's ``_apply_image_or_video_transform`` does for the policies.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from ._proto import shardfeed_pb2 as pb

SampleOps = list[tuple[str, dict[str, Any]]]

# The rows of the server's op table whose decisions this client's decoder
# (``shardfeed.decode.BatchDecoder``, through ``shardfeed.torch.ops``)
# applies itself: named in an encoded stream's request, so the server
# leaves those streams' JPEGs to the client.
CLIENT_OPS = (
    "horizontal_flip",
    "auto_augment",
    "color_jitter",
    "grayscale",
    "gaussian_blur",
    "solarize",
    "random_erasing",
)
# The resizes past the bilinear default this client's decoder makes as the
# server does (``shardfeed._resize``), as ``client_ops`` names them.
CLIENT_RESIZES = ("resize_bicubic",)

# The server's generator (SplitMix64, src/plan/rng.rs), written once for
# the client: its increment and its finalizer's multipliers. numpy uses
# them here, torch on the batch's device in torch/ops/random_erasing.py.
SPLITMIX_GAMMA = 0x9E3779B97F4A7C15
SPLITMIX_MULTIPLIERS = (0xBF58476D1CE4E5B9, 0x94D049BB133111EB)
_GOLDEN_GAMMA = np.uint64(SPLITMIX_GAMMA)


def _mix(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    first, second = (np.uint64(m) for m in SPLITMIX_MULTIPLIERS)
    z = (z ^ (z >> np.uint64(30))) * first
    z = (z ^ (z >> np.uint64(27))) * second
    return z ^ (z >> np.uint64(31))


def erase_noise(seed: int, height: int, width: int, mean: Any, std: Any) -> npt.NDArray[np.uint8]:
    """The levels the server erased with for ``value="random"``: ``(3,
    height, width)`` ``uint8``, standard normals per value (channel first)
    through the normalization, ``floor((mean + std * z) * 255 + 0.5)``
    clamped. The normals are Box-Muller over SplitMix64 outputs of the
    seed, the server's own (``src/decode/augment/kernels/erase.rs``)."""
    count = 3 * height * width
    index = np.arange(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        first = np.uint64(seed) + (np.uint64(2) * index + np.uint64(1)) * _GOLDEN_GAMMA
        second = np.uint64(seed) + (np.uint64(2) * index + np.uint64(2)) * _GOLDEN_GAMMA
        u1 = ((_mix(first) >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53
        u2 = (_mix(second) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
    z = z.reshape(3, height, width)
    mean32 = np.asarray(mean, dtype=np.float32).astype(np.float64).reshape(3, 1, 1)
    std32 = np.asarray(std, dtype=np.float32).astype(np.float64).reshape(3, 1, 1)
    levels = np.floor((mean32 + std32 * z) * 255.0 + 0.5)
    out: npt.NDArray[np.uint8] = np.clip(levels, 0, 255).astype(np.uint8)
    return out


def _as_tensor(levels: npt.NDArray[np.uint8]) -> Any:
    """A torch tensor where torch is installed (torchvision's ``erase``
    takes one), else the array."""
    try:
        import torch
    except ImportError:  # pragma: no cover - the numpy-only install
        return levels
    return torch.from_numpy(np.ascontiguousarray(levels))


def _interpolation(augmentation: Any) -> Any:
    return _sampling(augmentation.auto_augment.interpolation)


def _sampling(interpolation: int) -> Any:
    """A geometric op's wire interpolation as torchvision's
    ``InterpolationMode``."""
    name = "BILINEAR" if interpolation == pb.INTERPOLATION_BILINEAR else "NEAREST"
    try:
        from torchvision.transforms import InterpolationMode
    except ImportError:  # pragma: no cover - without torchvision
        return name.lower()
    return InterpolationMode[name]


def _policy_call(
    step: Any, interpolation: Any, fill: list[float] | None
) -> tuple[str, dict[str, Any]] | None:
    """One policy op as torchvision's ``_apply_image_or_video_transform``
    calls its kernel (None for Identity)."""
    op = pb.PolicyOp.Name(step.op).removeprefix("POLICY_OP_")
    magnitude = float(step.magnitude)
    geometry = {"interpolation": interpolation, "fill": fill}
    shear = math.degrees(math.atan(magnitude))
    affine = {"angle": 0.0, "scale": 1.0, **geometry}
    if op == "IDENTITY":
        return None
    if op == "SHEAR_X":
        return "affine", {**affine, "translate": [0, 0], "shear": [shear, 0.0], "center": [0, 0]}
    if op == "SHEAR_Y":
        return "affine", {**affine, "translate": [0, 0], "shear": [0.0, shear], "center": [0, 0]}
    if op == "TRANSLATE_X":
        return "affine", {**affine, "translate": [int(magnitude), 0], "shear": [0.0, 0.0]}
    if op == "TRANSLATE_Y":
        return "affine", {**affine, "translate": [0, int(magnitude)], "shear": [0.0, 0.0]}
    if op == "ROTATE":
        return "rotate", {"angle": magnitude, **geometry}
    enhance = {
        "BRIGHTNESS": ("adjust_brightness", "brightness_factor"),
        "COLOR": ("adjust_saturation", "saturation_factor"),
        "CONTRAST": ("adjust_contrast", "contrast_factor"),
        "SHARPNESS": ("adjust_sharpness", "sharpness_factor"),
    }
    if op in enhance:
        name, argument = enhance[op]
        return name, {argument: 1.0 + magnitude}
    if op == "POSTERIZE":
        return "posterize", {"bits": int(magnitude)}
    if op == "SOLARIZE":
        return "solarize", {"threshold": 255.0 * magnitude}
    return {"AUTO_CONTRAST": "autocontrast", "EQUALIZE": "equalize", "INVERT": "invert"}[op], {}


_JITTER = {
    pb.JITTER_OP_BRIGHTNESS: ("adjust_brightness", "brightness_factor"),
    pb.JITTER_OP_CONTRAST: ("adjust_contrast", "contrast_factor"),
    pb.JITTER_OP_SATURATION: ("adjust_saturation", "saturation_factor"),
    pb.JITTER_OP_HUE: ("adjust_hue", "hue_factor"),
}


# timm's op functions (``timm.data.auto_augment``) by wire op, with the
# name of the argument each takes; None: no argument.
_TIMM: dict[int, tuple[str, str | None]] = {
    pb.TIMM_OP_AUTO_CONTRAST: ("auto_contrast", None),
    pb.TIMM_OP_EQUALIZE: ("equalize", None),
    pb.TIMM_OP_INVERT: ("invert", None),
    pb.TIMM_OP_ROTATE: ("rotate", "degrees"),
    pb.TIMM_OP_POSTERIZE: ("posterize", "bits_to_keep"),
    pb.TIMM_OP_POSTERIZE_INCREASING: ("posterize", "bits_to_keep"),
    pb.TIMM_OP_POSTERIZE_ORIGINAL: ("posterize", "bits_to_keep"),
    pb.TIMM_OP_SOLARIZE: ("solarize", "thresh"),
    pb.TIMM_OP_SOLARIZE_INCREASING: ("solarize", "thresh"),
    pb.TIMM_OP_SOLARIZE_ADD: ("solarize_add", "add"),
    pb.TIMM_OP_COLOR: ("color", "factor"),
    pb.TIMM_OP_COLOR_INCREASING: ("color", "factor"),
    pb.TIMM_OP_CONTRAST: ("contrast", "factor"),
    pb.TIMM_OP_CONTRAST_INCREASING: ("contrast", "factor"),
    pb.TIMM_OP_BRIGHTNESS: ("brightness", "factor"),
    pb.TIMM_OP_BRIGHTNESS_INCREASING: ("brightness", "factor"),
    pb.TIMM_OP_SHARPNESS: ("sharpness", "factor"),
    pb.TIMM_OP_SHARPNESS_INCREASING: ("sharpness", "factor"),
    pb.TIMM_OP_SHEAR_X: ("shear_x", "factor"),
    pb.TIMM_OP_SHEAR_Y: ("shear_y", "factor"),
    pb.TIMM_OP_TRANSLATE_X_REL: ("translate_x_rel", "pct"),
    pb.TIMM_OP_TRANSLATE_Y_REL: ("translate_y_rel", "pct"),
    pb.TIMM_OP_TRANSLATE_X: ("translate_x_abs", "pixels"),
    pb.TIMM_OP_TRANSLATE_Y: ("translate_y_abs", "pixels"),
}
_TIMM_INTEGERS = frozenset({"bits_to_keep", "thresh", "add"})
_TIMM_FILL = (128, 128, 128)


def _timm_call(step: Any, fill: tuple[int, ...]) -> tuple[str, dict[str, Any]]:
    """One timm op as ``timm.data.auto_augment.<name>(pil_image, **kwargs)``
    runs it; the name is prefixed ``timm.`` (``replay`` runs it on PIL)."""
    name, argument = _TIMM[step.op]
    kwargs: dict[str, Any] = {}
    if argument is not None:
        value = float(step.argument)
        kwargs[argument] = int(value) if argument in _TIMM_INTEGERS else value
    if step.op in _TIMM_GEOMETRIC:
        bicubic = step.resample == pb.INTERPOLATION_BICUBIC
        kwargs["resample"] = "bicubic" if bicubic else "bilinear"
        kwargs["fillcolor"] = fill
    return f"timm.{name}", kwargs


_TIMM_GEOMETRIC = frozenset(
    {
        pb.TIMM_OP_ROTATE,
        pb.TIMM_OP_SHEAR_X,
        pb.TIMM_OP_SHEAR_Y,
        pb.TIMM_OP_TRANSLATE_X_REL,
        pb.TIMM_OP_TRANSLATE_Y_REL,
        pb.TIMM_OP_TRANSLATE_X,
        pb.TIMM_OP_TRANSLATE_Y,
    }
)


def _erase_call(box: Any, erasing: Any) -> tuple[str, dict[str, Any]]:
    value = erasing.WhichOneof("value")
    mean, std = list(erasing.normalize_mean), list(erasing.normalize_std)
    if value == "colour":
        levels = np.asarray(erasing.colour.levels, dtype=np.uint8).reshape(3, 1, 1)
    elif value == "random":
        levels = erase_noise(box.noise, box.height, box.width, mean, std)
    else:
        levels = erase_noise_mean(mean, std)
    return "erase", {
        "i": box.top,
        "j": box.left,
        "h": box.height,
        "w": box.width,
        "v": _as_tensor(levels),
    }


def erase_noise_mean(mean: Any, std: Any) -> npt.NDArray[np.uint8]:
    """The level 0 after Normalize is: the mean, ``(3, 1, 1)`` ``uint8``."""
    del std  # z = 0
    mean32 = np.asarray(mean, dtype=np.float32).astype(np.float64)
    return np.clip(np.floor(mean32 * 255.0 + 0.5), 0, 255).astype(np.uint8).reshape(3, 1, 1)


def sample_ops(crop: Any, augmentation: Any) -> SampleOps:
    """One sample's ops after its crop, in the order the server applied
    them: the table's (flips, rotation, policy, timm's RandAugment, jitter,
    grayscale, blur, solarize, the single colour ops, erasing), or where
    the stream has groups (RandomChoice, RandomOrder, RandomApply of
    several), the order the sample's ``applied_rows`` report."""
    calls = _row_calls(crop, augmentation)
    if not len(crop.applied_rows):
        return [call for _, call in calls]
    ran = list(crop.applied_rows)
    by_row: dict[str, SampleOps] = {}
    for row, call in calls:
        by_row.setdefault(row, []).append(call)
    return [call for row in ran for call in by_row.get(row, [])]


def _row_calls(crop: Any, augmentation: Any) -> list[tuple[str, tuple[str, dict[str, Any]]]]:
    """Each decision as a call, with the server's row it belongs to, in
    the table's order."""
    ops: list[tuple[str, tuple[str, dict[str, Any]]]] = []
    if crop.flipped:
        ops.append(("horizontal_flip", ("horizontal_flip", {})))
    if augmentation is None:
        return ops
    if crop.vertically_flipped:
        ops.append(("vertical_flip", ("vertical_flip", {})))
    if crop.HasField("rotation"):
        rotation = augmentation.rotation
        fill = list(map(float, rotation.fill)) or None
        sampling = _sampling(rotation.interpolation)
        arguments = {"angle": crop.rotation, "interpolation": sampling, "fill": fill}
        ops.append(("rotation", ("rotate", arguments)))
    if crop.HasField("affine"):
        affine, drawn = augmentation.affine, crop.affine
        arguments = {
            "angle": drawn.angle,
            "translate": [drawn.translate_x, drawn.translate_y],
            "scale": drawn.scale,
            "shear": [drawn.shear_x, drawn.shear_y],
            "interpolation": _sampling(affine.interpolation),
            "fill": list(map(float, affine.fill)) or None,
        }
        ops.append(("affine", ("affine", arguments)))
    if len(crop.policy):
        fill = list(map(float, augmentation.auto_augment.fill)) or None
        interpolation = _interpolation(augmentation)
        for step in crop.policy:
            call = _policy_call(step, interpolation, fill)
            if call is not None:
                ops.append(("auto_augment", call))
    if len(crop.timm_steps):
        levels = tuple(augmentation.timm_rand_augment.fill) or _TIMM_FILL
        ops.extend(("timm_rand_augment", _timm_call(step, levels)) for step in crop.timm_steps)
    # ColorJitter's adjustments, then RandomPhotometricDistort's (the same
    # four kernels).
    for row, steps in (("color_jitter", crop.jitter), ("photometric_distort", crop.photometric)):
        for step in steps:
            name, argument = _JITTER[step.op]
            ops.append((row, (name, {argument: float(step.factor)})))
    if len(crop.channel_permutation):
        permutation = {"permutation": list(crop.channel_permutation)}
        ops.append(("photometric_distort", ("permute_channels", permutation)))
    if crop.grayscale:
        ops.append(("grayscale", ("rgb_to_grayscale", {"num_output_channels": 3})))
    if crop.HasField("blur_sigma"):
        blur = augmentation.gaussian_blur
        sigma = float(crop.blur_sigma)
        kernel = [int(blur.kernel_width), int(blur.kernel_height)]
        arguments = {"kernel_size": kernel, "sigma": [sigma, sigma]}
        ops.append(("gaussian_blur", ("gaussian_blur", arguments)))
    if crop.solarized:
        threshold = {"threshold": float(augmentation.solarize.threshold)}
        ops.append(("solarize", ("solarize", threshold)))
    if crop.sharpened:
        factor = float(augmentation.sharpness.sharpness_factor)
        ops.append(("sharpness", ("adjust_sharpness", {"sharpness_factor": factor})))
    if crop.posterized:
        ops.append(("posterize", ("posterize", {"bits": int(augmentation.posterize.bits)})))
    for ran, name, row in (
        (crop.equalized, "equalize", "equalize"),
        (crop.autocontrasted, "autocontrast", "autocontrast"),
        (crop.inverted, "invert", "invert"),
    ):
        if ran:
            ops.append((row, (name, {})))
    if crop.HasField("erased"):
        ops.append(("random_erasing", _erase_call(crop.erased, augmentation.random_erasing)))
    return ops


def batch_ops(crops: Any, augmentation: Any) -> list[SampleOps]:
    """Every sample's ops of a batch."""
    return [sample_ops(crop, augmentation) for crop in crops]


def replay(image: Any, ops: SampleOps) -> Any:
    """A sample's ops (``Batch.ops[i]``, the flip included) replayed with
    torchvision's own kernels, ``torchvision.transforms.v2.functional``.

    ``image`` is the sample before its ops: the crop of its source box
    (``Batch.crop_boxes[i]``) resized to the output, as a CHW ``uint8``
    torch tensor or numpy array (a numpy array comes back as numpy). The
    result is what the sidecar delivered for the sample, within the
    tolerances of docs/AUGMENTATION.md."""
    import torch
    from torchvision.transforms.v2 import functional as F

    as_numpy = isinstance(image, np.ndarray)
    if as_numpy:
        image = torch.from_numpy(np.ascontiguousarray(image))
    if image.dtype != torch.uint8 or image.dim() != 3 or image.shape[0] != 3:
        raise ValueError(
            f"replay takes a CHW uint8 image of 3 channels, not {tuple(image.shape)} "
            f"{image.dtype} (an NHWC batch's image i is batch.images[i].permute(2, 0, 1))"
        )
    for name, kwargs in ops:
        if name.startswith("timm."):
            image = _replay_timm(image, name.removeprefix("timm."), kwargs)
        else:
            image = getattr(F, name)(image, **kwargs)
    return image.numpy() if as_numpy else image


def _replay_timm(image: Any, name: str, kwargs: dict[str, Any]) -> Any:
    """One timm op with timm's own function, on the PIL image of a CHW
    ``uint8`` tensor, as timm's RandAugment runs it."""
    import torch
    from PIL import Image
    from timm.data import auto_augment

    if "resample" in kwargs:
        resampling = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}
        kwargs = {**kwargs, "resample": resampling[kwargs["resample"]]}
    if name == "posterize" and kwargs["bits_to_keep"] == 0:
        # PosterizeIncreasing at magnitude 10 keeps no bits: Pillow's mask
        # gave black, and Pillow 13 raises instead (a timm run on it
        # stops); the sidecar serves the mask's black.
        return torch.zeros_like(image)
    picture = Image.fromarray(image.permute(1, 2, 0).contiguous().numpy(), mode="RGB")
    result = getattr(auto_augment, name)(picture, **kwargs)
    return torch.from_numpy(np.asarray(result, dtype=np.uint8).copy()).permute(2, 0, 1).contiguous()
