//! `Double.toString` / `Float.toString` as Java 17 and earlier print them
//! (`sun.misc.FloatingDecimal`), for Kafka Connect workers that run on such a JDK.
//!
//! Java 19 replaced the algorithm (JDK-4511638); the old one sometimes prints more digits
//! than needed (`8.41E21` as `8.409999999999999E21`, `1.0E23` as `9.999999999999999E22`).
//! This module follows the old algorithm step by step — the same estimates, the same
//! integer widths (wrapping where Java's `int` and `long` wrap), the same comparisons — since
//! its output is defined by those steps rather than by a specification. Each step that must
//! match Java is marked.
//!
//! # Invariants
//! - The output reads back (with Rust's or Java's parser) as exactly the input value.
//! - Never panics: every division is by a non-zero power of five or two shifted left.

use crate::format::javanum::FloatText;

const EXP_SHIFT: i32 = 52;
const FRACT_HOB: u64 = 1 << 52;
const SIGNIF_BIT_MASK: u64 = FRACT_HOB - 1;
const EXP_ONE: u64 = 0x3ff0_0000_0000_0000;
const MAX_SMALL_BIN_EXP: i32 = 62;
const MIN_SMALL_BIN_EXP: i32 = -(63 / 3);

/// Bit lengths of 5^i for i < 27 (Java's `N_5_BITS`).
const N_5_BITS: [i32; 27] = [
    0, 3, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28, 31, 33, 35, 38, 40, 42, 45, 47, 49, 52, 54, 56,
    59, 61,
];

/// Java's `insignificantDigitsNumber`.
const INSIGNIFICANT_DIGITS: [i32; 64] = [
    0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 8, 8, 8, 9, 9,
    9, 9, 10, 10, 10, 11, 11, 11, 12, 12, 12, 12, 13, 13, 13, 14, 14, 14, 15, 15, 15, 15, 16, 16,
    16, 17, 17, 17, 18, 18, 18, 19,
];

const fn pow5(i: usize) -> u64 {
    let mut r = 1u64;
    let mut k = 0;
    while k < i {
        r *= 5;
        k += 1;
    }
    r
}

/// A small unsigned big integer (little-endian 32-bit limbs): Java's `FDBigInteger` for the
/// operations the algorithm uses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Big(Vec<u32>);

impl Big {
    fn from_u64(v: u64) -> Big {
        let mut b = Big(vec![v as u32, (v >> 32) as u32]);
        b.trim();
        b
    }

    fn trim(&mut self) {
        while self.0.last() == Some(&0) {
            self.0.pop();
        }
    }

    fn mul_small(&mut self, m: u32) {
        let mut carry = 0u64;
        for limb in &mut self.0 {
            let v = u64::from(*limb) * u64::from(m) + carry;
            *limb = v as u32;
            carry = v >> 32;
        }
        if carry > 0 {
            self.0.push(carry as u32);
        }
    }

    fn mul_pow5(&mut self, mut n: i32) {
        while n > 0 {
            let step = n.min(13);
            self.mul_small(pow5(step as usize) as u32);
            n -= step;
        }
    }

    fn shl(&mut self, n: i32) {
        if n <= 0 || self.0.is_empty() {
            return;
        }
        let words = (n / 32) as usize;
        let bits = n % 32;
        if bits > 0 {
            let mut carry = 0u32;
            for limb in &mut self.0 {
                let v = (*limb << bits) | carry;
                carry = *limb >> (32 - bits);
                *limb = v;
            }
            if carry > 0 {
                self.0.push(carry);
            }
        }
        let mut shifted = vec![0u32; words];
        shifted.append(&mut self.0);
        self.0 = shifted;
    }

    fn pow52(p5: i32, p2: i32) -> Big {
        let mut b = Big::from_u64(1);
        b.mul_pow5(p5);
        b.shl(p2);
        b
    }

    fn cmp(&self, other: &Big) -> std::cmp::Ordering {
        self.0
            .len()
            .cmp(&other.0.len())
            .then_with(|| self.0.iter().rev().cmp(other.0.iter().rev()))
    }

    fn add(&self, other: &Big) -> Big {
        let n = self.0.len().max(other.0.len());
        let mut out = Vec::with_capacity(n + 1);
        let mut carry = 0u64;
        for i in 0..n {
            let v = u64::from(self.0.get(i).copied().unwrap_or(0))
                + u64::from(other.0.get(i).copied().unwrap_or(0))
                + carry;
            out.push(v as u32);
            carry = v >> 32;
        }
        if carry > 0 {
            out.push(carry as u32);
        }
        let mut b = Big(out);
        b.trim();
        b
    }

    /// `self -= other`; `other <= self`.
    fn sub_assign(&mut self, other: &Big) {
        let mut borrow = 0i64;
        for i in 0..self.0.len() {
            let v = i64::from(self.0[i]) - i64::from(other.0.get(i).copied().unwrap_or(0)) - borrow;
            if v < 0 {
                self.0[i] = (v + (1i64 << 32)) as u32;
                borrow = 1;
            } else {
                self.0[i] = v as u32;
                borrow = 0;
            }
        }
        self.trim();
    }

    /// Java's `quoRemIteration`: q = self / s (a digit), self = (self % s) * 10.
    fn quo_rem_iteration(&mut self, s: &Big) -> i32 {
        let mut q = 0;
        while self.cmp(s) != std::cmp::Ordering::Less {
            self.sub_assign(s);
            q += 1;
        }
        self.mul_small(10);
        q
    }
}

/// Digits and decimal exponent, as `BinaryToASCIIBuffer` holds them.
struct Buffer {
    digits: Vec<u8>,
    dec_exponent: i32,
}

impl Buffer {
    fn roundup(&mut self) {
        // Java's BinaryToASCIIBuffer.roundup.
        let mut i = self.digits.len() - 1;
        let mut q = self.digits[i];
        if q == b'9' {
            while q == b'9' && i > 0 {
                self.digits[i] = b'0';
                i -= 1;
                q = self.digits[i];
            }
            if q == b'9' {
                self.dec_exponent += 1;
                self.digits[0] = b'1';
                return;
            }
        }
        self.digits[i] = q + 1;
    }
}

// 0.301029995663981 is Java's literal (shorter than log10(2)); the estimate must use it.
#[allow(clippy::approx_constant)]
fn estimate_dec_exp(fract_bits: u64, bin_exp: i32) -> i32 {
    // Java's FloatingDecimal.estimateDecExp, with the same double arithmetic.
    let d2 = f64::from_bits(EXP_ONE | (fract_bits & SIGNIF_BIT_MASK));
    let d = (d2 - 1.5) * 0.289529654 + 0.176091259 + f64::from(bin_exp) * 0.301029995663981;
    let d_bits = d.to_bits();
    let exponent = ((d_bits >> 52) & 0x7ff) as i32 - 1023;
    let negative = d_bits >> 63 != 0;
    if (0..52).contains(&exponent) {
        let mask = SIGNIF_BIT_MASK >> exponent;
        let r = (((d_bits & SIGNIF_BIT_MASK) | FRACT_HOB) >> (EXP_SHIFT - exponent)) as i32;
        if negative {
            if mask & d_bits == 0 {
                -r
            } else {
                -r - 1
            }
        } else {
            r
        }
    } else if exponent < 0 {
        if d_bits & !(1u64 << 63) == 0 {
            0
        } else if negative {
            -1
        } else {
            0
        }
    } else {
        d as i32
    }
}

fn develop_long_digits(mut dec_exponent: i32, mut lvalue: i64, insignificant: i32) -> Buffer {
    // Java's BinaryToASCIIBuffer.developLongDigits.
    if insignificant != 0 {
        let pow10 = (pow5(insignificant as usize) as i64) << insignificant;
        let residue = lvalue % pow10;
        lvalue /= pow10;
        dec_exponent += insignificant;
        if residue >= (pow10 >> 1) {
            lvalue += 1;
        }
    }
    let mut rev = Vec::new();
    let mut c = lvalue % 10;
    lvalue /= 10;
    while c == 0 {
        dec_exponent += 1;
        c = lvalue % 10;
        lvalue /= 10;
    }
    while lvalue != 0 {
        rev.push(b'0' + c as u8);
        dec_exponent += 1;
        c = lvalue % 10;
        lvalue /= 10;
    }
    rev.push(b'0' + c as u8);
    rev.reverse();
    Buffer {
        digits: rev,
        dec_exponent: dec_exponent + 1,
    }
}

/// Java's `BinaryToASCIIBuffer.dtoa` with `isCompatibleFormat = true`.
fn dtoa(bin_exp: i32, mut fract_bits: u64, n_significant_bits: i32) -> Buffer {
    let tail_zeros = fract_bits.trailing_zeros() as i32;
    let n_fract_bits = EXP_SHIFT + 1 - tail_zeros;
    let n_tiny_bits = (n_fract_bits - bin_exp - 1).max(0);
    if (MIN_SMALL_BIN_EXP..=MAX_SMALL_BIN_EXP).contains(&bin_exp)
        && n_tiny_bits < 27
        && n_fract_bits + N_5_BITS[n_tiny_bits as usize] < 64
        && n_tiny_bits == 0
    {
        let insignificant = if bin_exp > n_significant_bits {
            let p2 = bin_exp - n_significant_bits - 1;
            if p2 > 1 && p2 < 64 {
                INSIGNIFICANT_DIGITS[p2 as usize]
            } else {
                0
            }
        } else {
            0
        };
        if bin_exp >= EXP_SHIFT {
            fract_bits <<= bin_exp - EXP_SHIFT;
        } else {
            fract_bits >>= EXP_SHIFT - bin_exp;
        }
        return develop_long_digits(0, fract_bits as i64, insignificant);
    }
    let mut dec_exp = estimate_dec_exp(fract_bits, bin_exp);
    let b5 = (-dec_exp).max(0);
    let mut b2 = b5 + n_tiny_bits + bin_exp;
    let s5 = dec_exp.max(0);
    let mut s2 = s5 + n_tiny_bits;
    let m5 = b5;
    let mut m2 = b2 - n_significant_bits;
    fract_bits >>= tail_zeros;
    b2 -= n_fract_bits - 1;
    let common2 = b2.min(s2);
    b2 -= common2;
    s2 -= common2;
    m2 -= common2;
    if n_fract_bits == 1 {
        m2 -= 1;
    }
    if m2 < 0 {
        b2 -= m2;
        s2 -= m2;
        m2 = 0;
    }
    let n5 = |i: i32| {
        if (i as usize) < N_5_BITS.len() {
            N_5_BITS[i as usize]
        } else {
            i * 3
        }
    };
    let b_bits = n_fract_bits + b2 + n5(b5);
    let ten_s_bits = s2 + 1 + n5(s5 + 1);
    let mut digits = Vec::with_capacity(20);
    let (low, high, low_digit_difference);
    if b_bits < 64 && ten_s_bits < 64 {
        if b_bits < 32 && ten_s_bits < 32 {
            // Java's int arithmetic, wrapping as Java's int does.
            let mut b = (fract_bits as i32)
                .wrapping_mul(pow5(b5 as usize) as i32)
                .wrapping_shl(b2 as u32);
            let s = (pow5(s5 as usize) as i32).wrapping_shl(s2 as u32);
            let mut m = (pow5(m5 as usize) as i32).wrapping_shl(m2 as u32);
            let tens = s.wrapping_mul(10);
            let mut q = b / s;
            b = 10i32.wrapping_mul(b % s);
            m = m.wrapping_mul(10);
            let mut lo = b < m;
            let mut hi = b.wrapping_add(m) > tens;
            if q == 0 && !hi {
                dec_exp -= 1;
            } else {
                digits.push(b'0' + q as u8);
            }
            if !(-3..8).contains(&dec_exp) {
                hi = false;
                lo = false;
            }
            while !lo && !hi {
                q = b / s;
                b = 10i32.wrapping_mul(b % s);
                m = m.wrapping_mul(10);
                if m > 0 {
                    lo = b < m;
                    hi = b.wrapping_add(m) > tens;
                } else {
                    lo = true;
                    hi = true;
                }
                digits.push(b'0' + q as u8);
            }
            low = lo;
            high = hi;
            low_digit_difference = i64::from(b.wrapping_shl(1).wrapping_sub(tens));
        } else {
            // Java's long arithmetic, wrapping as Java's long does.
            let mut b = (fract_bits as i64)
                .wrapping_mul(pow5(b5 as usize) as i64)
                .wrapping_shl(b2 as u32);
            let s = (pow5(s5 as usize) as i64).wrapping_shl(s2 as u32);
            let mut m = (pow5(m5 as usize) as i64).wrapping_shl(m2 as u32);
            let tens = s.wrapping_mul(10);
            let mut q = (b / s) as i32;
            b = 10i64.wrapping_mul(b % s);
            m = m.wrapping_mul(10);
            let mut lo = b < m;
            let mut hi = b.wrapping_add(m) > tens;
            if q == 0 && !hi {
                dec_exp -= 1;
            } else {
                digits.push(b'0' + q as u8);
            }
            if !(-3..8).contains(&dec_exp) {
                hi = false;
                lo = false;
            }
            while !lo && !hi {
                q = (b / s) as i32;
                b = 10i64.wrapping_mul(b % s);
                m = m.wrapping_mul(10);
                if m > 0 {
                    lo = b < m;
                    hi = b.wrapping_add(m) > tens;
                } else {
                    lo = true;
                    hi = true;
                }
                digits.push(b'0' + q as u8);
            }
            low = lo;
            high = hi;
            low_digit_difference = b.wrapping_shl(1).wrapping_sub(tens);
        }
    } else {
        // Java's FDBigInteger arithmetic (exact; its normalization shift changes nothing).
        let s = Big::pow52(s5, s2);
        let mut b = Big::from_u64(fract_bits);
        b.mul_pow5(b5);
        b.shl(b2);
        let mut m = Big::pow52(m5 + 1, m2 + 1);
        let ten_s = Big::pow52(s5 + 1, s2 + 1);
        let mut q = b.quo_rem_iteration(&s);
        let mut lo = b.cmp(&m) == std::cmp::Ordering::Less;
        // `tenSval.addAndCmp(Bval, Mval) <= 0`: b + m >= 10s (not `>` as in the int path).
        let mut hi = ten_s.cmp(&b.add(&m)) != std::cmp::Ordering::Greater;
        if q == 0 && !hi {
            dec_exp -= 1;
        } else {
            digits.push(b'0' + q as u8);
        }
        if !(-3..8).contains(&dec_exp) {
            hi = false;
            lo = false;
        }
        while !lo && !hi {
            q = b.quo_rem_iteration(&s);
            m.mul_small(10);
            lo = b.cmp(&m) == std::cmp::Ordering::Less;
            hi = ten_s.cmp(&b.add(&m)) != std::cmp::Ordering::Greater;
            digits.push(b'0' + q as u8);
        }
        low_digit_difference = if hi && lo {
            let mut b2x = b.clone();
            b2x.shl(1);
            match b2x.cmp(&ten_s) {
                std::cmp::Ordering::Less => -1,
                std::cmp::Ordering::Equal => 0,
                std::cmp::Ordering::Greater => 1,
            }
        } else {
            0
        };
        low = lo;
        high = hi;
    }
    let mut buf = Buffer {
        digits,
        dec_exponent: dec_exp + 1,
    };
    if high {
        if low {
            if low_digit_difference == 0 {
                if buf.digits.last().is_some_and(|d| (d - b'0') & 1 != 0) {
                    buf.roundup();
                }
            } else if low_digit_difference > 0 {
                buf.roundup();
            }
        } else {
            buf.roundup();
        }
    }
    buf
}

/// Java's `BinaryToASCIIBuffer.getChars` (the `toJavaFormatString` layout).
fn layout(negative: bool, buf: &Buffer) -> String {
    let digits = std::str::from_utf8(&buf.digits).unwrap_or("0");
    let n = digits.len() as i32;
    let e = buf.dec_exponent;
    let mut out = String::with_capacity(26);
    if negative {
        out.push('-');
    }
    if e > 0 && e < 8 {
        let char_length = n.min(e);
        out.push_str(&digits[..char_length as usize]);
        if char_length < e {
            out.extend(std::iter::repeat_n('0', (e - char_length) as usize));
            out.push_str(".0");
        } else {
            out.push('.');
            if char_length < n {
                out.push_str(&digits[char_length as usize..]);
            } else {
                out.push('0');
            }
        }
    } else if e <= 0 && e > -3 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-e) as usize));
        out.push_str(digits);
    } else {
        out.push_str(&digits[..1]);
        out.push('.');
        if n > 1 {
            out.push_str(&digits[1..]);
        } else {
            out.push('0');
        }
        out.push('E');
        if e <= 0 {
            out.push('-');
            out.push_str(&(-e + 1).to_string());
        } else {
            out.push_str(&(e - 1).to_string());
        }
    }
    out
}

fn special(negative: bool, zero: bool, nan: bool) -> FloatText {
    let (text, finite) = if nan {
        ("NaN", false)
    } else if !zero {
        (if negative { "-Infinity" } else { "Infinity" }, false)
    } else {
        (if negative { "-0.0" } else { "0.0" }, true)
    };
    FloatText {
        text: text.to_owned(),
        finite,
    }
}

/// Java 17's `Double.toString(v)`.
pub fn java17_double(v: f64) -> FloatText {
    let bits = v.to_bits();
    let negative = bits >> 63 != 0;
    let mut fract_bits = bits & SIGNIF_BIT_MASK;
    let mut bin_exp = ((bits >> 52) & 0x7ff) as i32;
    if bin_exp == 0x7ff {
        return special(negative, false, fract_bits != 0);
    }
    let n_significant_bits;
    if bin_exp == 0 {
        if fract_bits == 0 {
            return special(negative, true, false);
        }
        let leading_zeros = fract_bits.leading_zeros() as i32;
        let shift = leading_zeros - (63 - EXP_SHIFT);
        fract_bits <<= shift;
        bin_exp = 1 - shift;
        n_significant_bits = 64 - leading_zeros;
    } else {
        fract_bits |= FRACT_HOB;
        n_significant_bits = EXP_SHIFT + 1;
    }
    bin_exp -= 1023;
    let buf = dtoa(bin_exp, fract_bits, n_significant_bits);
    FloatText {
        text: layout(negative, &buf),
        finite: true,
    }
}

/// Java 17's `Float.toString(v)`.
pub fn java17_float(v: f32) -> FloatText {
    let bits = v.to_bits();
    let negative = bits >> 31 != 0;
    let mut fract_bits = bits & 0x007f_ffff;
    let mut bin_exp = ((bits >> 23) & 0xff) as i32;
    if bin_exp == 0xff {
        return special(negative, false, fract_bits != 0);
    }
    let n_significant_bits;
    if bin_exp == 0 {
        if fract_bits == 0 {
            return special(negative, true, false);
        }
        let leading_zeros = fract_bits.leading_zeros() as i32;
        let shift = leading_zeros - (31 - 23);
        fract_bits <<= shift;
        bin_exp = 1 - shift;
        n_significant_bits = 32 - leading_zeros;
    } else {
        fract_bits |= 1 << 23;
        n_significant_bits = 24;
    }
    bin_exp -= 127;
    let buf = dtoa(
        bin_exp,
        u64::from(fract_bits) << (EXP_SHIFT - 23),
        n_significant_bits,
    );
    FloatText {
        text: layout(negative, &buf),
        finite: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(v: f64) -> String {
        java17_double(v).text
    }

    // Expected strings: OpenJDK 17.0.15's Double.toString / Float.toString.
    #[test]
    fn doubles_java17_prints_differently() {
        assert_eq!(d(1.0e23), "9.999999999999999E22");
        assert_eq!(d(8.41e21), "8.409999999999999E21");
    }

    /// Checks a file of `bits<TAB>text` lines written by Java 17
    /// (`SIPHON_JAVA17_DOUBLES=path cargo test -p siphon-router java17_file`).
    #[test]
    fn java17_file() {
        let Some(path) = std::env::var_os("SIPHON_JAVA17_DOUBLES") else {
            return;
        };
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut bad = Vec::new();
        let mut n = 0;
        for line in text.lines() {
            let Some((kind_bits, expected)) = line.split_once('\t') else {
                continue;
            };
            n += 1;
            let got = if let Some(bits) = kind_bits.strip_prefix('f') {
                java17_float(f32::from_bits(bits.parse::<i32>().unwrap_or(0) as u32)).text
            } else {
                java17_double(f64::from_bits(kind_bits.parse::<i64>().unwrap_or(0) as u64)).text
            };
            if got != expected && bad.len() < 20 {
                bad.push(format!("{kind_bits}: java {expected} rust {got}"));
            }
        }
        assert!(
            bad.is_empty(),
            "{n} values, mismatches:\n{}",
            bad.join("\n")
        );
    }

    #[test]
    fn doubles_both_print_alike() {
        for (v, s) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (0.001, "0.001"),
            (2e-3, "0.002"),
            (1e7, "1.0E7"),
            (1.0e-5, "1.0E-5"),
            (2e22, "2.0E22"),
            (f64::from_bits(1), "4.9E-324"),
            (f64::MAX, "1.7976931348623157E308"),
            (0.1 + 0.2, "0.30000000000000004"),
            (1234567.0, "1234567.0"),
            (-1.5, "-1.5"),
            (1.1234567890123457, "1.1234567890123457"),
        ] {
            assert_eq!(d(v), s, "{v:e}");
        }
        assert_eq!(java17_float(1.1).text, "1.1");
        assert_eq!(java17_float(f32::from_bits(1)).text, "1.4E-45");
        assert_eq!(java17_float(3.4028235e38).text, "3.4028235E38");
    }
}
