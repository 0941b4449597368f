//! Arbitrary valid WebAssembly, generated with every proposal turned on,
//! wrapped as a `leash:plugin` guest and run through the sandbox as `leash
//! run` configures it (small limits). Must hold: no abort, no panic, no
//! `host_error`; and the engine accepts a component exactly when a
//! validator given leash's proposal allow-list does (a component it
//! refuses for a proposal must be one the allow-list refuses).
//!
//! The generated module (wasm-smith, no imports, every item exported) is
//! instantiated inside a component beside a small caller module whose
//! `run` calls each exported function of plain value types with zeros and
//! then returns an empty output.

#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use leash::job::{ErrorKind, Target};
use leash::sandbox::{Allocator, NoObserver, RunLimits, RunRequest, Sandbox, SandboxConfig, SandboxError, StopHandle};
use libfuzzer_sys::arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use wasmparser::{Payload, ValType, Validator};

struct Harness {
    tokio: tokio::runtime::Runtime,
    sandbox: Sandbox,
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let sandbox = Sandbox::new(SandboxConfig {
            allocator: Allocator::Pooling { slots: 4 },
            memory_ceiling_bytes: 64 << 20,
            ..SandboxConfig::default()
        })
        .unwrap();
        Harness { tokio, sandbox }
    })
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(mut config) = wasm_smith::Config::arbitrary(&mut u) else { return };
    config.gc_enabled = true;
    config.exceptions_enabled = true;
    config.tail_call_enabled = true;
    config.simd_enabled = true;
    config.relaxed_simd_enabled = true;
    config.threads_enabled = true;
    config.memory64_enabled = true;
    config.multi_value_enabled = true;
    config.reference_types_enabled = true;
    config.bulk_memory_enabled = true;
    config.wide_arithmetic_enabled = true;
    config.extended_const_enabled = true;
    config.custom_page_sizes_enabled = u.arbitrary().unwrap_or(false);
    config.saturating_float_to_int_enabled = true;
    config.sign_extension_ops_enabled = true;
    config.max_imports = 0;
    config.export_everything = true;
    config.max_funcs = config.max_funcs.min(20);
    config.max_instructions = config.max_instructions.min(200);
    config.max_memories = config.max_memories.min(2);
    config.max_tables = config.max_tables.min(4);
    config.max_memory32_bytes = config.max_memory32_bytes.min(4 << 20);
    config.max_memory64_bytes = config.max_memory64_bytes.min(4 << 20);
    config.max_table_elements = config.max_table_elements.min(1000);
    let Ok(module) = wasm_smith::Module::new(config, &mut u) else { return };
    let Some(component) = wrap(&module.to_bytes()) else { return };

    let h = harness();
    let allowed = Validator::new_with_features(leash::sandbox::proposals::enabled()).validate_all(&component).is_ok();
    match h.sandbox.load(&component) {
        Ok(plugin) => {
            assert!(allowed, "the engine loaded a component the proposal allow-list refuses");
            let limits = RunLimits {
                timeout: Duration::from_millis(500),
                fuel: Some(5_000_000),
                memory_bytes: 16 << 20,
                cancel_grace: Duration::from_millis(50),
                ..RunLimits::default()
            };
            let request = RunRequest::new(Target::Execute, Vec::new(), limits);
            let outcome = h.tokio.block_on(h.sandbox.run(&plugin, request, &StopHandle::new(), Arc::new(NoObserver)));
            if let Err(failure) = &outcome.result {
                assert_ne!(failure.kind, ErrorKind::HostError, "a guest caused a host error: {}", failure.message);
            }
        }
        Err(e @ SandboxError::UnsupportedProposal(_)) => {
            assert!(!allowed, "refused for a proposal the allow-list accepts: {e}");
        }
        // Refused for another reason (a compile limit, an engine limit).
        Err(_) => {}
    }
});

/// The component text around `core`, or `None` where the module cannot
/// be printed back to text.
fn wrap(core: &[u8]) -> Option<Vec<u8>> {
    let printed = wasmprinter::print_bytes(core).ok()?;
    // The fields, without the `(module` line and the closing paren.
    let body = printed.split_once('\n').map_or("", |(_, rest)| rest).trim_end().strip_suffix(')')?;
    let (imports, calls) = callers(core)?;
    let text = format!(
        r#"(component
  (core module $s {body})
  (core instance $si (instantiate $s))
  (core module $m
    {imports}
    (memory (export "memory") 1)
    (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32) i32.const 1024)
    (func (export "run") (param i32 i32 i32 i32 i32 i32 i64 i32 i32) (result i32)
      {calls}
      i32.const 16 i32.const 0 i32.store8
      i32.const 20 i32.const 0 i32.store
      i32.const 24 i32.const 0 i32.store
      i32.const 16))
  (core instance $i (instantiate $m (with "s" (instance $si))))
  (type $target0 (variant (case "execute") (case "apply") (case "action" string)))
  (export $target "target" (type $target0))
  (type $ctx0 (record (field "job-id" string) (field "target" $target) (field "attempt" u32)
                      (field "deadline-unix-ms" u64)))
  (export $ctx "job-context" (type $ctx0))
  (type $err0 (variant (case "failed" string) (case "invalid-input" string) (case "retryable" string)))
  (export $err "job-error" (type $err0))
  (type $run (func (param "ctx" $ctx) (param "input" (list u8)) (result (result (list u8) (error $err)))))
  (func $run (type $run) (canon lift (core func $i "run") (memory (core memory $i "memory"))
    (realloc (core func $i "cabi_realloc"))))
  (export "run" (func $run)))"#
    );
    wat::parse_str(text).ok()
}

/// Imports of each exported function of plain value types, and the calls
/// of them with zero arguments, results dropped.
fn callers(core: &[u8]) -> Option<(String, String)> {
    let mut types = Vec::new();
    let mut functions = Vec::new();
    let (mut imports, mut calls, mut n) = (String::new(), String::new(), 0);
    for payload in wasmparser::Parser::new(0).parse_all(core) {
        match payload.ok()? {
            Payload::TypeSection(reader) => {
                for group in reader {
                    for sub in group.ok()?.into_types() {
                        types.push(match &sub.composite_type.inner {
                            wasmparser::CompositeInnerType::Func(f) => {
                                Some((f.params().to_vec(), f.results().to_vec()))
                            }
                            _ => None,
                        });
                    }
                }
            }
            Payload::FunctionSection(reader) => {
                for ty in reader {
                    functions.push(ty.ok()?);
                }
            }
            Payload::ExportSection(reader) => {
                for export in reader {
                    let export = export.ok()?;
                    if export.kind != wasmparser::ExternalKind::Func {
                        continue;
                    }
                    let Some(Some((params, results))) =
                        functions.get(export.index as usize).and_then(|t| types.get(*t as usize))
                    else {
                        continue;
                    };
                    let plain = |v: &ValType| matches!(v, ValType::I32 | ValType::I64 | ValType::F32 | ValType::F64);
                    if !params.iter().chain(results).all(plain) {
                        continue;
                    }
                    n += 1;
                    let name: String = export.name.bytes().map(|b| format!("\\{b:02x}")).collect();
                    let sig = |kw: &str, list: &[ValType]| {
                        list.iter().map(|v| format!("({kw} {})", v.to_string())).collect::<Vec<_>>().join(" ")
                    };
                    imports.push_str(&format!(
                        "(import \"s\" \"{name}\" (func $f{n} {} {}))\n",
                        sig("param", params),
                        sig("result", results)
                    ));
                    for p in params {
                        calls.push_str(&format!("{p}.const 0 "));
                    }
                    calls.push_str(&format!("call $f{n} "));
                    for _ in results {
                        calls.push_str("drop ");
                    }
                }
            }
            _ => {}
        }
    }
    Some((imports, calls))
}
