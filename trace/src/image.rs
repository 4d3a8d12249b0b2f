//! What a module image tells before the driver loads it: its format (PTX
//! text, a cubin ELF, a fatbin holding either) and whether its code calls
//! the device's `malloc` (the driver then takes the whole malloc heap at
//! the first launch of one of its kernels) or `printf` (`vprintf`).
//!
//! The interposer finds how many bytes an image at a pointer spans with
//! [`extent`] (from the ELF or fatbin header; text ends at its NUL) and
//! reads them with [`scan`]. Everything here is safe code over a byte
//! slice: a malformed image is an answer of [`Answer::Unknown`] with a
//! note saying what could not be read, never a panic.
//!
//! ```
//! use trace::image::{Answer, ImageFormat, scan};
//!
//! let ptx = b".version 8.0\n.target sm_90\n.extern .func (.param .b64 func_retval0) malloc\n(\n.param .b64 malloc_param_0\n);\n";
//! let facts = scan(ptx);
//! assert_eq!(facts.format, ImageFormat::Ptx);
//! assert_eq!(facts.calls_malloc, Answer::Yes);
//! assert_eq!(facts.calls_printf, Answer::No);
//! ```

use crate::event::words::words;

/// The magic number of a fatbin (`0xBA55ED50`, little-endian).
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// The magic number of the runtime's fatbin wrapper (`__fatBinC_Wrapper_t`),
/// which points at the fatbin.
pub const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// The longest image read, bytes: a longer one is answered unknown.
pub const MAX_IMAGE_BYTES: u64 = 1 << 30;

const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
const FATBIN_KIND_PTX: u16 = 1;
const FATBIN_KIND_ELF: u16 = 2;
const FATBIN_FLAG_COMPRESSED: u64 = 0x2000;
const SHT_SYMTAB: u32 = 2;
const SHT_DYNSYM: u32 = 11;

words! {
    /// What a module image is.
    pub enum ImageFormat ("ptx, elf, fatbin or unknown") {
        /// PTX text (the driver compiles it at load).
        Ptx = "ptx",
        /// A cubin: an ELF of device code.
        Elf = "elf",
        /// A fatbin holding PTX and cubins for several architectures.
        Fatbin = "fatbin",
        /// Not read: a file that could not be opened, text that is no PTX,
        /// or bytes of no known format.
        Unknown = "unknown",
    }
}

words! {
    /// Whether an image's code calls a function.
    pub enum Answer ("yes, no or unknown") {
        /// It does.
        Yes = "yes",
        /// It does not (everything in the image was read).
        No = "no",
        /// Not everything could be read, and what was read does not.
        Unknown = "unknown",
    }
}

impl Answer {
    /// The answer for a whole made of parts answering `self` and `other`.
    pub fn and(self, other: Answer) -> Answer {
        match (self, other) {
            (Answer::Yes, _) | (_, Answer::Yes) => Answer::Yes,
            (Answer::Unknown, _) | (_, Answer::Unknown) => Answer::Unknown,
            _ => Answer::No,
        }
    }
}

/// What an image tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFacts {
    /// Its format.
    pub format: ImageFormat,
    /// Whether its code calls the device's `malloc`.
    pub calls_malloc: Answer,
    /// Whether its code calls the device's `printf` (`vprintf`).
    pub calls_printf: Answer,
    /// What could not be read, for people (empty when all was read).
    pub note: String,
}

impl ImageFacts {
    /// An image nothing could be read of, and why.
    pub fn unknown(note: impl Into<String>) -> ImageFacts {
        ImageFacts {
            format: ImageFormat::Unknown,
            calls_malloc: Answer::Unknown,
            calls_printf: Answer::Unknown,
            note: note.into(),
        }
    }
}

/// How far an image at a pointer reaches, from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extent {
    /// This many bytes from the start (an ELF or a fatbin).
    Bytes(u64),
    /// The runtime's wrapper: the fatbin is at this address.
    Wrapper(u64),
    /// Text: up to its NUL.
    Text,
}

/// The bytes [`extent`] needs to see at the start of an image.
pub const HEAD_BYTES: usize = 64;

/// How far the image whose first bytes are `head` (up to [`HEAD_BYTES`])
/// reaches.
pub fn extent(head: &[u8]) -> Extent {
    if head.starts_with(ELF_MAGIC) {
        let shoff = u64_at(head, 0x28).unwrap_or(0);
        let entry = u64::from(u16_at(head, 0x3A).unwrap_or(0));
        let count = u64::from(u16_at(head, 0x3C).unwrap_or(0));
        let phoff = u64_at(head, 0x20).unwrap_or(0);
        let ph_entry = u64::from(u16_at(head, 0x36).unwrap_or(0));
        let ph_count = u64::from(u16_at(head, 0x38).unwrap_or(0));
        let end = shoff
            .saturating_add(entry.saturating_mul(count))
            .max(phoff.saturating_add(ph_entry.saturating_mul(ph_count)))
            .max(64);
        return Extent::Bytes(end);
    }
    match u32_at(head, 0) {
        Some(FATBIN_MAGIC) => {
            let header = u64::from(u16_at(head, 6).unwrap_or(16));
            Extent::Bytes(header.saturating_add(u64_at(head, 8).unwrap_or(0)))
        }
        Some(FATBIN_WRAPPER_MAGIC) => Extent::Wrapper(u64_at(head, 8).unwrap_or(0)),
        _ => Extent::Text,
    }
}

/// What the image `bytes` tells.
pub fn scan(bytes: &[u8]) -> ImageFacts {
    if bytes.starts_with(ELF_MAGIC) {
        return scan_elf(bytes);
    }
    if u32_at(bytes, 0) == Some(FATBIN_MAGIC) {
        return scan_fatbin(bytes);
    }
    let text = bytes.split(|&b| b == 0).next().unwrap_or(&[]);
    let text = String::from_utf8_lossy(text);
    if is_ptx(&text) {
        return scan_ptx(&text);
    }
    ImageFacts::unknown("not PTX, a cubin or a fatbin")
}

fn is_ptx(text: &str) -> bool {
    text.lines().any(|line| {
        let line = line.trim_start();
        line.starts_with(".version") || line.starts_with(".target") || line.starts_with(".entry")
    })
}

/// PTX calls a function it names as a whole word outside comments (an
/// `.extern .func` declaration and the `call` of it).
fn scan_ptx(text: &str) -> ImageFacts {
    let mut malloc = false;
    let mut printf = false;
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for word in code.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$')) {
            malloc |= word == "malloc";
            printf |= word == "vprintf";
        }
    }
    ImageFacts {
        format: ImageFormat::Ptx,
        calls_malloc: yes_no(malloc),
        calls_printf: yes_no(printf),
        note: String::new(),
    }
}

fn yes_no(yes: bool) -> Answer {
    if yes { Answer::Yes } else { Answer::No }
}

/// A cubin calls what its symbol tables name (`malloc` is an undefined
/// symbol the driver links).
fn scan_elf(bytes: &[u8]) -> ImageFacts {
    let unread = |why: &str| ImageFacts {
        format: ImageFormat::Elf,
        calls_malloc: Answer::Unknown,
        calls_printf: Answer::Unknown,
        note: format!("cubin: {why}"),
    };
    if bytes.get(4) != Some(&2) || bytes.get(5) != Some(&1) {
        return unread("not a 64-bit little-endian ELF");
    }
    let (Some(shoff), Some(entry), Some(count)) = (
        u64_at(bytes, 0x28),
        u16_at(bytes, 0x3A),
        u16_at(bytes, 0x3C),
    ) else {
        return unread("header cut short");
    };
    let section = |index: u64| -> Option<(u32, u64, u64, u32)> {
        let at = usize::try_from(shoff.checked_add(index.checked_mul(u64::from(entry))?)?).ok()?;
        Some((
            u32_at(bytes, at + 4)?,
            u64_at(bytes, at + 24)?,
            u64_at(bytes, at + 32)?,
            u32_at(bytes, at + 40)?,
        ))
    };
    let (mut malloc, mut printf, mut tables) = (false, false, 0);
    for index in 0..u64::from(count) {
        let Some((kind, offset, size, link)) = section(index) else {
            return unread("section headers past the image's end");
        };
        if kind != SHT_SYMTAB && kind != SHT_DYNSYM {
            continue;
        }
        let (Some(symbols), Some((_, names_at, names_size, _))) =
            (slice(bytes, offset, size), section(u64::from(link)))
        else {
            return unread("a symbol table past the image's end");
        };
        let Some(names) = slice(bytes, names_at, names_size) else {
            return unread("a symbol name table past the image's end");
        };
        tables += 1;
        for symbol in symbols.chunks_exact(24) {
            let name_at = u32_at(symbol, 0).unwrap_or(0) as usize;
            let name = names
                .get(name_at..)
                .and_then(|rest| rest.split(|&b| b == 0).next())
                .unwrap_or(&[]);
            malloc |= name == b"malloc";
            printf |= name == b"vprintf";
        }
    }
    if tables == 0 {
        return unread("no symbol table");
    }
    ImageFacts {
        format: ImageFormat::Elf,
        calls_malloc: yes_no(malloc),
        calls_printf: yes_no(printf),
        note: String::new(),
    }
}

/// A fatbin's entries, each PTX or a cubin; compressed ones are not read
/// (the answer is then unknown unless a read entry calls the function).
fn scan_fatbin(bytes: &[u8]) -> ImageFacts {
    let header = u64::from(u16_at(bytes, 6).unwrap_or(16));
    let end = header.saturating_add(u64_at(bytes, 8).unwrap_or(0));
    let end = end.min(bytes.len() as u64);
    let mut at = header;
    let (mut malloc, mut printf) = (Answer::No, Answer::No);
    let (mut read, mut compressed, mut unreadable) = (0u32, 0u32, 0u32);
    while at + 16 <= end {
        let base = at as usize;
        let (Some(kind), Some(entry_header), Some(size)) = (
            u16_at(bytes, base),
            u32_at(bytes, base + 4),
            u64_at(bytes, base + 8),
        ) else {
            break;
        };
        let flags = u64_at(bytes, base + 40).unwrap_or(0);
        let compressed_size = u32_at(bytes, base + 16).unwrap_or(0);
        let payload_at = at.saturating_add(u64::from(entry_header));
        let next = payload_at.saturating_add(size);
        if entry_header < 16 || next > end {
            unreadable += 1;
            break;
        }
        let payload = slice(bytes, payload_at, size).unwrap_or(&[]);
        if flags & FATBIN_FLAG_COMPRESSED != 0 || compressed_size != 0 {
            compressed += 1;
            malloc = malloc.and(Answer::Unknown);
            printf = printf.and(Answer::Unknown);
        } else if kind == FATBIN_KIND_PTX || kind == FATBIN_KIND_ELF {
            let facts = scan(payload);
            if facts.format == ImageFormat::Unknown {
                unreadable += 1;
            } else {
                read += 1;
            }
            malloc = malloc.and(facts.calls_malloc);
            printf = printf.and(facts.calls_printf);
        } else {
            unreadable += 1;
            malloc = malloc.and(Answer::Unknown);
            printf = printf.and(Answer::Unknown);
        }
        at = next;
    }
    let mut note = Vec::new();
    if compressed > 0 {
        note.push(format!("{compressed} compressed entries not read"));
    }
    if unreadable > 0 {
        note.push(format!(
            "{unreadable} entries of no known kind or cut short"
        ));
        malloc = malloc.and(Answer::Unknown);
        printf = printf.and(Answer::Unknown);
    }
    if read == 0 && compressed == 0 && unreadable == 0 {
        note.push("no entries".into());
        malloc = malloc.and(Answer::Unknown);
        printf = printf.and(Answer::Unknown);
    }
    ImageFacts {
        format: ImageFormat::Fatbin,
        calls_malloc: malloc,
        calls_printf: printf,
        note: if note.is_empty() {
            String::new()
        } else {
            format!("fatbin: {}", note.join(", "))
        },
    }
}

fn slice(bytes: &[u8], at: u64, size: u64) -> Option<&[u8]> {
    let start = usize::try_from(at).ok()?;
    let end = start.checked_add(usize::try_from(size).ok()?)?;
    bytes.get(start..end)
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        bytes.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        bytes.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        bytes.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests;
