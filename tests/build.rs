//! Builds every plugin in `plugins/` for wasm32-wasip2 and tells the crate
//! where each component is. Cargo reruns this only when plugin, SDK or WIT
//! sources change; the nested build has its own target directory, so its
//! cache survives across test runs and profiles.

use std::path::{Path, PathBuf};
use std::process::Command;

fn watch(path: &Path) {
    println!("cargo:rerun-if-changed={}", path.display());
}

fn main() {
    let crate_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = crate_dir.parent().expect("tests/ sits in the workspace root");
    let plugins = root.join("plugins");
    let target_dir = plugins.join("target");

    watch(&root.join("wit"));
    watch(&root.join("guest-sdk/rust/src"));
    watch(&root.join("guest-sdk/rust/Cargo.toml"));
    watch(&plugins.join("Cargo.toml"));
    watch(&plugins.join("Cargo.lock"));
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&plugins).expect("plugins/ is readable") {
        let path = entry.expect("plugins/ entry").path();
        if path.join("Cargo.toml").is_file() {
            watch(&path.join("src"));
            watch(&path.join("Cargo.toml"));
            names.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    names.sort();

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--manifest-path"])
        .arg(plugins.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        // Flags meant for the host build must not leak into the guests'.
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .status()
        .expect("cannot run cargo to build the plugins");
    assert!(
        status.success(),
        "building plugins/ for wasm32-wasip2 failed; is the target installed? (rustup target add wasm32-wasip2)"
    );

    let out_dir = target_dir.join("wasm32-wasip2/release");
    let mut code =
        String::from("/// Built plugin components, by crate name.\npub const PLUGINS: &[(&str, &str)] = &[\n");
    for name in &names {
        let file = out_dir.join(format!("{}.wasm", name.replace('-', "_")));
        assert!(file.is_file(), "plugin {name} did not produce {}", file.display());
        code.push_str(&format!("    ({name:?}, {:?}),\n", file.display().to_string()));
    }
    code.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("plugins.rs");
    std::fs::write(out, code).expect("cannot write plugins.rs");
}
