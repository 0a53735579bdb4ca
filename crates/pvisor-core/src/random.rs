//! Random bytes from the kernel (`getrandom(2)`, through the `getrandom`
//! crate): ids, access tokens, temporary names, and the entropy that reseeds
//! a restored guest's CRNG. The one path to randomness, and it never hands
//! out bytes it did not get: a failure is an error, or, where nothing can go
//! on without randomness, a panic that says so. Never zeros, never a clock.

use std::io;

/// Fills `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> io::Result<()> {
    getrandom::fill(buf).map_err(|e| io::Error::other(format!("getrandom(2) failed: {e}")))
}

/// `N` random bytes.
pub fn bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    fill(&mut buf)?;
    Ok(buf)
}

/// `N` random bytes for a caller that cannot go on without them (an id that
/// must be unique, a token that must be secret).
///
/// # Panics
/// When the kernel gives no randomness (Linux before 3.17, or a seccomp
/// filter denying `getrandom`), naming the cause.
pub fn must<const N: usize>() -> [u8; N] {
    bytes().unwrap_or_else(|e| panic!("pvisor needs randomness from the kernel and got none: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_draws_differ() {
        assert_ne!(must::<16>(), must::<16>());
    }
}
