//! Reading the command line's values: durations, sizes, input.

use std::io::Read;
use std::time::Duration;

use crate::cli::CliError;

pub(crate) fn read_input(source: Option<&str>) -> Result<Vec<u8>, CliError> {
    match source {
        None => Ok(Vec::new()),
        Some("-") => {
            let mut input = Vec::new();
            std::io::stdin()
                .read_to_end(&mut input)
                .map_err(|e| CliError::usage(format!("cannot read input from stdin: {e}")))?;
            Ok(input)
        }
        Some(path) => std::fs::read(path).map_err(|e| CliError::usage(format!("cannot read input file {path}: {e}"))),
    }
}

/// Parse a metadata entry, `KEY=VALUE` (the value a string).
pub fn parse_meta(text: &str) -> Result<(String, String), String> {
    let (key, value) = text.split_once('=').ok_or_else(|| format!("{text:?} is not KEY=VALUE"))?;
    crate::job::labels::check_metadata_key(key)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// Parse `500ms`, `30s`, `2m`, `1h`, or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("invalid duration {text:?}: expected e.g. 500ms, 30s, 2m, 1h, 7d"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86_400.0,
        other => return Err(format!("invalid duration unit {other:?} in {text:?}: use ms, s, m, h or d")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("duration {text:?} is out of range"))
}

/// Parse `64MiB`, `1GiB`, `512KiB`, `10MB`, or a bare number of bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 =
        number.parse().map_err(|_| format!("invalid size {text:?}: expected e.g. 64MiB, 1GiB or bytes"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        other => return Err(format!("invalid size unit {other:?} in {text:?}: use B, KiB, MiB, GiB, KB, MB or GB")),
    };
    value.checked_mul(scale).ok_or_else(|| format!("size {text:?} is out of range"))
}
