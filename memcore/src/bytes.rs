//! Byte counts as people write and read them: the one parser and the one
//! formatter of the workspace, so `16KB` means the same on every command line
//! and in every environment variable.
//!
//! Binary units (`KiB`, `MiB`, `GiB`, `TiB`, `PiB`, and the bare letters
//! `K`, `M`, `G`, `T`, `P`) are powers of 1024; decimal units (`kB`/`KB`,
//! `MB`, `GB`, `TB`, `PB`) are powers of 1000, as coreutils reads them.
//!
//! ```
//! use memcore::bytes;
//! assert_eq!(bytes::parse("16KiB"), Ok(16 << 10));
//! assert_eq!(bytes::parse("2M"), Ok(2 << 20));
//! assert_eq!(bytes::parse("8MB"), Ok(8_000_000));
//! assert_eq!(bytes::parse("1.5 GiB"), Ok(3 << 29));
//! assert_eq!(bytes::human(5_830_299_792), "5.43 GiB");
//! assert!(bytes::parse("12 parsecs").is_err());
//! ```

use alloc::format;
use alloc::string::String;

/// Bytes in a KiB.
pub const KIB: u64 = 1 << 10;
/// Bytes in a MiB.
pub const MIB: u64 = 1 << 20;
/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;

/// Why a text is not a byte count. The text itself is the caller's to show
/// (quoted as it sees fit): the error names only what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not a number with an optional unit (`4096`, `16KiB`, `1.5GiB`).
    #[error("not a byte count (e.g. 4096, 16KiB, 1.5GiB)")]
    NotACount,
    /// A leading minus sign.
    #[error("negative; a byte count is at least 0")]
    Negative,
    /// A unit this parser does not know.
    #[error("unknown unit (use B, KiB, MiB, GiB, TiB, PiB, K, M, G, T, P, kB, MB, GB, TB, PB)")]
    UnknownUnit,
    /// More than 2^64 - 1 bytes.
    #[error("overflows a 64-bit byte count (at most 18446744073709551615 bytes)")]
    Overflow,
    /// A fraction that leaves part of a byte.
    #[error("not a whole number of bytes")]
    Fractional,
    /// More digits after the point than the parser keeps exact.
    #[error("too many digits after the point")]
    TooPrecise,
}

/// Parse a byte count: a number with an optional unit (see the module doc).
/// `B` alone is bytes; `_` may group digits; fractions are allowed when the
/// result is a whole number of bytes, with a digit on both sides of the point.
pub fn parse(text: &str) -> Result<u64, ParseError> {
    let trimmed = text.trim();
    if trimmed.starts_with('-') {
        return Err(ParseError::Negative);
    }
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale = unit_scale(unit.trim()).ok_or(ParseError::UnknownUnit)?;
    let number: String = number.chars().filter(|&c| c != '_').collect();
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (number.as_str(), None),
    };
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || fraction.is_some_and(|fraction| !digits(fraction)) {
        return Err(ParseError::NotACount);
    }
    let whole: u64 = whole.parse().map_err(|_| ParseError::Overflow)?;
    let mut bytes = whole.checked_mul(scale).ok_or(ParseError::Overflow)?;
    if let Some(fraction) = fraction {
        if fraction.len() > 18 {
            return Err(ParseError::TooPrecise);
        }
        let digits: u64 = fraction.parse().map_err(|_| ParseError::NotACount)?;
        let denominator = 10u128.pow(fraction.len() as u32);
        let scaled = u128::from(digits) * u128::from(scale);
        if scaled % denominator != 0 {
            return Err(ParseError::Fractional);
        }
        let part = u64::try_from(scaled / denominator).map_err(|_| ParseError::Overflow)?;
        bytes = bytes.checked_add(part).ok_or(ParseError::Overflow)?;
    }
    Ok(bytes)
}

/// What one unit is worth in bytes; `None` for an unknown unit.
fn unit_scale(unit: &str) -> Option<u64> {
    Some(match unit {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "kiB" | "Ki" => 1 << 10,
        "M" | "MiB" | "Mi" => 1 << 20,
        "G" | "GiB" | "Gi" => 1 << 30,
        "T" | "TiB" | "Ti" => 1 << 40,
        "P" | "PiB" | "Pi" => 1 << 50,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "PB" => 1_000_000_000_000_000,
        _ => return None,
    })
}

/// Whether `word` is a byte unit (`MiB`, `GB`, `B`; trailing punctuation
/// aside, and not the bare letters `K`, `M`, ... that prose uses for other
/// things): a word a wrapped line keeps beside its number.
///
/// ```
/// use memcore::bytes::is_unit;
/// assert!(is_unit("MiB") && is_unit("GiB),") && is_unit("B"));
/// assert!(!is_unit("M") && !is_unit("less") && !is_unit("%"));
/// ```
pub fn is_unit(word: &str) -> bool {
    let word = word.trim_end_matches(|c: char| !c.is_ascii_alphabetic());
    (word.len() > 1 || word == "B") && unit_scale(word).is_some()
}

/// A byte count for people, in binary units with three significant digits:
/// `812 B`, `37.5 KiB`, `5.43 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else if value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else if value >= 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

/// A byte count for people with the exact count beside it, where the
/// exact figure matters (a kernel's frame, as ptxas prints it):
/// `16.0 KiB (16384 B)`; below 1 KiB [`human`] is exact already: `512 B`.
///
/// ```
/// use memcore::bytes::exact;
/// assert_eq!(exact(16 << 10), "16.0 KiB (16384 B)");
/// assert_eq!(exact(512), "512 B");
/// ```
pub fn exact(bytes: u64) -> String {
    if bytes < KIB {
        human(bytes)
    } else {
        format!("{} ({bytes} B)", human(bytes))
    }
}

/// A byte count in MiB with one decimal (`1234.5 MiB`), for tables whose
/// rows are compared with each other.
pub fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB as f64)
}

/// A signed difference of byte counts: its size written by `unsigned`
/// ([`human`], [`mib`]) after `-` when it is negative, and after `+` when
/// it is not and `plus` asks for the sign (`-2.00 MiB`, `+3.0 MiB`).
pub fn signed(bytes: i128, plus: bool, unsigned: impl FnOnce(u64) -> String) -> String {
    let size = u64::try_from(bytes.unsigned_abs()).unwrap_or(u64::MAX);
    let sign = match (bytes < 0, plus) {
        (true, _) => "-",
        (false, true) => "+",
        (false, false) => "",
    };
    format!("{sign}{}", unsigned(size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_rejects_the_rest() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("16KiB"), Ok(16 << 10));
        assert_eq!(parse("16K"), Ok(16 << 10));
        assert_eq!(parse("16KB"), Ok(16_000));
        assert_eq!(parse("2MiB"), Ok(2 << 20));
        assert_eq!(parse("64M"), Ok(64 << 20));
        assert_eq!(parse("1GiB"), Ok(1 << 30));
        assert_eq!(parse("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse("8MB"), Ok(8_000_000));
        assert_eq!(parse("1_000"), Ok(1000));
        assert_eq!(parse("0.5KiB"), Ok(512));
        assert_eq!(parse("2PiB"), Ok(2 << 50));
        assert_eq!(parse("1.3B"), Err(ParseError::Fractional));
        assert_eq!(parse("12 parsecs"), Err(ParseError::UnknownUnit));
        assert_eq!(parse(""), Err(ParseError::NotACount));
        assert_eq!(parse("-4"), Err(ParseError::Negative));
        assert_eq!(parse("-1KiB"), Err(ParseError::Negative));
        assert_eq!(parse("99999999999TiB"), Err(ParseError::Overflow));
    }

    #[test]
    fn malformed_counts_are_errors_not_zero() {
        for text in [
            ".KiB", ".", "KiB", "", "  ", "_", "1.2.3MiB", "1.", ".5", "1..2", "0x10",
        ] {
            assert!(parse(text).is_err(), "{text:?} parsed as {:?}", parse(text));
        }
        assert_eq!(parse("20000000PiB"), Err(ParseError::Overflow));
        assert_eq!(parse("18446744073709551616"), Err(ParseError::Overflow));
        assert_eq!(parse("16384PiB"), Err(ParseError::Overflow));
        assert_eq!(parse("16383PiB"), Ok(16383 << 50));
        assert_eq!(
            parse("1.0000000000000000001KiB"),
            Err(ParseError::TooPrecise)
        );
    }

    #[test]
    fn prints_for_people() {
        assert_eq!(human(812), "812 B");
        assert_eq!(human(38_400), "37.5 KiB");
        assert_eq!(human(5_830_299_792), "5.43 GiB");
        assert_eq!(human(u64::MAX), "16384 PiB");
        assert_eq!(mib(3 << 19), "1.5 MiB");
    }

    #[test]
    fn a_signed_difference_keeps_its_sign_and_saturates() {
        assert_eq!(signed(-(2 << 20), false, human), "-2.00 MiB");
        assert_eq!(signed(3 << 20, false, human), human(3 << 20));
        assert_eq!(signed(3 << 20, true, mib), "+3.0 MiB");
        assert_eq!(signed(0, true, mib), "+0.0 MiB");
        assert_eq!(
            signed(i128::MIN, false, exact),
            format!("-{}", exact(u64::MAX))
        );
    }
}
