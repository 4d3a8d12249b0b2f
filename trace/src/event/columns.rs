//! How each field is written and read: one codec per text form (decimal,
//! signed, hexadecimal, decimal or `-`, escaped text, a word, a window of
//! three columns). The record table names a codec for every field, so a
//! field's text form is said once, where the field is declared.

use std::borrow::Cow;

use super::line::Line;
use super::words::Word;
use super::{LimitKind, Window};

/// A field that does not parse: which of the codec's columns, and what it
/// should be.
#[derive(Debug)]
pub(super) struct Bad {
    /// 0-based column within the codec's columns.
    pub offset: usize,
    /// What the column should be.
    pub what: &'static str,
}

impl Bad {
    fn at(offset: usize, what: &'static str) -> Bad {
        Bad { offset, what }
    }
}

/// How many tab-separated columns a codec writes.
pub(super) trait Columns {
    /// Columns per field.
    const COLUMNS: usize = 1;
}

/// Writes and reads a field of type `T`.
pub(super) trait Codec<'a, T>: Columns {
    /// Write `value` (its columns separated by tabs, no leading tab).
    fn put(value: &T, line: &mut Line);
    /// Read the field back from exactly [`Columns::COLUMNS`] columns.
    fn take(columns: &[&'a str]) -> Result<T, Bad>;
}

/// An unsigned decimal number.
pub(super) struct Dec;
/// A signed decimal number.
pub(super) struct Signed;
/// `0x` and hexadecimal digits (pointers, handles, streams).
pub(super) struct Hex;
/// An unsigned decimal number, or `-` for one the interposer could not read.
pub(super) struct Maybe;
/// A string with `\`, tab and line end escaped, cut to `MAX_NAME_BYTES`.
pub(super) struct Text;
/// A word of a closed set ([`Word`]).
pub(super) struct Named;
/// Free memory before and after a call and the live bytes' change: three
/// columns, `Maybe Maybe Signed`.
pub(super) struct Span;

impl Columns for Dec {}
impl Columns for Signed {}
impl Columns for Hex {}
impl Columns for Maybe {}
impl Columns for Text {}
impl Columns for Named {}
impl Columns for Span {
    const COLUMNS: usize = 3;
}

fn one<'a>(columns: &[&'a str]) -> &'a str {
    columns.first().copied().unwrap_or("")
}

impl Codec<'_, u64> for Dec {
    fn put(value: &u64, line: &mut Line) {
        line.dec(*value);
    }
    fn take(columns: &[&str]) -> Result<u64, Bad> {
        one(columns)
            .parse()
            .map_err(|_| Bad::at(0, "a decimal number"))
    }
}

impl Codec<'_, u32> for Dec {
    fn put(value: &u32, line: &mut Line) {
        line.dec(u64::from(*value));
    }
    fn take(columns: &[&str]) -> Result<u32, Bad> {
        one(columns)
            .parse()
            .map_err(|_| Bad::at(0, "a 32-bit decimal number"))
    }
}

/// A limit is written as its `CUlimit` number.
impl Codec<'_, LimitKind> for Dec {
    fn put(value: &LimitKind, line: &mut Line) {
        line.dec(u64::from(value.to_cu()));
    }
    fn take(columns: &[&str]) -> Result<LimitKind, Bad> {
        <Dec as Codec<u32>>::take(columns).map(LimitKind::from_cu)
    }
}

impl Codec<'_, i32> for Signed {
    fn put(value: &i32, line: &mut Line) {
        line.signed(i64::from(*value));
    }
    fn take(columns: &[&str]) -> Result<i32, Bad> {
        one(columns)
            .parse()
            .map_err(|_| Bad::at(0, "a 32-bit signed number"))
    }
}

impl Codec<'_, i64> for Signed {
    fn put(value: &i64, line: &mut Line) {
        line.signed(*value);
    }
    fn take(columns: &[&str]) -> Result<i64, Bad> {
        one(columns)
            .parse()
            .map_err(|_| Bad::at(0, "a signed decimal number"))
    }
}

impl Codec<'_, u64> for Hex {
    fn put(value: &u64, line: &mut Line) {
        line.hex(*value);
    }
    fn take(columns: &[&str]) -> Result<u64, Bad> {
        one(columns)
            .strip_prefix("0x")
            .and_then(|digits| u64::from_str_radix(digits, 16).ok())
            .ok_or(Bad::at(0, "a 0x hexadecimal number"))
    }
}

impl Codec<'_, Option<u64>> for Maybe {
    fn put(value: &Option<u64>, line: &mut Line) {
        line.maybe(*value);
    }
    fn take(columns: &[&str]) -> Result<Option<u64>, Bad> {
        match one(columns) {
            "-" => Ok(None),
            _ => <Dec as Codec<u64>>::take(columns).map(Some),
        }
    }
}

impl<'a> Codec<'a, Cow<'a, str>> for Text {
    fn put(value: &Cow<'a, str>, line: &mut Line) {
        line.text(value);
    }
    fn take(columns: &[&'a str]) -> Result<Cow<'a, str>, Bad> {
        Ok(unescape(one(columns)))
    }
}

impl<T: Word> Codec<'_, T> for Named {
    fn put(value: &T, line: &mut Line) {
        line.word(value.word());
    }
    fn take(columns: &[&str]) -> Result<T, Bad> {
        T::from_word(one(columns)).ok_or(Bad::at(0, T::WHAT))
    }
}

impl Codec<'_, Window> for Span {
    fn put(value: &Window, line: &mut Line) {
        line.maybe(value.free_before);
        line.tab();
        line.maybe(value.free_after);
        line.tab();
        line.signed(value.live_change);
    }
    fn take(columns: &[&str]) -> Result<Window, Bad> {
        let column = |offset: usize| columns.get(offset..=offset).unwrap_or(&[]);
        let shift = |offset: usize| move |bad: Bad| Bad::at(offset, bad.what);
        Ok(Window {
            free_before: Maybe::take(column(0)).map_err(shift(0))?,
            free_after: Maybe::take(column(1)).map_err(shift(1))?,
            live_change: Signed::take(column(2)).map_err(shift(2))?,
        })
    }
}

/// `text` with the log's escapes (`\\`, `\t`, `\n`) undone; a `\` before
/// any other character stands for that character.
fn unescape(text: &str) -> Cow<'_, str> {
    if !text.contains('\\') {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

/// The values of a field a codec writes and reads back unchanged, for the
/// round-trip property.
#[cfg(test)]
pub(super) trait Sample<T> {
    fn arbitrary() -> proptest::strategy::BoxedStrategy<T>;
}

#[cfg(test)]
mod arbitrary {
    use proptest::prelude::*;
    use proptest::strategy::BoxedStrategy;

    use super::*;
    use crate::event::MAX_NAME_BYTES;

    macro_rules! any_of {
        ($($codec:ident: $ty:ty => $strategy:expr;)*) => {
            $(impl Sample<$ty> for $codec {
                fn arbitrary() -> BoxedStrategy<$ty> {
                    $strategy.boxed()
                }
            })*
        };
    }

    any_of! {
        Dec: u64 => any::<u64>();
        Dec: u32 => any::<u32>();
        Dec: LimitKind => any::<u32>().prop_map(LimitKind::from_cu);
        Signed: i32 => any::<i32>();
        Signed: i64 => any::<i64>();
        Hex: u64 => any::<u64>();
        Maybe: Option<u64> => any::<Option<u64>>();
        Span: Window => (any::<Option<u64>>(), any::<Option<u64>>(), any::<i64>())
            .prop_map(|(free_before, free_after, live_change)| Window {
                free_before,
                free_after,
                live_change,
            });
    }

    /// Strings up to the longest kept, with the escaped bytes often.
    impl Sample<Cow<'static, str>> for Text {
        fn arbitrary() -> BoxedStrategy<Cow<'static, str>> {
            prop_oneof![
                "[a-z\\\\\t\n_/.]{0,40}",
                "\\PC{0,40}",
                "[\\\\\t\né]{0,1500}",
            ]
            .prop_map(|text: String| {
                Cow::Owned(crate::event::line::cut(&text, MAX_NAME_BYTES).to_owned())
            })
            .boxed()
        }
    }

    impl<T: Word + std::fmt::Debug> Sample<T> for Named {
        fn arbitrary() -> BoxedStrategy<T> {
            proptest::sample::select(T::ALL).boxed()
        }
    }
}
