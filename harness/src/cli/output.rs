//! Standard output for every subcommand: writes return errors instead of
//! panicking as `println!` does, and each error says it was the output that
//! failed. `main` treats a closed pipe (`cudamem explain | head -1`) as the
//! reader being done, and any other failure (a full disk) as an error.

use std::io::{self, ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Standard output whose write errors keep their kind and name the output.
pub struct Stdout(io::Stdout);

/// The process's standard output.
pub fn stdout() -> Stdout {
    Stdout(io::stdout())
}

fn named(error: io::Error) -> io::Error {
    io::Error::new(error.kind(), format!("writing to standard output: {error}"))
}

impl Write for Stdout {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0.write(bytes).map_err(named)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().map_err(named)
    }
}

/// Whether `error` (anywhere in its chain) is a write to a closed pipe.
pub fn is_closed_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
    })
}

/// An output path that is the same file as an input: writing it would
/// destroy what is being read.
#[derive(Debug, thiserror::Error)]
#[error(
    "{flag} {} is the same file as the input {}; refusing to overwrite it \
     (name another file)",
    output.display(),
    input.display()
)]
pub struct SameFile {
    /// The option that named the output.
    pub flag: &'static str,
    /// The output as given.
    pub output: PathBuf,
    /// The input it is.
    pub input: PathBuf,
}

/// The device and inode of the file at `path`, following symlinks; `None`
/// when it does not exist (yet).
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path)
        .ok()
        .map(|meta| (meta.dev(), meta.ino()))
}

/// Refuse `output` (named by `flag`) when it is the same file as one of
/// `inputs`: the same device and inode, so a hard link or a symlink to an
/// input is caught as the input's own path is.
pub fn refuse_input(flag: &'static str, output: &Path, inputs: &[&Path]) -> Result<(), SameFile> {
    let Some(written) = identity(output) else {
        return Ok(());
    };
    match inputs.iter().find(|input| identity(input) == Some(written)) {
        Some(input) => Err(SameFile {
            flag,
            output: output.to_path_buf(),
            input: input.to_path_buf(),
        }),
        None => Ok(()),
    }
}
