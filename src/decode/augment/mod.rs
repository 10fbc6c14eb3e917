//! What each sample's output is made of, decided before any pixel is
//! decoded: one crop (`crop.rs`), then the ops of one table (`ops/mod.rs`,
//! each op in its own file there, behind [`op::Op`]), all drawn from one generator
//! keyed by the sample (`key.rs`), and the stream's spec that holds them
//! (`spec.rs`).

mod crop;
mod key;
mod op;
mod ops;
mod spec;

pub use crop::{Crop, RandomResizedCrop};
pub use key::{sample_identity, SampleKey};
pub use op::{AugmentError, Op, CHANNELS};
pub use ops::{flip_rows, Drawn, HorizontalFlip, Ops, Slot};
pub use spec::{CropBox, OutputSpec, DEFAULT_SIZE, MAX_SIZE};
