"""The delivery ledger's matrix: its rows (idiom x feature x fault) and what
each feature asks of the dataset. test_ledger.py runs them."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from shardfeed import (
    Augment,
    ColorJitter,
    GaussianBlur,
    OpGroup,
    RandomAdjustSharpness,
    RandomAffine,
    RandomErasing,
    RandomPhotometricDistort,
    RandomPosterize,
    RandomRotation,
    RandomSolarize,
    TimmRandAugment,
    TrivialAugmentWide,
    views,
)

# Rows marked full_only run only with SHARDFEED_LEDGER=full.
FULL = os.environ.get("SHARDFEED_LEDGER") == "full"

# What a feature asks of the dataset beyond one plain stream.
# Encoded features stream 32x32 outputs: a JPEG goes compressed only when it
# is no longer than its pixels, and these ~1.8 KB noise JPEGs are longer
# than 24x24x3.
ENCODED_SIZE = 32
# torchvision's "new recipe": TrivialAugmentWide + RandomErasing(0.1).
RECIPE = Augment.train(
    auto_augment=TrivialAugmentWide(interpolation="bilinear"), random_erasing=RandomErasing(0.1)
)
# The self-supervised recipe (DINOv2's second global view): a bicubic crop,
# RandomApply([ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8), grayscale 0.2,
# RandomApply([GaussianBlur(9, (0.1, 2))], p) and RandomSolarize(128, 0.2)
# (the blur's p raised from 0.1 so the rows see it often).
BICUBIC_COLOUR = Augment.train(
    interpolation="bicubic",
    color_jitter=ColorJitter(0.4, 0.4, 0.2, 0.1, p=0.8),
    grayscale=0.2,
    gaussian_blur=GaussianBlur(9, (0.1, 2.0), p=0.5),
    solarize=RandomSolarize(128, 0.2),
)
# torchvision's single-op transforms, each its own coin (a rotation and an
# affine of their own draws), in a stream the client's decoder leaves to
# the sidecar.
SINGLE_OPS = Augment.train(
    vertical_flip=0.5,
    rotation=RandomRotation(20),
    affine=RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1), shear=5),
    photometric_distort=RandomPhotometricDistort(),
    sharpness=RandomAdjustSharpness(2.0, 0.5),
    posterize=RandomPosterize(4, 0.3),
    equalize=0.3,
    autocontrast=0.3,
    invert=0.3,
)
# DeiT's recipe as timm builds it: rand-m9-mstd0.5-inc1, bicubic, pixel
# erasing.
TIMM_DEIT = Augment.train(
    interpolation="bicubic",
    timm_rand_augment=TimmRandAugment(fill=(124, 116, 104)),
    random_erasing=RandomErasing(0.25, scale=(0.02, 1 / 3), ratio=(0.3, 1 / 0.3), value="random"),
)
# DeiT III's three augmentations (RandomChoice) after a RandomOrder of
# the jitter and the grayscale coin, and a RandomApply over two coins.
GROUPS = Augment.train(
    color_jitter=ColorJitter(0.3, 0.3, 0.3, 0.0),
    grayscale=0.5,
    gaussian_blur=GaussianBlur(9, (0.1, 2.0), p=1.0),
    solarize=RandomSolarize(128, 1.0),
    sharpness=RandomAdjustSharpness(2.0, 1.0),
    equalize=1.0,
    invert=1.0,
    groups=(
        OpGroup("order", ("color_jitter", "grayscale")),
        OpGroup("choice", ("gaussian_blur", "solarize", "sharpness")),
        OpGroup("apply", ("equalize", "invert"), p=0.5),
    ),
)
# Several views per sample (DINO's shape, small): two global views whose
# ops differ and three local ones of one transform.
VIEWS = views(
    {
        "global": [
            dataclasses.replace(BICUBIC_COLOUR, size=(32, 32), gaussian_blur=None),
            dataclasses.replace(BICUBIC_COLOUR, size=(32, 32)),
        ],
        "local": (
            dataclasses.replace(
                Augment.train(scale=(0.05, 0.32), interpolation="bicubic", grayscale=0.2),
                size=(16, 16),
            ),
            3,
        ),
    }
)
MIXED = ("mix", "recipe_mix", "repeats_mix", "parquet_mix", "views_mix")
POOLED = (
    "pool",
    "recipe_pool",
    "repeats_pool",
    "parquet_pool",
    "bicubic_pool",
    "single_ops_pool",
    "timm_deit_pool",
    "groups_pool",
    "views_pool",
)
# Repeated augmentation: every sample twice an epoch, each copy its own crop.
REPEATS = 2
FEATURE_OPTIONS: dict[str, dict[str, Any]] = {
    "repeats": dict(augment="train", repeats=REPEATS),
    "repeats_mix": dict(augment="train", repeats=REPEATS),
    "repeats_pool": dict(augment="train", repeats=REPEATS),
    # The client decodes each copy with the copy's own box and flip.
    "repeats_encoded": dict(
        augment="train", repeats=REPEATS, decode="client", image_size=ENCODED_SIZE
    ),
    "recipe": dict(augment=RECIPE),
    "recipe_mix": dict(augment=RECIPE),
    # The ops travel in the pool's units and run after the tier's stored
    # source: each sample's pixels still its own.
    "recipe_pool": dict(augment=RECIPE),
    "recipe_tier": dict(augment=RECIPE, decoded_source=64),
    # The client's decoder applies the ops too (shardfeed.torch.ops).
    "recipe_encoded": dict(augment=RECIPE, decode="client", image_size=ENCODED_SIZE),
    "encoded": dict(decode="client", image_size=ENCODED_SIZE),
    # The loop tells the stream's search its waits every other batch
    # (ShareSearch.loop_id): across a kill, a break and workers, the
    # reports go to the stream that asks, and lose nothing.
    "encoded_auto": dict(decode="client", server_decode_fraction="auto", image_size=ENCODED_SIZE),
    # Epoch 0 from the original while the tier fills in the background,
    # epoch 1 from the stored source (the default first stored epoch).
    "tier": dict(decoded_source=64),
    "tier_unlisted": dict(decoded_source=64),
    # Every epoch from the stored source (a tier filled ahead).
    "tier_stored": dict(decoded_source=64, decoded_source_from_epoch=0),
    # Every sample the trainer could decode sent compressed (share 0): a
    # corrupt one must be the sidecar's to substitute, never the trainer
    # decoder's.
    "encoded_corrupt": dict(decode="client", image_size=ENCODED_SIZE),
    "tier_corrupt": dict(decoded_source=64),
    # Parquet rows through every decode path: the recipe's ops, the
    # trainer's decoder, the tier (keyed by file and row), the pool.
    "parquet_recipe": dict(augment=RECIPE),
    "parquet_encoded": dict(decode="client", image_size=ENCODED_SIZE),
    "parquet_tier": dict(decoded_source=64),
    "bicubic": dict(augment=BICUBIC_COLOUR),
    # The trainer's decoder resizes bicubic, blurs and solarizes (at 128)
    # as the sidecar does: the samples it decodes are its own, each with
    # the sidecar's decisions.
    "bicubic_encoded": dict(augment=BICUBIC_COLOUR, decode="client", image_size=ENCODED_SIZE),
    # The unit carries the resize's interpolation (pool wire revision 5).
    "bicubic_pool": dict(augment=BICUBIC_COLOUR),
    "single_ops": dict(augment=SINGLE_OPS),
    # The coins and the angle travel in the pool's units (wire revision 6).
    "single_ops_pool": dict(augment=SINGLE_OPS),
    "single_ops_encoded": dict(augment=SINGLE_OPS, decode="client", image_size=ENCODED_SIZE),
    "timm_deit": dict(augment=TIMM_DEIT),
    # timm's steps travel in the pool's units (wire revision 7).
    "timm_deit_pool": dict(augment=TIMM_DEIT),
    "timm_deit_encoded": dict(augment=TIMM_DEIT, decode="client", image_size=ENCODED_SIZE),
    "groups": dict(augment=GROUPS),
    # The groups and each sample's rows travel in the pool's units (wire
    # revision 8).
    "groups_pool": dict(augment=GROUPS),
    # The client's decoder runs no groups: the sidecar decodes the stream.
    "groups_encoded": dict(augment=GROUPS, decode="client", image_size=ENCODED_SIZE),
    # Every view of a sample keyed by (sample, copy, group, view): a kill or
    # a resume repeats the same pixels of every view, in a mix too.
    "views": dict(views=VIEWS, augment=None, image_size=None),
    "views_mix": dict(views=VIEWS, augment=None, image_size=None),
    # A unit of views: the worker decodes each sample once for all its views.
    # Through the tier: one stored source per sample, every view from it.
    "views_tier": dict(views=VIEWS, augment=None, image_size=None, decoded_source=64),
    "views_pool": dict(views=VIEWS, augment=None, image_size=None),
    # The trainer's decoder takes each sample sent compressed once and makes
    # every view from it (bicubic, jitter, blur, solarize at 128) with the
    # sidecar's decisions; the rest arrive as the sidecar's views.
    "views_encoded": dict(views=VIEWS, augment=None, image_size=None, decode="client"),
    # Each copy's views keyed by its copy index too.
    "views_repeats": dict(views=VIEWS, augment=None, image_size=None, repeats=REPEATS),
}


@dataclass(frozen=True)
class Row:
    idiom: str
    feature: str
    fault: str
    full_only: bool = False
    trainer: tuple[tuple[str, Any], ...] = ()


# Lightning's epoch shapes: whole epochs, shortened ones, a step budget.
LIMIT = (("limit_train_batches", 3), ("max_epochs", 3))
MAX_STEPS = (("max_steps", 9), ("max_epochs", -1))

# CI runs every feature's faults; the full ledger (SHARDFEED_LEDGER=full)
# adds the other idioms. A feature the trainer's process decodes (encoded
# delivery) breaks through the plain idiom in CI: under a
# StatefulDataLoader each of its 2 workers decodes on 2 cores, 33-41 s a
# row here, and those rows are in the full ledger.
MATRIX = [
    Row("plain", "one", "none"),
    Row("plain", "one", "kill"),
    Row("plain", "one", "break"),
    Row("plain", "mix", "none"),
    Row("plain", "mix", "kill"),
    Row("plain", "mix", "break", full_only=True),
    Row("workers", "one", "none"),
    Row("workers", "one", "kill", full_only=True),
    Row("workers", "mix", "none", full_only=True),
    Row("stateful", "one", "break"),
    Row("stateful", "one", "kill", full_only=True),
    Row("stateful", "mix", "break", full_only=True),
    Row("lightning", "one", "none", full_only=True),
    Row("lightning", "one", "none", trainer=LIMIT),
    Row("lightning", "one", "none", full_only=True, trainer=MAX_STEPS),
    Row("lightning", "mix", "none", full_only=True, trainer=LIMIT),
    Row("lightning", "one", "break", full_only=True),
    Row("lightning", "one", "kill", full_only=True, trainer=LIMIT),
    Row("accelerate", "one", "none"),
    Row("accelerate", "one", "kill", full_only=True),
    Row("plain", "encoded", "kill"),
    Row("plain", "encoded", "break", full_only=True),
    Row("workers", "encoded", "none", full_only=True),
    # Found a race: a worker whose sibling finished first snapshotted its
    # own epoch as complete (client decode makes the workers' pace differ).
    # Later, in CI, a rank's second pass streamed epoch 0 again: the epoch
    # page's records were updated without a lock (torn reads, lost updates,
    # shown by tests/unit/test_epochs.py) and a late-unpickling worker could
    # map another dataset's page by a reused descriptor number.
    Row("stateful", "encoded", "break"),
    Row("plain", "tier", "kill"),
    Row("workers", "tier", "none", full_only=True),
    Row("stateful", "tier", "break", full_only=True),
    # The decode pool: a worker SIGKILLed mid-epoch ("worker"), the sidecar
    # itself killed and restarted.
    Row("plain", "pool", "worker"),
    Row("workers", "pool", "kill"),
    Row("stateful", "pool", "break", full_only=True),
    Row("lightning", "pool", "worker", full_only=True, trainer=LIMIT),
    # ShardfeedDataset.dataloader(): the loader the README's examples use,
    # with workers (its wait meter wraps the loader's iterator).
    Row("loader", "one", "kill"),
    Row("stateful_loader", "one", "break"),
    Row("loader", "mix", "none", full_only=True),
    Row("stateful_loader", "mix", "break", full_only=True),
    Row("stateful_loader", "encoded", "break", full_only=True),
    Row("stateful_loader", "tier", "break", full_only=True),
    Row("loader", "pool", "worker", full_only=True),
    # The tier over an S3 whose listings carry no ETags: versions from HEAD
    # (the row also checks that the tier kept and served records).
    Row("plain", "tier_unlisted", "kill"),
    Row("stateful_loader", "tier_unlisted", "break", full_only=True),
    Row("workers", "tier_unlisted", "none", full_only=True),
    Row("plain", "tier_stored", "kill"),
    Row("stateful", "tier_stored", "break", full_only=True),
    # The tuned share: probes move it within a batch stream; neither a
    # kill nor a resume may lose or repeat a sample for it.
    Row("plain", "encoded_auto", "kill"),
    Row("stateful", "encoded_auto", "break"),
    Row("workers", "encoded_auto", "none", full_only=True),
    Row("plain", "encoded_auto", "break", full_only=True),
    # Loose objects, their readers' GETs in flight sized per stream.
    Row("plain", "loose", "kill"),
    Row("stateful", "loose", "break", full_only=True),
    Row("loader", "loose", "none", full_only=True),
    # Shard reads: each ranged GET a task of its own, 16 of 64 KiB in
    # flight a reader, over an S3 that sends slowly: a kill or a break
    # lands while parts arrive, and aborted tasks must lose nothing.
    Row("plain", "paced_reads", "kill"),
    Row("stateful", "paced_reads", "break"),
    Row("workers", "paced_reads", "none", full_only=True),
    # Corrupt scans (headers intact): substituted by the sidecar in every
    # delivery, the same samples whoever decodes, nothing else substituted,
    # exactly once across a break or a kill.
    Row("plain", "corrupt", "break"),
    Row("plain", "encoded_corrupt", "break"),
    Row("stateful", "encoded_corrupt", "break", full_only=True),
    Row("plain", "encoded_corrupt", "kill", full_only=True),
    Row("workers", "encoded_corrupt", "none", full_only=True),
    Row("plain", "tier_corrupt", "kill"),
    Row("stateful", "tier_corrupt", "break", full_only=True),
    # The recipes' ops (TrivialAugmentWide + RandomErasing): decisions keyed
    # by the sample, so a kill or a resume repeats the same pixels; a
    # client decoder that cannot apply them leaves every sample to the
    # sidecar.
    Row("plain", "recipe", "kill"),
    Row("stateful", "recipe", "break"),
    Row("plain", "recipe_mix", "kill"),
    Row("stateful", "recipe_mix", "break", full_only=True),
    Row("plain", "recipe_encoded", "break"),
    Row("stateful", "recipe_encoded", "break", full_only=True),
    Row("plain", "recipe_pool", "worker"),
    Row("plain", "recipe_tier", "kill"),
    Row("plain", "recipe_encoded", "kill", full_only=True),
    Row("workers", "recipe", "none", full_only=True),
    Row("loader", "recipe_mix", "none", full_only=True),
    # Repeated augmentation (repeats=2): each (sample, copy) exactly once
    # an epoch, a copy's decisions keyed by its copy index, so a kill or a
    # resume repeats the same pixels; copies travel to the pool and to a
    # client decoder with their own boxes.
    Row("plain", "repeats", "kill"),
    Row("stateful", "repeats", "break"),
    Row("plain", "repeats_mix", "kill"),
    Row("plain", "repeats_encoded", "break"),
    Row("stateful", "repeats_encoded", "break", full_only=True),
    Row("plain", "repeats_pool", "worker"),
    Row("stateful_loader", "repeats", "break", full_only=True),
    Row("workers", "repeats_mix", "none", full_only=True),
    # Parquet (the Hub's image layout), row groups of 5 rows straddling
    # batches and ranks, alone and mixed with tar shards: a kill or a
    # resume inside a row group repeats and loses nothing.
    Row("plain", "parquet", "kill"),
    Row("stateful", "parquet", "break"),
    Row("plain", "parquet_mix", "kill"),
    Row("stateful", "parquet_mix", "break"),
    Row("workers", "parquet", "none", full_only=True),
    Row("loader", "parquet_mix", "none", full_only=True),
    Row("plain", "parquet_recipe", "kill"),
    Row("plain", "parquet_encoded", "break"),
    Row("stateful", "parquet_encoded", "break", full_only=True),
    Row("plain", "parquet_tier", "kill"),
    Row("plain", "parquet_pool", "worker"),
    # A bicubic crop and a jitter applied to a share p of the samples: the
    # apply-or-not keyed by the sample like every decision, so a kill or a
    # resume repeats the same pixels; a client decoder resizes, blurs and
    # solarizes them with the sidecar's decisions; the pool resizes alike.
    Row("plain", "bicubic", "kill"),
    Row("stateful", "bicubic", "break"),
    Row("plain", "bicubic_encoded", "break"),
    Row("stateful", "bicubic_encoded", "break", full_only=True),
    Row("plain", "bicubic_pool", "worker"),
    Row("workers", "bicubic", "none", full_only=True),
    # The single-op transforms: each coin and angle keyed by the sample, so
    # a kill repeats the same pixels and a pool worker draws the same.
    Row("plain", "single_ops", "kill"),
    Row("plain", "single_ops_pool", "worker"),
    Row("stateful", "single_ops_encoded", "break", full_only=True),
    # timm's RandAugment: its ops, magnitudes and samplings keyed by the
    # sample, so a kill repeats the same pixels and a worker draws the same.
    Row("plain", "timm_deit", "kill"),
    Row("plain", "timm_deit_pool", "worker"),
    Row("stateful", "timm_deit_encoded", "break", full_only=True),
    Row("plain", "groups", "kill"),
    Row("plain", "groups_pool", "worker"),
    Row("stateful", "groups_encoded", "break", full_only=True),
    # Several views per sample, each group one array: exactly once per
    # sample, every view's pixels the same across a kill or a resume, and
    # whether a sample's views were decoded here or by a pool worker, or
    # cropped from the tier's stored source.
    Row("plain", "views", "kill"),
    Row("stateful", "views", "break"),
    Row("plain", "views_mix", "kill"),
    Row("plain", "views_pool", "worker"),
    Row("plain", "views_tier", "kill"),
    Row("plain", "views_encoded", "break"),
    Row("stateful", "views_encoded", "break", full_only=True),
    Row("workers", "views_encoded", "none", full_only=True),
    Row("stateful", "views_repeats", "break", full_only=True),
    Row("workers", "views", "none", full_only=True),
    Row("stateful", "views_mix", "break", full_only=True),
]


def row_id(row: Row) -> str:
    shape = "-".join(f"{k}={v}" for k, v in row.trainer if k != "max_epochs")
    return "-".join(filter(None, (row.idiom, row.feature, row.fault, shape)))
