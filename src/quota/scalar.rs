//! Quota scalars: Mesos's fixed-point `Value::Scalar`, kept as whole milli-units.
//!
//! Owns: [`Scalar`], the conversion from a request's `f64` (Mesos's `convertToFixed`, which is
//! `llround(v * 1000)`, behind Mesos's input checks), the conversion back
//! (`convertToFloating`), and how a scalar, or a raw request value, is printed in a message.
//!
//! Invariants:
//! - QUOTA-1: a [`Scalar`] is a whole number of milli-units in `0..=i64::MAX`. Comparisons are
//!   integer comparisons, so `1.0004 == 1` and `0.0004 == 0`, as in Mesos. Sums saturate at
//!   [`Scalar::MAX`] and differences floor at zero instead of wrapping (Mesos wraps; see
//!   `docs/design/quota-values.md`).
//! - QUOTA-2: a scalar prints as Mesos prints it: rounded to three decimals, then `%.15g`.
//!   A raw value too large for fixed point (or not finite) prints as its real value, where
//!   Mesos would print the overflowed `-9.22337203685478e+15` (spec §10 Q3).
//!
//! Contact points: `quantities.rs` and `limits.rs` hold scalars; `validate.rs` converts request
//! values with [`Scalar::from_f64`] and prints rejected ones with [`format_input`]; `format.rs`
//! does the `%.15g`.

use std::fmt;
use std::num::FpCategory;

use super::format::{MESOS_PRINT_DIGITS, format_g};

/// Milli-units per unit: Mesos keeps exactly three decimal digits of a scalar.
pub const SCALAR_MILLI_PER_UNIT: i64 = 1000;

/// `2^63` as an `f64` (exact): the first value `llround` cannot return.
const TWO_POW_63_F64: f64 = 9_223_372_036_854_775_808.0;

/// A non-negative quantity of one resource, in thousandths of its unit (QUOTA-1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Scalar(i64);

impl Scalar {
    /// Zero of any resource.
    pub const ZERO: Scalar = Scalar(0);

    /// The largest scalar, `9223372036854775.807`; sums saturate here.
    pub const MAX: Scalar = Scalar(i64::MAX);

    /// Returns the scalar of `milli` thousandths, or `None` if `milli` is negative.
    pub const fn from_milli(milli: i64) -> Option<Scalar> {
        if milli < 0 { None } else { Some(Scalar(milli)) }
    }

    /// Returns `units` whole units.
    pub const fn from_units(units: u32) -> Scalar {
        // u32::MAX * 1000 is far below i64::MAX, so this cannot overflow.
        Scalar(units as i64 * SCALAR_MILLI_PER_UNIT)
    }

    /// Returns the value in thousandths of the unit.
    pub const fn milli(self) -> i64 {
        self.0
    }

    /// Returns `true` for zero.
    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// Converts a request value the way Mesos does: `llround(value * 1000)`, after
    /// `validateInputScalarValue`'s checks in its order (infinite, NaN, subnormal, negative).
    ///
    /// `-0.0` is zero. A negative value is rejected even if it would round to zero
    /// (`-0.0001`), as in Mesos. A value whose milli-units do not fit an `i64` (about
    /// 9.22e15 and up) is rejected with [`ScalarError::Overflow`] where Mesos would silently
    /// wrap; UPDATE_QUOTA never gets there because its caps are checked first.
    pub fn from_f64(value: f64) -> Result<Scalar, ScalarError> {
        match value.classify() {
            FpCategory::Infinite => Err(ScalarError::Infinite),
            FpCategory::Nan => Err(ScalarError::NaN),
            FpCategory::Subnormal => Err(ScalarError::Subnormal),
            FpCategory::Zero => Ok(Scalar::ZERO),
            FpCategory::Normal if value < 0.0 => Err(ScalarError::Negative),
            FpCategory::Normal => match fixed_milli(value) {
                Some(milli) if milli >= 0 => Ok(Scalar(milli)),
                _ => Err(ScalarError::Overflow),
            },
        }
    }

    /// Returns the value as a double, as Mesos's `convertToFloating` computes it (integer part
    /// and thousandths converted separately, then added).
    pub fn to_f64(self) -> f64 {
        milli_to_f64(self.0)
    }

    /// Returns `self + other`, or [`Scalar::MAX`] if the sum does not fit.
    pub const fn saturating_add(self, other: Scalar) -> Scalar {
        Scalar(self.0.saturating_add(other.0))
    }

    /// Returns `self - other`, or zero if `other` is larger (quantities never go negative).
    pub const fn saturating_sub(self, other: Scalar) -> Scalar {
        if other.0 >= self.0 {
            Scalar::ZERO
        } else {
            Scalar(self.0 - other.0)
        }
    }
}

impl fmt::Display for Scalar {
    /// Prints as Mesos's `operator<<(ostream&, const Value::Scalar&)`: `1`, `0.5`, `1.235`,
    /// `1e+15`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_g(self.to_f64(), MESOS_PRINT_DIGITS))
    }
}

/// Why a request value cannot be a [`Scalar`]. The `Display` text of every variant but
/// `Overflow` is Mesos's `validateInputScalarValue` reason, verbatim.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScalarError {
    /// Positive or negative infinity.
    Infinite,
    /// Not a number.
    NaN,
    /// A subnormal double, of either sign.
    Subnormal,
    /// A negative normal double.
    Negative,
    /// Too large for `i64` milli-units (kvd's own message: Mesos wraps around silently).
    Overflow,
}

impl fmt::Display for ScalarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ScalarError::Infinite => "Infinite values not supported",
            ScalarError::NaN => "NaN not supported",
            ScalarError::Subnormal => "Subnormal values not supported",
            ScalarError::Negative => "Negative values not supported",
            ScalarError::Overflow => {
                "Values too large for the fixed-point representation are not supported"
            }
        })
    }
}

impl std::error::Error for ScalarError {}

/// Returns a raw request value printed as Mesos prints the `Value::Scalar` holding it: rounded
/// to three decimals, then `%.15g`, so `-0.0001` prints `0` and `1.2345` prints `1.235`. A value
/// whose milli-units do not fit an `i64`, infinities and NaNs print as their real value
/// (`1e+16`, `inf`, `nan`) instead of Mesos's overflowed `-9.22337203685478e+15` (QUOTA-2).
pub fn format_input(value: f64) -> String {
    match fixed_milli(value) {
        Some(milli) => format_g(milli_to_f64(milli), MESOS_PRINT_DIGITS),
        None => format_g(value, MESOS_PRINT_DIGITS),
    }
}

/// Returns `llround(value * 1000)`, or `None` where C's `llround` overflows (its result is
/// unspecified there) or `value` is NaN.
fn fixed_milli(value: f64) -> Option<i64> {
    // f64::round rounds half away from zero, like llround.
    let rounded = (value * SCALAR_MILLI_PER_UNIT as f64).round();
    // Every integral double in [-2^63, 2^63) converts to i64 exactly; NaN fails both tests.
    if (-TWO_POW_63_F64..TWO_POW_63_F64).contains(&rounded) {
        Some(rounded as i64)
    } else {
        None
    }
}

/// Mesos's `convertToFloating`: the quotient and remainder are converted separately so that
/// floating-point division only ever sees 0..=999.
fn milli_to_f64(milli: i64) -> f64 {
    let quotient = (milli / SCALAR_MILLI_PER_UNIT) as f64;
    let remainder = (milli % SCALAR_MILLI_PER_UNIT) as f64 / SCALAR_MILLI_PER_UNIT as f64;
    quotient + remainder
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(value: f64) -> Scalar {
        Scalar::from_f64(value).unwrap()
    }

    /// The examples table of spec §0: the value, and what Mesos prints for it.
    #[test]
    fn prints_the_spec_examples_table() {
        let cases: &[(f64, &str)] = &[
            (1.0, "1"),
            (0.5, "0.5"),
            (2048.0, "2048"),
            (1.2345, "1.235"),
            (1_000_000_000_001.0, "1000000000001"),
            (1e15, "1e+15"),
        ];
        for (value, printed) in cases {
            assert_eq!(scalar(*value).to_string(), *printed, "Scalar {value}");
            assert_eq!(format_input(*value), *printed, "raw {value}");
        }
    }

    #[test]
    fn two_pow_63_prints_its_real_value_not_the_overflow() {
        // Mesos prints -9.22337203685478e+15 here (spec §10 Q3); kvd prints the real value.
        assert_eq!(format_input(TWO_POW_63_F64), "9.22337203685478e+18");
        assert_eq!(Scalar::from_f64(TWO_POW_63_F64), Err(ScalarError::Overflow));
    }

    /// Raw request values as they appear in error messages (checked against g++ output of
    /// Mesos's `convertToFloating(convertToFixed(v))` at precision 15).
    #[test]
    fn raw_values_print_rounded_to_milli_units() {
        let cases: &[(f64, &str)] = &[
            (0.0004, "0"),
            (0.0005, "0.001"),
            (0.0015, "0.002"),
            (0.0025, "0.003"),
            (1e-5, "0"),
            (-0.0001, "0"),
            (-1.0, "-1"),
            (-1.5, "-1.5"),
            (0.1 + 0.2, "0.3"),
            (1234.5678, "1234.568"),
            (4.0005, "4"),
            (123_456_789_012.345_6, "123456789012.346"),
            (999_999_999_999.999, "999999999999.999"),
            (1_000_000_000_000.000_4, "1000000000000"),
            (1_099_511_627_777.0, "1099511627777"),
            (999_999_999_999_999.9, "1e+15"),
            (9_223_372_036_854_774.0, "9.22337203685477e+15"),
            (5e-324, "0"),
            (1e-310, "0"),
        ];
        for (value, printed) in cases {
            assert_eq!(format_input(*value), *printed, "raw {value:e}");
        }
    }

    #[test]
    fn raw_values_outside_fixed_point_print_their_real_value() {
        let cases: &[(f64, &str)] = &[
            (9_223_372_036_854_776.0, "9.22337203685478e+15"),
            (1e16, "1e+16"),
            (1e300, "1e+300"),
            (-1e300, "-1e+300"),
            (f64::INFINITY, "inf"),
            (f64::NEG_INFINITY, "-inf"),
            (f64::NAN, "nan"),
            (-f64::NAN, "-nan"),
        ];
        for (value, printed) in cases {
            assert_eq!(format_input(*value), *printed, "raw {value:e}");
        }
    }

    #[test]
    fn from_f64_rounds_like_llround() {
        let cases: &[(f64, i64)] = &[
            (0.0, 0),
            (-0.0, 0),
            (0.0004, 0),
            (0.0005, 1),
            (1.0004, 1000),
            (1.0005, 1001),
            (1.2345, 1235),
            (2.5, 2500),
            (1e12, 1_000_000_000_000_000),
            // The product is a double before it is rounded, as in C: not ...774_000.
            (9_223_372_036_854_774.0, 9_223_372_036_854_773_760),
        ];
        for (value, milli) in cases {
            assert_eq!(scalar(*value).milli(), *milli, "value {value}");
        }
    }

    #[test]
    fn from_f64_rejects_in_mesos_order() {
        let cases: &[(f64, ScalarError, &str)] = &[
            (
                f64::INFINITY,
                ScalarError::Infinite,
                "Infinite values not supported",
            ),
            (
                f64::NEG_INFINITY,
                ScalarError::Infinite,
                "Infinite values not supported",
            ),
            (f64::NAN, ScalarError::NaN, "NaN not supported"),
            (
                5e-324,
                ScalarError::Subnormal,
                "Subnormal values not supported",
            ),
            // fpclassify comes before the sign test: a negative subnormal is "subnormal".
            (
                -5e-324,
                ScalarError::Subnormal,
                "Subnormal values not supported",
            ),
            (-1.0, ScalarError::Negative, "Negative values not supported"),
            (
                -0.0001,
                ScalarError::Negative,
                "Negative values not supported",
            ),
            (
                1e16,
                ScalarError::Overflow,
                "Values too large for the fixed-point representation are not supported",
            ),
        ];
        for (value, error, message) in cases {
            assert_eq!(Scalar::from_f64(*value), Err(*error), "value {value:e}");
            assert_eq!(error.to_string(), *message);
        }
    }

    #[test]
    fn equality_is_fixed_point() {
        assert_eq!(scalar(1.0004), scalar(1.0));
        assert_eq!(scalar(0.0004), Scalar::ZERO);
        assert!(scalar(0.0004).is_zero());
        assert!(scalar(1.0005) > scalar(1.0));
        assert_eq!(scalar(0.1).saturating_add(scalar(0.2)), scalar(0.3));
    }

    #[test]
    fn arithmetic_saturates_and_floors() {
        assert_eq!(
            Scalar::MAX.saturating_add(Scalar::from_units(1)),
            Scalar::MAX
        );
        assert_eq!(
            Scalar::from_units(1).saturating_sub(Scalar::from_units(2)),
            Scalar::ZERO
        );
        assert_eq!(
            Scalar::from_units(3).saturating_sub(Scalar::from_units(1)),
            Scalar::from_units(2)
        );
        assert_eq!(Scalar::from_milli(-1), None);
        assert_eq!(
            Scalar::from_milli(1500).map(|s| s.to_string()),
            Some("1.5".to_string())
        );
        assert_eq!(Scalar::MAX.to_string(), "9.22337203685478e+15");
    }

    #[test]
    fn to_f64_splits_quotient_and_remainder() {
        assert_eq!(Scalar::from_units(2048).to_f64(), 2048.0);
        assert_eq!(scalar(1.235).to_f64(), 1.0 + 0.235);
        assert_eq!(
            scalar(999_999_999_999.999).to_f64(),
            999_999_999_999.0 + 0.999
        );
    }
}
