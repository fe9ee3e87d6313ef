//! [`super::write_json_string`] 32 and 16 bytes at a time with SSE2, which every x86_64
//! processor has, and SSSE3's byte shuffle where the processor has it (checked at run time).
//!
//! Each block of the input is compared with the bytes that need an escape in a few vector
//! instructions per 16 bytes, giving a bit mask of them. In the common case, where the only
//! such bytes are `"` and `\` (JSON text), each is written as a backslash followed by the
//! byte itself. A block with up to two of them is written run by run: per escape, one
//! whole-block store of the run and a one-byte store of the backslash, the escaped byte
//! starting the next run. A block with more (JSON documents: a quote every few bytes) is
//! spread eight bytes at a time: one shuffle, looked up by the group's eight mask bits, moves
//! each byte to its place in the output and leaves a gap before each escaped one, which a
//! backslash fills; one 16-byte store per group. Blocks with
//! other escapes (control characters, characters above U+FFFF) take a general path. Output
//! goes straight into the spare capacity of the output vector; its length is set once at the
//! end.
//!
//! # Invariants
//! - The output is byte for byte [`super::write_by_words`]'s, with or without the shuffles (the
//!   tests in the parent module compare all three writers with a byte-at-a-time reference).
//! - The shuffles run only where SSSE3 was detected: [`write_escaped_spreading`] is the only
//!   caller that sets `SPREAD`.
//! - Every store into the output is within its capacity: each `put` method of [`Spare`]
//!   checks the room for its whole stores first and grows the vector when short.
//! - The output's length is only set over bytes that were stored.
//! - A flagged byte never lies inside a character already written: only a 4-byte character
//!   is written past its first byte, and its continuation bytes (0x80..=0xBF) are never flagged.

// The one place in the crate with `unsafe`: SSE2 intrinsics and stores into spare capacity,
// each block with its reason.
#![allow(unsafe_code)]

use super::{supplementary_escape, ESCAPES, HEX, SUPPLEMENTARY, UNICODE};
use std::arch::x86_64::{
    _mm_add_epi8, _mm_cmpeq_epi8, _mm_loadl_epi64, _mm_loadu_si128, _mm_min_epu8,
    _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8, _mm_shuffle_epi8, _mm_storeu_si128,
};

/// How one group of eight bytes is spread, for one mask of its flagged bytes (a row of
/// [`SPREAD`], aligned so that each of its two vectors is one aligned load).
#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Spread {
    /// For each output byte, the group's byte it takes, or 0x80 (a zero) for a backslash.
    shuffle: [u8; 16],
    /// A backslash where `shuffle` has a zero, zeros elsewhere.
    backslashes: [u8; 16],
    /// The output's length: 8 and a byte per flagged byte.
    len: u8,
}

/// [`Spread`] for every mask of eight flagged bytes (bit `i`: byte `i` needs a backslash).
static SPREAD: [Spread; 256] = spreads();

const fn spreads() -> [Spread; 256] {
    let empty = Spread {
        shuffle: [0x80; 16],
        backslashes: [0; 16],
        len: 0,
    };
    let mut table = [empty; 256];
    let mut mask = 0;
    while mask < 256 {
        let (mut lane, mut at) = (0, 0);
        while lane < 8 {
            if mask >> lane & 1 == 1 {
                table[mask].backslashes[at] = b'\\';
                at += 1;
            }
            table[mask].shuffle[at] = lane as u8;
            at += 1;
            lane += 1;
        }
        table[mask].len = at as u8;
        mask += 1;
    }
    table
}

/// The widest block: two SSE2 registers. A block buffer holds two of them, so that a window
/// of a block's width starting anywhere in the block stays in the buffer.
const WIDE: usize = 32;

/// Appends `text`, escaped, to `out` (the quotes are the caller's).
pub(super) fn write_escaped(out: &mut Vec<u8>, text: &str) {
    if std::arch::is_x86_feature_detected!("ssse3") {
        // SAFETY: the processor has SSSE3, just checked (the check reads a cached flag).
        unsafe { write_escaped_spreading(out, text) }
    } else {
        write_escaped_with::<false>(out, text);
    }
}

/// [`write_escaped`] without the SSSE3 spreading, whatever the processor has (for the tests,
/// which compare both writers).
#[cfg(test)]
pub(super) fn write_escaped_sse2(out: &mut Vec<u8>, text: &str) {
    write_escaped_with::<false>(out, text);
}

/// [`write_escaped_with`] compiled with SSSE3, so that blocks dense in quotes are spread
/// with byte shuffles ([`Spare::put_backslashed_spread`]).
#[target_feature(enable = "ssse3")]
fn write_escaped_spreading(out: &mut Vec<u8>, text: &str) {
    write_escaped_with::<true>(out, text);
}

/// The writer; `SPREAD` only where SSSE3 is available (from [`write_escaped_spreading`]).
#[inline(always)]
fn write_escaped_with<const SPREAD: bool>(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    let mut out = Spare::new(out);
    // The current block at the front; the bytes after it are only read past the end of a
    // clean run, whose bytes beyond the run are stored but not kept.
    let mut block = [0u8; 2 * WIDE];
    // Start of the current block in `bytes`, and the first byte not written yet (past the
    // block's start after a 4-byte character that crossed into it).
    let (mut start, mut from) = (0, 0);
    while let Some(whole) = bytes[start..].first_chunk::<WIDE>() {
        block[..WIDE].copy_from_slice(whole);
        from = write_block::<WIDE, SPREAD>(&mut out, text, &block, start, WIDE, from);
        start += WIDE;
    }
    if let Some(half) = bytes[start..].first_chunk::<16>() {
        block[..16].copy_from_slice(half);
        from = write_block::<16, SPREAD>(&mut out, text, &block, start, 16, from);
        start += 16;
    }
    let rest = &bytes[start..];
    if !rest.is_empty() {
        block[..rest.len()].copy_from_slice(rest);
        write_block::<16, SPREAD>(&mut out, text, &block, start, rest.len(), from);
    }
    out.finish();
}

/// Writes the block of `text` that starts at `start` and holds `taken` (1..=`W`, `W` 16 or
/// 32) of its bytes, copied to the front of `block`, from its byte `from` on; returns the
/// first byte not written (the block's end, or past it after a 4-byte character that
/// crosses it).
#[inline(always)]
fn write_block<const W: usize, const SPREAD: bool>(
    out: &mut Spare<'_>,
    text: &str,
    block: &[u8; 2 * WIDE],
    start: usize,
    taken: usize,
    from: usize,
) -> usize {
    let masks = escape_masks::<W>(block);
    // Bits past the end of the text (bytes left from the previous block) are dropped.
    let flagged = masks.any & low_bits(taken);
    if from == start && flagged & !masks.quote_or_backslash == 0 {
        // The common case (JSON text has many quotes, rarely a control character): each
        // escape is a backslash before the byte. Up to two of them are written one by one,
        // more by spreading the block with shuffles.
        let beyond_two = flagged & flagged.wrapping_sub(1);
        if SPREAD && beyond_two & beyond_two.wrapping_sub(1) != 0 {
            // SAFETY: `SPREAD` is only set by `write_escaped_spreading`, which runs only where
            // the processor has SSSE3.
            unsafe { out.put_backslashed_spread::<W>(block, flagged, taken) };
        } else {
            out.put_backslashed::<W>(block, flagged, taken);
        }
        start + taken
    } else {
        write_block_escapes::<W>(out, text, block, start, taken, from, flagged)
    }
}

/// [`write_block`] for a block with any escape, or that starts inside a character written
/// already; `flagged` has a bit for each byte that needs an escape.
#[inline(never)]
fn write_block_escapes<const W: usize>(
    out: &mut Spare<'_>,
    text: &str,
    block: &[u8; 2 * WIDE],
    start: usize,
    taken: usize,
    mut from: usize,
    mut flagged: u32,
) -> usize {
    while flagged != 0 {
        let lane = flagged.trailing_zeros() as usize;
        flagged &= flagged - 1;
        let at = start + lane;
        // The clean run before the flagged byte, then its escape.
        let run = window::<W>(block, from - start);
        let b = block[lane % WIDE];
        from = match ESCAPES[usize::from(b)] {
            UNICODE => {
                let hex = |digit: u8| HEX[usize::from(digit & 0x0F)];
                out.put2(
                    run,
                    at - from,
                    &[b'\\', b'u', b'0', b'0', hex(b >> 4), hex(b)],
                );
                at + 1
            }
            SUPPLEMENTARY => {
                let (escape, read) = supplementary_escape(text, at);
                out.put2(run, at - from, &escape);
                at + read
            }
            escape => {
                out.put2(run, at - from, &[b'\\', escape]);
                at + 1
            }
        };
    }
    let end = start + taken;
    if from < end {
        out.put(window::<W>(block, from - start), end - from);
        from = end;
    }
    from
}

/// The bits below `n` (at most 32) of a block mask.
#[inline(always)]
fn low_bits(n: usize) -> u32 {
    ((1u64 << n.min(32)) - 1) as u32
}

/// The `W` bytes of `block` from `offset` (at most `W`; `W` at most [`WIDE`]).
#[inline(always)]
fn window<const W: usize>(block: &[u8; 2 * WIDE], offset: usize) -> &[u8; W] {
    block[offset.min(W)..]
        .first_chunk::<W>()
        .expect("offset.min(W) + W <= 2 * WIDE")
}

/// Bit masks of the first `W` bytes of a block, a bit per byte.
struct Masks {
    /// The bytes that need an escape (as in [`ESCAPES`]: below 0x20, `"`, `\`, or a 4-byte
    /// UTF-8 lead 0xF0..=0xFF).
    any: u32,
    /// The `"` and `\` among them.
    quote_or_backslash: u32,
}

/// [`Masks`] of the first `W` (16 or 32) bytes of `block`.
#[inline(always)]
fn escape_masks<const W: usize>(block: &[u8; 2 * WIDE]) -> Masks {
    let low = escape_masks_16(block, 0);
    if W <= 16 {
        return low;
    }
    let high = escape_masks_16(block, 16);
    Masks {
        any: low.any | high.any << 16,
        quote_or_backslash: low.quote_or_backslash | high.quote_or_backslash << 16,
    }
}

/// [`Masks`] of the 16 bytes of `block` from `offset` (0 or 16).
#[inline(always)]
fn escape_masks_16(block: &[u8; 2 * WIDE], offset: usize) -> Masks {
    let lanes: &[u8; 16] = window::<16>(block, offset);
    // SAFETY: SSE2 is part of the x86_64 baseline, so these intrinsics are available on every
    // target this module is compiled for; the load reads the 16 bytes of `lanes`.
    unsafe {
        let v = _mm_loadu_si128(lanes.as_ptr().cast());
        let splat = |b: u8| _mm_set1_epi8(b as i8);
        // Adding 0x10 maps 0xF0..=0xFF to 0x00..=0x0F and 0x00..=0x1F to 0x10..=0x2F, so both
        // ranges become "at most 0x2F" (unsigned): `min(x, 0x2F) == x`.
        let shifted = _mm_add_epi8(v, splat(0x10));
        let control_or_lead4 = _mm_cmpeq_epi8(_mm_min_epu8(shifted, splat(0x2F)), shifted);
        let quote = _mm_cmpeq_epi8(v, splat(b'"'));
        let backslash = _mm_cmpeq_epi8(v, splat(b'\\'));
        let quote_or_backslash = _mm_or_si128(quote, backslash);
        Masks {
            any: _mm_movemask_epi8(_mm_or_si128(control_or_lead4, quote_or_backslash)) as u32,
            quote_or_backslash: _mm_movemask_epi8(quote_or_backslash) as u32,
        }
    }
}

/// A vector appended to through its spare capacity: each store is a fixed-size copy, of which
/// only a prefix is kept; the vector's length is set by [`Spare::finish`].
struct Spare<'a> {
    out: &'a mut Vec<u8>,
    /// The length so far: `out.len() <= len <= out.capacity()`, and every byte below it
    /// initialized.
    len: usize,
}

impl<'a> Spare<'a> {
    fn new(out: &'a mut Vec<u8>) -> Self {
        let len = out.len();
        Self { out, len }
    }

    /// Stores all of `bytes` at the end and keeps the first `keep` of them (at most `N`).
    #[inline(always)]
    fn put<const N: usize>(&mut self, bytes: &[u8; N], keep: usize) {
        if self.out.capacity() - self.len < N {
            self.grow(N);
        }
        // SAFETY: the check above leaves at least `N` bytes of capacity past `len`, and
        // `bytes` is a separate borrow, so the copy stays inside the allocation and does not
        // overlap its source.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.out.as_mut_ptr().add(self.len), N);
        }
        self.len += keep.min(N);
    }

    /// Stores all of `first` at the end and keeps the first `keep` of them (at most `N`),
    /// then appends `then`.
    #[inline(always)]
    fn put2<const N: usize, const M: usize>(
        &mut self,
        first: &[u8; N],
        keep: usize,
        then: &[u8; M],
    ) {
        if self.out.capacity() - self.len < N + M {
            self.grow(N + M);
        }
        let keep = keep.min(N);
        // SAFETY: the check above leaves at least `N + M` bytes of capacity past `len`, and
        // `keep <= N`, so both copies stay inside the allocation; their sources are separate
        // borrows, so they do not overlap it.
        unsafe {
            let end = self.out.as_mut_ptr().add(self.len);
            std::ptr::copy_nonoverlapping(first.as_ptr(), end, N);
            std::ptr::copy_nonoverlapping(then.as_ptr(), end.add(keep), M);
        }
        self.len += keep + M;
    }

    /// Appends `block[..end]` (`end` clamped to `W`, at most [`WIDE`]) with a backslash
    /// before each byte whose bit is set in `flagged` (bits from `end` on are ignored).
    #[inline(always)]
    fn put_backslashed<const W: usize>(
        &mut self,
        block: &[u8; 2 * WIDE],
        flagged: u32,
        end: usize,
    ) {
        let end = end.min(W);
        let mut flagged = flagged & low_bits(end);
        // The last store writes `W` bytes past what is kept.
        self.reserve_backslashed(end, flagged, W);
        let base = self.out.as_mut_ptr();
        let mut len = self.len;
        let mut from = 0;
        while flagged != 0 {
            let at = flagged.trailing_zeros() as usize;
            flagged &= flagged - 1;
            // SAFETY: `from <= at < end <= W` here (so `from % W == from`): the bytes kept
            // so far are at most `at` of the block and a backslash per bit below `at`, so the
            // `W` stored end within the room checked above.
            unsafe {
                let run = window::<W>(block, from % W);
                std::ptr::copy_nonoverlapping(run.as_ptr(), base.add(len), W);
                *base.add(len + (at - from)) = b'\\';
            }
            len += at - from + 1;
            // The flagged byte itself starts the next run.
            from = at;
        }
        // SAFETY: as above; `from <= end <= W`.
        unsafe {
            std::ptr::copy_nonoverlapping(window::<W>(block, from).as_ptr(), base.add(len), W)
        };
        self.len = len + (end - from);
    }

    /// [`Spare::put_backslashed`] eight bytes at a time: each group of eight is spread by one
    /// byte shuffle into up to 16 bytes with a gap before each flagged byte, the gaps filled
    /// with backslashes, and stored whole; the position advances by the group's length.
    /// About a dozen instructions per eight bytes, however many escapes they hold.
    #[target_feature(enable = "ssse3")]
    #[inline]
    fn put_backslashed_spread<const W: usize>(
        &mut self,
        block: &[u8; 2 * WIDE],
        flagged: u32,
        end: usize,
    ) {
        let end = end.min(W);
        let flagged = flagged & low_bits(end);
        // The store of the last group starts within what is kept and writes 16 bytes.
        self.reserve_backslashed(end, flagged, 16);
        let base = self.out.as_mut_ptr();
        let mut len = self.len;
        let groups = end.div_ceil(8);
        for group in 0..groups {
            let lanes = ((flagged >> (8 * group)) & 0xFF) as usize;
            let spread = &SPREAD[lanes];
            let bytes: &[u8; 8] = block[8 * group..]
                .first_chunk::<8>()
                .expect("8 * group + 8 <= W <= 2 * WIDE");
            // SAFETY: the loads read the 8 bytes of `bytes` and the 16 of each table row; the
            // bytes kept before this group are at most two per byte of the block before it, so
            // the 16-byte store ends within the room checked above.
            unsafe {
                let group_bytes = _mm_loadl_epi64(bytes.as_ptr().cast());
                let shuffled =
                    _mm_shuffle_epi8(group_bytes, _mm_loadu_si128(spread.shuffle.as_ptr().cast()));
                let filled = _mm_or_si128(
                    shuffled,
                    _mm_loadu_si128(spread.backslashes.as_ptr().cast()),
                );
                _mm_storeu_si128(base.add(len).cast(), filled);
            }
            len += usize::from(spread.len);
        }
        // The last group's bytes past `end` were stored after its kept ones, not kept.
        self.len = len - (8 * groups - end);
    }

    /// Makes room for `end` bytes with a backslash before each of the `flagged` ones, and
    /// `tail` bytes more for stores past what is kept. The bits are counted only when the
    /// quick bound (a backslash per byte) does not fit: near the end of the output's reserve.
    #[inline(always)]
    fn reserve_backslashed(&mut self, end: usize, flagged: u32, tail: usize) {
        if self.out.capacity() - self.len < 2 * end + tail {
            let room = end + flagged.count_ones() as usize + tail;
            if self.out.capacity() - self.len < room {
                self.grow(room);
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn grow(&mut self, room: usize) {
        self.set_len();
        self.out.reserve(room);
    }

    fn finish(mut self) {
        self.set_len();
    }

    fn set_len(&mut self) {
        // SAFETY: `len` is within the capacity and every byte below it was initialized:
        // those below the original length by the caller, the others by the `put` methods,
        // which keep no more than they stored.
        unsafe { self.out.set_len(self.len) }
    }
}
