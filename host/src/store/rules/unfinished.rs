//! What becomes of an attempt that ended without an outcome: its lease
//! expired (the worker died or stalled) or its worker released it at
//! shutdown. Both stores read the job's counters and the attempt's effects
//! and apply the one decision made here.
//!
//! The effect ledger decides. An attempt that recorded no effect intent
//! provably touched nothing outside its sandbox (an effect is sent only
//! after its intent is committed), so it runs again without spending an
//! attempt, up to the job's `free_rerun_limit`. An attempt that recorded one
//! spends an attempt, and `max_attempts` decides whether it runs again; the
//! job's error names the effect.
//!
//! A process that died under the attempt is counted too (`process_deaths`):
//! the job that was running in [`QUARANTINE_AFTER_DEATHS`] processes that
//! died under it is quarantined, ended `host_crash` and never claimed
//! again, so one job that crashes the host cannot crash-loop a fleet.

use crate::clock::Timestamp;
use crate::job::{Backoff, ErrorKind};
use crate::store::LEASE_LOST_MESSAGE;

/// A job's counters as the sweep or the release reads them.
#[derive(Debug, Clone)]
pub(crate) struct Counters {
    pub lost_leases: u32,
    pub retries: u32,
    pub max_attempts: u32,
    pub free_reruns: u32,
    pub free_rerun_limit: u32,
    pub cancel_requested: bool,
    pub backoff: Backoff,
    pub process_deaths: u32,
}

/// Processes that may die under one job before it is quarantined.
pub const QUARANTINE_AFTER_DEATHS: u32 = 2;

/// The attempt's effects: how many have no outcome, and the one
/// to name (the first still in flight, else the last).
#[derive(Debug, Clone)]
pub(crate) struct AttemptEffects {
    pub in_flight: u32,
    pub seq: i64,
    pub method: String,
    pub url: String,
    pub status: Option<i64>,
    pub error: Option<String>,
}

impl AttemptEffects {
    /// "effect #2 (POST `https://api.example/hooks`) was in flight: its
    /// outcome is unknown", or what the last one answered.
    pub(crate) fn describe(&self) -> String {
        let which = format!("#{} ({} {})", self.seq, self.method, self.url);
        let more = match self.in_flight {
            0 | 1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        match (&self.status, &self.error) {
            _ if self.in_flight > 0 => format!("effect {which}{more} was in flight: its outcome is unknown"),
            (Some(status), _) => format!("its last effect, {which}, answered {status}"),
            (None, Some(error)) => format!("its last effect, {which}, failed: {error}"),
            (None, None) => format!("its last effect was {which}"),
        }
    }
}

/// Which counter a requeue or a failure raises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bump {
    LostLeases,
    Retries,
    FreeReruns,
    Nothing,
}

impl Bump {
    /// The SQL assignment, with its leading comma (both stores spell it
    /// alike).
    pub(crate) fn sql(self) -> &'static str {
        match self {
            Bump::LostLeases => ", lost_leases = lost_leases + 1",
            Bump::Retries => ", retries = retries + 1",
            Bump::FreeReruns => ", free_reruns = free_reruns + 1",
            Bump::Nothing => "",
        }
    }
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Back to the queue, due at `run_after`, with `last_error`.
    Requeue { bump: Bump, run_after: Timestamp, last_error: String },
    /// Ended for good.
    End { bump: Bump, cancelled: bool, kind: ErrorKind, message: String },
}

/// A decision on an attempt, and whether its process died under it
/// (`process_deaths + 1`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    pub fate: Fate,
    pub died: bool,
}

impl Decision {
    /// The SQL assignments the decision adds, each with its leading comma.
    pub(crate) fn bumps(&self) -> String {
        let bump = match &self.fate {
            Fate::Requeue { bump, .. } | Fate::End { bump, .. } => bump.sql(),
        };
        let died = if self.died { ", process_deaths = process_deaths + 1" } else { "" };
        format!("{bump}{died}")
    }
}

/// How a process died under a job, as its quarantine message tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Death<'a> {
    /// Its supervisor saw it end: how (`killed by signal 9 (SIGKILL)`) and
    /// the last lines it wrote to stderr.
    Seen { how: &'a str, stderr: &'a str },
    /// The store saw it stop: no report from it since before its lease
    /// ran out.
    Silent,
}

/// The attempt's process died: the lease rules of [`lost_lease`], unless
/// this is the job's [`QUARANTINE_AFTER_DEATHS`]th death, which ends it as
/// `host_crash` whatever attempts it has left.
pub(crate) fn died(c: &Counters, effects: Option<&AttemptEffects>, death: &Death<'_>, now: Timestamp) -> Decision {
    let deaths = c.process_deaths + 1;
    if deaths < QUARANTINE_AFTER_DEATHS || c.cancel_requested {
        let mut fate = lost_lease(c, effects, now);
        // A death its supervisor saw is told as it was, not as a timeout.
        if let Death::Seen { how, .. } = death {
            let seen = format!("LeaseLost: its worker process {how}");
            match &mut fate {
                Fate::Requeue { last_error: text, .. } | Fate::End { message: text, .. } => {
                    *text = text.replace(LEASE_LOST_MESSAGE, &seen);
                }
            }
        }
        return Decision { fate, died: true };
    }
    let last = match death {
        Death::Seen { how, .. } => format!("the last was {how}"),
        Death::Silent => "the last stopped reporting to the store while it held the lease".to_owned(),
    };
    let mut message =
        format!("HostCrash: {deaths} processes died while running it ({last}); quarantined, it is not claimed again");
    if let Some(effects) = effects {
        message.push_str(&format!("; {}", effects.describe()));
    }
    if let Death::Seen { stderr, .. } = death
        && !stderr.trim().is_empty()
    {
        message.push_str(&format!(". The last process's stderr ended:\n{}", stderr.trim_end()));
    }
    let fate = Fate::End { bump: Bump::Nothing, cancelled: false, kind: ErrorKind::HostCrash, message };
    Decision { fate, died: true }
}

const NO_EFFECT: &str = "no effect was recorded, so it runs again without spending an attempt";

/// A lease that ran out.
pub(crate) fn lost_lease(c: &Counters, effects: Option<&AttemptEffects>, now: Timestamp) -> Fate {
    if c.cancel_requested {
        return Fate::End {
            bump: Bump::LostLeases,
            cancelled: true,
            kind: ErrorKind::Cancelled,
            message: "Cancelled: its worker stopped while it was being cancelled".into(),
        };
    }
    let spent = c.lost_leases + c.retries + 1;
    match effects {
        None if c.free_reruns < c.free_rerun_limit => Fate::Requeue {
            bump: Bump::FreeReruns,
            run_after: now.plus(c.backoff.delay(c.free_reruns + 1)),
            last_error: format!(
                "lease_lost: {LEASE_LOST_MESSAGE}; {NO_EFFECT} (free re-run {} of {})",
                c.free_reruns + 1,
                c.free_rerun_limit
            ),
        },
        _ if spent < c.max_attempts => Fate::Requeue {
            bump: Bump::LostLeases,
            run_after: now.plus(c.backoff.delay(spent)),
            last_error: format!("lease_lost: {}", lost_message(c, effects)),
        },
        _ => Fate::End {
            bump: Bump::LostLeases,
            cancelled: false,
            kind: ErrorKind::LeaseLost,
            message: lost_message(c, effects),
        },
    }
}

fn lost_message(c: &Counters, effects: Option<&AttemptEffects>) -> String {
    match effects {
        Some(e) => format!("{LEASE_LOST_MESSAGE}; {}", e.describe()),
        None if c.free_rerun_limit > 0 => format!(
            "{LEASE_LOST_MESSAGE}; no effect was recorded, but it was already re-run {} times for that, its limit",
            c.free_reruns
        ),
        None => LEASE_LOST_MESSAGE.to_owned(),
    }
}

/// A release at shutdown, before the guest started, or after the store
/// failed under one of its effects. `None`: the
/// attempt recorded no effect, so the release costs nothing, as ever.
pub(crate) fn released(c: &Counters, effects: Option<&AttemptEffects>, now: Timestamp) -> Option<Fate> {
    let effects = effects?;
    let spent = c.lost_leases + c.retries + 1;
    let why = format!(
        "Interrupted: its worker released it (shutting down, or its store failing under it) after the attempt's effects began; {}",
        effects.describe()
    );
    Some(if spent < c.max_attempts {
        Fate::Requeue {
            bump: Bump::Retries,
            run_after: now.plus(c.backoff.delay(spent)),
            last_error: format!("interrupted: {why}"),
        }
    } else {
        Fate::End { bump: Bump::Nothing, cancelled: false, kind: ErrorKind::Interrupted, message: why }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(max_attempts: u32, free_reruns: u32) -> Counters {
        Counters {
            lost_leases: 0,
            retries: 0,
            max_attempts,
            free_reruns,
            free_rerun_limit: 2,
            cancel_requested: false,
            backoff: Backoff { base: std::time::Duration::from_millis(1), cap: std::time::Duration::from_millis(1) },
            process_deaths: 0,
        }
    }

    fn effect(in_flight: u32) -> AttemptEffects {
        AttemptEffects {
            in_flight,
            seq: 2,
            method: "POST".into(),
            url: "https://api.example/hooks".into(),
            status: (in_flight == 0).then_some(201),
            error: None,
        }
    }

    #[test]
    fn an_attempt_without_effects_reruns_free_until_its_limit() {
        let now = Timestamp::from_unix_ms(0);
        let Fate::Requeue { bump, .. } = lost_lease(&counters(1, 1), None, now) else { panic!() };
        assert_eq!(bump, Bump::FreeReruns);
        let Fate::End { kind, message, .. } = lost_lease(&counters(1, 2), None, now) else { panic!() };
        assert_eq!(kind, ErrorKind::LeaseLost);
        assert!(message.contains("re-run 2 times"), "{message}");
    }

    #[test]
    fn an_attempt_with_an_effect_spends_an_attempt_and_names_it() {
        let now = Timestamp::from_unix_ms(0);
        let Fate::End { message, .. } = lost_lease(&counters(1, 0), Some(&effect(1)), now) else { panic!() };
        assert!(message.contains("effect #2 (POST https://api.example/hooks) was in flight"), "{message}");
        let Fate::Requeue { bump, .. } = lost_lease(&counters(2, 0), Some(&effect(0)), now) else { panic!() };
        assert_eq!(bump, Bump::LostLeases);
        assert_eq!(effect(0).describe(), "its last effect, #2 (POST https://api.example/hooks), answered 201");
        assert!(released(&counters(1, 0), None, now).is_none());
        let Some(Fate::End { kind, .. }) = released(&counters(1, 0), Some(&effect(1)), now) else { panic!() };
        assert_eq!(kind, ErrorKind::Interrupted);
    }

    #[test]
    fn the_second_process_death_quarantines_the_job_whatever_attempts_are_left() {
        let now = Timestamp::from_unix_ms(0);
        let crash = Death::Seen { how: "killed by signal 6 (SIGABRT)", stderr: "thread panicked\nabort\n" };
        let first = died(&counters(5, 0), None, &crash, now);
        assert!(first.died);
        let Fate::Requeue { bump: Bump::FreeReruns, last_error, .. } = &first.fate else { panic!("{first:?}") };
        assert!(last_error.starts_with("lease_lost: LeaseLost: its worker process killed by signal 6"), "{last_error}");
        let second = died(&Counters { process_deaths: 1, ..counters(5, 1) }, Some(&effect(1)), &crash, now);
        let Fate::End { kind, message, cancelled: false, .. } = &second.fate else { panic!("{second:?}") };
        assert_eq!(*kind, ErrorKind::HostCrash);
        assert!(message.starts_with("HostCrash: 2 processes died while running it (the last was killed by signal 6"));
        assert!(message.contains("effect #2 (POST https://api.example/hooks) was in flight"), "{message}");
        assert!(message.ends_with("stderr ended:\nthread panicked\nabort"), "{message}");
        assert_eq!(second.bumps(), ", process_deaths = process_deaths + 1");
        let silent = died(&Counters { process_deaths: 1, ..counters(5, 0) }, None, &Death::Silent, now);
        let Fate::End { message, .. } = &silent.fate else { panic!() };
        assert!(message.contains("stopped reporting to the store"), "{message}");
        // A job being cancelled ends cancelled, as a lost lease would.
        let cancelling = Counters { process_deaths: 1, cancel_requested: true, ..counters(5, 0) };
        let Fate::End { kind, .. } = died(&cancelling, None, &crash, now).fate else { panic!() };
        assert_eq!(kind, ErrorKind::Cancelled);
    }
}
