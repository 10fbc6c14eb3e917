//! What each sample's output is made of, decided before any pixel is
//! decoded: one crop (`crop.rs`), then the ops of one table (`ops/mod.rs`,
//! each op in its own file there, behind [`op::Op`]), each drawn from a
//! generator keyed by the sample and its own name (`key.rs`), run by the
//! pixel kernels (`kernels/`), and the stream's spec that holds them
//! (`spec.rs`); several views of one sample, each group with a spec of
//! its own, decided together (`views.rs`).

mod crop;
#[cfg(test)]
mod golden;
mod kernels;
mod key;
mod op;
mod ops;
mod spec;
mod views;
mod wire;

pub use crop::{Crop, RandomResizedCrop};
pub use kernels::{set_simd as set_augment_simd, Interpolation};
pub use key::{sample_identity, SampleKey};
pub use op::{AugmentError, DrawAt, Op, CHANNELS};
pub use ops::{
    flip_rows, AffineDrawn, AutoAugment, Autocontrast, Coin, ColorJitter, Drawn, Equalize,
    EraseValue, ErasedBox, Fill, GaussianBlur, Grayscale, HorizontalFlip, Invert, JitterDrawn,
    JitterOp, Kernel, Ops, PhotometricDrawn, Policy, PolicyDrawn, PolicyOp, PolicyStep, Posterize,
    RandomAffine, RandomErasing, RandomPhotometricDistort, RandomRotation, Sharpness, Slot,
    Solarize, VerticalFlip, MAX_JITTER_STEPS, MAX_POLICY_OPS, MAX_TIMM_LAYERS,
};
pub use ops::{PilResample, TimmDrawn, TimmOp, TimmRandAugment, TimmStep};
pub use spec::{CropBox, OutputSpec, Resample, DEFAULT_SIZE, MAX_SIZE};
pub use views::{view_key, ViewGroup, Views, ViewsPlan, MAX_VIEWS_PER_GROUP, MAX_VIEW_GROUPS};
