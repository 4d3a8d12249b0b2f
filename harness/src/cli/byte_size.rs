//! Byte counts on the command line and in tables: `4096`, `16KiB`, `2MiB`,
//! `1.5GiB`, `8MB` in, `1.50 GiB` out.

use crate::trace::quote;

/// Parse a byte count: a number with an optional unit. Binary units (KiB,
/// MiB, GiB, TiB, PiB, and K/M/G/T/P) are powers of 1024; decimal ones (kB,
/// MB, GB, TB, PB) powers of 1000. `B` alone is bytes. Fractions are allowed
/// when the result is a whole number of bytes; a number needs a digit on
/// both sides of its point.
pub fn parse(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let shown = quote(text);
    let not_a_count = || format!("{shown} is not a byte count (e.g. 4096, 16KiB, 1.5GiB)");
    if trimmed.starts_with('-') {
        return Err(format!("{shown} is negative; a byte count is at least 0"));
    }
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let number = number.replace('_', "");
    let scale: u64 = match unit.trim() {
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
        other => {
            return Err(format!(
                "{shown}: unknown unit {} (use B, KiB, MiB, GiB, TiB, PiB, kB, MB, GB, TB, PB)",
                quote(other)
            ));
        }
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (number.as_str(), None),
    };
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || fraction.is_some_and(|fraction| !digits(fraction)) {
        return Err(not_a_count());
    }
    let overflow = || {
        format!(
            "{shown} overflows a 64-bit byte count (at most {} bytes)",
            u64::MAX
        )
    };
    let whole: u64 = whole.parse().map_err(|_| overflow())?;
    let mut bytes = whole.checked_mul(scale).ok_or_else(overflow)?;
    if let Some(fraction) = fraction {
        if fraction.len() > 18 {
            return Err(format!("{shown}: too many digits after the point"));
        }
        let digits: u64 = fraction.parse().map_err(|_| not_a_count())?;
        let denominator = 10u64.pow(fraction.len() as u32);
        let scaled = u128::from(digits) * u128::from(scale);
        if scaled % u128::from(denominator) != 0 {
            return Err(format!("{shown} is not a whole number of bytes"));
        }
        let part = u64::try_from(scaled / u128::from(denominator)).map_err(|_| overflow())?;
        bytes = bytes.checked_add(part).ok_or_else(overflow)?;
    }
    Ok(bytes)
}

/// A byte count for people: `812 B`, `37.5 KiB`, `5.43 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units_and_rejects_the_rest() {
        assert_eq!(parse("4096"), Ok(4096));
        assert_eq!(parse("16KiB"), Ok(16 << 10));
        assert_eq!(parse("2MiB"), Ok(2 << 20));
        assert_eq!(parse("1GiB"), Ok(1 << 30));
        assert_eq!(parse("1.5 GiB"), Ok(3 << 29));
        assert_eq!(parse("8MB"), Ok(8_000_000));
        assert_eq!(parse("1_000"), Ok(1000));
        assert!(parse("1.3B").is_err());
        assert!(parse("12 parsecs").is_err());
        assert!(parse("").is_err());
        assert!(parse("-4").is_err());
        assert!(parse("99999999999TiB").is_err());
        assert_eq!(parse("0.5KiB"), Ok(512));
        assert_eq!(parse("2PiB"), Ok(2 << 50));
    }

    #[test]
    fn malformed_counts_are_errors_not_zero() {
        let error = |text: &str| parse(text).unwrap_err();
        for text in [
            ".KiB", ".", "KiB", "", "  ", "_", "1.2.3MiB", "1.", ".5", "1..2", "0x10",
        ] {
            assert!(parse(text).is_err(), "{text:?} parsed as {:?}", parse(text));
        }
        assert!(error("-4").contains("negative"), "{}", error("-4"));
        assert!(error("-1KiB").contains("negative"));
        assert!(
            error("20000000PiB").contains("overflows"),
            "{}",
            error("20000000PiB")
        );
        assert!(error("18446744073709551616").contains("overflows"));
        assert!(error("16384PiB").contains("overflows"));
        assert_eq!(parse("16383PiB"), Ok(16383 << 50));
        // A huge argument is quoted cut.
        let huge = format!("{}x", "1".repeat(10_000));
        assert!(error(&huge).len() < 250, "{}", error(&huge));
    }

    #[test]
    fn prints_for_people() {
        assert_eq!(human(812), "812 B");
        assert_eq!(human(38_400), "37.5 KiB");
        assert_eq!(human(5_830_299_792), "5.43 GiB");
    }
}
