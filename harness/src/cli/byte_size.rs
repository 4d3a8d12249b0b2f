//! Byte counts on the command line: memcore's one parser, with the text
//! quoted in the error for clap.

use crate::trace::quote;

/// Parse a byte count for clap (`memcore::bytes::parse`), the error naming
/// the text.
pub fn parse(text: &str) -> Result<u64, String> {
    memcore::bytes::parse(text).map_err(|error| format!("{} is {error}", quote(text)))
}

/// `bytes` exactly, in the largest binary unit that divides it (`32MiB`,
/// `1536KiB`, `100`), as [`parse`] reads it back: for defaults in `--help`.
pub fn exact(bytes: u64) -> String {
    const UNITS: [(&str, u32); 5] = [
        ("PiB", 50),
        ("TiB", 40),
        ("GiB", 30),
        ("MiB", 20),
        ("KiB", 10),
    ];
    UNITS
        .iter()
        .find(|&&(_, shift)| bytes != 0 && bytes.trailing_zeros() >= shift)
        .map_or_else(
            || bytes.to_string(),
            |&(unit, shift)| format!("{}{unit}", bytes >> shift),
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_quote_the_text_cut() {
        assert_eq!(parse("16KiB"), Ok(16 << 10));
        assert!(parse("-4").unwrap_err().contains("negative"));
        let huge = format!("{}x", "1".repeat(10_000));
        assert!(parse(&huge).unwrap_err().len() < 250);
    }

    #[test]
    fn exact_counts_read_back() {
        for (bytes, text) in [
            (0, "0"),
            (100, "100"),
            (32 << 20, "32MiB"),
            (1536 << 10, "1536KiB"),
            (1 << 40, "1TiB"),
        ] {
            assert_eq!(exact(bytes), text);
            assert_eq!(parse(text), Ok(bytes));
        }
    }
}
