//! Recurses without bound until the wasm call stack is exhausted.

use leash_sdk::{Context, Error, Plugin};

#[inline(never)]
#[allow(unconditional_recursion, reason = "exhausting the stack is this plugin's purpose")]
fn descend(depth: u64) -> u64 {
    // black_box keeps the call from becoming a loop; the frame stays on the
    // wasm stack, not the shadow stack in linear memory.
    std::hint::black_box(descend(std::hint::black_box(depth + 1))) + 1
}

struct StackOverflow;

impl Plugin for StackOverflow {
    fn run(_ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, Error> {
        Ok(descend(0).to_le_bytes().to_vec())
    }
}

leash_sdk::export!(StackOverflow);
