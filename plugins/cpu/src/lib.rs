//! CPU-bound work of a fixed size, for benchmarks: rounds of sorting,
//! hashing and table lookups over a 4 KiB buffer. Never calls the host.
//!
//! Input (optional JSON): `{"rounds": N}` (default 100). Output: `{"rounds": N, "checksum": C}`.

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    rounds: u32,
}

impl Default for Input {
    fn default() -> Self {
        Input { rounds: 100 }
    }
}

/// One round: mix, sort and fold the buffer. Deterministic for a given seed.
fn round(buffer: &mut [u32], seed: u32) -> u64 {
    let mut x = seed.wrapping_mul(2654435761) | 1;
    for slot in buffer.iter_mut() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *slot = x;
    }
    buffer.sort_unstable();
    buffer.iter().enumerate().fold(0u64, |acc, (i, v)| acc.rotate_left(5) ^ u64::from(*v) ^ i as u64)
}

struct Cpu;

impl Plugin for Cpu {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        let mut buffer = vec![0u32; 1024];
        let checksum = (0..input.rounds).fold(0u64, |acc, r| acc ^ round(&mut buffer, r));
        leash_sdk::json_output(&serde_json::json!({ "rounds": input.rounds, "checksum": checksum }))
    }
}

leash_sdk::export!(Cpu);
