//! The crate's two hash functions, frozen: sample identities, the shuffle's
//! substitutions, cache and tier record names, dataset digests and pool
//! placement all derive from them, so a change would move every frozen
//! digest and orphan every cache on disk. A leaf: it imports nothing, and
//! whatever needs a stable hash imports it from here rather than from the
//! module of one of its users.

/// FNV-1a, 64-bit.
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes
        .into_iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        })
}

/// MurmurHash3's 64-bit finalizer: every input bit reaches every output bit.
pub fn fmix64(mut hash: u64) -> u64 {
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hashes_are_frozen() {
        assert_eq!(fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fmix64(0), 0);
        assert_eq!(fmix64(fnv1a("shardfeed".bytes())), 0x08c2_5235_a733_f14d);
        assert_eq!(fmix64(1), 0xb456_bcfc_34c2_cb2c);
    }
}
