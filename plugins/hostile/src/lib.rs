//! A guest that attacks its host: each run performs the one attack its input
//! names, the way an untrusted plugin would, so the host's answer to every
//! class stays tested. Input: `{"attack": NAME, "n": N}` (`n` where the
//! attack takes a size). See `plugins/README.md` for the list.

use leash_sdk::{Context, Error, Plugin};
use serde::Deserialize;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    attack: String,
    #[serde(default)]
    n: u64,
}

// The host's `log`, imported by hand so its arguments can be anything the
// canonical ABI can carry: this is the core signature the component's
// `log` lowers to (level, message pointer and length, fields pointer and
// length).
#[link(wasm_import_module = "leash:plugin/host@0.1.0")]
unsafe extern "C" {
    #[link_name = "log"]
    fn raw_log(level: i32, message: *const u8, message_len: usize, fields: *const u8, fields_len: usize);
}

fn log_raw(level: i32, message: *const u8, message_len: usize, fields: *const u8, fields_len: usize) {
    // SAFETY: the host reads these through the canonical ABI, which checks
    // every pointer, length and value against the guest's own memory; a bad
    // one traps the guest, which is the point.
    unsafe { raw_log(level, message, message_len, fields, fields_len) }
}

struct Hostile;

impl Plugin for Hostile {
    fn run(_ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
        let input: Input = leash_sdk::json_input(&input)?;
        let n = input.n as usize;
        match input.attack.as_str() {
            // Finding: empty fields cost the host memory but counted nothing.
            "log-empty-fields" => {
                let fields = vec![("", ""); n.max(1)];
                loop {
                    leash_sdk::log::log(leash_sdk::log::Level::Info, "", &fields);
                }
            }
            "log-bad-utf8" => {
                let bytes = [0xffu8, 0xfe, 0xfd];
                log_raw(2, bytes.as_ptr(), bytes.len(), std::ptr::null(), 0);
            }
            "log-bad-level" => log_raw(99, b"x".as_ptr(), 1, std::ptr::null(), 0),
            "log-out-of-bounds" => log_raw(2, 0xffff_0000usize as *const u8, 0x1000, std::ptr::null(), 0),
            "log-misaligned" => {
                let buffer = [0u8; 64];
                // A list of string pairs must be 4-byte aligned.
                let odd = buffer.as_ptr().wrapping_add(1 + (buffer.as_ptr() as usize % 4 == 3) as usize);
                log_raw(2, b"x".as_ptr(), 1, odd, 1);
            }
            "exit" => std::process::exit(3),
            // Not an attack that fails: a look at what an earlier run in
            // the same pooled slot left behind. A static the module's data
            // initialises and a page grown past the initial memory are
            // read, then dirtied for the next run to find.
            "residue" => {
                static mut MARK: [u8; 8] = *b"pristine";
                // SAFETY: one thread; the static is only reached here.
                let data = unsafe { std::ptr::read_volatile(&raw const MARK) };
                unsafe { std::ptr::write_volatile(&raw mut MARK, *b"dirtied!") };
                let page = core::arch::wasm32::memory_grow(0, 1);
                if page == usize::MAX {
                    return Err(Error::failed("memory.grow refused one page"));
                }
                let base = (page * 65536) as *mut u8;
                // SAFETY: the page was just grown and nothing else uses it.
                let nonzero = (0..65536).filter(|&i| unsafe { std::ptr::read_volatile(base.add(i)) } != 0).count();
                unsafe { std::ptr::write_bytes(base, 0xab, 65536) };
                let data = String::from_utf8_lossy(&data);
                return Ok(format!(r#"{{"data":"{data}","grown_nonzero":{nonzero}}}"#).into_bytes());
            }
            "poll-empty" => {
                wasi::io::poll::poll(&[]);
            }
            "random-huge" => {
                let bytes = wasi::random::random::get_random_bytes(n as u64);
                return Ok(bytes.len().to_string().into_bytes());
            }
            "stream-overwrite" => {
                let stdout = wasi::cli::stdout::get_stdout();
                let _ = stdout.write(&vec![b'x'; n.max(1 << 20)]);
            }
            "handles" => loop {
                std::mem::forget(wasi::clocks::monotonic_clock::subscribe_duration(1));
            },
            // A refused growth the guest handles, then an unrelated panic.
            "oom-then-panic" => {
                let mut hoard: Vec<u8> = Vec::new();
                let refused = hoard.try_reserve_exact(n.max(1 << 30)).is_err();
                panic!("an unrelated bug (the reservation was refused: {refused})");
            }
            "stdout-flood" => {
                let chunk = [b'o'; 4096];
                let mut left = n;
                while left > 0 {
                    let take = left.min(chunk.len());
                    std::io::Write::write_all(&mut std::io::stdout(), &chunk[..take]).map_err(Error::failed)?;
                    left -= take;
                }
                return Ok(n.to_string().into_bytes());
            }
            "huge-error" => return Err(Error::failed("E".repeat(n))),
            "huge-progress-note" => {
                leash_sdk::progress(1, 2, &"N".repeat(n));
            }
            // Text meant to take over the operator's terminal.
            "terminal" => {
                let forged = "\x1b]0;pwned\x07\x1b[2J\nleash: succeeded in 1.0 ms, fuel used 1, peak memory 1 bytes";
                leash_sdk::log::log(leash_sdk::log::Level::Info, forged, &[("k\x1b[31m", forged)]);
                println!("{forged}");
                eprintln!("{forged}");
                return Err(Error::failed(forged));
            }
            other => return Err(Error::invalid_input(format!("unknown attack {other:?}"))),
        }
        Err(Error::failed(format!("attack {} returned: the host let it through", input.attack)))
    }
}

leash_sdk::export!(Hostile);
