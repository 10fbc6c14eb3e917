//! A small, frozen pseudo-random generator.
//!
//! The data order of every epoch is a function of the seed; it must not change
//! when a dependency is upgraded, so the generator lives here rather than in a
//! crate whose output stream may change between versions.

/// SplitMix64: 64-bit state, passes BigCrush, and derives independent streams
/// cheaply from structured seeds (seed, epoch, rank, purpose).
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

const GOLDEN_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Output `position` (from 0) of the generator whose state is `seed`,
/// without running the outputs before it: for draws that must be made one
/// value at a time in any order (the erasing noise, which numpy replays).
pub fn output_at(seed: u64, position: u64) -> u64 {
    mix(seed.wrapping_add(position.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA)))
}

impl Rng {
    /// A generator for one purpose, keyed by every input that must change the
    /// stream (e.g. `[seed, epoch, PURPOSE_SHARDS]`).
    pub fn derive(parts: &[u64]) -> Self {
        let mut state = 0x5348_4152_4446_4545; // "SHARDFEE"
        for &part in parts {
            state = mix(state ^ mix(part.wrapping_add(GOLDEN_GAMMA)));
        }
        Self { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// Uniform in `0..bound` without modulo bias (Lemire's method).
    /// `bound` must be non-zero.
    pub fn below(&mut self, bound: u64) -> u64 {
        debug_assert!(bound > 0);
        let mut product = u128::from(self.next_u64()) * u128::from(bound);
        let mut low = product as u64;
        if low < bound {
            let threshold = bound.wrapping_neg() % bound;
            while low < threshold {
                product = u128::from(self.next_u64()) * u128::from(bound);
                low = product as u64;
            }
        }
        (product >> 64) as u64
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_at_a_position_is_the_streams() {
        let mut rng = Rng { state: 42 };
        for position in 0..5 {
            assert_eq!(output_at(42, position), rng.next_u64());
        }
    }

    #[test]
    fn stream_is_frozen() {
        // Changing these values changes every user's data order: never do it
        // without a new plan version.
        let mut rng = Rng::derive(&[0, 0]);
        let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();
        let mut again = Rng::derive(&[0, 0]);
        assert_eq!(first, (0..3).map(|_| again.next_u64()).collect::<Vec<_>>());
        assert_ne!(
            Rng::derive(&[0, 1]).next_u64(),
            Rng::derive(&[1, 0]).next_u64()
        );
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut rng = Rng::derive(&[42]);
        let mut counts = [0u32; 7];
        for _ in 0..70_000 {
            counts[rng.below(7) as usize] += 1;
        }
        for count in counts {
            assert!((9_000..11_000).contains(&count), "{counts:?}");
        }
    }
}
