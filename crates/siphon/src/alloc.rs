//! The C library's allocator, set up once at start for large records.
//!
//! glibc serves an allocation of 128 KiB or more with its own `mmap` and gives it back to the
//! kernel when freed, but after the first such free it raises that threshold to the freed
//! size (up to 32 MiB): from then on records of a few hundred kB (a row read from the stream,
//! the record built from it, the Kafka client's copy) come from the heap, whose freed chunks
//! stay resident between large ones. Measured with 600 rows of 512 KB behind a broker that
//! takes nothing and then drained: 6-7 MB more peak RSS than the records alive at any time.
//! [`tune`] fixes the threshold at its initial 128 KiB, which also stops the raising.
//!
//! # Invariants
//! - [`tune`] runs before any thread is started (the threshold applies to every thread's
//!   allocations from then on, the Kafka client's included).
//! - A threshold set in the environment (`MALLOC_MMAP_THRESHOLD_`, or `GLIBC_TUNABLES` naming
//!   `glibc.malloc.mmap_threshold`) is left as it is.
//! - The only `unsafe` is the `mallopt` call, which takes two integers.
#![allow(unsafe_code)]

/// Allocations of this size or more are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD_BYTES: usize = 128 * 1024;

/// Fixes the allocator's mmap threshold at [`MMAP_THRESHOLD_BYTES`] (glibc on Linux; nothing
/// elsewhere), unless the environment sets one. Returns whether it was set.
pub fn tune() -> bool {
    let from_env = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("mmap_threshold"));
    !from_env && set_mmap_threshold()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_mmap_threshold() -> bool {
    // 128 KiB fits a C int.
    let threshold = MMAP_THRESHOLD_BYTES as libc::c_int;
    // SAFETY: `mallopt` takes two integers and changes allocator parameters under the
    // allocator's own lock; it returns 1 on success, 0 on error.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, threshold) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_mmap_threshold() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_set_on_glibc() {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none()
            && std::env::var_os("GLIBC_TUNABLES").is_none()
        {
            assert_eq!(tune(), cfg!(all(target_os = "linux", target_env = "gnu")));
        }
    }
}
