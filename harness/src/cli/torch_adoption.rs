//! `cudamem run --torch POLICY`: cudamem's PyTorch backend in an unmodified PyTorch
//! program. The program is started through `env` with its Python path led by
//! `python/adopt/` (whose `sitecustomize.py` installs the backend right after the
//! program imports torch, before any CUDA call it can make, and runs any
//! sitecustomize it hides) and the backend's settings: the policy, the library and
//! the C++ sources. A backend that cannot be installed is told on stderr by the
//! program's Python, which then runs on PyTorch's own allocator.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The pool the backend runs PyTorch on (`CUDAMEM_POLICY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TorchPolicy {
    /// ctx's TLSF pool over VMM pages.
    Tlsf,
    /// ctx's stitched pool: pages mapped where needed.
    Stitch,
}

impl TorchPolicy {
    fn name(self) -> &'static str {
        match self {
            TorchPolicy::Tlsf => "tlsf",
            TorchPolicy::Stitch => "stitch",
        }
    }
}

/// Why the backend's files were not found.
#[derive(Debug, thiserror::Error)]
pub enum AdoptionError {
    /// No `python/adopt/sitecustomize.py` where a build or a bundle keeps it.
    #[error(
        "--torch: no python/adopt/sitecustomize.py near {exe} (looked in {looked}); set \
         CUDAMEM_TORCH_PY to the python/ folder of a cudamem checkout or bundle"
    )]
    NoPython {
        /// The `cudamem` executable.
        exe: String,
        /// The folders looked in.
        looked: String,
    },
}

/// Where a build (`target/{,cuda/}release/cudamem`) or a bundle (`bin/cudamem`) keeps
/// `name`, nearest first, from the folder of the `cudamem` executable.
fn near(exe_dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = vec![exe_dir.join(name)];
    for up in 1..=3 {
        let mut dir = exe_dir.to_path_buf();
        for _ in 0..up {
            dir.pop();
        }
        out.push(dir.join(name));
    }
    out
}

/// The program and arguments that run `program args` with the backend installed by
/// `policy`: `env NAME=VALUE... program args...`. `env_py` and `env_lib` are
/// `CUDAMEM_TORCH_PY` and `CUDAMEM_TORCH_LIB`; `python_path` the caller's
/// `PYTHONPATH`.
pub fn wrap(
    policy: TorchPolicy,
    program: OsString,
    args: Vec<OsString>,
    exe: &Path,
    env_py: Option<OsString>,
    env_lib: Option<OsString>,
    python_path: Option<OsString>,
) -> Result<(OsString, Vec<OsString>), AdoptionError> {
    let exe_dir = exe.parent().unwrap_or(Path::new("."));
    let candidates: Vec<PathBuf> = match env_py {
        Some(dir) => vec![PathBuf::from(dir)],
        None => near(exe_dir, "python"),
    };
    let python = candidates
        .iter()
        .find(|dir| dir.join("adopt/sitecustomize.py").is_file())
        .ok_or_else(|| AdoptionError::NoPython {
            exe: exe.display().to_string(),
            looked: candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    let mut path = OsString::from(python.join("adopt"));
    if let Some(rest) = python_path.filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(rest);
    }
    let setting = |name: &str, value: &OsString| {
        let mut pair = OsString::from(format!("{name}="));
        pair.push(value);
        pair
    };
    let mut wrapped = vec![
        setting("PYTHONPATH", &path),
        setting("CUDAMEM_TORCH_POLICY", &policy.name().into()),
        setting("CUDAMEM_POLICY", &policy.name().into()),
    ];
    let lib = env_lib.or_else(|| {
        let mut found = near(exe_dir, "libcudamem_torch.so");
        found.extend(near(exe_dir, "lib/libcudamem_torch.so"));
        found.extend(near(exe_dir, "target/cuda/release/libcudamem_torch.so"));
        found.into_iter().find(|p| p.is_file()).map(Into::into)
    });
    if let Some(lib) = lib {
        wrapped.push(setting("CUDAMEM_TORCH_LIB", &lib));
    }
    let cpp = [python.join("../torch-alloc/cpp"), python.join("../cpp")]
        .into_iter()
        .find(|dir| dir.join("cudamem_allocator.cpp").is_file());
    if let Some(cpp) = cpp {
        wrapped.push(setting("CUDAMEM_TORCH_CPP", &cpp.into_os_string()));
    }
    wrapped.push(program);
    wrapped.extend(args);
    Ok(("env".into(), wrapped))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder laid out as a checkout, removed when dropped.
    struct Layout(PathBuf);

    impl Layout {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Layout {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn layout() -> Layout {
        use std::sync::atomic::{AtomicU32, Ordering};
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let root = Layout(std::env::temp_dir().join(format!(
            "cudamem-torch-adoption-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )));
        let adopt = root.path().join("python/adopt");
        std::fs::create_dir_all(&adopt).unwrap();
        std::fs::write(adopt.join("sitecustomize.py"), "").unwrap();
        std::fs::create_dir_all(root.path().join("target/cuda/release")).unwrap();
        std::fs::write(
            root.path().join("target/cuda/release/libcudamem_torch.so"),
            "",
        )
        .unwrap();
        std::fs::create_dir_all(root.path().join("torch-alloc/cpp")).unwrap();
        std::fs::write(
            root.path().join("torch-alloc/cpp/cudamem_allocator.cpp"),
            "",
        )
        .unwrap();
        root
    }

    fn text(v: &[OsString]) -> Vec<String> {
        v.iter().map(|s| s.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn a_checkout_build_finds_its_python_library_and_sources() {
        let root = layout();
        let exe = root.path().join("target/release/cudamem");
        let (program, args) = wrap(
            TorchPolicy::Stitch,
            "python3".into(),
            vec!["train.py".into(), "--lr=1".into()],
            &exe,
            None,
            None,
            Some("/mine".into()),
        )
        .unwrap();
        assert_eq!(program, "env");
        let args = text(&args);
        let r = root.path().display();
        assert_eq!(args[0], format!("PYTHONPATH={r}/python/adopt:/mine"));
        assert_eq!(
            &args[1..3],
            ["CUDAMEM_TORCH_POLICY=stitch", "CUDAMEM_POLICY=stitch"]
        );
        assert!(
            args[3].starts_with("CUDAMEM_TORCH_LIB=") && args[3].ends_with("libcudamem_torch.so")
        );
        assert!(args[4].starts_with("CUDAMEM_TORCH_CPP="));
        assert_eq!(&args[5..], ["python3", "train.py", "--lr=1"]);
    }

    #[test]
    fn settings_given_win_and_a_missing_python_folder_is_named() {
        let root = layout();
        let (_, args) = wrap(
            TorchPolicy::Tlsf,
            "python3".into(),
            vec![],
            Path::new("/nowhere/bin/cudamem"),
            Some(root.path().join("python").into()),
            Some("/my/lib.so".into()),
            None,
        )
        .unwrap();
        let args = text(&args);
        assert!(args[0].ends_with("python/adopt"), "{args:?}");
        assert!(args.contains(&"CUDAMEM_TORCH_LIB=/my/lib.so".to_owned()));
        assert!(args.contains(&"CUDAMEM_POLICY=tlsf".to_owned()));
        let missing = wrap(
            TorchPolicy::Tlsf,
            "python3".into(),
            vec![],
            Path::new("/nowhere/bin/cudamem"),
            None,
            None,
            None,
        )
        .unwrap_err();
        assert!(
            missing.to_string().contains("CUDAMEM_TORCH_PY"),
            "{missing}"
        );
    }
}
