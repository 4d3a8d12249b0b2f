//! The macro that turns the record table (in [`super`]) into the [`Event`]
//! enum, its kinds' words and column counts, the encoder and the parser:
//! a record kind is declared once.
//!
//! [`Event`]: super::Event

use super::columns::{Bad, Codec, Columns};
use super::line::Line;

/// Write one field with codec `C`.
pub(super) fn put<'a, C: Codec<'a, T>, T>(value: &T, line: &mut Line) {
    line.tab();
    C::put(value, line);
}

/// Read one field with codec `C` from `parts` at `*at`, moving `*at` past
/// its columns; a bad field is the index of its bad column and what it
/// should be.
pub(super) fn take<'a, C: Codec<'a, T>, T>(
    parts: &[&'a str],
    at: &mut usize,
) -> Result<T, (usize, &'static str)> {
    let start = *at;
    *at += C::COLUMNS;
    let columns = parts.get(start..*at).unwrap_or(&[]);
    C::take(columns).map_err(|Bad { offset, what }| (start + offset, what))
}

/// Any value a field of codec `C` may hold and read back as written.
#[cfg(test)]
pub(super) fn arbitrary<C: super::columns::Sample<T>, T>() -> proptest::strategy::BoxedStrategy<T> {
    C::arbitrary()
}

/// Columns of a codec, for the kinds' column counts.
pub(super) const fn columns<C: Columns>() -> usize {
    C::COLUMNS
}

/// `records! { /// doc  Variant = "kind" ("what it records") { field: Type = Codec, ... } ... }`:
/// the [`Event`](super::Event) enum (each variant documented by its
/// description, the module's table of kinds on the enum), `Event::kind`,
/// `KINDS` (each kind's word and column count, the kind, time and thread
/// included), `Line::encode` and `parse_event`. Fields are written in the
/// order declared, each after a tab, with its codec (see
/// [`super::columns`]).
macro_rules! records {
    (
        $(
            $variant:ident = $kind:literal ($what:literal) {
                $( $(#[$field_meta:meta])* $field:ident : $ty:ty = $codec:ident ),* $(,)?
            }
        )*
    ) => {
        /// One record of the log: its kinds, as written (after the kind,
        /// the time and the thread, each field is one tab-separated column;
        /// a `window` is three: `free_before free_after live_change`):
        ///
        /// | kind | fields | what |
        /// | --- | --- | --- |
        $(
            #[doc = concat!("| `", $kind, "` | ", $(stringify!($field), " ",)* "| ", $what, " |")]
        )*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum Event<'a> {
            $(
                #[doc = concat!("`", $kind, "`: ", $what, ".")]
                #[allow(missing_docs)]
                $variant {
                    $( $(#[$field_meta])* $field: $ty, )*
                },
            )*
        }

        impl Event<'_> {
            /// The record's kind, as the log writes it.
            pub const fn kind(&self) -> &'static str {
                match self {
                    $( Event::$variant { .. } => $kind, )*
                }
            }
        }

        /// Every kind and its columns, the kind, time and thread included.
        pub(super) const KINDS: &[(&str, usize)] = &[
            $( ($kind, 3 $(+ $crate::event::records::columns::<$crate::event::columns::$codec>())*), )*
        ];

        impl Line {
            /// Write `record` as one finished line (line end included),
            /// replacing what the line held.
            pub fn encode(&mut self, record: &Record<'_>) {
                self.clear();
                self.word(record.event.kind());
                self.tab();
                self.dec(record.time_ns);
                self.tab();
                self.dec(u64::from(record.thread));
                match &record.event {
                    $(
                        Event::$variant { $($field),* } => {
                            $( $crate::event::records::put::<$crate::event::columns::$codec, _>($field, self); )*
                        }
                    )*
                }
                self.finish();
            }
        }

        /// The event of kind `kind` from a line's `parts` (whose count was
        /// checked): a bad field is the index of its bad column and what it
        /// should be.
        #[allow(unused_assignments)]
        fn parse_event<'a>(kind: &str, parts: &[&'a str]) -> Result<Event<'a>, (usize, &'static str)> {
            let mut at = 3;
            match kind {
                $(
                    $kind => Ok(Event::$variant {
                        $( $field: $crate::event::records::take::<$crate::event::columns::$codec, _>(parts, &mut at)?, )*
                    }),
                )*
                _ => Err((0, "a record kind")),
            }
        }

        /// Any event, every kind with arbitrary field values (for the
        /// round-trip property).
        #[cfg(test)]
        pub(super) fn any_event() -> proptest::strategy::BoxedStrategy<Event<'static>> {
            use proptest::strategy::Strategy;
            proptest::prop_oneof![
                $(
                    ( $( $crate::event::records::arbitrary::<$crate::event::columns::$codec, _>(), )* )
                        .prop_map(|( $($field,)* )| Event::$variant { $($field),* }),
                )*
            ]
            .boxed()
        }
    };
}
pub(super) use records;
