//! Standard output for every subcommand: writes return errors instead of
//! panicking as `println!` does, and each error says it was the output that
//! failed. `main` treats a closed pipe (`cudamem explain | head -1`) as the
//! reader being done, and any other failure (a full disk) as an error.

use std::io::{self, ErrorKind, Write};

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
