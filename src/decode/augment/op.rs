//! What an augmentation op is to the rest of the crate: its request
//! parameters checked, its per-sample draw, its effect on an output, and
//! its place on the wire. The table (`ops/mod.rs`) lists the ops; nothing
//! else names one.

use super::key::SampleKey;
use crate::plan::rng::Rng;

/// Bytes per output pixel: RGB.
pub const CHANNELS: usize = 3;

/// A request's augmentation could not be used; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct AugmentError {
    pub field: &'static str,
    pub message: String,
}

pub(super) fn invalid(field: &'static str, message: String) -> AugmentError {
    AugmentError { field, message }
}

/// What an op's draw may read of the sample and the stream.
#[derive(Debug, Clone, Copy)]
pub struct DrawAt<'a> {
    pub key: &'a SampleKey,
    /// The output's size (the policies' translations scale with it).
    pub width: u32,
    pub height: u32,
}

/// One op's draw for sample `sample` (an identity) of `seed` and `epoch`
/// at a `width x height` output, copy 0: what a single op's tests draw.
#[cfg(test)]
pub fn draw_alone<O: Op>(
    op: &O,
    (seed, epoch, sample): (u64, u64, u64),
    (width, height): (u32, u32),
) -> O::Drawn {
    let key = SampleKey {
        seed,
        epoch,
        sample,
        copy: 0,
    };
    let at = DrawAt {
        key: &key,
        width,
        height,
    };
    op.draw(&mut key.generator(), &at)
}

impl DrawAt<'_> {
    /// The op's own generator: keyed by the sample and the op's name, so
    /// its draws move with neither the crop's nor another op's, nor with
    /// its place in the table.
    pub fn generator(&self, op: &'static str) -> Rng {
        self.key.op_generator(op)
    }
}

/// One op applied after the crop and resize, to the finished output.
///
/// The flip, the first op, draws from the sample's generator after the
/// crop (frozen since it shipped); every later op draws from a generator
/// of its own ([`DrawAt::generator`]), so adding, removing or reordering
/// ops moves no other op's decisions.
pub trait Op: Copy + Default + PartialEq + std::fmt::Debug {
    /// What the op decided for one sample (`bool` for a coin flip).
    type Drawn: Copy + Default + PartialEq + std::fmt::Debug;

    /// The op's name as the table publishes it (Describe, the pool's build
    /// identity) and as its generator is keyed: never rename one.
    const NAME: &'static str;

    /// Whether every client that decodes applies this op's decisions,
    /// whether or not its request names the op (`client_ops`): true for
    /// the flip alone, which clients replayed before they named ops.
    const CLIENT_REPLAYS: bool;

    /// The op turned off: what a request that does not name it gets.
    const OFF: Self;

    /// Checks the op's parameters, naming the request field that is wrong.
    fn validate(&self) -> Result<(), AugmentError>;

    /// Whether the op draws anything (the default op must not).
    fn is_random(&self) -> bool;

    /// The op's decision for one sample. `sample` is the crop's generator,
    /// which only the flip reads; an op that is not random must not draw.
    fn draw(&self, sample: &mut Rng, at: &DrawAt) -> Self::Drawn;

    /// Applies the decision to one output of `width` RGB pixels per row.
    fn apply(&self, drawn: &Self::Drawn, width: u32, out: &mut [u8]);
}
