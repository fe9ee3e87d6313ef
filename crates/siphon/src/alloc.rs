//! The C library's allocator, set up once at start: large records off the heap, no page
//! faults for the Kafka client's request buffers.
//!
//! glibc serves an allocation of 128 KiB or more with its own `mmap` and gives it back to the
//! kernel when freed, but after the first such free it raises that threshold to the freed
//! size (up to 32 MiB): from then on records of a few hundred kB (a row read from the stream,
//! the record built from it, the Kafka client's copy) come from the heap, whose freed chunks
//! stay resident between large ones, adding to the peak RSS beyond the records alive at any
//! time. [`tune`] fixes the threshold, which also stops the raising.
//!
//! The threshold is 1 MiB, not glibc's initial 128 KiB: librdkafka allocates each produce
//! request's buffer at up to `message.max.bytes` (1,000,000 by default), and with a 128 KiB
//! threshold every such buffer was a fresh mapping whose pages the kernel faulted in and
//! zeroed as records were copied into it: one minor fault per 4 KiB sent. The trim threshold
//! is fixed at 8 MiB for the same reason: with the threshold fixed glibc keeps its 128 KiB
//! default, and the heap's top would be given back and faulted in again as the in-flight
//! window empties and fills.
//!
//! # Invariants
//! - [`tune`] runs before any thread is started (the thresholds apply to every thread's
//!   allocations from then on, the Kafka client's included).
//! - A threshold set in the environment (`MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_`,
//!   or `GLIBC_TUNABLES` naming `glibc.malloc.mmap_threshold` or `glibc.malloc.trim_threshold`)
//!   leaves both as they are.
//! - The only `unsafe` is the `mallopt` calls, which take two integers.
#![allow(unsafe_code)]

/// Allocations of this size or more are mapped on their own and unmapped when freed.
pub const MMAP_THRESHOLD_BYTES: usize = 1024 * 1024;

/// Free memory at the top of the heap beyond this is given back to the kernel.
pub const TRIM_THRESHOLD_BYTES: usize = 8 * 1024 * 1024;

/// Fixes the allocator's mmap threshold at [`MMAP_THRESHOLD_BYTES`] and its trim threshold at
/// [`TRIM_THRESHOLD_BYTES`] (glibc on Linux; nothing elsewhere), unless the environment sets
/// one. Returns whether they were set.
pub fn tune() -> bool {
    let from_env = std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_some()
        || std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES")
            .is_ok_and(|t| t.contains("mmap_threshold") || t.contains("trim_threshold"));
    !from_env && set_thresholds()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() -> bool {
    // Both fit a C int.
    let mmap = MMAP_THRESHOLD_BYTES as libc::c_int;
    let trim = TRIM_THRESHOLD_BYTES as libc::c_int;
    // SAFETY: `mallopt` takes two integers and changes allocator parameters under the
    // allocator's own lock; it returns 1 on success, 0 on error.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, mmap) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_set_on_glibc() {
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none()
            && std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_none()
            && std::env::var_os("GLIBC_TUNABLES").is_none()
        {
            assert_eq!(tune(), cfg!(all(target_os = "linux", target_env = "gnu")));
        }
    }
}
