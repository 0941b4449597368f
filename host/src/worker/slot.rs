//! A slot's jobs claimed ahead of it.
//!
//! A finish may claim the slot's next jobs in the same round trip. After a
//! short attempt it claims more than the slot needs (jobs *ahead*), so
//! the slot's next finish does not hold the slot: the slot starts a job
//! ahead at once, and that finish, with the claim that refills it,
//! commits while the guest runs. How many: enough to cover a finish's
//! round trip ([`Slot::depth`]: as many attempts like the last as fit in
//! the time finishes take to be answered lately, at least one and at
//! most [`DEEPEST`] less one). On a store whose commit is the slowest
//! step (PostgreSQL's, a disk flush) a busy slot of short jobs then runs
//! several jobs per commit instead of one.
//!
//! A slot claims ahead only after attempts shorter than
//! [`WorkerConfig::claim_ahead_below`](super::WorkerConfig::claim_ahead_below)
//! (100 ms unless set), and only while every slot of the pool is busy (a
//! free slot's claim would take the job sooner). A job ahead holds a lease
//! it does not renew, and waits at most [`Slot::hold_for`] (that same
//! time, at most a third of the lease and [`MOST_HELD`]); a slot claims
//! no more ahead than attempts like the last would start within a hold.
//! A job still waiting when its hold ends, unless the slot is already
//! done with the job before it (it runs next), is released to the queue
//! again in its place (its `run_after` kept), no attempt spent, for any
//! slot or worker to take; the slot's next claim waits for that release
//! (at most a hold), so it finds the job in its place. A pool of long
//! jobs never holds one. Shutdown releases them without running them.
//!
//! Several of a slot's finishes may be out at once (a job ahead ended
//! before the finish of the job before it was recorded); their claims may
//! reach the store in any order, so the jobs they bring may start in
//! another order than the queue's.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::store::Lease;
use crate::worker::RunningJob;

/// Longest a job ahead waits for its slot before it is released.
pub(super) const MOST_HELD: Duration = Duration::from_secs(1);

/// Most jobs a slot has ready or asked for: the next one and those ahead.
pub(super) const DEEPEST: u32 = 8;

/// A claimed job and its registration, not yet run.
pub(super) type Claimed = (Lease, RunningJob);

/// The jobs a slot's finishes claimed, in the order they came, and the
/// finishes still out.
#[derive(Debug, Default)]
pub(super) struct Slot {
    state: Mutex<Ahead>,
    changed: Notify,
    /// Told when the last release under way ends.
    released: Notify,
}

#[derive(Debug, Default)]
struct Ahead {
    ready: VecDeque<Claimed>,
    /// Finishes sent and not yet answered.
    finishing: usize,
    /// Jobs those finishes asked for.
    asked: u32,
    /// The slot's guest ended and its next job is not taken yet: the jobs
    /// ready are about to run, not to be released.
    between: bool,
    /// Jobs taken back (their wait ran out) whose release is under way.
    releasing: usize,
}

impl Slot {
    /// How long a job ahead may wait for its slot, for a lease of `ttl`
    /// and jobs claimed ahead after attempts shorter than `below`: about
    /// one such attempt, and less than a renewal period, so it starts
    /// without renewing.
    pub(super) fn hold_for(ttl: Duration, below: Duration) -> Duration {
        (ttl / 3).min(MOST_HELD).min(below)
    }

    /// How many jobs a busy slot should have ready or asked for after an
    /// attempt that took `attempt`, when finishes are answered in `round`:
    /// the next one, and behind it as many attempts like this one as fit
    /// in a round (at least one), so the slot does not wait for its
    /// finishes; at most [`DEEPEST`], and no more than would start within
    /// `hold`.
    pub(super) fn depth(attempt: Duration, round: Duration, hold: Duration) -> u32 {
        let attempt = attempt.as_nanos().max(1);
        let cover = round.as_nanos().div_ceil(attempt);
        let within = hold.as_nanos() / attempt;
        let ahead = u32::try_from(cover.min(within).max(1)).unwrap_or(u32::MAX);
        ahead.saturating_add(1).min(DEEPEST)
    }

    /// The slot's next job: the first ready, or the first a finish still
    /// out brings; `None` when nothing is ready and no finish is out.
    pub(super) async fn next(&self) -> Option<Claimed> {
        loop {
            {
                let mut ahead = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(job) = ahead.ready.pop_front() {
                    ahead.between = false;
                    return Some(job);
                }
                if ahead.finishing == 0 {
                    return None;
                }
            }
            // A permit stored by a finish answered in between is taken here.
            self.changed.notified().await;
        }
    }

    /// A finish is going out: it should claim enough jobs that the slot
    /// has `depth` ready or asked for (0 claims nothing), counted as asked
    /// until it is answered.
    pub(super) fn sending(self: &Arc<Self>, depth: u32) -> Sent {
        let mut ahead = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let have = u32::try_from(ahead.ready.len()).unwrap_or(u32::MAX).saturating_add(ahead.asked);
        let asked = depth.saturating_sub(have);
        ahead.between = true;
        ahead.finishing += 1;
        ahead.asked += asked;
        Sent { slot: self.clone(), asked, answered: false }
    }

    /// A finish that asked for `asked` jobs was answered with `jobs`
    /// (registered already).
    fn answered(&self, asked: u32, jobs: Vec<Claimed>) {
        {
            let mut ahead = self.state.lock().unwrap_or_else(|e| e.into_inner());
            ahead.finishing -= 1;
            ahead.asked -= asked;
            ahead.ready.extend(jobs);
        }
        self.changed.notify_one();
    }

    /// Take a job still waiting, by id (its wait ran out), to release it;
    /// none while the slot is between jobs (it is about to run it). The
    /// slot's next claims wait for the release ([`Self::releases_done`])
    /// until the [`Releasing`] returned is dropped.
    pub(super) fn take(self: &Arc<Self>, id: crate::job::JobId) -> Option<(Claimed, Releasing)> {
        let mut ahead = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if ahead.between {
            return None;
        }
        let at = ahead.ready.iter().position(|(lease, _)| lease.job.id == id)?;
        let job = ahead.ready.remove(at)?;
        ahead.releasing += 1;
        Some((job, Releasing { slot: self.clone() }))
    }

    /// Wait until no job taken back is still being released, so a claim
    /// sent after it sees the released jobs in their places in the queue
    /// (a claim racing a release would take the jobs behind them first).
    pub(super) async fn releases_done(&self) {
        loop {
            // Made before the check, so a release ending in between is not
            // missed.
            let ended = self.released.notified();
            if self.state.lock().unwrap_or_else(|e| e.into_inner()).releasing == 0 {
                return;
            }
            ended.await;
        }
    }
}

/// A release under way of a job taken back from its slot; dropped when the
/// release has ended (landed, lost or failed).
#[derive(Debug)]
pub(super) struct Releasing {
    slot: Arc<Slot>,
}

impl Drop for Releasing {
    fn drop(&mut self) {
        let none_left = {
            let mut ahead = self.slot.state.lock().unwrap_or_else(|e| e.into_inner());
            ahead.releasing -= 1;
            ahead.releasing == 0
        };
        if none_left {
            self.slot.released.notify_waiters();
        }
    }
}

/// A finish out for a slot. Answered once: by [`Sent::answer`], or, if
/// its task ends without answering (a panic), with nothing when dropped,
/// so the slot never waits for it forever.
#[derive(Debug)]
pub(super) struct Sent {
    slot: Arc<Slot>,
    asked: u32,
    answered: bool,
}

impl Sent {
    /// How many jobs the finish should claim.
    pub(super) fn asked(&self) -> u32 {
        self.asked
    }

    /// The slot it is for.
    pub(super) fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    /// The finish was answered with `jobs` (registered already).
    pub(super) fn answer(mut self, jobs: Vec<Claimed>) {
        self.answered = true;
        self.slot.answered(self.asked, jobs);
    }
}

impl Drop for Sent {
    fn drop(&mut self) {
        if !self.answered {
            self.slot.answered(self.asked, Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finish_asks_only_for_what_the_slot_lacks() {
        let slot = Arc::new(Slot::default());
        // Nothing ready, nothing asked: the first finish asks for two.
        let first = slot.sending(2);
        assert_eq!(first.asked(), 2);
        // One out asking for two: the next one asks for none.
        let second = slot.sending(2);
        assert_eq!(second.asked(), 0);
        // The first answered with nothing (the queue was empty): the next
        // finish asks again.
        first.answer(Vec::new());
        let third = slot.sending(1);
        assert_eq!(third.asked(), 1);
        second.answer(Vec::new());
        third.answer(Vec::new());
        assert_eq!(slot.sending(0).asked(), 0, "depth 0 (shutdown, a suspect) claims nothing");
    }

    #[test]
    fn a_slot_claims_ahead_what_covers_a_round_and_starts_within_a_hold() {
        let ms = Duration::from_millis;
        let hold = ms(100);
        // Finishes answered in 4 ms, attempts of 1 ms: four ahead.
        assert_eq!(Slot::depth(ms(1), ms(4), hold), 5);
        // Attempts of 0.1 ms would want forty: at most `DEEPEST`.
        assert_eq!(Slot::depth(Duration::from_micros(100), ms(4), hold), DEEPEST);
        assert_eq!(Slot::depth(Duration::ZERO, ms(4), hold), DEEPEST);
        // Attempts longer than a round, or no round measured yet: one.
        assert_eq!(Slot::depth(ms(20), ms(4), hold), 2);
        assert_eq!(Slot::depth(ms(1), Duration::ZERO, hold), 2);
        // A job ahead must start within its hold: 30 ms attempts and
        // 100 ms finishes would want four ahead; three start in time.
        assert_eq!(Slot::depth(ms(30), ms(100), hold), 4);
        assert_eq!(Slot::depth(ms(60), ms(100), hold), 2, "one ahead at least, as before");
    }

    #[test]
    fn the_hold_stays_inside_a_renewal_period() {
        let (long, short) = (Duration::from_secs(3600), Duration::from_millis(100));
        assert_eq!(Slot::hold_for(Duration::from_secs(30), long), MOST_HELD);
        assert_eq!(Slot::hold_for(Duration::from_millis(900), long), Duration::from_millis(300));
        assert_eq!(Slot::hold_for(Duration::from_secs(30), short), short, "about one short attempt");
    }

    /// A claimed job of id `n`, as a finish answers it.
    fn claimed(n: u8) -> Claimed {
        let id = format!("01M926XFVQHZM05AGHKSGVVEM{n}");
        let job = crate::job::Job::for_tests(serde_json::json!({"id": id, "status": "running"}));
        let running = RunningJob { stop: crate::sandbox::StopHandle::new(), cancelled: Default::default() };
        (Lease { job, token: String::new() }, running)
    }

    fn id(claimed: Option<Claimed>) -> Option<String> {
        claimed.map(|(lease, _)| lease.job.id.to_string())
    }

    #[tokio::test]
    async fn a_job_is_taken_back_only_while_its_slot_runs_a_guest_and_claims_wait_for_its_release() {
        let slot = Arc::new(Slot::default());
        let (first, second) = (claimed(1), claimed(2));
        let ids = (first.0.job.id, second.0.job.id);
        // A finish brings two jobs: the slot runs the first; the second
        // waits ahead.
        slot.sending(2).answer(vec![first, second]);
        assert_eq!(id(slot.next().await), Some(ids.0.to_string()));
        // The first's guest ended and its finish is out: the slot is
        // about to run the second, which is not taken back.
        let sent = slot.sending(2);
        assert!(slot.take(ids.1).is_none(), "taken from a slot about to run it");
        assert_eq!(id(slot.next().await), Some(ids.1.to_string()));
        // That finish brings the next job ahead while the second's guest
        // runs: that one is taken back; until its release ends, the
        // slot's claims wait.
        let third = claimed(3).0.job.id;
        sent.answer(vec![claimed(3)]);
        let (taken, releasing) = slot.take(third).expect("a job ahead of a running guest");
        assert_eq!(id(Some(taken)), Some(third.to_string()));
        let waiter = slot.clone();
        let waiting = tokio::spawn(async move { waiter.releases_done().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a claim went out before the release ended");
        drop(releasing);
        tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the release ended").unwrap();
        slot.releases_done().await;
    }

    #[tokio::test]
    async fn the_slot_waits_for_a_finish_out_and_ends_when_none_is() {
        let slot = Arc::new(Slot::default());
        assert!(slot.next().await.is_none());
        let sent = slot.sending(1);
        let waiter = slot.clone();
        let next = tokio::spawn(async move { waiter.next().await.is_none() });
        sent.answer(Vec::new());
        assert!(next.await.unwrap(), "answered with nothing: the slot ends");
    }

    #[tokio::test]
    async fn a_finish_whose_task_died_does_not_hold_its_slot() {
        let slot = Arc::new(Slot::default());
        let sent = slot.sending(2);
        let task = tokio::spawn(async move {
            let _sent = sent;
            panic!("a finish task that panics");
        });
        assert!(task.await.is_err());
        let next = tokio::time::timeout(Duration::from_secs(10), slot.next()).await;
        assert!(next.expect("the slot ends instead of waiting forever").is_none());
        assert_eq!(slot.sending(2).asked(), 2, "and what it asked for is asked again");
    }
}
