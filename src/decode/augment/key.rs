//! What a sample's draws are keyed by, and the uniform numbers every op
//! draws. Frozen: a test pins identities and boxes.

use crate::hash::{fmix64, fnv1a};
use crate::plan::rng::Rng;

/// Keeps the augmentation stream independent of the plan's streams.
const PURPOSE_AUGMENT: u64 = 3;

/// What the augmentation of one sample is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleKey {
    pub seed: u64,
    pub epoch: u64,
    /// [`sample_identity`] of the sample.
    pub sample: u64,
}

impl SampleKey {
    /// The one generator the crop and then each op draw from, in order.
    pub fn generator(&self) -> Rng {
        Rng::derive(&[self.seed, self.epoch, PURPOSE_AUGMENT, self.sample])
    }

    /// The generator of one op after the flip, keyed by its name.
    pub fn op_generator(&self, op: &str) -> Rng {
        Rng::derive(&[
            self.seed,
            self.epoch,
            PURPOSE_AUGMENT,
            self.sample,
            fnv1a(op.bytes()),
        ])
    }
}

/// A stable 64-bit identity of a sample: FNV-1a over the shard name, a NUL
/// and the key, then MurmurHash3's finalizer. Frozen (a test pins it).
pub fn sample_identity(shard: &str, key: &str) -> u64 {
    let bytes = shard.bytes().chain([0]).chain(key.bytes());
    fmix64(fnv1a(bytes))
}

/// Uniform in `[0, 1)` from the top 53 bits of one draw.
pub fn uniform(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Uniform in `[low, high)`.
pub fn uniform_in(rng: &mut Rng, (low, high): (f64, f64)) -> f64 {
    low + (high - low) * uniform(rng)
}
