//! What each sample's output is made of, decided before any pixel is
//! decoded: one crop (`crop.rs`), then the ops of one table (`table.rs`,
//! each op in its own file behind [`op::Op`]), all drawn from one generator
//! keyed by the sample (`key.rs`), and the stream's spec that holds them
//! (`spec.rs`).

mod crop;
mod flip;
mod key;
mod op;
mod spec;
mod table;

pub use crop::{Crop, RandomResizedCrop};
pub use flip::{flip_rows, HorizontalFlip};
pub use key::{sample_identity, SampleKey};
pub use op::{AugmentError, Op, CHANNELS};
pub use spec::{CropBox, OutputSpec, DEFAULT_SIZE, MAX_SIZE};
pub use table::{Drawn, Ops, Slot};
