//! PyTorch's out-of-memory message: the first line of the text a `torch.cuda.
//! OutOfMemoryError` carries, written as PyTorch's caching allocator writes it, so
//! tools that read it (accelerate's `find_executable_batch_size`, Lightning's batch
//! size finder, users' own `"CUDA out of memory." in str(e)`) see what they expect.
//! cudamem's ledger follows on the next lines.

/// The words every PyTorch out-of-memory message starts with; tools match on them.
pub const PREFIX: &str = "CUDA out of memory.";

/// What the first line says, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headline {
    /// The device's number.
    pub device: i32,
    /// Bytes the caller asked for.
    pub requested: u64,
    /// The device's memory.
    pub total: u64,
    /// The device's free memory now.
    pub free: u64,
    /// Bytes of live blocks, the device's pool and private pools together.
    pub allocated: u64,
    /// Of `allocated`, bytes in private pools (CUDA graphs, `MemPool`s).
    pub allocated_private: u64,
    /// Device memory the allocator holds (PyTorch's reserved bytes).
    pub reserved: u64,
    /// The memory fraction's bound, when one is set.
    pub allowed: Option<u64>,
}

impl Headline {
    /// The line, as PyTorch's `CUDACachingAllocator` writes it (no newline).
    ///
    /// ```
    /// use cudamem_torch::oom::Headline;
    /// let line = Headline {
    ///     device: 0, requested: 2 << 30, total: 80 << 30, free: 3 << 29,
    ///     allocated: 70 << 30, allocated_private: 0, reserved: 75 << 30, allowed: None,
    /// }
    /// .render();
    /// assert!(line.starts_with(
    ///     "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of \
    ///      80.00 GiB of which 1.50 GiB is free."
    /// ));
    /// ```
    pub fn render(&self) -> String {
        let used = self.total.saturating_sub(self.free);
        let allowed = self
            .allowed
            .map(|bytes| format!("{} allowed; ", format_size(bytes)))
            .unwrap_or_default();
        let private = if self.allocated_private > 0 {
            format!(
                "with {} allocated in private pools (e.g., CUDA Graphs), ",
                format_size(self.allocated_private)
            )
        } else {
            String::new()
        };
        format!(
            "{PREFIX} Tried to allocate {}. GPU {} has a total capacity of {} of which {} is \
             free. Including non-PyTorch memory, this process has {} memory in use. {allowed}\
             Of the allocated memory {} is allocated by PyTorch, {private}and {} is reserved by \
             PyTorch but unallocated. If reserved but unallocated memory is large try setting \
             PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
             documentation for Memory Management  \
             (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
            format_size(self.requested),
            self.device,
            format_size(self.total),
            format_size(self.free),
            format_size(used),
            format_size(self.allocated),
            format_size(self.reserved.saturating_sub(self.allocated)),
        )
    }
}

/// A size as PyTorch's `format_size` writes it: bytes up to 1 KiB, then KiB, MiB or
/// GiB with two decimals (each unit up to and including 1024 of the one below).
pub fn format_size(bytes: u64) -> String {
    const KIB: u64 = 1 << 10;
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    let value = bytes as f64;
    if bytes <= KIB {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", value / KIB as f64)
    } else if bytes <= GIB {
        format!("{:.2} MiB", value / MIB as f64)
    } else {
        format!("{:.2} GiB", value / GIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_pytorch_writes_them() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(1025), "1.00 KiB");
        assert_eq!(format_size(1 << 20), "1024.00 KiB");
        assert_eq!(format_size((1 << 20) + 1), "1.00 MiB");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(150_109_880_320), "139.80 GiB");
    }

    #[test]
    fn the_line_names_the_fraction_and_the_private_pools_when_there_are_some() {
        let mut h = Headline {
            device: 1,
            requested: 512,
            total: 8 << 30,
            free: 0,
            allocated: 3 << 30,
            allocated_private: 1 << 30,
            reserved: 4 << 30,
            allowed: Some(4 << 30),
        };
        let line = h.render();
        assert!(line.starts_with("CUDA out of memory. Tried to allocate 512 bytes. GPU 1 "));
        assert!(line.contains("this process has 8.00 GiB memory in use. 4.00 GiB allowed; "));
        assert!(
            line.contains(
                "Of the allocated memory 3.00 GiB is allocated by PyTorch, with 1024.00 MiB \
                 allocated in private pools (e.g., CUDA Graphs), and 1024.00 MiB is reserved"
            ),
            "{line}"
        );
        h.allowed = None;
        h.allocated_private = 0;
        let line = h.render();
        assert!(!line.contains("allowed;") && !line.contains("private pools"));
        assert!(!line.contains('\n'));
    }
}
