//! The pixel kernels the ops after the crop run on a finished output
//! (packed RGB rows, `uint8`), apart from the op rows that decide when and
//! with what they run (`../ops/`).
//!
//! Each kernel reproduces torchvision's tensor kernel on `uint8`
//! (`torchvision.transforms.v2.functional`), where it truncates, where it
//! rounds and in which precision (float32), so that a sample the server
//! augmented and the same decision replayed with torchvision agree to the
//! level (docs/AUGMENTATION.md has the measured agreement per op). The
//! kernels are written as plain loops over rows the compiler vectorizes;
//! none allocates more than one output-sized scratch buffer.

mod affine;
mod colour;
mod erase;

pub use affine::{affine, rotate, Interpolation, Sampling};
pub use colour::{
    adjust_brightness, adjust_contrast, adjust_hue, adjust_saturation, adjust_sharpness,
    autocontrast, equalize, grayscale, invert, posterize, solarize,
};
pub use erase::{erase, noise_level, EraseFill};
