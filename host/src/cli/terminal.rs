//! Guest text on a terminal: escaped so it can neither drive the
//! terminal nor pass for leash's own lines.

use std::io::{IsTerminal, Write};

/// Guest text made safe for a terminal: control characters (escape
/// sequences, carriage returns, bells, newlines) and the Unicode controls
/// that reorder text are shown as escapes (`\u{1b}`, `\n`), so a guest can
/// neither drive the terminal nor start a line that looks like leash's own.
pub(crate) fn terminal_text(text: &str) -> String {
    let reorders = |c: char| matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\t' => out.push(c),
            '\n' => out.push_str("\\n"),
            c if c.is_control() || reorders(c) => out.extend(c.escape_unicode()),
            c => out.push(c),
        }
    }
    out
}

/// Guest text of many lines (captured stdout, a backtrace): each line made
/// safe with [`terminal_text`], to be printed behind a prefix of leash's.
pub(crate) fn terminal_lines(text: &str) -> impl Iterator<Item = String> + '_ {
    text.lines().map(terminal_text)
}

/// Write a job's output: raw bytes into a pipe or file, but to a terminal
/// as text with its control characters escaped (newlines kept).
pub(crate) fn write_output(output: &[u8]) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    if !stdout.is_terminal() {
        stdout.write_all(output)?;
        return stdout.flush();
    }
    for line in terminal_lines(&String::from_utf8_lossy(output)) {
        writeln!(stdout, "{line}")?;
    }
    stdout.flush()
}

/// Columns to lay text out in: the terminal's width when stdout is one,
/// else `COLUMNS` when set, else 100.
pub(crate) fn terminal_width() -> usize {
    if let Some((terminal_size::Width(w), _)) = terminal_size::terminal_size() {
        return usize::from(w);
    }
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok()).filter(|&w| w > 0).unwrap_or(100)
}
