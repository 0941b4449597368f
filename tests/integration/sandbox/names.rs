//! A component shrunk by `leash plugins shrink` (its function names moved
//! into one compressed `leash:names` section) traps with the backtrace of
//! the build it came from, on either compiler tier (`LEASH_TEST_TIER`).

use std::sync::Arc;

use leash::sandbox::names::shrink;
use leash::sandbox::{NoObserver, Sandbox, SandboxError, StopHandle};
use leash_tests::plugin_bytes;
use wasmparser::{Parser, Payload};

use crate::support::{self, limits, output_json, request};

/// Name sections at any depth: the core modules' `name`, the component's
/// `component-name`.
fn name_sections(component: &[u8]) -> usize {
    Parser::new(0)
        .parse_all(component)
        .filter(|p| matches!(p, Ok(Payload::CustomSection(c)) if c.name() == "name" || c.name() == "component-name"))
        .count()
}

async fn trap_backtrace(sandbox: &Sandbox, component: &[u8]) -> String {
    let plugin = sandbox.load(component).expect("loads");
    let outcome = sandbox.run(&plugin, request(b"", limits()), &StopHandle::new(), Arc::new(NoObserver)).await;
    outcome.result.expect_err("it traps").backtrace.expect("a backtrace")
}

#[tokio::test]
async fn a_shrunk_component_traps_with_the_backtrace_of_its_build() {
    let sandbox = support::sandbox();
    // A panic's frames (every frame has its place in the file) and a stack
    // overflow's (the innermost, in a prologue, has none: named by its
    // module's other frames).
    for (plugin, frame) in [("panic", "std::process::abort"), ("stack-overflow", "stack_overflow::descend")] {
        let built = plugin_bytes(plugin);
        let shrunk = shrink(&built).unwrap();
        assert!(name_sections(&built) > 0, "{plugin}: the build has names");
        assert_eq!(name_sections(&shrunk.bytes), 0, "{plugin}: the shrunk component has none");
        assert_eq!(shrunk.bytes.len(), built.len() - shrunk.names_before + shrunk.names_after);
        assert!(shrunk.names_after * 3 < shrunk.names_before, "{plugin}: {shrunk:?}");

        let expected = trap_backtrace(&sandbox, &built).await;
        assert!(expected.contains(frame), "{plugin}: {expected}");
        assert_eq!(trap_backtrace(&sandbox, &shrunk.bytes).await, expected, "{plugin}");
    }
}

#[tokio::test]
async fn the_rust_hello_shrunk_is_under_100_kb_and_runs_as_before() {
    let built = plugin_bytes("hello");
    let shrunk = shrink(&built).unwrap();
    assert!(shrunk.bytes.len() <= 100_000, "{} bytes (built: {})", shrunk.bytes.len(), built.len());
    let sandbox = support::sandbox();
    let plugin = sandbox.load(&shrunk.bytes).unwrap();
    let outcome =
        sandbox.run(&plugin, request(br#"{"name":"Ada"}"#, limits()), &StopHandle::new(), Arc::new(NoObserver)).await;
    assert_eq!(output_json(&outcome)["greeting"], "Hello, Ada!");
}

#[test]
fn a_damaged_names_section_refuses_the_component_and_says_why() {
    let shrunk = shrink(&plugin_bytes("hello")).unwrap();
    // The section is the file's last: put one in its place that does not
    // unpack.
    let mut damaged = shrunk.bytes[..shrunk.bytes.len() - shrunk.names_after].to_vec();
    let body = [&[11u8][..], b"leash:names", &[1, 0xff, 0xff, 0xff, 0xff]].concat();
    damaged.extend([0, body.len() as u8]);
    damaged.extend(body);
    let err = support::sandbox().load(&damaged).expect_err("refused");
    assert!(matches!(err, SandboxError::InvalidComponent(_)), "{err:?}");
    assert!(err.to_string().contains("`leash:names` section does not unpack"), "{err}");
    assert!(shrink(&shrunk.bytes).unwrap_err().contains("shrunk already"));
}
