//! The modules compiled with relocatable device code (`kernels::cm_link`):
//! each assembles with ptxas as relocatable code, the example user module
//! declares `cm_malloc`/`cm_free` and the library defines them, and nvlink
//! links the two into one image with nothing left unresolved, while the
//! user module alone does not link. The driver's link step (ctx) does what
//! nvlink does here.
//!
//! ptxas and nvlink come from the pinned `nvidia-cuda-nvcc` wheel (`cargo
//! xtask cuda-tools`), or nvlink beside the ptxas in `KERNELS_PTXAS`.

use std::path::{Path, PathBuf};
use std::process::Command;

use kernels::Module;
use kernels::cm_link::{EXPORTS, LIBRARY, LINKED, USER_EXAMPLE};

fn tool(name: &str) -> PathBuf {
    let ptxas = std::env::var_os("KERNELS_PTXAS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/cuda-tools/nvidia/cu13/bin/ptxas"),
        PathBuf::from,
    );
    let path = ptxas.with_file_name(name);
    assert!(
        path.is_file(),
        "{name} not found at {}: run `cargo xtask cuda-tools`",
        path.display()
    );
    path
}

fn run(command: &mut Command) -> (bool, String) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

/// Assembles `module` as relocatable code into `dir`; the cubin's path.
fn assemble(module: &Module, dir: &Path) -> PathBuf {
    let source = dir.join(format!("{}.ptx", module.name));
    std::fs::write(&source, module.ptx).unwrap();
    let cubin = dir.join(format!("{}.cubin", module.name));
    let (ok, report) = run(Command::new(tool("ptxas"))
        .args(["-arch=sm_90", "-c", "-o"])
        .arg(&cubin)
        .arg(&source));
    assert!(ok, "ptxas -c rejected {}: {report}", module.name);
    cubin
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kernels-link-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_library_defines_and_the_user_module_declares_the_exports() {
    for name in EXPORTS {
        assert!(
            LIBRARY
                .ptx
                .lines()
                .any(|l| l.starts_with(".visible .func") && l.contains(&format!(" {name}("))),
            "cm_link.ptx defines {name}"
        );
        assert!(
            USER_EXAMPLE
                .ptx
                .lines()
                .any(|l| l.starts_with(".extern .func") && l.trim_end().ends_with(name)),
            "cm_user.ptx declares {name}"
        );
    }
    assert!(
        LIBRARY
            .ptx
            .contains(".visible .global .align 8 .u64 cm_heap;")
    );
    for module in LINKED {
        for kernel in module.kernels {
            assert!(
                module
                    .ptx
                    .contains(&format!(".visible .entry {}(", kernel.name)),
                "{} in {}",
                kernel.name,
                module.name
            );
        }
    }
}

#[test]
fn nvlink_links_the_user_module_with_the_library_and_not_alone() {
    let dir = scratch("nvlink");
    let library = assemble(&LIBRARY, &dir);
    let user = assemble(&USER_EXAMPLE, &dir);
    let linked = dir.join("linked.cubin");
    let (ok, report) = run(Command::new(tool("nvlink"))
        .args(["-arch=sm_90", "-o"])
        .arg(&linked)
        .arg(&user)
        .arg(&library));
    assert!(ok, "nvlink of cm_user + cm_link failed: {report}");
    assert!(std::fs::metadata(&linked).unwrap().len() > 0);
    let (ok, report) = run(Command::new(tool("nvlink"))
        .args(["-arch=sm_90", "-o"])
        .arg(dir.join("alone.cubin"))
        .arg(&user));
    assert!(!ok, "cm_user linked without the library: {report}");
    assert!(
        report.contains("cm_malloc") || report.contains("cm_free"),
        "nvlink's error names the missing function: {report}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
