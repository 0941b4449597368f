//! Loops forever and never calls the host: only the epoch deadline or fuel
//! can stop it.

use leash_sdk::{Context, Error, Plugin};

struct Spin;

impl Plugin for Spin {
    fn run(_ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let mut x: u64 = 0;
        loop {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

leash_sdk::export!(Spin);
