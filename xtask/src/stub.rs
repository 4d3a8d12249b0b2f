//! A stub `libcuda.so` so the CUDA backend builds and links on machines without a driver.
//!
//! `cust_raw` (under `cust`) links `-lcuda` and finds the library through
//! `find_cuda_helper`, which searches `$CUDA_LIBRARY_PATH/lib64` (then `/opt/cuda`,
//! `/usr/local/cuda`, `/usr/local/cuda-*`). CI machines have no CUDA, so we compile a
//! library that exports every `cu*` entry point `cust_raw` declares, each returning
//! `CUDA_ERROR_UNKNOWN` (999), and point `CUDA_LIBRARY_PATH` at it.
//!
//! The names are parsed from the `cust_raw` sources cargo downloaded, at run time, so the
//! stub cannot drift from the bindings. The stub's soname is `libcuda.so.1`, the driver's
//! own, and it is found only through a link search path: binaries carry no rpath to it,
//! so on a GPU machine the dynamic loader picks the real driver library.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};

use crate::step;

/// `CUDA_ERROR_UNKNOWN`: what every stub entry point returns.
const STUB_RESULT: u32 = 999;

/// Fewer entry points than this means the bindings file was not what we expected.
const MIN_ENTRY_POINTS: usize = 100;

/// Builds (or reuses) the stub and returns the folder to export as `CUDA_LIBRARY_PATH`.
///
/// The folder is `<target dir>/cuda-stub` (`$CARGO_TARGET_DIR`, else
/// `<workspace_root>/target`); it holds `lib64/libcuda.so` for the linker and
/// `lib64/libcuda.so.1` so a test binary can be started against the stub with
/// `LD_LIBRARY_PATH=<folder>/lib64` (every driver call then fails with
/// `CUDA_ERROR_UNKNOWN`). Compiles only when the generated C source changed.
pub fn generate(workspace_root: &Path) -> anyhow::Result<PathBuf> {
    build(workspace_root, &cust_raw_bindings(workspace_root, None)?)
}

/// [`generate`], finding `cust_raw`'s sources through a `CARGO_HOME` that is
/// empty at the start (`<target dir>/fresh-cargo-home`, removed first and
/// after), as on a fresh machine: what CI runs, so a change that breaks the
/// fresh-registry case fails there. Only the user's cargo configuration is
/// carried over (a registry mirror must still apply); no registry, no caches.
pub fn generate_from_empty_home(workspace_root: &Path) -> anyhow::Result<PathBuf> {
    let home = step::target_dir(workspace_root).join("fresh-cargo-home");
    empty_cargo_home(&home, user_cargo_home().as_deref())?;
    let bindings = cust_raw_bindings(workspace_root, Some(&home))?;
    ensure!(
        bindings.starts_with(&home),
        "cust_raw's sources were found at {}, not downloaded into the empty CARGO_HOME {}",
        bindings.display(),
        home.display()
    );
    let stub = build(workspace_root, &bindings)?;
    fs::remove_dir_all(&home).with_context(|| format!("removing {}", home.display()))?;
    Ok(stub)
}

/// Makes `home` an empty cargo home: removes it, creates it, and copies the
/// configuration files (only) of `user_home`.
fn empty_cargo_home(home: &Path, user_home: Option<&Path>) -> anyhow::Result<()> {
    if home.exists() {
        fs::remove_dir_all(home).with_context(|| format!("removing {}", home.display()))?;
    }
    fs::create_dir_all(home).with_context(|| format!("creating {}", home.display()))?;
    for name in ["config.toml", "config"] {
        let Some(config) = user_home.map(|user| user.join(name)) else {
            continue;
        };
        if config.is_file() {
            fs::copy(&config, home.join(name))
                .with_context(|| format!("copying {}", config.display()))?;
        }
    }
    Ok(())
}

/// The user's cargo home: `$CARGO_HOME`, else `~/.cargo`.
fn user_cargo_home() -> Option<PathBuf> {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
}

/// Builds the stub from `cust_raw`'s bindings file; returns the folder.
fn build(workspace_root: &Path, bindings_path: &Path) -> anyhow::Result<PathBuf> {
    let bindings = fs::read_to_string(bindings_path)
        .with_context(|| format!("reading {}", bindings_path.display()))?;
    let names = entry_points(&bindings);
    ensure!(
        names.len() >= MIN_ENTRY_POINTS && names.iter().any(|n| n == "cuInit"),
        "found only {} cu* functions in {}; is this cust_raw's bindings file?",
        names.len(),
        bindings_path.display()
    );
    let source = c_source(&names, bindings_path);

    let dir = step::target_dir(workspace_root).join("cuda-stub");
    let lib64 = dir.join("lib64");
    fs::create_dir_all(&lib64).with_context(|| format!("creating {}", lib64.display()))?;
    let source_path = dir.join("libcuda_stub.c");
    let library = lib64.join("libcuda.so");
    let versioned = lib64.join("libcuda.so.1");
    let up_to_date = fs::read_to_string(&source_path).is_ok_and(|old| old == source)
        && library.is_file()
        && versioned.is_file();
    if up_to_date {
        return Ok(dir);
    }

    fs::write(&source_path, &source)
        .with_context(|| format!("writing {}", source_path.display()))?;
    let compiler = env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&compiler)
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&library)
        .arg(&source_path)
        .status()
        .with_context(|| format!("running the C compiler `{compiler}`"))?;
    if !status.success() {
        bail!("`{compiler}` failed to build the stub libcuda ({status})");
    }
    // A copy rather than a symlink: it survives being carried as a plain file.
    fs::copy(&library, &versioned).with_context(|| format!("writing {}", versioned.display()))?;
    Ok(dir)
}

/// The names of every `pub fn cu*` declared in bindgen output, sorted, without duplicates.
fn entry_points(bindings: &str) -> Vec<String> {
    let mut names: Vec<String> = bindings
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("pub fn "))
        .filter_map(|rest| {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))?;
            let name = &rest[..end];
            (name.starts_with("cu") && rest[end..].starts_with('(')).then(|| name.to_owned())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// C source defining each entry point as a function that returns [`STUB_RESULT`].
fn c_source(names: &[String], bindings_path: &Path) -> String {
    // Named from the package folder on: the same bindings give the same
    // source (and no rebuild) whichever cargo home holds them.
    let components: Vec<_> = bindings_path.components().collect();
    let from_package = components[components.len().saturating_sub(3)..]
        .iter()
        .collect::<PathBuf>();
    let mut source = format!(
        "/* Generated by `cargo xtask` (xtask/src/stub.rs) from {}.\n   \
         Every CUDA driver entry point fails with CUDA_ERROR_UNKNOWN. Do not edit. */\n",
        from_package.display()
    );
    for name in names {
        source.push_str(&format!("int {name}(void) {{ return {STUB_RESULT}; }}\n"));
    }
    source
}

/// The `cust_raw` version the workspace lock file pins.
fn locked_cust_raw_version(workspace_root: &Path) -> anyhow::Result<String> {
    let lock_path = workspace_root.join("Cargo.lock");
    let lock = fs::read_to_string(&lock_path)
        .with_context(|| format!("reading {}", lock_path.display()))?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"cust_raw\"" {
            let version = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = \""))
                .and_then(|v| v.strip_suffix('"'));
            if let Some(version) = version {
                return Ok(version.to_owned());
            }
        }
    }
    bail!("{} does not pin cust_raw", lock_path.display())
}

/// Path of `cust_raw`'s `src/cuda.rs`: first in the cargo home's registry
/// sources, else wherever `cargo metadata` (which downloads missing sources)
/// says the package lives. `cargo_home`: that folder, or `None` for the
/// user's.
fn cust_raw_bindings(workspace_root: &Path, cargo_home: Option<&Path>) -> anyhow::Result<PathBuf> {
    let version = locked_cust_raw_version(workspace_root)?;
    let package_dir = format!("cust_raw-{version}");
    let registry = cargo_home
        .map(Path::to_path_buf)
        .or_else(user_cargo_home)
        .map(|home| home.join("registry").join("src"));
    let indexes = registry.and_then(|registry| fs::read_dir(registry).ok());
    for index in indexes.into_iter().flatten().flatten() {
        let candidate = index.path().join(&package_dir).join("src").join("cuda.rs");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }

    let mut command = metadata_command(workspace_root, cargo_home);
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    ensure!(
        output.status.success(),
        "`cargo metadata` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata = String::from_utf8_lossy(&output.stdout);
    let package_root = package_root_in_metadata(&metadata, &package_dir)
        .with_context(|| format!("`cargo metadata` lists no {package_dir}"))?;
    Ok(package_root.join("src").join("cuda.rs"))
}

/// `cargo metadata` for the workspace with the `cuda` features, in
/// `cargo_home` if given.
fn metadata_command(workspace_root: &Path, cargo_home: Option<&Path>) -> Command {
    let mut command = step::cargo();
    // `cust` is optional (feature `cuda`): without the features cargo neither
    // lists nor downloads it.
    command
        .args(["metadata", "--format-version", "1", "--features"])
        .arg(crate::ci::CUDA_FEATURES)
        .current_dir(workspace_root);
    if let Some(home) = cargo_home {
        command.env("CARGO_HOME", home);
    }
    command
}

/// The folder of the package whose folder is named `package_dir`, from `cargo metadata`
/// JSON (its `manifest_path` ends in `<package_dir>/Cargo.toml`).
fn package_root_in_metadata(metadata: &str, package_dir: &str) -> Option<PathBuf> {
    let end = metadata.find(&format!("{package_dir}/Cargo.toml\""))?;
    let start = metadata[..end].rfind('"')? + 1;
    Some(PathBuf::from(&metadata[start..end + package_dir.len()]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_takes_cu_functions_only() {
        let bindings = r#"
pub struct CUuuid_st { pub bytes: [u8; 16] }
extern "C" {
    pub fn cuInit(Flags: ::std::os::raw::c_uint) -> CUresult;
}
extern "C" {
    pub fn cuMemGetInfo_v2(
        free: *mut usize,
        total: *mut usize,
    ) -> CUresult;
}
impl CUuuid_st { pub fn bytes(&self) -> u8 { 0 } }
    pub fn_: CUhostFn,
extern "C" {
    pub fn cuInit(Flags: ::std::os::raw::c_uint) -> CUresult;
}
"#;
        assert_eq!(entry_points(bindings), ["cuInit", "cuMemGetInfo_v2"]);
    }

    #[test]
    fn package_root_comes_from_the_manifest_path() {
        let metadata =
            r#"{"packages":[{"name":"cust_raw","manifest_path":"/r/cust_raw-0.11.3/Cargo.toml"}]}"#;
        assert_eq!(
            package_root_in_metadata(metadata, "cust_raw-0.11.3"),
            Some(PathBuf::from("/r/cust_raw-0.11.3"))
        );
        assert_eq!(package_root_in_metadata(metadata, "cust_raw-0.12.0"), None);
    }

    #[test]
    fn the_stub_source_does_not_depend_on_the_cargo_home() {
        let names = ["cuInit".to_owned()];
        let user = c_source(
            &names,
            Path::new("/root/.cargo/registry/src/index-1/cust_raw-0.11.3/src/cuda.rs"),
        );
        let fresh = c_source(
            &names,
            Path::new(
                "/w/target/fresh-cargo-home/registry/src/index-2/cust_raw-0.11.3/src/cuda.rs",
            ),
        );
        assert_eq!(user, fresh);
        assert!(user.contains("from cust_raw-0.11.3/src/cuda.rs."), "{user}");
    }

    #[test]
    fn an_empty_cargo_home_keeps_the_configuration_only() {
        let dir = std::env::temp_dir().join(format!("xtask-home-{}", std::process::id()));
        let user = dir.join("user");
        let home = dir.join("fresh");
        fs::create_dir_all(user.join("registry/src/index/cust_raw-0.11.3/src")).unwrap();
        fs::write(user.join("config.toml"), "[net]\nretry = 3\n").unwrap();
        fs::write(user.join("credentials.toml"), "secret").unwrap();
        // Left over from an earlier run: must be gone.
        fs::create_dir_all(home.join("registry/src/index/cust_raw-0.11.3/src")).unwrap();

        empty_cargo_home(&home, Some(&user)).unwrap();
        let mut left: Vec<_> = fs::read_dir(&home)
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .collect();
        left.sort();
        assert_eq!(left, ["config.toml"]);
        assert_eq!(
            fs::read_to_string(home.join("config.toml")).unwrap(),
            "[net]\nretry = 3\n"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn metadata_runs_in_the_given_cargo_home_with_the_cuda_features() {
        let home = Path::new("/w/target/fresh-cargo-home");
        let command = metadata_command(Path::new("/w"), Some(home));
        let args: Vec<_> = command.get_args().collect();
        assert!(args.contains(&std::ffi::OsStr::new(crate::ci::CUDA_FEATURES)));
        assert!(
            command
                .get_envs()
                .any(|(key, value)| key == "CARGO_HOME" && value == Some(home.as_os_str()))
        );
        let user = metadata_command(Path::new("/w"), None);
        assert!(user.get_envs().all(|(key, _)| key != "CARGO_HOME"));
    }

    #[test]
    fn c_source_returns_unknown_error_from_every_entry_point() {
        let names = ["cuInit".to_owned(), "cuMemAlloc_v2".to_owned()];
        let source = c_source(&names, Path::new("cuda.rs"));
        assert!(source.contains("int cuInit(void) { return 999; }\n"));
        assert!(source.contains("int cuMemAlloc_v2(void) { return 999; }\n"));
    }
}
