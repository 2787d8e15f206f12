//! Names unique to one run of the bench: key prefixes, scratch
//! directories, probe keys.
//!
//! A leaf, because every layer needs one (the load generator's keys, the
//! servers' scratch directories, the one-in-flight probes) and none of them
//! owns the others.

/// A short unique id, so keys never collide across runs on a kept store.
pub fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:04x}",
        nanos & 0xffff_ffff_ffff,
        rand::random::<u16>()
    )
}
