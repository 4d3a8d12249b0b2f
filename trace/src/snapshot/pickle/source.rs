//! The bytes of a pickle as the reader takes them: counted against the
//! size bound, read without allocating ahead of what the input holds.

use std::io::{self, BufRead, Read};

use super::PickleError;

/// The bytes being read, counted against the size bound.
pub(super) struct Source<R> {
    inner: R,
    /// Bytes taken so far: where the next opcode starts.
    pub(super) offset: u64,
    max_bytes: u64,
}

impl<R: BufRead> Source<R> {
    /// The bytes of `inner`, at most `max_bytes` of them.
    pub(super) fn new(inner: R, max_bytes: u64) -> Self {
        Self {
            inner,
            offset: 0,
            max_bytes,
        }
    }

    pub(super) fn io_error(&self, err: &io::Error) -> PickleError {
        if let crate::Problem::TooLarge { limit_bytes } = crate::file::read_problem(err) {
            PickleError::TooLarge { limit_bytes }
        } else if err.kind() == io::ErrorKind::UnexpectedEof {
            PickleError::Truncated {
                offset: self.offset,
            }
        } else {
            PickleError::Io {
                offset: self.offset,
                message: err.to_string(),
            }
        }
    }

    pub(super) fn reserve(&mut self, bytes: u64) -> Result<(), PickleError> {
        match self.offset.checked_add(bytes) {
            Some(end) if end <= self.max_bytes => Ok(()),
            _ => Err(PickleError::TooLarge {
                limit_bytes: self.max_bytes,
            }),
        }
    }

    pub(super) fn byte(&mut self) -> Result<u8, PickleError> {
        self.reserve(1)?;
        let buffer = match self.inner.fill_buf() {
            Ok(buffer) => buffer,
            Err(err) => return Err(self.io_error(&err)),
        };
        let Some(&byte) = buffer.first() else {
            return Err(PickleError::Truncated {
                offset: self.offset,
            });
        };
        self.inner.consume(1);
        self.offset += 1;
        Ok(byte)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Result<[u8; N], PickleError> {
        self.reserve(N as u64)?;
        let mut bytes = [0u8; N];
        if let Err(err) = self.inner.read_exact(&mut bytes) {
            return Err(self.io_error(&err));
        }
        self.offset += N as u64;
        Ok(bytes)
    }

    /// `length` bytes, never allocating ahead of what the input really holds.
    pub(super) fn bytes(&mut self, length: u64) -> Result<Vec<u8>, PickleError> {
        self.reserve(length)?;
        let mut bytes = Vec::with_capacity(length.min(1 << 16) as usize);
        let read = (&mut self.inner).take(length).read_to_end(&mut bytes);
        self.offset += bytes.len() as u64;
        match read {
            Err(err) => Err(self.io_error(&err)),
            Ok(_) if (bytes.len() as u64) < length => Err(PickleError::Truncated {
                offset: self.offset,
            }),
            Ok(_) => Ok(bytes),
        }
    }

    pub(super) fn skip(&mut self, length: u64) -> Result<(), PickleError> {
        self.reserve(length)?;
        let copied = io::copy(&mut (&mut self.inner).take(length), &mut io::sink());
        match copied {
            Err(err) => Err(self.io_error(&err)),
            Ok(copied) => {
                self.offset += copied;
                if copied < length {
                    Err(PickleError::Truncated {
                        offset: self.offset,
                    })
                } else {
                    Ok(())
                }
            }
        }
    }
}
