//! Tries to reach the network: a TCP connection, a UDP send and a DNS lookup.
//!
//! Input (optional JSON): `{"addr": "127.0.0.1:PORT"}` (default
//! `127.0.0.1:80`). Output: `{"tcp_connect": {"ok": bool, "detail": ...}, "udp_send": ..., "dns_lookup": ...}`.

use std::net::{TcpStream, ToSocketAddrs, UdpSocket};

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    addr: String,
}

impl Default for Input {
    fn default() -> Self {
        Input { addr: "127.0.0.1:80".to_owned() }
    }
}

fn attempt<T>(result: std::io::Result<T>) -> Value {
    match result {
        Ok(_) => json!({ "ok": true, "detail": "succeeded" }),
        Err(e) => json!({ "ok": false, "detail": e.to_string() }),
    }
}

struct NetEscape;

impl Plugin for NetEscape {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input_or_default(&input)?;
        let addr: std::net::SocketAddr =
            input.addr.parse().map_err(|e| Error::invalid_input(format!("addr {:?}: {e}", input.addr)))?;
        let report = json!({
            "tcp_connect": attempt(TcpStream::connect(addr)),
            "udp_send": attempt(UdpSocket::bind("0.0.0.0:0").and_then(|s| s.send_to(b"leash", addr))),
            "dns_lookup": attempt(("localhost", 80).to_socket_addrs()),
        });
        leash_sdk::json_output(&report)
    }
}

leash_sdk::export!(NetEscape);
