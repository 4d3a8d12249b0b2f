//! What a module image tells before the driver loads it (see
//! [`trace::image`]): read here from the program's pointer or file, and
//! recorded as an `image` record just before the load's `module` record,
//! so the accounting knows whether the malloc heap may come at a first
//! launch and how much code the load may hold.

use std::ffi::{CStr, c_char, c_void};

use trace::event::{Call, Event};
use trace::image::{self, Extent, HEAD_BYTES, ImageFacts, ImageFormat, MAX_IMAGE_BYTES};

use crate::hooks::enter;
use crate::recorder;

/// Files larger than this are not read (the answer is unknown).
const MAX_FILE_BYTES: u64 = 256 << 20;

/// Where a load's image is.
pub enum Source {
    /// In the program's memory.
    Memory(*const c_void),
    /// In a file, by its path.
    File(*const c_char),
}

/// Read the image `call` is about to load and record what it tells.
///
/// # Safety
/// A `Memory` pointer is null or the image the program hands the driver
/// (which reads it the same way); a `File` pointer is null or a C string.
pub unsafe fn record(call: Call, source: Source) {
    let Some(_inside) = enter() else {
        return;
    };
    let facts = match source {
        // SAFETY: as this function's contract says.
        Source::Memory(image) => unsafe { in_memory(image) },
        // SAFETY: as this function's contract says.
        Source::File(path) => unsafe { in_file(path) },
    };
    let (facts, bytes) = match facts {
        // The size bounds the code only where the whole image was read (a
        // compressed entry may hold more code than its bytes).
        Ok((facts, bytes)) => {
            let known = facts.format != ImageFormat::Unknown && facts.note.is_empty();
            (facts, known.then_some(bytes))
        }
        Err(facts) => (facts, None),
    };
    recorder::after(
        Event::Image {
            call,
            format: facts.format,
            bytes,
            malloc: facts.calls_malloc,
            printf: facts.calls_printf,
            note: facts.note.as_str().into(),
        },
        0,
    );
}

/// The bytes at `image` up to `len`, as a slice.
///
/// # Safety
/// `len` bytes from `image` are readable.
unsafe fn bytes<'a>(image: *const u8, len: usize) -> &'a [u8] {
    // SAFETY: as the caller promises.
    unsafe { std::slice::from_raw_parts(image, len) }
}

/// # Safety
/// `image` is null or a module image: text ending in a NUL, or an ELF or
/// fatbin whose header says its size, or the runtime's fatbin wrapper.
unsafe fn in_memory(image: *const c_void) -> Result<(ImageFacts, u64), ImageFacts> {
    let mut at = image.cast::<u8>();
    for _ in 0..2 {
        if at.is_null() {
            return Err(ImageFacts::unknown("no image"));
        }
        // The magic numbers hold no zero byte: stop at a NUL, as text ends.
        let mut magic = [0u8; 4];
        for (index, slot) in magic.iter_mut().enumerate() {
            // SAFETY: the bytes before a NUL of a text image, or a binary
            // image's header.
            *slot = unsafe { *at.add(index) };
            if *slot == 0 {
                break;
            }
        }
        let head_len = match u32::from_le_bytes(magic) {
            image::FATBIN_MAGIC | image::FATBIN_WRAPPER_MAGIC => 16,
            _ if &magic == b"\x7fELF" => HEAD_BYTES,
            _ => 0,
        };
        if head_len == 0 {
            // SAFETY: a text image ends in a NUL.
            let len = unsafe { libc::strnlen(at.cast(), MAX_IMAGE_BYTES as usize) };
            // SAFETY: `len` bytes before the NUL.
            let text = unsafe { bytes(at, len) };
            return Ok((image::scan(text), len as u64));
        }
        // SAFETY: the header of a binary image.
        match image::extent(unsafe { bytes(at, head_len) }) {
            Extent::Wrapper(fatbin) => at = fatbin as *const u8,
            Extent::Bytes(len) if len <= MAX_IMAGE_BYTES => {
                // SAFETY: the image spans what its header says (the driver
                // reads as much).
                let image = unsafe { bytes(at, len as usize) };
                return Ok((image::scan(image), len));
            }
            Extent::Bytes(len) => {
                return Err(ImageFacts::unknown(format!(
                    "an image of {len} bytes, more than is read"
                )));
            }
            Extent::Text => return Err(ImageFacts::unknown("no image")),
        }
    }
    Err(ImageFacts::unknown(
        "a fatbin wrapper that points at another",
    ))
}

/// # Safety
/// `path` is null or a C string.
unsafe fn in_file(path: *const c_char) -> Result<(ImageFacts, u64), ImageFacts> {
    if path.is_null() {
        return Err(ImageFacts::unknown("no file name"));
    }
    // SAFETY: the program's C string.
    let path = unsafe { CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    let size = std::fs::metadata(&path)
        .map_err(|error| ImageFacts::unknown(format!("{path}: {error}")))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(ImageFacts::unknown(format!(
            "{path}: {size} bytes, more than is read"
        )));
    }
    let bytes =
        std::fs::read(&path).map_err(|error| ImageFacts::unknown(format!("{path}: {error}")))?;
    Ok((image::scan(&bytes), bytes.len() as u64))
}
