//! The work both peers' plugins do, written once: each plugin is a thin
//! wrapper that calls these functions with its runtime's calling convention.

use serde_json::{Value, json};

/// (a) Return the input unchanged.
pub fn echo(input: &[u8]) -> Vec<u8> {
    input.to_vec()
}

/// (b) Parse a JSON order document, price every line, total it, and
/// serialise the result.
pub fn transform(input: &[u8]) -> Result<Vec<u8>, String> {
    let doc: Value = serde_json::from_slice(input).map_err(|e| format!("input is not JSON: {e}"))?;
    let items = doc["items"].as_array().ok_or("input has no `items` array")?;
    let mut total = 0.0;
    let mut lines = Vec::with_capacity(items.len());
    for item in items {
        let price = item["price"].as_f64().unwrap_or(0.0);
        let qty = item["qty"].as_f64().unwrap_or(0.0);
        let amount = price * qty;
        total += amount;
        let name = item["name"].as_str().unwrap_or_default().to_uppercase();
        let tags: Vec<Value> = item["tags"].as_array().into_iter().flatten().rev().cloned().collect();
        lines.push(json!({ "sku": item["sku"], "name": name, "amount": amount, "tags": tags }));
    }
    let out = json!({ "order": doc["order"], "customer": doc["customer"], "lines": lines, "total": total, "count": items.len() });
    serde_json::to_vec(&out).map_err(|e| e.to_string())
}

/// (c) A CPU-bound loop: `rounds` steps of an xorshift mix; returns the
/// final state as 8 little-endian bytes.
pub fn cpu(rounds: u64) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..rounds {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x = x.wrapping_add(i);
    }
    x.to_le_bytes().to_vec()
}

/// Parse the `cpu` input: a decimal round count.
pub fn cpu_rounds(input: &[u8]) -> Result<u64, String> {
    std::str::from_utf8(input).ok().and_then(|s| s.trim().parse().ok()).ok_or_else(|| "expected a round count".into())
}

/// A ~10 KB order document for (b).
pub fn sample_document() -> Vec<u8> {
    let items: Vec<Value> = (0..60)
        .map(|i| {
            json!({
                "sku": format!("SKU-{i:05}"),
                "name": format!("item number {i} of the sample order"),
                "price": 1.25 * f64::from(i),
                "qty": i % 7 + 1,
                "tags": ["bench", "sample", format!("t{}", i % 5)],
            })
        })
        .collect();
    serde_json::to_vec(&json!({ "order": "ORD-1", "customer": { "id": 42, "name": "Ada" }, "items": items })).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_is_about_ten_kilobytes_and_transforms() {
        let doc = sample_document();
        assert!((8_000..14_000).contains(&doc.len()), "{}", doc.len());
        let out: Value = serde_json::from_slice(&transform(&doc).unwrap()).unwrap();
        assert_eq!(out["count"], 60);
    }
}
