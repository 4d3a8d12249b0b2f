//! Running the commands of a task: each is printed before it runs, and a
//! non-zero exit stops the task with an error that names the command.

use std::ffi::OsStr;
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// A `cargo` command: the cargo that runs xtask (`$CARGO`), else `cargo`.
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
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
