//! Panics on every run.

use leash_sdk::{Context, Error, Plugin};

struct Panic;

impl Plugin for Panic {
    fn run(_ctx: &Context, _input: Vec<u8>) -> Result<Vec<u8>, Error> {
        panic!("the panic plugin always panics");
    }
}

leash_sdk::export!(Panic);
