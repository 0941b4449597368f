//! Allocates and touches memory in 1 MiB chunks until something stops it.

use leash_sdk::{Context, Error, Plugin};

struct AllocBomb;

impl Plugin for AllocBomb {
    fn run(_ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let mut hoard: Vec<Vec<u8>> = Vec::new();
        loop {
            hoard.push(std::hint::black_box(vec![0xA5u8; 1 << 20]));
        }
    }
}

leash_sdk::export!(AllocBomb);
