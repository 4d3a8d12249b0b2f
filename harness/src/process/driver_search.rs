//! Where the loader would find the driver library, looked for as it looks
//! for a name without a `/`: the folders of `LD_LIBRARY_PATH`, the loader's
//! cache (`/etc/ld.so.cache`), then the system's library folders. Files are
//! only looked at, never loaded: `cudamem` itself loads no driver.

use std::ffi::OsStr;
use std::fmt;
use std::path::{Path, PathBuf};

/// The driver library's name, as programs and the CUDA runtime ask for it.
pub const DRIVER_NAME: &str = "libcuda.so.1";

/// The loader's cache.
pub const LD_CACHE: &str = "/etc/ld.so.cache";

/// The header of the cache's current format (glibc 2.32 and later write
/// only this one; older ones put it after the old format's table).
const CACHE_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
/// Bytes of that header: magic, entry count, string bytes, flags and
/// padding, extension offset, three unused words.
const CACHE_HEADER_BYTES: usize = 48;
/// Bytes of one entry: flags, key, value, os version, hwcap.
const CACHE_ENTRY_BYTES: usize = 24;

/// The system's library folders the loader tries after its cache (those of
/// them that exist are listed).
const SYSTEM_DIRS: [&str; 6] = [
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
];

/// What the cache said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheAnswer {
    /// No cache file (or it cannot be read).
    Absent,
    /// A cache in a format not read here.
    Unreadable,
    /// The cache lists the name at this path.
    Listed(PathBuf),
    /// The cache does not list the name.
    NotListed,
}

/// Where the driver library was looked for, and where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverSearch {
    /// `LD_LIBRARY_PATH`'s folders (empty: not set).
    pub library_path: Vec<PathBuf>,
    /// The cache file and what it said.
    pub cache: (PathBuf, CacheAnswer),
    /// The system folders looked in.
    pub system_dirs: Vec<PathBuf>,
    /// The first file of that name found, in the loader's order.
    pub found: Option<PathBuf>,
}

/// Look for [`DRIVER_NAME`] as the loader would for a program run with
/// `ld_library_path`.
pub fn search(ld_library_path: Option<&OsStr>) -> DriverSearch {
    let cache = std::fs::read(LD_CACHE).ok();
    let system: Vec<&Path> = SYSTEM_DIRS.iter().map(Path::new).collect();
    search_in(
        DRIVER_NAME,
        ld_library_path,
        (Path::new(LD_CACHE), cache.as_deref()),
        &system,
    )
}

/// [`search`] for `name`, with the cache's bytes given (`None`: absent) and
/// the system folders to try.
pub fn search_in(
    name: &str,
    ld_library_path: Option<&OsStr>,
    cache: (&Path, Option<&[u8]>),
    system_dirs: &[&Path],
) -> DriverSearch {
    // The loader skips empty entries of LD_LIBRARY_PATH only in that they
    // name the current folder; they are listed as they are.
    let library_path: Vec<PathBuf> = ld_library_path
        .filter(|value| !value.is_empty())
        .map(|value| std::env::split_paths(value).collect())
        .unwrap_or_default();
    let answer = match cache.1 {
        None => CacheAnswer::Absent,
        Some(bytes) => match cache_lookup(bytes, name) {
            None => CacheAnswer::Unreadable,
            Some(Some(path)) => CacheAnswer::Listed(path),
            Some(None) => CacheAnswer::NotListed,
        },
    };
    let system_dirs: Vec<PathBuf> = system_dirs
        .iter()
        .filter(|dir| dir.is_dir())
        .map(|dir| dir.to_path_buf())
        .collect();
    let in_dir = |dir: &PathBuf| {
        let candidate = dir.join(name);
        candidate.is_file().then_some(candidate)
    };
    let found = library_path
        .iter()
        .find_map(in_dir)
        .or_else(|| match &answer {
            CacheAnswer::Listed(path) if path.is_file() => Some(path.clone()),
            _ => None,
        })
        .or_else(|| system_dirs.iter().find_map(in_dir));
    DriverSearch {
        library_path,
        cache: (cache.0.to_path_buf(), answer),
        system_dirs,
        found,
    }
}

/// The path the cache gives `name`: `Some(None)` when it lists no such
/// name, `None` when the bytes are no cache of the current format.
fn cache_lookup(bytes: &[u8], name: &str) -> Option<Option<PathBuf>> {
    let start = bytes
        .windows(CACHE_MAGIC.len())
        .position(|window| window == CACHE_MAGIC)?;
    let cache = &bytes[start..];
    let word = |at: usize| -> Option<usize> {
        let field = cache.get(at..at + 4)?;
        Some(u32::from_le_bytes(field.try_into().ok()?) as usize)
    };
    let string = |at: usize| -> Option<&[u8]> {
        let rest = cache.get(at..)?;
        let end = rest.iter().position(|&byte| byte == 0)?;
        Some(&rest[..end])
    };
    let entries = word(CACHE_MAGIC.len())?;
    for index in 0..entries {
        let at = CACHE_HEADER_BYTES.checked_add(index.checked_mul(CACHE_ENTRY_BYTES)?)?;
        let (key, value) = (word(at + 4)?, word(at + 8)?);
        if string(key)? == name.as_bytes() {
            let path = String::from_utf8_lossy(string(value)?).into_owned();
            return Some(Some(PathBuf::from(path)));
        }
    }
    Some(None)
}

impl fmt::Display for DriverSearch {
    /// Where the loader looked: "LD_LIBRARY_PATH (…), /etc/ld.so.cache
    /// (…) and /lib, /usr/lib".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let paths = |paths: &[PathBuf]| {
            paths
                .iter()
                .map(|path| path.display().to_string())
                .collect::<Vec<_>>()
        };
        let library_path = if self.library_path.is_empty() {
            "not set".to_string()
        } else {
            paths(&self.library_path).join(":")
        };
        let (cache, answer) = &self.cache;
        let said = match answer {
            CacheAnswer::Absent => "absent".to_string(),
            CacheAnswer::Unreadable => "in a format not read here".to_string(),
            CacheAnswer::Listed(path) => format!("lists {}", path.display()),
            CacheAnswer::NotListed => format!("lists no {DRIVER_NAME}"),
        };
        write!(
            f,
            "LD_LIBRARY_PATH ({library_path}), {} ({said})",
            cache.display()
        )?;
        if !self.system_dirs.is_empty() {
            write!(f, " and {}", paths(&self.system_dirs).join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache of the current format listing `entries` (name, path).
    fn cache_of(entries: &[(&str, &str)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let table_end = CACHE_HEADER_BYTES + entries.len() * CACHE_ENTRY_BYTES;
        let mut offsets = Vec::new();
        for (name, path) in entries {
            let key = table_end + strings.len();
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
            let value = table_end + strings.len();
            strings.extend_from_slice(path.as_bytes());
            strings.push(0);
            offsets.push((key as u32, value as u32));
        }
        let mut bytes = CACHE_MAGIC.to_vec();
        bytes.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&(strings.len() as u32).to_le_bytes());
        bytes.resize(CACHE_HEADER_BYTES, 0);
        for (key, value) in offsets {
            bytes.extend_from_slice(&0x0303i32.to_le_bytes());
            bytes.extend_from_slice(&key.to_le_bytes());
            bytes.extend_from_slice(&value.to_le_bytes());
            bytes.extend_from_slice(&[0; 12]);
        }
        bytes.extend_from_slice(&strings);
        bytes
    }

    #[test]
    fn the_cache_is_read_by_name_and_bad_bytes_are_said_to_be_unreadable() {
        let cache = cache_of(&[
            ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        ]);
        assert_eq!(
            cache_lookup(&cache, "libcuda.so.1"),
            Some(Some(PathBuf::from(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
            )))
        );
        assert_eq!(cache_lookup(&cache, "libcudart.so.13"), Some(None));
        // The old format's table before it is skipped.
        let mut old = b"ld.so-1.7.0\0\0\0\0\0".to_vec();
        old.extend_from_slice(&cache);
        assert_eq!(
            cache_lookup(&old, "libc.so.6"),
            Some(Some(PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")))
        );
        assert_eq!(cache_lookup(b"not a cache", "libcuda.so.1"), None);
        // An entry count past the bytes: unreadable, not a panic.
        let mut cut = cache_of(&[("libcuda.so.1", "/x")]);
        cut[CACHE_MAGIC.len()..CACHE_MAGIC.len() + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        cut.truncate(CACHE_HEADER_BYTES + 10);
        assert_eq!(cache_lookup(&cut, "libcuda.so.2"), None);
    }

    #[test]
    fn the_search_follows_the_loaders_order_and_says_where_it_looked() {
        let root = tempfile::tempdir().unwrap();
        let (first, second, system) = (
            root.path().join("first"),
            root.path().join("second"),
            root.path().join("system"),
        );
        for dir in [&first, &second, &system] {
            std::fs::create_dir(dir).unwrap();
        }
        let path = std::env::join_paths([&first, &second]).unwrap();
        let cache = cache_of(&[("libc.so.6", "/lib/libc.so.6")]);
        let nowhere = root.path().join("nowhere");
        let dirs = [system.as_path(), nowhere.as_path()];
        let search = search_in(
            DRIVER_NAME,
            Some(&path),
            (Path::new("/c"), Some(&cache)),
            &dirs,
        );
        assert_eq!(search.found, None);
        assert_eq!(
            search.to_string(),
            format!(
                "LD_LIBRARY_PATH ({}:{}), /c (lists no libcuda.so.1) and {}",
                first.display(),
                second.display(),
                system.display()
            )
        );
        // The system folder, then LD_LIBRARY_PATH before it.
        std::fs::write(system.join(DRIVER_NAME), b"").unwrap();
        let search = search_in(DRIVER_NAME, Some(&path), (Path::new("/c"), None), &dirs);
        assert_eq!(search.found, Some(system.join(DRIVER_NAME)));
        assert_eq!(search.cache.1, CacheAnswer::Absent);
        std::fs::write(second.join(DRIVER_NAME), b"").unwrap();
        let search = search_in(DRIVER_NAME, Some(&path), (Path::new("/c"), None), &dirs);
        assert_eq!(search.found, Some(second.join(DRIVER_NAME)));
        let search = search_in(DRIVER_NAME, None, (Path::new("/c"), None), &[]);
        assert!(
            search
                .to_string()
                .starts_with("LD_LIBRARY_PATH (not set), /c (absent)")
        );
    }
}
