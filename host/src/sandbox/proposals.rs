//! The WebAssembly proposals the engine accepts: one allow-list.
//!
//! wasmtime's defaults are not leash's. `Config::new()` turns on every
//! proposal wasmtime ships (WebAssembly 3.0: GC, typed function
//! references, exceptions, tail calls, multi-memory, memory64, threads,
//! …) and clears only what the crate was built without, so a build with
//! no `gc` feature still validated GC-typed code, and wasmtime 48.0.8
//! aborts the whole process on it (advisory GHSA-rc4p-x33f-vpr2). Bugs of
//! that class live in proposals no supported guest toolchain emits. So
//! the engine is told every proposal explicitly, from [`PROPOSALS`]: on
//! only what Rust (wasm32-wasip2), componentize-py and componentize-js
//! emit, off everything else. A component that uses an off proposal is
//! refused at load, naming it (`unsupported_by`).

// The same wasmparser wasmtime validates with (one version in the lock).
use wasmparser::{Validator, WasmFeatures};

/// One proposal (or wasmparser feature flag) and whether leash enables it.
#[derive(Debug, Clone, Copy)]
pub struct Proposal {
    /// wasmparser's name for the flag.
    pub name: &'static str,
    /// The flag.
    pub flags: WasmFeatures,
    /// Whether the engine accepts components that use it.
    pub enabled: bool,
    /// Why.
    pub why: &'static str,
}

const EMITTED: &str = "emitted by the supported toolchains";
const WASM2: &str = "WebAssembly 2.0; Rust emits it with -C target-feature=+simd128";
const UNUSED: &str = "no supported toolchain emits it";

const fn on(name: &'static str, flags: WasmFeatures, why: &'static str) -> Proposal {
    Proposal { name, flags, enabled: true, why }
}

const fn off(name: &'static str, flags: WasmFeatures, why: &'static str) -> Proposal {
    Proposal { name, flags, enabled: false, why }
}

/// Every flag wasmparser knows, on or off. A test fails when a wasmtime
/// upgrade brings a flag this table does not name.
pub const PROPOSALS: &[Proposal] = &[
    on("floats", WasmFeatures::FLOATS, "WebAssembly 1.0"),
    on("mutable_global", WasmFeatures::MUTABLE_GLOBAL, EMITTED),
    on("saturating_float_to_int", WasmFeatures::SATURATING_FLOAT_TO_INT, EMITTED),
    on("sign_extension", WasmFeatures::SIGN_EXTENSION, EMITTED),
    on("reference_types", WasmFeatures::REFERENCE_TYPES, EMITTED),
    on("call_indirect_overlong", WasmFeatures::CALL_INDIRECT_OVERLONG, EMITTED),
    on("multi_value", WasmFeatures::MULTI_VALUE, EMITTED),
    on("bulk_memory", WasmFeatures::BULK_MEMORY, EMITTED),
    on("bulk_memory_opt", WasmFeatures::BULK_MEMORY_OPT, EMITTED),
    on("simd", WasmFeatures::SIMD, WASM2),
    on("extended_const", WasmFeatures::EXTENDED_CONST, "componentize-py 0.25 emits it"),
    on("component_model", WasmFeatures::COMPONENT_MODEL, "the plugin contract is a component"),
    off("gc", WasmFeatures::GC, "typed subtyping aborted the host in wasmtime 48.0.8; no supported toolchain emits it"),
    off("gc_types", WasmFeatures::GC_TYPES, "needs wasmtime's gc support, not built"),
    off("function_references", WasmFeatures::FUNCTION_REFERENCES, UNUSED),
    off("exceptions", WasmFeatures::EXCEPTIONS, UNUSED),
    off("legacy_exceptions", WasmFeatures::LEGACY_EXCEPTIONS, UNUSED),
    off("tail_call", WasmFeatures::TAIL_CALL, UNUSED),
    off("multi_memory", WasmFeatures::MULTI_MEMORY, UNUSED),
    off("memory64", WasmFeatures::MEMORY64, UNUSED),
    off("relaxed_simd", WasmFeatures::RELAXED_SIMD, "results differ between hosts; no supported toolchain emits it"),
    off("threads", WasmFeatures::THREADS, "a job is one thread"),
    off("shared_everything_threads", WasmFeatures::SHARED_EVERYTHING_THREADS, UNUSED),
    off("custom_page_sizes", WasmFeatures::CUSTOM_PAGE_SIZES, UNUSED),
    off("memory_control", WasmFeatures::MEMORY_CONTROL, UNUSED),
    off("stack_switching", WasmFeatures::STACK_SWITCHING, UNUSED),
    off("wide_arithmetic", WasmFeatures::WIDE_ARITHMETIC, UNUSED),
    off("custom_descriptors", WasmFeatures::CUSTOM_DESCRIPTORS, UNUSED),
    off("compact_imports", WasmFeatures::COMPACT_IMPORTS, UNUSED),
    off("cm_values", WasmFeatures::CM_VALUES, UNUSED),
    off("cm_nested_names", WasmFeatures::CM_NESTED_NAMES, UNUSED),
    off("cm_async", WasmFeatures::CM_ASYNC, "the contract is WASI 0.2, synchronous"),
    off("cm_async_stackful", WasmFeatures::CM_ASYNC_STACKFUL, UNUSED),
    off("cm_more_async_builtins", WasmFeatures::CM_MORE_ASYNC_BUILTINS, UNUSED),
    off("cm_threading", WasmFeatures::CM_THREADING, UNUSED),
    off("cm_error_context", WasmFeatures::CM_ERROR_CONTEXT, UNUSED),
    off("cm_fixed_length_lists", WasmFeatures::CM_FIXED_LENGTH_LISTS, UNUSED),
    off("cm_gc", WasmFeatures::CM_GC, UNUSED),
    off("cm_map", WasmFeatures::CM_MAP, UNUSED),
    off("cm64", WasmFeatures::CM64, UNUSED),
    off("cm_implements", WasmFeatures::CM_IMPLEMENTS, UNUSED),
    off("cm_canon_names", WasmFeatures::CM_CANON_NAMES, UNUSED),
];

/// The flags the engine enables: the table's `on` rows, nothing else.
pub fn enabled() -> WasmFeatures {
    PROPOSALS.iter().filter(|p| p.enabled).fold(WasmFeatures::empty(), |all, p| all | p.flags)
}

/// Tell `config` every proposal: first all off, then the allowed on.
pub(super) fn configure(config: &mut wasmtime::Config) {
    config.wasm_features(WasmFeatures::all(), false);
    config.wasm_features(enabled(), true);
}

/// The names of the off proposals `bytes` needs, when wasmtime refused it
/// for using them: `None` when the bytes are invalid for another reason
/// (or valid as they are). Runs only after a refusal, on the compile
/// threads: one validation with everything on, then one per off proposal,
/// dropping each one the component validates without.
pub(super) fn unsupported_by(bytes: &[u8]) -> Option<Vec<&'static str>> {
    let valid = |features: WasmFeatures| Validator::new_with_features(features).validate_all(bytes).is_ok();
    let allowed = enabled();
    if valid(allowed) {
        return None;
    }
    let mut needed: Vec<&Proposal> = PROPOSALS.iter().filter(|p| !p.enabled).collect();
    let with = |set: &[&Proposal]| set.iter().fold(allowed, |all, p| all | p.flags);
    if !valid(with(&needed)) {
        return None;
    }
    let mut i = 0;
    while i < needed.len() {
        let mut without = needed.clone();
        without.remove(i);
        if valid(with(&without)) {
            needed = without;
        } else {
            i += 1;
        }
    }
    Some(needed.iter().map(|p| p.name).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_every_flag_wasmparser_knows_once() {
        let named = PROPOSALS.iter().fold(WasmFeatures::empty(), |all, p| all | p.flags);
        for (name, flag) in WasmFeatures::all().iter_names() {
            assert!(
                named.contains(flag),
                "wasmparser knows the flag {name} and the proposals table does not: decide on or off"
            );
            let name = name.to_lowercase();
            assert_eq!(PROPOSALS.iter().filter(|p| p.name == name).count(), 1, "{name} is named once");
        }
    }

    #[test]
    fn on_and_off_never_share_a_bit() {
        let off = PROPOSALS.iter().filter(|p| !p.enabled).fold(WasmFeatures::empty(), |all, p| all | p.flags);
        assert!((off & enabled()).is_empty(), "{:?}", off & enabled());
    }

    #[test]
    fn a_gc_typed_module_is_traced_to_the_gc_proposal() {
        let module = wat::parse_str(
            "(module (type $a (sub (func))) (type $b (sub $a (func))) (func (type $b)) (table 1 funcref) \
             (func (call_indirect (type $a) (i32.const 0))))",
        )
        .unwrap();
        assert_eq!(unsupported_by(&module), Some(vec!["gc"]));
        assert_eq!(unsupported_by(b"\0asm\x01\0\0\0junk"), None, "not a proposal problem");
        assert_eq!(unsupported_by(&wat::parse_str("(module)").unwrap()), None, "valid as it is");
    }
}
