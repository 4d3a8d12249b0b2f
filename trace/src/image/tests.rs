//! Images of each format, built here byte by byte (and the repo's own PTX),
//! read for what their code calls.

use proptest::prelude::*;

use super::*;

/// A 64-bit little-endian ELF whose symbol table names `symbols`.
pub(crate) fn cubin(symbols: &[&str]) -> Vec<u8> {
    let mut names = vec![0u8];
    let mut table = vec![0u8; 24];
    for symbol in symbols {
        let mut entry = vec![0u8; 24];
        entry[..4].copy_from_slice(&(names.len() as u32).to_le_bytes());
        table.extend(entry);
        names.extend(symbol.as_bytes());
        names.push(0);
    }
    let symtab_at = 64u64;
    let strtab_at = symtab_at + table.len() as u64;
    let shoff = strtab_at + names.len() as u64;
    let mut out = vec![0u8; 64];
    out[..4].copy_from_slice(b"\x7fELF");
    out[4] = 2;
    out[5] = 1;
    out[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
    out[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
    out[0x3C..0x3E].copy_from_slice(&3u16.to_le_bytes());
    out.extend(&table);
    out.extend(&names);
    let header = |kind: u32, offset: u64, size: u64, link: u32| {
        let mut h = vec![0u8; 64];
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&offset.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        h[40..44].copy_from_slice(&link.to_le_bytes());
        h
    };
    out.extend(header(0, 0, 0, 0));
    out.extend(header(SHT_SYMTAB, symtab_at, table.len() as u64, 2));
    out.extend(header(3, strtab_at, names.len() as u64, 0));
    out
}

/// A fatbin of `entries`: (kind, compressed, payload).
pub(crate) fn fatbin(entries: &[(u16, bool, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for &(kind, compressed, payload) in entries {
        let mut header = vec![0u8; 64];
        header[..2].copy_from_slice(&kind.to_le_bytes());
        header[4..8].copy_from_slice(&64u32.to_le_bytes());
        header[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        if compressed {
            header[40..48].copy_from_slice(&FATBIN_FLAG_COMPRESSED.to_le_bytes());
        }
        body.extend(header);
        body.extend(payload);
    }
    let mut out = Vec::new();
    out.extend(FATBIN_MAGIC.to_le_bytes());
    out.extend(1u16.to_le_bytes());
    out.extend(16u16.to_le_bytes());
    out.extend((body.len() as u64).to_le_bytes());
    out.extend(body);
    out
}

const PTX_MALLOC: &str = include_str!("../../../kernels/ptx/heap.ptx");
const PTX_PLAIN: &str = include_str!("../../../kernels/ptx/moves.ptx");

#[test]
fn ptx_calls_malloc_where_it_names_it_as_a_word() {
    let facts = scan(PTX_MALLOC.as_bytes());
    assert_eq!(facts.format, ImageFormat::Ptx);
    assert_eq!(facts.calls_malloc, Answer::Yes);
    let facts = scan(PTX_PLAIN.as_bytes());
    assert_eq!(
        (facts.format, facts.calls_malloc),
        (ImageFormat::Ptx, Answer::No)
    );
    // A name that contains malloc, or a comment, is not a call.
    let text = ".version 8.0\n.entry heap_malloc_free() // calls malloc\n{ ret; }\0junk malloc";
    assert_eq!(scan(text.as_bytes()).calls_malloc, Answer::No);
    let printf = ".version 8.0\n.extern .func (.param .b32 r) vprintf\n";
    assert_eq!(scan(printf.as_bytes()).calls_printf, Answer::Yes);
}

#[test]
fn a_cubin_calls_what_its_symbol_table_names() {
    let facts = scan(&cubin(&["_Z4workPv", "malloc", "free"]));
    assert_eq!(facts.format, ImageFormat::Elf);
    assert_eq!(
        (facts.calls_malloc, facts.calls_printf),
        (Answer::Yes, Answer::No)
    );
    let facts = scan(&cubin(&["_Z4workPv", "mallocx"]));
    assert_eq!(facts.calls_malloc, Answer::No);
    // Its extent is read from the header: to the end of the section headers.
    let image = cubin(&["malloc"]);
    assert_eq!(
        extent(&image[..HEAD_BYTES]),
        Extent::Bytes(image.len() as u64)
    );
    // Cut short: unknown, and said.
    let facts = scan(&image[..image.len() - 30]);
    assert_eq!(facts.calls_malloc, Answer::Unknown);
    assert!(
        facts.note.contains("past the image's end"),
        "{}",
        facts.note
    );
}

#[test]
fn a_fatbin_is_read_entry_by_entry_and_says_what_it_could_not_read() {
    let elf = cubin(&["malloc"]);
    let image = fatbin(&[
        (FATBIN_KIND_PTX, false, PTX_PLAIN.as_bytes()),
        (FATBIN_KIND_ELF, false, &elf),
    ]);
    assert_eq!(
        extent(&image[..HEAD_BYTES]),
        Extent::Bytes(image.len() as u64)
    );
    let facts = scan(&image);
    assert_eq!(facts.format, ImageFormat::Fatbin);
    assert_eq!(facts.calls_malloc, Answer::Yes);
    assert_eq!(facts.note, "");
    let plain = fatbin(&[(FATBIN_KIND_PTX, false, PTX_PLAIN.as_bytes())]);
    assert_eq!(scan(&plain).calls_malloc, Answer::No);
    // A compressed entry cannot be read: unknown unless another says yes.
    let packed = fatbin(&[
        (FATBIN_KIND_PTX, false, PTX_PLAIN.as_bytes()),
        (FATBIN_KIND_ELF, true, b"\x01\x02"),
    ]);
    let facts = scan(&packed);
    assert_eq!(facts.calls_malloc, Answer::Unknown);
    assert_eq!(facts.note, "fatbin: 1 compressed entries not read");
    let mixed = fatbin(&[
        (FATBIN_KIND_ELF, true, b"\x01"),
        (FATBIN_KIND_ELF, false, &elf),
    ]);
    assert_eq!(scan(&mixed).calls_malloc, Answer::Yes);
}

#[test]
fn the_runtime_wrapper_points_at_its_fatbin() {
    let mut wrapper = Vec::new();
    wrapper.extend(FATBIN_WRAPPER_MAGIC.to_le_bytes());
    wrapper.extend(1u32.to_le_bytes());
    wrapper.extend(0xdead_beefu64.to_le_bytes());
    wrapper.resize(HEAD_BYTES, 0);
    assert_eq!(extent(&wrapper), Extent::Wrapper(0xdead_beef));
    assert_eq!(extent(b"hello\0"), Extent::Text);
    assert_eq!(scan(b"image\0").format, ImageFormat::Unknown);
}

proptest! {
    /// Any bytes: an answer, never a panic; a known format keeps its name.
    #[test]
    fn arbitrary_images_are_answered(bytes in prop::collection::vec(any::<u8>(), 0..512), cut in 0usize..4) {
        let _ = extent(&bytes[..bytes.len().min(HEAD_BYTES)]);
        let _ = scan(&bytes);
        let elf = cubin(&["malloc"]);
        let damaged: Vec<u8> = elf.iter().zip(bytes.iter().chain(std::iter::repeat(&0)))
            .enumerate()
            .map(|(i, (&e, &b))| if i % (cut + 7) == 0 && i > 8 { b } else { e })
            .collect();
        let facts = scan(&damaged);
        prop_assert_eq!(facts.format, ImageFormat::Elf);
        let packed = fatbin(&[(FATBIN_KIND_ELF, false, &damaged)]);
        let _ = scan(&packed[..packed.len().saturating_sub(cut * 13)]);
    }
}
