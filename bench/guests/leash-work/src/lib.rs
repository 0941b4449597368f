//! The benchmark work as a leash plugin: the action names the work.

use leash_sdk::{Context, Error, Plugin, Target};

struct Work;

impl Plugin for Work {
    fn run(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        match &ctx.target {
            Target::Action(name) if name == "echo" => Ok(bench_work::echo(&input)),
            Target::Action(name) if name == "transform" => bench_work::transform(&input).map_err(Error::InvalidInput),
            Target::Action(name) if name == "cpu" => {
                Ok(bench_work::cpu(bench_work::cpu_rounds(&input).map_err(Error::InvalidInput)?))
            }
            other => Err(Error::InvalidInput(format!("unknown work {other:?}"))),
        }
    }
}

leash_sdk::export!(Work);
