//! The benchmark work as an Extism plugin: one export per kind of work.

use extism_pdk::{FnResult, WithReturnCode, plugin_fn};

#[plugin_fn]
pub fn echo(input: Vec<u8>) -> FnResult<Vec<u8>> {
    Ok(bench_work::echo(&input))
}

#[plugin_fn]
pub fn transform(input: Vec<u8>) -> FnResult<Vec<u8>> {
    bench_work::transform(&input).map_err(|e| WithReturnCode::new(extism_pdk::Error::msg(e), 1))
}

#[plugin_fn]
pub fn cpu(input: Vec<u8>) -> FnResult<Vec<u8>> {
    let rounds = bench_work::cpu_rounds(&input).map_err(|e| WithReturnCode::new(extism_pdk::Error::msg(e), 1))?;
    Ok(bench_work::cpu(rounds))
}
