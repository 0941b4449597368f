//! A job's tags and metadata: what a submitter attaches to find its jobs
//! again (`GET /v1/jobs?tag=…&meta=…`). Neither reaches the guest.
//!
//! Both are indexed as *labels*: `t:TAG` for a tag and `m:KEY=VALUE` for a
//! metadata entry (a string value as itself, a number or boolean as its
//! JSON text), one row each beside the job, so a filter reads an index,
//! never the jobs table.

use serde_json::{Map, Value};

/// Most tags a job may carry.
pub const MAX_TAGS: usize = 16;
/// Longest tag, in bytes.
pub const MAX_TAG_BYTES: usize = 64;
/// Most metadata keys a job may carry.
pub const MAX_METADATA_KEYS: usize = 16;
/// Longest metadata key, in bytes.
pub const MAX_METADATA_KEY_BYTES: usize = 64;
/// Longest metadata string value, in bytes.
pub const MAX_METADATA_VALUE_BYTES: usize = 256;

/// Check `tags` and `metadata`: at most 16 tags of 1 to 64 bytes of
/// `A-Z a-z 0-9 _ . : / = @ + -`, no repeats; metadata at most 16 keys of
/// 1 to 64 bytes of `a-z 0-9 _ . -`, each a string (at most 256 bytes), a
/// number or a boolean.
pub fn check_labels(tags: &[String], metadata: &Map<String, Value>) -> Result<(), String> {
    if tags.len() > MAX_TAGS {
        return Err(format!("{} tags, over the ceiling of {MAX_TAGS}", tags.len()));
    }
    for (i, tag) in tags.iter().enumerate() {
        check_tag(tag)?;
        if tags[..i].contains(tag) {
            return Err(format!("tag {tag:?} is given twice"));
        }
    }
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(format!("{} metadata keys, over the ceiling of {MAX_METADATA_KEYS}", metadata.len()));
    }
    for (key, value) in metadata {
        check_metadata_key(key)?;
        match value {
            Value::String(text) if text.len() > MAX_METADATA_VALUE_BYTES => {
                return Err(format!(
                    "metadata {key:?} is {} bytes, over the ceiling of {MAX_METADATA_VALUE_BYTES}",
                    text.len()
                ));
            }
            Value::String(_) | Value::Number(_) | Value::Bool(_) => {}
            _ => return Err(format!("metadata {key:?} must be a string, a number or a boolean")),
        }
    }
    Ok(())
}

/// Check one tag (as a filter gives it, too).
pub fn check_tag(tag: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"_.:/=@+-".contains(&b);
    if tag.is_empty() || tag.len() > MAX_TAG_BYTES || !tag.bytes().all(allowed) {
        return Err(format!("tag {tag:?} is not valid: use 1 to {MAX_TAG_BYTES} of A-Z, a-z, 0-9 and _ . : / = @ + -"));
    }
    Ok(())
}

/// Check one metadata key (as a filter gives it, too).
pub fn check_metadata_key(key: &str) -> Result<(), String> {
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b);
    if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES || !key.bytes().all(allowed) {
        return Err(format!(
            "metadata key {key:?} is not valid: use 1 to {MAX_METADATA_KEY_BYTES} of a-z, 0-9 and _ . -"
        ));
    }
    Ok(())
}

/// The label a tag is indexed as.
pub fn tag_label(tag: &str) -> String {
    format!("t:{tag}")
}

/// The label a metadata entry is indexed as (`None`: a value no filter
/// can match: an array, an object or null, which [`check_labels`]
/// refuses).
pub fn metadata_label(key: &str, value: &Value) -> Option<String> {
    let text = match value {
        Value::String(text) => text.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        _ => return None,
    };
    Some(format!("m:{key}={text}"))
}

/// Every label of a job.
pub fn labels_of(tags: &[String], metadata: &Map<String, Value>) -> Vec<String> {
    let mut labels: Vec<String> = tags.iter().map(|t| tag_label(t)).collect();
    labels.extend(metadata.iter().filter_map(|(k, v)| metadata_label(k, v)));
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_and_metadata_are_bounded_and_labelled() {
        let meta = |v: Value| v.as_object().unwrap().clone();
        let tags = vec!["env:prod".to_owned(), "team/payments".to_owned()];
        let metadata = meta(serde_json::json!({ "customer": "acme", "batch": 42, "dry_run": false }));
        assert!(check_labels(&tags, &metadata).is_ok());
        assert_eq!(
            labels_of(&tags, &metadata),
            ["t:env:prod", "t:team/payments", "m:batch=42", "m:customer=acme", "m:dry_run=false"]
        );
        assert!(check_labels(&["a b".into()], &Map::new()).unwrap_err().contains("not valid"));
        assert!(check_labels(&["a".into(), "a".into()], &Map::new()).unwrap_err().contains("twice"));
        let many: Vec<String> = (0..17).map(|i| format!("t{i}")).collect();
        assert!(check_labels(&many, &Map::new()).unwrap_err().contains("17 tags"));
        assert!(check_labels(&[], &meta(serde_json::json!({ "Key": 1 }))).unwrap_err().contains("metadata key"));
        assert!(check_labels(&[], &meta(serde_json::json!({ "k": [1] }))).unwrap_err().contains("a string, a number"));
        let long = "x".repeat(257);
        assert!(check_labels(&[], &meta(serde_json::json!({ "k": long }))).unwrap_err().contains("257 bytes"));
    }
}
