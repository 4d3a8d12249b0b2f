//! The C library's own functions, found without `dlsym` or `dlvsym`.
//!
//! This library exports both (so that a program's own wrapper of `dlsym`,
//! reaching the next one through `dlvsym`, still reaches this library's),
//! and a call to either from here would reach that export. So the C
//! library's `dlvsym` is found by reading the loaded objects' dynamic
//! symbol tables: the first object (in load order) whose GNU hash table
//! holds the name with a `GLIBC_` version is the C library. Everything
//! read is part of an object the loader has mapped; every walk is bounded.

use std::ffi::{CStr, c_char, c_int, c_void};

/// Where an `Elf64_Dyn` table's tags of interest point.
const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;
const DT_VERDEF: i64 = 0x6fff_fffc;
const DT_VERDEFNUM: i64 = 0x6fff_fffd;
/// `PT_DYNAMIC`.
const PT_DYNAMIC: u32 = 2;
/// `Elf64_Sym`'s size.
const SYM_BYTES: usize = 24;
/// A `versym` entry's hidden bit (a non-default version).
const VERSYM_HIDDEN: u16 = 0x8000;

/// `Elf64_Dyn`.
#[repr(C)]
struct Dyn {
    d_tag: i64,
    d_un: u64,
}

/// `Elf64_Verdef`.
#[repr(C)]
struct Verdef {
    _version: u16,
    _flags: u16,
    vd_ndx: u16,
    _count: u16,
    _hash: u32,
    vd_aux: u32,
    vd_next: u32,
}

/// `Elf64_Verdaux`.
#[repr(C)]
struct Verdaux {
    vda_name: u32,
    _next: u32,
}

/// The most entries read of a dynamic table, of one hash chain and of the
/// version definitions: far past any real object's.
const MOST_DYNAMIC: usize = 4096;
const MOST_CHAIN: usize = 1 << 16;
const MOST_VERDEFS: usize = 4096;

/// The address of the C library's `name` (its default version, else any
/// `GLIBC_` one), or 0 when no loaded object defines it so. Walks the
/// loaded objects under the loader's list lock: called at load, while the
/// process has one thread (see `lifecycle`), never where a `fork` may copy
/// the lock held.
pub fn glibc_function(name: &CStr) -> usize {
    let mut search = Search {
        name: name.to_bytes(),
        found: 0,
    };
    // SAFETY: `visit` is of the type dl_iterate_phdr calls and reads `data`
    // as the `Search` passed, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut search).cast()) };
    search.found
}

struct Search<'a> {
    name: &'a [u8],
    found: usize,
}

/// One loaded object: stop (1) at the first that defines the name under a
/// `GLIBC_` version.
unsafe extern "C" fn visit(
    info: *mut libc::dl_phdr_info,
    _size: usize,
    data: *mut c_void,
) -> c_int {
    // SAFETY: dl_iterate_phdr passes a valid info and our `Search`.
    let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
    crate::stop::slow_setup_for_test();
    // A panic here (none is expected) leaves the object unsearched; it is
    // caught here, not by the interposer's stop, since the program's own
    // `dlsym` needs this lookup after a stop too.
    let found = std::panic::catch_unwind(|| {
        // SAFETY: the loader's description of an object it has mapped.
        unsafe { Object::of(info) }.and_then(|object| object.lookup(search.name))
    })
    .ok()
    .flatten();
    match found {
        Some(address) => {
            search.found = address;
            1
        }
        None => 0,
    }
}

/// What a loaded object's dynamic table says of its symbols.
struct Object {
    base: usize,
    strtab: usize,
    symtab: usize,
    gnu_hash: usize,
    versym: usize,
    verdef: usize,
    verdefnum: usize,
}

impl Object {
    /// # Safety
    /// `info` describes an object the loader has mapped.
    unsafe fn of(info: &libc::dl_phdr_info) -> Option<Self> {
        let base = info.dlpi_addr as usize;
        if info.dlpi_phdr.is_null() {
            return None;
        }
        // SAFETY: the loader's program headers for this object.
        let headers =
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
        let dynamic = headers.iter().find(|header| header.p_type == PT_DYNAMIC)?;
        let mut at = base.wrapping_add(dynamic.p_vaddr as usize) as *const Dyn;
        let mut object = Self {
            base,
            strtab: 0,
            symtab: 0,
            gnu_hash: 0,
            versym: 0,
            verdef: 0,
            verdefnum: 0,
        };
        for _ in 0..MOST_DYNAMIC {
            // SAFETY: within the object's dynamic table, which ends at DT_NULL.
            let entry = unsafe { &*at };
            // The loader rewrites most pointers in place to addresses; where
            // it does not (a read-only table, the vDSO's), they are offsets.
            let pointer = || {
                let value = entry.d_un as usize;
                if value < base {
                    base.wrapping_add(value)
                } else {
                    value
                }
            };
            match entry.d_tag {
                DT_NULL => break,
                DT_STRTAB => object.strtab = pointer(),
                DT_SYMTAB => object.symtab = pointer(),
                DT_GNU_HASH => object.gnu_hash = pointer(),
                DT_VERSYM => object.versym = pointer(),
                DT_VERDEF => object.verdef = pointer(),
                DT_VERDEFNUM => object.verdefnum = entry.d_un as usize,
                _ => {}
            }
            at = at.wrapping_add(1);
        }
        (object.strtab != 0 && object.symtab != 0 && object.gnu_hash != 0 && object.versym != 0)
            .then_some(object)
    }

    /// `name`'s address here when it is defined under a `GLIBC_` version:
    /// the default one if there is one, else the first.
    fn lookup(&self, name: &[u8]) -> Option<usize> {
        let hash = name.iter().fold(5381u32, |hash, &byte| {
            hash.wrapping_mul(33).wrapping_add(u32::from(byte))
        });
        let table = self.gnu_hash as *const u32;
        // SAFETY: the GNU hash table's header: buckets, first hashed symbol,
        // bloom words.
        let (buckets, first, bloom) = unsafe { (*table, *table.add(1), *table.add(2)) };
        if buckets == 0 {
            return None;
        }
        let bucket_at = self.gnu_hash + 16 + bloom as usize * 8;
        let chain_at = bucket_at + buckets as usize * 4;
        // SAFETY: one of the table's buckets.
        let start = unsafe { *(bucket_at as *const u32).add((hash % buckets) as usize) };
        if start < first {
            return None;
        }
        let mut hidden = None;
        for index in (start..).take(MOST_CHAIN) {
            // SAFETY: the chain entry of a symbol the bucket leads to; the
            // chain ends at an entry with its low bit set.
            let chained = unsafe { *(chain_at as *const u32).add((index - first) as usize) };
            if chained | 1 == hash | 1 {
                if let Some((address, is_hidden)) = self.glibc_symbol(index as usize, name) {
                    if !is_hidden {
                        return Some(address);
                    }
                    hidden.get_or_insert(address);
                }
            }
            if chained & 1 == 1 {
                break;
            }
        }
        hidden
    }

    /// Symbol `index`'s address and whether its version is hidden, when it
    /// is `name`, defined, under a `GLIBC_` version.
    fn glibc_symbol(&self, index: usize, name: &[u8]) -> Option<(usize, bool)> {
        let symbol = (self.symtab + index * SYM_BYTES) as *const libc::Elf64_Sym;
        // SAFETY: a symbol the hash table names, in the object's table.
        let symbol = unsafe { &*symbol };
        // SAFETY: its name, a NUL-terminated string in the string table.
        let named =
            unsafe { CStr::from_ptr((self.strtab + symbol.st_name as usize) as *const c_char) };
        if named.to_bytes() != name || symbol.st_shndx == 0 || symbol.st_value == 0 {
            return None;
        }
        // SAFETY: the symbol's entry in the version table, as long as the
        // symbol table.
        let version = unsafe { *(self.versym as *const u16).add(index) };
        self.version_name(version & !VERSYM_HIDDEN)
            .filter(|version| version.starts_with(b"GLIBC_"))
            .map(|_| {
                (
                    self.base.wrapping_add(symbol.st_value as usize),
                    version & VERSYM_HIDDEN != 0,
                )
            })
    }

    /// The name of the version this object defines at `index`.
    fn version_name(&self, index: u16) -> Option<&[u8]> {
        let mut at = self.verdef;
        if at == 0 {
            return None;
        }
        for _ in 0..self.verdefnum.min(MOST_VERDEFS) {
            // SAFETY: an `Elf64_Verdef` of the object's chain of them.
            let definition = unsafe { &*(at as *const Verdef) };
            if definition.vd_ndx == index {
                // SAFETY: its first `Elf64_Verdaux`, which names it.
                let aux = unsafe { &*((at + definition.vd_aux as usize) as *const Verdaux) };
                // SAFETY: a NUL-terminated string in the string table.
                let name = unsafe {
                    CStr::from_ptr((self.strtab + aux.vda_name as usize) as *const c_char)
                };
                return Some(name.to_bytes());
            }
            if definition.vd_next == 0 {
                return None;
            }
            at += definition.vd_next as usize;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_c_librarys_functions_are_found_where_the_loader_bound_them() {
        // This test program does not define getpid or malloc: its own
        // references to them are the C library's.
        assert_eq!(
            glibc_function(c"getpid"),
            libc::getpid as *const () as usize
        );
        assert_eq!(
            glibc_function(c"malloc"),
            libc::malloc as *const () as usize
        );
    }

    #[test]
    fn names_the_c_library_lacks_are_not_found() {
        assert_eq!(glibc_function(c"cuMemAlloc_v2"), 0);
        assert_eq!(glibc_function(c""), 0);
    }

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn the_c_librarys_dlvsym_finds_its_versioned_functions() {
        let dlvsym = glibc_function(c"dlvsym");
        assert_ne!(dlvsym, 0);
        type DlvsymFn =
            unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char) -> *mut c_void;
        // SAFETY: the C library's dlvsym, of this type.
        let dlvsym = unsafe { std::mem::transmute::<usize, DlvsymFn>(dlvsym) };
        // The version every architecture's first glibc defined getpid at.
        #[cfg(target_arch = "x86_64")]
        let first = c"GLIBC_2.2.5";
        #[cfg(target_arch = "aarch64")]
        let first = c"GLIBC_2.17";
        // SAFETY: a pseudo-handle and constant C strings.
        let found = unsafe { dlvsym(libc::RTLD_DEFAULT, c"getpid".as_ptr(), first.as_ptr()) };
        assert_eq!(found as usize, libc::getpid as *const () as usize);
    }
}
