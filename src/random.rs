//! Values others must not predict: DNS query IDs, RADIUS request
//! authenticators, serials, tokens. They come from the operating
//! system's CSPRNG (`getrandom(2)`, through the getrandom crate), never
//! from a generator of our own. Load spreading that only needs to look
//! random (`parent::random`, the weighted pick) stays cheap and is not
//! here.

/// Fill `buf` from the OS's CSPRNG. It fails only where the kernel has no
/// getrandom(2) and no /dev/urandom; then the process cannot make a value
/// nobody can guess, and says so: the one thread that asked panics
/// (`panic = "unwind"` ends that thread only) rather than use a guessable
/// value.
pub fn fill(buf: &mut [u8]) {
    if let Err(e) = getrandom::getrandom(buf) {
        panic!("the OS's random source failed: {e}");
    }
}

/// A random u16 (a DNS query ID).
pub fn u16() -> u16 {
    let mut b = [0u8; 2];
    fill(&mut b);
    u16::from_ne_bytes(b)
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_differ() {
        let a: std::collections::HashSet<u16> = (0..64).map(|_| super::u16()).collect();
        assert!(a.len() > 32, "{a:?}");
        let (mut x, mut y) = ([0u8; 16], [0u8; 16]);
        super::fill(&mut x);
        super::fill(&mut y);
        assert_ne!(x, y);
    }
}
