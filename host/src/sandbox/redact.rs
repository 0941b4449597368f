//! Cutting a job's granted secret values out of what the host keeps.
//!
//! A guest never holds a secret's value, but an upstream may echo it back
//! and the guest pass it on: into its output, logs, progress, stdio, its
//! failure message or a URL. Every such text is cleaned before it is kept
//! or cut, so a value straddling a cut cannot survive in part. A value is
//! found in its raw form and in the encodings a guest's ordinary
//! libraries apply on the way: JSON string escapes (`\"`, `\\`, `\u0022`,
//! …) and URL percent-encoding (`%22`, either case, `+` for a space),
//! mixed freely within one occurrence. What is not found: a value the
//! guest re-encodes itself (base64, hex, reversed, split across writes);
//! against that the control is the grant, which sends a secret only to the
//! hosts it is bound to.

/// The secrets one job was granted, and their references.
#[derive(Debug, Clone, Default)]
pub(crate) struct Redactor {
    /// `(value, {secret:NAME})`, longest value first, so a value that
    /// contains another is cut whole.
    secrets: Vec<(Vec<u8>, String)>,
}

/// Most bytes one byte of a value may take in the encodings looked for
/// (`\u0022`).
const WIDEST_ENCODING: usize = 6;

impl Redactor {
    /// A redactor for `(value, reference)` pairs.
    pub(crate) fn new(pairs: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut secrets: Vec<(Vec<u8>, String)> =
            pairs.into_iter().filter(|(v, _)| !v.is_empty()).map(|(v, r)| (v.into_bytes(), r)).collect();
        secrets.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        Redactor { secrets }
    }

    /// Whether there is anything to cut.
    pub(crate) fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// The most bytes one encoded occurrence of a value can span: what a
    /// capture must keep past its cut to see a value that straddles it.
    pub(crate) fn widest(&self) -> usize {
        self.secrets.first().map_or(0, |(v, _)| v.len() * WIDEST_ENCODING)
    }

    /// `text` cleaned, or `None` when it holds no value.
    pub(crate) fn text(&self, text: &str) -> Option<String> {
        let cleaned = self.scan(text.as_bytes())?;
        // Only whole runs of ASCII were replaced by ASCII.
        Some(String::from_utf8(cleaned).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
    }

    /// Clean `text` in place.
    pub(crate) fn clean(&self, text: &mut String) {
        if let Some(cleaned) = self.text(text) {
            *text = cleaned;
        }
    }

    /// `bytes` cleaned (they need not be UTF-8).
    pub(crate) fn bytes(&self, bytes: Vec<u8>) -> Vec<u8> {
        self.scan(&bytes).unwrap_or(bytes)
    }

    fn scan(&self, text: &[u8]) -> Option<Vec<u8>> {
        if self.secrets.is_empty() {
            return None;
        }
        let mut out: Option<Vec<u8>> = None;
        let mut copied = 0;
        let mut i = 0;
        while i < text.len() {
            let found = self.secrets.iter().find_map(|(value, reference)| {
                let end = matches_at(text, i, value)?;
                Some((end, reference))
            });
            match found {
                Some((end, reference)) => {
                    let out = out.get_or_insert_with(|| Vec::with_capacity(text.len()));
                    out.extend_from_slice(&text[copied..i]);
                    out.extend_from_slice(reference.as_bytes());
                    i = end;
                    copied = end;
                }
                None => i += 1,
            }
        }
        let mut out = out?;
        out.extend_from_slice(&text[copied..]);
        Some(out)
    }
}

/// Where an occurrence of `value` starting at `at` ends, if one does:
/// each byte raw, percent-encoded, JSON-escaped, or `+` for a space. A
/// byte may have two spellings that both fit (`\\` is a raw backslash
/// and also an escaped one), so the match backtracks, within a budget
/// (only values full of `\` and `%` come near it).
fn matches_at(text: &[u8], at: usize, value: &[u8]) -> Option<usize> {
    let mut budget = 4096u32;
    match_from(text, at, value, &mut budget)
}

fn match_from(text: &[u8], at: usize, value: &[u8], budget: &mut u32) -> Option<usize> {
    let Some((&want, rest)) = value.split_first() else { return Some(at) };
    *budget = budget.checked_sub(1)?;
    let here = text.get(at..)?;
    let mut spellings = [encoded_len(here, want), (here.first() == Some(&want)).then_some(1)];
    if spellings[0] == spellings[1] {
        spellings[1] = None;
    }
    spellings.into_iter().flatten().find_map(|len| match_from(text, at + len, rest, budget))
}

/// How many bytes at the start of `text` spell `want` encoded.
fn encoded_len(text: &[u8], want: u8) -> Option<usize> {
    match *text.first()? {
        b'%' => (hex_pair(text.get(1..3)?)? == want).then_some(3),
        b'+' => (want == b' ').then_some(1),
        b'\\' => {
            let (byte, len) = match *text.get(1)? {
                b'"' => (b'"', 2),
                b'\\' => (b'\\', 2),
                b'/' => (b'/', 2),
                b't' => (b'\t', 2),
                b'n' => (b'\n', 2),
                b'r' => (b'\r', 2),
                b'b' => (0x08, 2),
                b'f' => (0x0c, 2),
                b'u' => {
                    let digits = text.get(2..6)?;
                    if hex_pair(&digits[..2])? != 0 {
                        return None;
                    }
                    (hex_pair(&digits[2..])?, 6)
                }
                _ => return None,
            };
            (byte == want).then_some(len)
        }
        _ => None,
    }
}

fn hex_pair(two: &[u8]) -> Option<u8> {
    let digit = |b: u8| (b as char).to_digit(16);
    Some((digit(two[0])? * 16 + digit(two[1])?) as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redactor() -> Redactor {
        Redactor::new([
            ("s3\"cr\\et v/al".to_owned(), "{secret:A}".to_owned()),
            ("abc".to_owned(), "{secret:B}".to_owned()),
            ("abcdef".to_owned(), "{secret:C}".to_owned()),
        ])
    }

    #[test]
    fn raw_json_escaped_and_percent_encoded_forms_are_cut() {
        let r = redactor();
        for form in [
            "s3\"cr\\et v/al",
            "s3\\\"cr\\\\et v\\/al",
            "s3\\u0022cr\\u005cet v/al",
            "s3%22cr%5Cet%20v%2Fal",
            "s3%22cr%5cet+v/al",
            "s3\\\"cr%5Cet v/al",
        ] {
            assert_eq!(r.text(&format!("<{form}>")).as_deref(), Some("<{secret:A}>"), "{form}");
        }
        assert_eq!(r.text("got abcdef and abc").as_deref(), Some("got {secret:C} and {secret:B}"), "longest first");
        assert_eq!(r.text("nothing here"), None);
        assert_eq!(r.bytes(b"\xffabc\xfe".to_vec()), b"\xff{secret:B}\xfe");
    }

    #[test]
    fn a_byte_with_two_spellings_is_matched_either_way() {
        let r = Redactor::new([("a\\\\b%41".to_owned(), "{secret:X}".to_owned())]);
        for form in ["a\\\\b%41", "a\\\\\\\\b%2541", "a%5C%5Cb%41"] {
            assert_eq!(r.text(form).as_deref(), Some("{secret:X}"), "{form}");
        }
    }

    #[test]
    fn a_capture_keeps_enough_past_its_cut_to_see_any_form() {
        let r = redactor();
        let widest = "s3\\u0022cr\\u005cet\\u0020v\\u002fal".len();
        assert!(r.widest() >= widest, "{} < {widest}", r.widest());
        assert_eq!(Redactor::default().widest(), 0);
    }
}
