//! Running the commands of a task: each is printed before it runs, and a
//! non-zero exit stops the task with an error that names the command.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// A `cargo` command: the cargo that runs xtask (`$CARGO`), else `cargo`.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Where cargo puts build outputs for this workspace: `$CARGO_TARGET_DIR`
/// (relative to the root), else `<root>/target`.
pub fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

/// The target folder of every build with the `cuda` feature: `<target>/cuda`,
/// so `target/{debug,release}/cudamem` stay the CPU build, which starts
/// without a driver (ARCHITECTURE.md, invariants).
pub fn cuda_target_dir(root: &Path) -> PathBuf {
    target_dir(root).join("cuda")
}

/// A `cargo` command in `root` for a build with the `cuda` feature: its
/// outputs go to [`cuda_target_dir`]; with `stub`, it links against the stub
/// libcuda in that folder (`CUDA_LIBRARY_PATH`).
pub fn cuda_cargo(root: &Path, stub: Option<&Path>) -> Command {
    let mut command = cargo();
    command
        .current_dir(root)
        .env("CARGO_TARGET_DIR", cuda_target_dir(root));
    if let Some(stub) = stub {
        command.env("CUDA_LIBRARY_PATH", stub);
    }
    command
}

/// How a command reads in logs: program, arguments and any variables set.
fn describe(command: &Command) -> String {
    let mut text = String::new();
    for (key, value) in command.get_envs() {
        if let Some(value) = value {
            text.push_str(&format!(
                "{}={} ",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
    }
    text.push_str(&command.get_program().to_string_lossy());
    for arg in command.get_args() {
        text.push(' ');
        text.push_str(&quote(arg));
    }
    text
}

fn quote(arg: &OsStr) -> String {
    let arg = arg.to_string_lossy();
    if arg.is_empty() || arg.contains([' ', '"', '\'', '$']) {
        format!("'{}'", arg.replace('\'', "'\\''"))
    } else {
        arg.into_owned()
    }
}

/// Prints `==> title` and the command, runs it with inherited output, and
/// fails unless it exits 0.
pub fn run(title: &str, command: &mut Command) -> Result<()> {
    println!("==> {title}\n    $ {}", describe(command));
    let status = command
        .status()
        .with_context(|| format!("starting `{}`", describe(command)))?;
    if !status.success() {
        bail!("{title} failed ({status}): `{}`", describe(command));
    }
    Ok(())
}

/// Runs the command with stderr inherited and returns its stdout; fails
/// unless it exits 0.
pub fn output(command: &mut Command) -> Result<String> {
    let out = command
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting `{}`", describe(command)))?;
    if !out.status.success() {
        bail!("`{}` failed ({})", describe(command), out.status);
    }
    String::from_utf8(out.stdout).with_context(|| format!("output of `{}`", describe(command)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_quotes_what_a_shell_would_split() {
        let mut command = Command::new("cargo");
        command
            .args(["clippy", "--", "-D", "warnings", "a b"])
            .env("X", "1");
        assert_eq!(describe(&command), "X=1 cargo clippy -- -D warnings 'a b'");
    }

    #[test]
    fn run_reports_a_failing_command() {
        let error = run("false", &mut Command::new("false")).unwrap_err();
        assert!(error.to_string().contains("false failed"), "{error}");
        assert!(run("true", &mut Command::new("true")).is_ok());
    }
}
