//! What a sample's draws are keyed by, and the uniform numbers every op
//! draws. Frozen: a test pins identities and boxes.

use crate::hash::{fmix64, fnv1a};
use crate::plan::rng::Rng;

/// Keeps the augmentation stream independent of the plan's streams.
const PURPOSE_AUGMENT: u64 = 3;
/// Keys the draws of a sample's second and later copies (repeated
/// augmentation): copy 0 keeps the keys it had before copies existed.
const PURPOSE_AUGMENT_COPY: u64 = 4;

/// What the augmentation of one sample is keyed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleKey {
    pub seed: u64,
    pub epoch: u64,
    /// [`sample_identity`] of the sample.
    pub sample: u64,
    /// Which of the epoch's copies of the sample (repeated augmentation):
    /// each copy draws its own decisions.
    pub copy: u32,
}

impl SampleKey {
    /// The generator the crop and then the flip draw from, in order.
    pub fn generator(&self) -> Rng {
        self.derive(None)
    }

    /// The generator of one op after the flip, keyed by its name.
    pub fn op_generator(&self, op: &str) -> Rng {
        self.derive(Some(fnv1a(op.bytes())))
    }

    /// Copy 0 is keyed as samples were before copies existed; the others
    /// under a purpose of their own, with the copy index.
    fn derive(&self, op: Option<u64>) -> Rng {
        let mut key = [self.seed, self.epoch, PURPOSE_AUGMENT, self.sample, 0, 0];
        let mut len = 4;
        if self.copy != 0 {
            key[2] = PURPOSE_AUGMENT_COPY;
            key[len] = u64::from(self.copy);
            len += 1;
        }
        if let Some(op) = op {
            key[len] = op;
            len += 1;
        }
        Rng::derive(&key[..len])
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Copy 0 keeps the generators it had before copies existed (so a
    /// stream without repeats draws what it always drew); every other copy
    /// draws afresh, for the crop and for each op.
    #[test]
    fn each_copy_draws_its_own_decisions_and_copy_zero_is_unchanged() {
        let key = |copy| SampleKey {
            seed: 11,
            epoch: 2,
            sample: 99,
            copy,
        };
        let before = Rng::derive(&[11, 2, PURPOSE_AUGMENT, 99]).next_u64();
        assert_eq!(key(0).generator().next_u64(), before);
        let firsts: Vec<u64> = (0..4).map(|c| key(c).generator().next_u64()).collect();
        let ops: Vec<u64> = (0..4)
            .map(|c| key(c).op_generator("trivial_augment").next_u64())
            .collect();
        for draws in [&firsts, &ops] {
            let distinct: std::collections::HashSet<_> = draws.iter().collect();
            assert_eq!(distinct.len(), draws.len(), "{draws:?}");
        }
    }
}
