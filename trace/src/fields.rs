//! The fields of a CSV trace record: byte counts, times and pointers, each
//! parsed or refused with the [`Problem`] that says why.

use crate::Problem;

/// Parse a byte count field: a non-negative decimal integer.
pub fn parse_size(text: &str) -> Result<u64, Problem> {
    let trimmed = text.trim();
    let bad = |why| Problem::BadSize {
        text: trimmed.to_string(),
        why,
    };
    if trimmed.starts_with('-')
        && trimmed[1..].bytes().all(|b| b.is_ascii_digit())
        && trimmed.len() > 1
    {
        return Err(bad("is negative"));
    }
    if trimmed.is_empty() || !trimmed.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad("is not a number"));
    }
    trimmed
        .parse::<u64>()
        .map_err(|_| bad("overflows a 64-bit byte count"))
}

/// Parse a time field `[[HH:]MM:]SS[.fraction]` into nanoseconds.
pub fn parse_time(text: &str) -> Result<u64, Problem> {
    let trimmed = text.trim();
    let bad = || {
        Problem::Malformed(format!(
            "time {:?} is not [[HH:]MM:]SS[.fraction]",
            cut(trimmed)
        ))
    };
    let (whole, fraction) = trimmed.split_once('.').unwrap_or((trimmed, ""));
    if fraction.len() > 9 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let parts: Vec<&str> = whole.split(':').collect();
    if parts.len() > 3 {
        return Err(bad());
    }
    let mut seconds = 0u64;
    for part in parts {
        if part.is_empty() || part.len() > 12 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        seconds = seconds * 60 + part.parse::<u64>().map_err(|_| bad())?;
    }
    let nanos = format!("{fraction:0<9}")
        .parse::<u64>()
        .map_err(|_| bad())?;
    seconds
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(nanos))
        .ok_or_else(bad)
}

/// `text` cut to 80 characters for an error message.
fn cut(text: &str) -> String {
    text.chars().take(80).collect()
}

/// Parse a pointer field: hexadecimal, with or without `0x`.
pub fn parse_pointer(text: &str) -> Result<u64, Problem> {
    let trimmed = text.trim();
    let digits = trimmed
        .strip_prefix("0x")
        .or_else(|| trimmed.strip_prefix("0X"))
        .unwrap_or(trimmed);
    // from_str_radix takes a sign; an address has none.
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Problem::BadPointer(trimmed.to_string()));
    }
    u64::from_str_radix(digits, 16).map_err(|_| Problem::BadPointer(trimmed.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_or_say_why_not() {
        assert_eq!(parse_size(" 4096 "), Ok(4096));
        let why = |text| match parse_size(text) {
            Err(Problem::BadSize { why, .. }) => why,
            other => panic!("{other:?}"),
        };
        assert_eq!(why("-5"), "is negative");
        assert_eq!(why("12ab"), "is not a number");
        assert_eq!(why(""), "is not a number");
        assert_eq!(
            why("99999999999999999999999"),
            "overflows a 64-bit byte count"
        );
    }

    #[test]
    fn times_parse_or_say_why_not() {
        assert_eq!(parse_time("00:00:58.617548"), Ok(58_617_548_000));
        assert_eq!(parse_time("1:02:03.5"), Ok(3_723_500_000_000));
        assert_eq!(parse_time("7"), Ok(7_000_000_000));
        for bad in ["", "1:2:3:4", "00:00:0x.1", "1.2.3", "-1", "1.1234567890"] {
            assert!(
                matches!(parse_time(bad), Err(Problem::Malformed(_))),
                "{bad:?}"
            );
        }
    }
}
