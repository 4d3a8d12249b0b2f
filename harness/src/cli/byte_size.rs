//! Byte counts on the command line: memcore's one parser, with the text
//! quoted in the error for clap.

use trace::quote;

/// Parse a byte count for clap (`memcore::bytes::parse`), the error naming
/// the text.
pub fn parse(text: &str) -> Result<u64, String> {
    memcore::bytes::parse(text).map_err(|error| format!("{} is {error}", quote(text)))
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
}
