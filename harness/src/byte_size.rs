//! Byte counts on the command line and in tables: `4096`, `16KiB`, `2MiB`,
//! `1.5GiB`, `8MB` in, `1.50 GiB` out.

/// Parse a byte count: a number with an optional unit. Binary units (KiB,
/// MiB, GiB, TiB, and K/M/G/T) are powers of 1024; decimal ones (kB, MB, GB,
/// TB) powers of 1000. `B` alone is bytes. Fractions are allowed when the
/// result is a whole number of bytes.
pub fn parse(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
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
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
            ));
        }
    };
    if number.is_empty() {
        return Err(format!("{text:?} is not a byte count"));
    }
    let (whole, fraction) = number.split_once('.').unwrap_or((&number, ""));
    let overflow = || format!("{text:?} overflows 64 bits");
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole
            .parse()
            .map_err(|_| format!("{text:?} is not a byte count"))?
    };
    let mut bytes = whole.checked_mul(scale).ok_or_else(overflow)?;
    if !fraction.is_empty() {
        if fraction.contains('.') || fraction.len() > 12 {
            return Err(format!("{text:?} is not a byte count"));
        }
        let digits: u64 = fraction
            .parse()
            .map_err(|_| format!("{text:?} is not a byte count"))?;
        let denominator = 10u64.pow(fraction.len() as u32);
        let scaled = u128::from(digits) * u128::from(scale);
        if scaled % u128::from(denominator) != 0 {
            return Err(format!("{text:?} is not a whole number of bytes"));
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
    }

    #[test]
    fn prints_for_people() {
        assert_eq!(human(812), "812 B");
        assert_eq!(human(38_400), "37.5 KiB");
        assert_eq!(human(5_830_299_792), "5.43 GiB");
    }
}
