//! The libraries that call the driver: which of them are CUDA's own (the
//! interposer looks past them for the library that asked), how they are
//! shown, and which framework a caller belongs to (for advice).

/// What the interposer's caller search does with a library's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibraryClass {
    /// The driver, the runtime or the interposer itself: looked past.
    Cuda,
    /// Anything else: the first such frame is the caller.
    Other,
}

/// The class of the library at `path` (a loaded object's file name, as
/// `dladdr` reports it).
///
/// ```
/// use trace::process::libraries::{LibraryClass, classify};
///
/// assert_eq!(classify("/usr/lib/x86_64-linux-gnu/libcuda.so.1"), LibraryClass::Cuda);
/// assert_eq!(classify("/opt/venv/lib/nvidia/cuda_runtime/lib/libcudart.so.13"), LibraryClass::Cuda);
/// assert_eq!(classify("/opt/venv/lib/torch/lib/libc10_cuda.so"), LibraryClass::Other);
/// assert_eq!(classify("/usr/lib/libcudnn.so.9"), LibraryClass::Other);
/// ```
pub fn classify(path: &str) -> LibraryClass {
    let name = file_name(path);
    let cuda = ["libcuda.so", "libcudart.so", "libcudamem_interpose.so"]
        .iter()
        .any(|prefix| name.starts_with(prefix));
    if cuda {
        LibraryClass::Cuda
    } else {
        LibraryClass::Other
    }
}

/// The last component of `path`; `(unknown)` for an empty one.
pub fn file_name(path: &str) -> &str {
    match path.rsplit('/').next() {
        Some("") | None => "(unknown)",
        Some(name) => name,
    }
}

/// A framework whose memory habits the advice knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framework {
    /// PyTorch's caching allocator (libc10_cuda, libtorch_cuda).
    PyTorch,
    /// XLA (JAX, TensorFlow): preallocates most of the device at start.
    Xla,
    /// CuPy's memory pool.
    CuPy,
}

impl Framework {
    /// The framework the library at `path` belongs to, if any: by its file
    /// name, or by the package folders it lies in. Only the folders below
    /// the last `site-packages`/`dist-packages` count where there is one
    /// (a virtual environment under `/opt/torch` says nothing of the JAX
    /// installed in it).
    ///
    /// ```
    /// use trace::process::libraries::Framework;
    ///
    /// assert_eq!(Framework::of("/x/torch/lib/libc10_cuda.so"), Some(Framework::PyTorch));
    /// assert_eq!(Framework::of("/x/jaxlib/xla_extension.so"), Some(Framework::Xla));
    /// assert_eq!(Framework::of("/x/jax_plugins/xla_cuda13/xla_cuda_plugin.so"), Some(Framework::Xla));
    /// assert_eq!(
    ///     Framework::of("/opt/torch/.venv/lib/python3.12/site-packages/jaxlib/libjax_common.so"),
    ///     Some(Framework::Xla)
    /// );
    /// assert_eq!(Framework::of("/x/cupy/cuda/memory.cpython-312-x86_64-linux-gnu.so"), Some(Framework::CuPy));
    /// assert_eq!(Framework::of("/usr/bin/my_app"), None);
    /// ```
    pub fn of(path: &str) -> Option<Framework> {
        let lower = path.to_ascii_lowercase();
        let name = file_name(&lower);
        let folders = match (lower.rfind("site-packages/"), lower.rfind("dist-packages/")) {
            (None, None) => &lower[..],
            (a, b) => &lower[a.max(b).unwrap_or(0) + "site-packages/".len()..],
        };
        let folders = folders.split('/');
        let in_package = |names: &[&str]| folders.clone().any(|folder| names.contains(&folder));
        if name.contains("xla") || in_package(&["jaxlib", "jax_plugins", "jax"]) {
            Some(Framework::Xla)
        } else if name.starts_with("libc10")
            || name.starts_with("libtorch")
            || in_package(&["torch"])
        {
            Some(Framework::PyTorch)
        } else if name.starts_with("cupy") || in_package(&["cupy", "cupy_backends"]) {
            Some(Framework::CuPy)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_of_odd_paths() {
        assert_eq!(file_name(""), "(unknown)");
        assert_eq!(file_name("/"), "(unknown)");
        assert_eq!(file_name("app"), "app");
        assert_eq!(file_name("/a/b/libx.so.1"), "libx.so.1");
    }

    #[test]
    fn cuda_libraries_are_matched_by_file_name_only() {
        assert_eq!(classify("/home/libcuda.so.dir/app"), LibraryClass::Other);
        assert_eq!(classify("/t/libcudamem_interpose.so"), LibraryClass::Cuda);
        assert_eq!(classify("/usr/lib/libcublasLt.so.13"), LibraryClass::Other);
    }

    #[test]
    fn a_framework_is_told_by_its_package_not_by_the_environment_above_it() {
        let venv = "/opt/torch/.venv/lib/python3.12/site-packages";
        assert_eq!(
            Framework::of(&format!("{venv}/jaxlib/mosaic/libmosaic_gpu.so")),
            Some(Framework::Xla)
        );
        assert_eq!(
            Framework::of(&format!("{venv}/cupy_backends/cuda/api/driver.so")),
            Some(Framework::CuPy)
        );
        assert_eq!(
            Framework::of(&format!("{venv}/torch/lib/libshm.so")),
            Some(Framework::PyTorch)
        );
        assert_eq!(
            Framework::of(&format!("{venv}/nvidia/cublas/lib/libcublasLt.so.13")),
            None
        );
        assert_eq!(
            Framework::of("/tmp/fixtures/libxla_probe.so"),
            Some(Framework::Xla)
        );
    }
}
