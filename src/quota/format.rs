//! C's `printf("%.*g")` for `f64`, written out here so that quota messages print numbers the
//! way Mesos does (a C++ stream at precision 15 formats like `%.15g`).
//!
//! Owns: the exact decimal expansion of an `f64`, rounding it to a number of significant
//! digits, and the `%g` choice between fixed and exponential notation.
//!
//! Invariants:
//! - QUOTA-2 (formatting half): `format_g(v, p)` is the string glibc's `printf("%.*g", p, v)`
//!   produces, for every `f64`: `inf`, `-inf`, `nan`, `-nan`, `0`, `-0`, subnormals included.
//!   The expansion is exact (no floating-point arithmetic), and a tie at the last kept digit
//!   rounds half to even, as glibc does in the default rounding mode.
//!
//! Contact points: `scalar.rs` is the only caller; it first rounds values to milli-units as
//! Mesos does, then prints them with [`MESOS_PRINT_DIGITS`].

/// Significant digits Mesos prints a scalar with: `std::numeric_limits<double>::digits10`.
pub(crate) const MESOS_PRINT_DIGITS: usize = 15;

/// Bits of an `f64`'s stored fraction.
const F64_FRACTION_BITS: u32 = 52;
/// The exponent bias of an `f64`, plus the fraction width, so that `value = m * 2^(e - this)`.
const F64_EXPONENT_OFFSET: i64 = 1075;
/// The largest power of ten that fits a `u32` limb, used to peel decimal digits nine at a time.
const DECIMAL_CHUNK: u32 = 1_000_000_000;
/// Decimal digits in one [`DECIMAL_CHUNK`].
const DECIMAL_CHUNK_DIGITS: usize = 9;
/// The largest power of five that fits a `u32`: 5^13.
const POW5_13: u32 = 1_220_703_125;

/// Returns `value` formatted as C's `%.{precision}g` (precision 0 counts as 1, as in C).
pub(crate) fn format_g(value: f64, precision: usize) -> String {
    let precision = precision.max(1);
    let sign = if value.is_sign_negative() { "-" } else { "" };
    if value.is_nan() {
        return format!("{sign}nan");
    }
    if value.is_infinite() {
        return format!("{sign}inf");
    }
    if value == 0.0 {
        return format!("{sign}0");
    }
    let (digits, point) = exact_decimal(value.abs());
    let (digits, point) = round_significant(digits, point, precision);
    let mut out = String::from(sign);
    // `%g` picks the style from the exponent of the already rounded value.
    let exponent = point - 1;
    let precision_exponent = i64::try_from(precision).unwrap_or(i64::MAX);
    if exponent < -4 || exponent >= precision_exponent {
        push_exponential(&mut out, &digits, exponent);
    } else {
        push_fixed(&mut out, &digits, point);
    }
    out
}

/// Appends `0.d1d2... * 10^point` in fixed notation; `digits` has no trailing zeros.
fn push_fixed(out: &mut String, digits: &[u8], point: i64) {
    let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
    if point <= 0 {
        out.push_str("0.");
        push_zeros(out, -point);
        push_digits(out, digits);
    } else if point >= len {
        push_digits(out, digits);
        push_zeros(out, point - len);
    } else {
        let split = usize::try_from(point).unwrap_or(digits.len());
        push_digits(out, &digits[..split]);
        out.push('.');
        push_digits(out, &digits[split..]);
    }
}

/// Appends `d1.d2d3...e±XX`; C prints at least two exponent digits.
fn push_exponential(out: &mut String, digits: &[u8], exponent: i64) {
    if let Some((first, rest)) = digits.split_first() {
        push_digits(out, &[*first]);
        if !rest.is_empty() {
            out.push('.');
            push_digits(out, rest);
        }
    }
    let exponent_sign = if exponent < 0 { '-' } else { '+' };
    out.push('e');
    out.push(exponent_sign);
    out.push_str(&format!("{:02}", exponent.unsigned_abs()));
}

fn push_digits(out: &mut String, digits: &[u8]) {
    out.extend(digits.iter().map(|d| char::from(b'0' + d)));
}

fn push_zeros(out: &mut String, count: i64) {
    for _ in 0..count {
        out.push('0');
    }
}

/// Returns the exact decimal expansion of a finite, positive `value` as digits (most
/// significant first, no leading zero) and the position of the decimal point, so that
/// `value = 0.d1d2d3... * 10^point`.
fn exact_decimal(value: f64) -> (Vec<u8>, i64) {
    let bits = value.to_bits();
    let biased_exponent = i64::try_from((bits >> F64_FRACTION_BITS) & 0x7ff).unwrap_or(0);
    let fraction = bits & ((1u64 << F64_FRACTION_BITS) - 1);
    // Subnormals have no implicit leading bit and the exponent of the smallest normal.
    let (mut mantissa, mut exponent) = if biased_exponent == 0 {
        (fraction, 1 - F64_EXPONENT_OFFSET)
    } else {
        (
            fraction | (1u64 << F64_FRACTION_BITS),
            biased_exponent - F64_EXPONENT_OFFSET,
        )
    };
    // Dropping common factors of two keeps the big integer below as small as possible.
    while mantissa & 1 == 0 && exponent < 0 {
        mantissa >>= 1;
        exponent += 1;
    }
    let mut big = BigUint::from_u64(mantissa);
    if exponent >= 0 {
        // value = m * 2^e is an integer.
        big.mul_pow2(exponent.unsigned_abs());
        let digits = big.into_decimal_digits();
        let point = i64::try_from(digits.len()).unwrap_or(i64::MAX);
        (digits, point)
    } else {
        // value = m / 2^k = m * 5^k / 10^k: the digits of m * 5^k, point moved k places left.
        let shift = exponent.unsigned_abs();
        big.mul_pow5(shift);
        let digits = big.into_decimal_digits();
        let len = i64::try_from(digits.len()).unwrap_or(i64::MAX);
        (digits, len - i64::try_from(shift).unwrap_or(i64::MAX))
    }
}

/// Rounds `0.digits * 10^point` to at most `precision` significant digits, half to even, and
/// strips trailing zeros. Returns the new digits and point.
fn round_significant(mut digits: Vec<u8>, mut point: i64, precision: usize) -> (Vec<u8>, i64) {
    if digits.len() > precision {
        let next = digits[precision];
        let rest_nonzero = digits[precision + 1..].iter().any(|d| *d != 0);
        let last_odd = digits[precision - 1] % 2 == 1;
        digits.truncate(precision);
        let round_up = next > 5 || (next == 5 && (rest_nonzero || last_odd));
        if round_up && increment(&mut digits) {
            // 99..9 rounded up to 100..0: one more integer digit, the same significant count.
            digits.insert(0, 1);
            digits.truncate(precision);
            point += 1;
        }
    }
    while digits.last() == Some(&0) {
        digits.pop();
    }
    (digits, point)
}

/// Adds one unit in the last place; returns `true` when the carry ran out of the top digit
/// (all digits are then zero).
fn increment(digits: &mut [u8]) -> bool {
    for digit in digits.iter_mut().rev() {
        if *digit == 9 {
            *digit = 0;
        } else {
            *digit += 1;
            return false;
        }
    }
    true
}

/// An unsigned integer of any size, little-endian `u32` limbs: just enough arithmetic for an
/// exact `f64` expansion (the largest is about 2^2500, for the smallest subnormal).
struct BigUint {
    limbs: Vec<u32>,
}

impl BigUint {
    fn from_u64(value: u64) -> BigUint {
        let mut limbs = vec![(value & 0xffff_ffff) as u32, (value >> 32) as u32];
        while limbs.last() == Some(&0) {
            limbs.pop();
        }
        BigUint { limbs }
    }

    fn mul_small(&mut self, factor: u32) {
        let mut carry = 0u64;
        for limb in &mut self.limbs {
            let product = u64::from(*limb) * u64::from(factor) + carry;
            *limb = (product & 0xffff_ffff) as u32;
            carry = product >> 32;
        }
        if carry > 0 {
            self.limbs.push(carry as u32);
        }
    }

    fn mul_pow2(&mut self, mut power: u64) {
        while power >= 31 {
            self.mul_small(1 << 31);
            power -= 31;
        }
        self.mul_small(1 << power);
    }

    fn mul_pow5(&mut self, mut power: u64) {
        while power >= 13 {
            self.mul_small(POW5_13);
            power -= 13;
        }
        for _ in 0..power {
            self.mul_small(5);
        }
    }

    /// Divides in place and returns the remainder.
    fn div_small(&mut self, divisor: u32) -> u32 {
        let mut remainder = 0u64;
        for limb in self.limbs.iter_mut().rev() {
            let dividend = (remainder << 32) | u64::from(*limb);
            *limb = (dividend / u64::from(divisor)) as u32;
            remainder = dividend % u64::from(divisor);
        }
        while self.limbs.last() == Some(&0) {
            self.limbs.pop();
        }
        remainder as u32
    }

    /// Returns the decimal digits, most significant first, without leading zeros.
    fn into_decimal_digits(mut self) -> Vec<u8> {
        let mut reversed = Vec::new();
        while !self.limbs.is_empty() {
            let mut chunk = self.div_small(DECIMAL_CHUNK);
            for _ in 0..DECIMAL_CHUNK_DIGITS {
                reversed.push((chunk % 10) as u8);
                chunk /= 10;
            }
        }
        while reversed.last() == Some(&0) {
            reversed.pop();
        }
        reversed.reverse();
        reversed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks `%.15g` of each value against the text glibc printed for it (g++ 12, glibc 2.36).
    fn check_g15(cases: &[(f64, &str)]) {
        for (value, expected) in cases {
            assert_eq!(
                format_g(*value, MESOS_PRINT_DIGITS),
                *expected,
                "value {value:e}"
            );
        }
    }

    #[test]
    fn g15_matches_glibc_on_plain_values() {
        check_g15(&[
            (1.0, "1"),
            (0.5, "0.5"),
            (2048.0, "2048"),
            (100.0, "100"),
            (100000.0, "100000"),
            (123456.789, "123456.789"),
            (1.2345, "1.2345"),
            (1234.5678, "1234.5678"),
            (0.1, "0.1"),
            (0.1 + 0.2, "0.3"),
            (-1.0, "-1"),
            (-1.5, "-1.5"),
            (-0.0001, "-0.0001"),
        ]);
    }

    #[test]
    fn g15_switches_to_exponent_outside_minus4_to_15() {
        check_g15(&[
            (1e14, "100000000000000"),
            (999999999999999.0, "999999999999999"),
            (1e15, "1e+15"),
            (999999999999999.9, "1e+15"),
            (9223372036854775808.0, "9.22337203685478e+18"),
            (1e300, "1e+300"),
            (-1e300, "-1e+300"),
            (0.0001, "0.0001"),
            (0.0004, "0.0004"),
            (1e-5, "1e-05"),
            (5e-324, "4.94065645841247e-324"),
            (1e-310, "9.99999999999997e-311"),
            (4611686018427387.904, "4.61168601842739e+15"),
        ]);
    }

    #[test]
    fn g15_rounds_ties_half_to_even() {
        check_g15(&[
            (1234567890123.125, "1234567890123.12"),
            (12345678901234.5, "12345678901234.5"),
            (123456789012.3456, "123456789012.346"),
            (999999999999.999, "999999999999.999"),
        ]);
    }

    #[test]
    fn g15_prints_specials_like_glibc() {
        check_g15(&[
            (0.0, "0"),
            (-0.0, "-0"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (-f64::NAN, "-nan"),
        ]);
    }

    #[test]
    fn other_precisions_follow_c() {
        assert_eq!(format_g(0.5, 0), "0.5");
        assert_eq!(format_g(2.5, 1), "2");
        assert_eq!(format_g(3.5, 1), "4");
        assert_eq!(format_g(99.5, 2), "1e+02");
        assert_eq!(format_g(123456.0, 6), "123456");
        assert_eq!(format_g(1234567.0, 6), "1.23457e+06");
    }

    /// Rust's `{:.14e}` is also exact, so the two must agree on the fifteen digits and the
    /// exponent for any bit pattern; this sweeps a deterministic pseudo-random sample.
    #[test]
    fn digits_agree_with_rust_exact_formatting() {
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..20_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let value = f64::from_bits(state);
            if !value.is_finite() || value == 0.0 {
                continue;
            }
            let ours = format_g(value, 30);
            let theirs = format!("{value:.29e}");
            assert_eq!(
                canonical(&ours),
                canonical(&theirs),
                "value bits {state:#x}: {ours} vs {theirs}"
            );
        }
    }

    /// Reduces a number's text to (sign, significant digits without trailing zeros, exponent).
    fn canonical(text: &str) -> (bool, String, i64) {
        let negative = text.starts_with('-');
        let body = text.trim_start_matches('-');
        let (mantissa, exponent) = match body.split_once('e') {
            Some((m, e)) => (m, e.parse::<i64>().unwrap()),
            None => (body, 0),
        };
        let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let all: String = format!("{int_part}{frac_part}");
        let leading = all.len() - all.trim_start_matches('0').len();
        let digits = all
            .trim_start_matches('0')
            .trim_end_matches('0')
            .to_string();
        let point = int_part.len() as i64 - leading as i64 + exponent;
        (negative, digits, point)
    }
}
