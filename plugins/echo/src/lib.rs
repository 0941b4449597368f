//! Returns its input bytes unchanged.

use leash_sdk::{Context, Error, Plugin};

struct Echo;

impl Plugin for Echo {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        Ok(input)
    }
}

leash_sdk::export!(Echo);
