//! Bounded capture of a guest's stdout and stderr.
//!
//! wasmtime-wasi's `MemoryOutputPipe` traps the guest once its buffer is
//! full, which would turn a chatty plugin into a crash. This pipe keeps the
//! first `capacity` bytes, counts the rest, and never fails a write.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

use super::STREAM_WRITE_PERMIT;
use super::redact::Redactor;

#[derive(Debug, Default)]
struct Buffer {
    kept: Vec<u8>,
    dropped: u64,
}

/// A shared, bounded byte sink handed to WASI as stdout or stderr.
#[derive(Debug, Clone)]
pub(crate) struct CapturedOutput {
    capacity: usize,
    /// Kept past `capacity` until [`CapturedOutput::take_cleaned`] cuts:
    /// room for a secret value that straddles the cut to be seen whole.
    lookahead: usize,
    buffer: Arc<Mutex<Buffer>>,
}

impl CapturedOutput {
    pub(crate) fn new(capacity: usize, lookahead: usize) -> Self {
        CapturedOutput { capacity, lookahead, buffer: Arc::default() }
    }

    pub(crate) fn push(&self, bytes: &[u8]) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.capacity.saturating_add(self.lookahead).saturating_sub(buffer.kept.len());
        let keep = bytes.len().min(room);
        buffer.kept.extend_from_slice(&bytes[..keep]);
        buffer.dropped += (bytes.len() - keep) as u64;
    }

    /// The kept bytes from `offset` on, as text.
    pub(crate) fn lossy_text_from(&self, offset: usize) -> String {
        let buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(buffer.kept.get(offset..).unwrap_or_default()).into_owned()
    }

    /// How many bytes are kept so far.
    pub(crate) fn kept_len(&self) -> usize {
        self.buffer.lock().unwrap_or_else(|e| e.into_inner()).kept.len()
    }

    /// The kept bytes, cleaned of secret values and then cut to the
    /// capacity, and how many were dropped past it.
    pub(crate) fn take_cleaned(&self, redactor: &Redactor) -> (Vec<u8>, u64) {
        let mut buffer = self.buffer.lock().unwrap_or_else(|e| e.into_inner());
        let mut kept = redactor.bytes(std::mem::take(&mut buffer.kept));
        let mut dropped = std::mem::take(&mut buffer.dropped);
        if kept.len() > self.capacity {
            dropped += (kept.len() - self.capacity) as u64;
            kept.truncate(self.capacity);
            kept.shrink_to_fit();
        }
        (kept, dropped)
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        if bytes.len() > STREAM_WRITE_PERMIT {
            return Err(StreamError::trap(&format!(
                "a write of {} bytes, over the {STREAM_WRITE_PERMIT} bytes check-write permits",
                bytes.len()
            )));
        }
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always ready: bytes past the capacity are counted, not refused.
        Ok(STREAM_WRITE_PERMIT)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl AsyncWrite for CapturedOutput {
    fn poll_write(self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_first_bytes_and_counts_the_rest() {
        let out = CapturedOutput::new(4, 0);
        out.push(b"abc");
        out.push(b"defg");
        assert_eq!(out.take_cleaned(&Redactor::default()), (b"abcd".to_vec(), 3));
        assert_eq!(out.take_cleaned(&Redactor::default()), (Vec::new(), 0));
    }

    #[test]
    fn a_secret_straddling_the_cut_is_cleaned_before_it_is_cut() {
        let redactor = Redactor::new([("hunter2".to_owned(), "{secret:PW}".to_owned())]);
        let out = CapturedOutput::new(8, redactor.widest());
        out.push(b"12345hunter2 and more");
        let (kept, dropped) = out.take_cleaned(&redactor);
        assert_eq!(kept, b"12345{se");
        assert_eq!(dropped, "12345{secret:PW} and more".len() as u64 - 8);
    }
}
