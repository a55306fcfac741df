//! The reload generation: a counter every reload that took effect bumps.
//! A leaf, so that the access layer (which records the generation a
//! session was admitted under) need not know the registry of services.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bumped by every reload that took effect; relays compare it with the
/// value they started with to know when to check their session again.
static GENERATION: AtomicU64 = AtomicU64::new(0);

pub fn generation() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

/// A reload took effect.
pub fn bump_generation() {
    // Release: whoever reads the new value also sees the swapped settings.
    GENERATION.fetch_add(1, Ordering::Release);
}
