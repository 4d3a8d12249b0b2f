//! What the `cudamem` binary does as a process, which only a process shows:
//! a reader that closes the pipe early (`cudamem explain | head -1`) ends
//! the command quietly, a full disk is an error, exit statuses say how a
//! run ended, `--help` says what the command is for, and the bare command's
//! report lands where git ignores it. Everything else is tested in process.

mod support;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root (the folder above harness/).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
}

fn rmm_trace() -> String {
    root()
        .join("traces/rmm/resnet50_train.csv.gz")
        .to_string_lossy()
        .into_owned()
}

/// Every subcommand's text and JSON output.
fn invocations() -> Vec<Vec<String>> {
    let trace = rmm_trace();
    [
        vec!["explain"],
        vec!["explain", "--json"],
        vec!["heap", "--size", "256"],
        vec!["heap", "--size", "256", "--json"],
        vec!["replay", "--policy", "tlsf", &trace],
        vec!["replay", "--policy", "tlsf", &trace, "--json"],
    ]
    .into_iter()
    .map(|args| args.into_iter().map(str::to_owned).collect())
    .collect()
}

fn cudamem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cudamem"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    for args in invocations() {
        let output = support::with_closed_stdout(&args);
        assert_eq!(
            output.status.code(),
            Some(0),
            "cudamem {args:?}: {}",
            text(&output.stderr)
        );
        assert!(
            output.stderr.is_empty(),
            "cudamem {args:?} wrote to stderr: {}",
            text(&output.stderr)
        );
    }
}

#[test]
fn a_full_disk_is_an_error_with_a_message() {
    for args in invocations() {
        let full = File::options().write(true).open("/dev/full").unwrap();
        let output = cudamem().args(&args).stdout(full).output().unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "cudamem {args:?}: {stderr}");
        assert!(
            stderr.contains("writing to standard output") && stderr.contains("No space left"),
            "cudamem {args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "cudamem {args:?}: {stderr}");
    }
}

#[test]
fn exit_statuses_say_how_a_run_ended() {
    // A failure: 1, and one line on stderr that says it is cudamem's.
    let output = cudamem()
        .args(["replay", "/nonexistent/trace.csv"])
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.starts_with("cudamem: /nonexistent/trace.csv: ") && stderr.lines().count() == 1,
        "{stderr}"
    );
    assert!(output.stdout.is_empty());
    // Arguments that do not parse: clap's 2.
    let output = cudamem().args(["heap", "--size=-1"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("invalid value"));
}

#[test]
fn help_says_what_cudamem_is_for_and_what_a_bare_run_does() {
    for flag in ["--help", "-h"] {
        let output = cudamem().arg(flag).output().unwrap();
        assert!(output.status.success());
        let help = text(&output.stdout);
        let first = help.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("Where did my GPU memory go?"),
            "{flag}: {first}"
        );
        assert!(!help.contains("Property tests"), "{flag}: {help}");
        assert!(
            help.contains("With no command, cudamem replays its built-in")
                && help.contains("cudamem-report.html"),
            "{flag}: {help}"
        );
    }
}

#[test]
fn the_bare_command_writes_its_report_where_git_ignores_it() {
    let scratch = support::temp_dir();
    let dir: PathBuf = scratch.path().to_path_buf();
    let output: Output = cudamem().current_dir(&dir).output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let name = "cudamem-report.html";
    assert!(
        text(&output.stdout).contains(&format!("report: {name}")),
        "{}",
        text(&output.stdout)
    );
    assert!(dir.join(name).is_file());
    let ignore = std::fs::read_to_string(root().join(".gitignore")).unwrap();
    assert!(
        ignore.lines().any(|line| line.trim() == format!("/{name}")),
        ".gitignore does not ignore /{name}:\n{ignore}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_crate_description_names_the_command() {
    let manifest = std::fs::read_to_string(root().join("harness/Cargo.toml")).unwrap();
    let description = manifest
        .lines()
        .find_map(|line| line.strip_prefix("description = "))
        .unwrap();
    assert!(description.contains("cudamem"), "{description}");
    assert!(!description.contains("benchmarks"), "{description}");
}
