//! One conformance suite for every store backend: each case in `cases` runs
//! as its own test against each backend, named
//! `conformance::<backend>::<role>::<case>` (grouped by the store role
//! each exercises, one file per role in `cases/`), so a failure names the
//! backend and the case.

pub(crate) mod cases;

use std::sync::Arc;

use leash::store::postgres::PostgresStore;
use leash::store::sqlite::SqliteStore;
use leash::store::{Durability, JobStore};

/// Every case, by topic: the one list each backend instantiates.
macro_rules! with_cases {
    ($callback:ident ! ($($args:tt)*)) => {
        $callback!($($args)*
            jobs {
                insert_then_get_round_trips_every_field,
                an_insert_answers_the_rows_as_stored,
                insert_refuses_zero_attempts_and_writes_nothing,
                a_large_insert_returns_every_job_in_order,
                an_idempotency_key_belongs_to_one_job_while_it_is_kept,
                cancel_has_three_windows,
                cancel_of_an_unknown_job_is_not_found,
                counts_snapshot_matches_the_states,
                list_filters_pages_newest_first_without_payloads,
                list_filters_by_error_text_kind_and_creation_time,
                queued_count_matches_the_snapshot,
                a_gated_job_waits_unclaimed_and_uncounted_as_queued,
                approval_queues_the_job_and_records_the_decision,
                a_held_approval_waits_for_its_run_trigger,
                a_rejection_cancels_with_kind_rejected,
                decisions_the_state_does_not_allow_are_refused_and_change_nothing,
                two_approvals_racing_one_wins,
                cancel_of_a_gated_job_is_immediate,
                a_cancel_that_follows_a_decision_is_stamped_after_it,
                a_pending_approval_expires_after_its_ttl,
                a_decision_past_the_approval_ttl_is_refused_and_expires_the_job,
                a_sync_gate_counts_its_deadline_from_the_trigger,
            }
            leases {
                claim_takes_the_oldest_jobs_first_up_to_the_limit,
                claim_sets_owner_token_and_lease,
                claim_skips_running_and_expired_jobs,
                a_claim_never_starts_a_job_younger_than_itself,
                every_claim_gets_a_fresh_token,
                finish_records_success_output_and_usage,
                finish_records_failure_kind_message_and_backtrace,
                a_stale_token_changes_nothing,
                finish_and_claim_ends_one_job_and_claims_the_next,
                finishes_at_once_are_fenced_one_by_one,
                terminal_jobs_have_no_way_out,
                extend_renews_the_lease_and_reads_cancel_requested,
                release_requeues_without_spending_an_attempt,
                a_released_job_is_claimable_again,
                a_job_released_unstarted_keeps_its_place,
                concurrency_key_allows_one_running_job_per_key,
                progress_is_fenced_by_the_token_and_reset_by_a_claim,
                finish_keeps_logs_and_last_progress,
                a_delayed_job_is_not_claimed_before_its_time,
                claims_take_the_earliest_due_first,
                a_retry_queues_the_job_after_its_backoff_and_spends_an_attempt,
                a_retry_with_a_stale_token_changes_nothing,
                a_suspect_is_claimed_only_by_a_claimer_that_runs_nothing_and_alone,
                a_submitter_s_running_cap_holds_its_claims,
            }
            flow {
                under_a_ten_thousand_job_backlog_the_first_claims_take_the_highest_priority,
                a_job_due_later_holds_back_no_lower_priority,
                an_aged_job_takes_the_aged_share_whatever_its_priority,
                a_capped_submitter_s_jobs_go_by_priority_too,
                a_paused_plugin_s_jobs_wait_and_a_resume_frees_them_in_due_order,
            }
            labels {
                jobs_are_listed_by_tags_and_metadata_and_lose_them_when_deleted,
            }
            rates {
                a_backlog_over_its_limit_waits_for_evenly_spaced_slots,
                each_key_has_its_own_bucket_and_unlimited_jobs_pass_by,
                a_burst_starts_at_once_then_the_rate,
                slots_held_up_past_their_grace_are_given_again,
                a_slot_that_has_come_goes_before_older_jobs_given_none,
                outbound_requests_take_slots_together_and_a_late_one_takes_none,
                a_limit_keeps_its_hosts_and_secrets,
                limits_are_set_read_and_removed_audited_and_a_removed_one_limits_nothing,
            }
            schedules {
                a_schedule_round_trips_pauses_resumes_and_is_removed_audited,
                a_firing_is_taken_once_and_a_stale_one_writes_nothing,
                many_schedulers_racing_for_one_firing_submit_its_jobs_once,
                skip_submits_nothing_while_the_schedule_s_job_has_not_ended,
            }
            attempts {
                each_attempt_keeps_its_worker_times_ending_error_and_logs,
                only_the_latest_earlier_attempts_keep_their_logs,
                a_retried_job_runs_again_with_fresh_attempts_and_keeps_its_history,
            }
            effects {
                a_lost_lease_without_effects_reruns_free_until_its_limit,
                a_lost_lease_after_an_effect_spends_the_attempt_and_names_the_effect,
                a_release_after_an_effect_spends_an_attempt,
                effects_are_recorded_only_under_the_lease_and_numbered_per_attempt,
                proposals_land_with_a_success_and_an_answered_proposal_is_recorded_once,
            }
            sweeps {
                reclaim_requeues_while_attempts_remain,
                reclaim_fails_with_lease_lost_when_no_attempts_remain,
                reclaim_leaves_live_leases_alone,
                reclaim_of_a_job_being_cancelled_cancels_it,
                queued_jobs_expire_as_expired,
                a_requeued_job_gets_a_fresh_expiry,
                retention_deletes_only_old_terminal_jobs,
                reclaim_requeues_after_the_backoff_and_shares_the_attempt_budget,
                a_deadline_caps_the_queue_expiry_through_every_requeue,
                a_dead_workers_jobs_are_reclaimed_at_once_and_the_second_death_quarantines,
                an_expired_lease_whose_worker_fell_silent_counts_a_process_death,
            }
            plugins {
                plugins_are_stored_by_digest_once,
                plugin_names_resolve_to_the_newest_registration,
                replacing_a_plugin_name_does_not_change_queued_jobs,
                grants_belong_to_a_registration_and_are_pinned_on_jobs,
                approval_policy_belongs_to_a_registration,
                declared_requests_are_kept_with_the_bytes,
                compiled_code_is_kept_by_digest_and_engine,
                compiled_code_keeps_its_bound_dropping_the_least_recently_used,
            }
            plans {
                a_plan_is_stored_with_its_execute_job,
                a_succeeded_execute_leads_to_one_apply_job_with_its_output,
                a_policy_set_while_an_auto_plan_runs_gates_its_apply_phase,
                a_plan_key_is_taken_once,
                a_failed_or_cancelled_plan_never_gets_an_apply_job,
                retention_keeps_a_plans_phases_until_the_last_ends,
            }
            workers {
                workers_register_refresh_and_are_deleted_at_retention,
            }
            sessions {
                an_ended_session_is_refused_until_its_expiry_then_forgotten,
            }
            principals {
                principals_hold_roles_and_tokens_that_end_with_them,
                audited_changes_at_once_form_one_unbroken_chain,
                a_principal_s_submits_append_one_row_per_job_in_order,
                a_rule_decides_only_while_it_stands_and_its_author_may_approve,
                audit_retention_deletes_a_prefix_and_the_chain_still_verifies,
            }
            events {
                every_change_appends_one_event_in_commit_order,
                changes_to_many_jobs_at_once_append_one_event_each,
                a_decision_and_a_worker_change_are_events,
                events_resume_after_any_id_and_page_in_order,
                retention_deletes_old_events_and_a_reader_behind_hears_it_missed_some,
            }
        );
    };
}

/// One test per case for the backend `$open` opens (`None`: skipped, and
/// the opener has said why).
macro_rules! backend_tests {
    ($open:path; $($topic:ident { $($case:ident),* $(,)? })*) => {
        $(
            mod $topic {
                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                    async fn $case() {
                        let Some(fresh) = $open().await else { return };
                        crate::store::conformance::cases::$topic::$case(fresh.store.clone()).await;
                    }
                )*
            }
        )*
    };
}

/// A fresh, empty store and what keeps it alive.
pub(crate) struct Fresh {
    pub(crate) store: Arc<dyn JobStore>,
    _keep: Box<dyn std::any::Any + Send>,
}

/// A new SQLite file in a temporary folder.
pub(crate) async fn sqlite() -> Option<Fresh> {
    Some(sqlite_with(Durability::Normal))
}

pub(crate) fn sqlite_with(durability: Durability) -> Fresh {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jobs.db");
    std::fs::copy(migrated_sqlite_file(), &file).unwrap();
    let store = SqliteStore::open(&file, durability).unwrap();
    Fresh::new(Arc::new(store), dir)
}

/// An empty store's file, migrated once per test process and closed: a
/// copy opens as a fresh store without running every migration again
/// (which is most of what a fresh store costs, and every SQLite case opens
/// one). Migrating itself is tested where the migrations are.
fn migrated_sqlite_file() -> &'static std::path::Path {
    static FILE: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> = std::sync::OnceLock::new();
    &FILE
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("template.db");
            drop(SqliteStore::open(&file, Durability::Normal).unwrap());
            // Closing the last connection checkpointed the log into the file.
            let wal = dir.path().join("template.db-wal");
            assert!(std::fs::metadata(&wal).map_or(true, |m| m.len() == 0), "the template's log was not checkpointed");
            (dir, file)
        })
        .1
}

/// A new schema in the test PostgreSQL (`None`: skipped, and said why).
pub(crate) async fn postgres() -> Option<Fresh> {
    let schema = crate::support::pg::Schema::create(&crate::support::pg::url()?).await;
    let store = PostgresStore::open(&schema.url).await.unwrap();
    Some(Fresh::new(Arc::new(store), schema))
}

impl Fresh {
    /// A store that stays alive with whatever `keep` holds.
    pub(crate) fn new(store: Arc<dyn JobStore>, keep: impl std::any::Any + Send) -> Fresh {
        Fresh { store, _keep: Box::new(keep) }
    }
}

mod sqlite {
    with_cases!(backend_tests!(crate::store::conformance::sqlite;));
}

mod postgres {
    with_cases!(backend_tests!(crate::store::conformance::postgres;));
}
