//! The SQLite store's job labels: a job's tags and metadata entries, one
//! row each, so a list filtered by them reads an index (see
//! [`labels`](crate::job::labels)).

use rusqlite::{Connection, params};

use super::rows::db_err;
use crate::job::Job;
use crate::job::labels::labels_of;
use crate::store::StoreError;

/// The migration that adds tags and metadata (listed in
/// [`MIGRATIONS`](super::migrations::MIGRATIONS)). A deleted job's labels
/// go with it; a job without any costs the delete nothing.
pub(super) const MIGRATION: &str = r#"
ALTER TABLE jobs ADD COLUMN tags_json TEXT;
ALTER TABLE jobs ADD COLUMN metadata_json TEXT;
CREATE TABLE job_labels (
    label  TEXT NOT NULL,
    job_id TEXT NOT NULL,
    PRIMARY KEY (label, job_id)
) WITHOUT ROWID;
CREATE INDEX job_labels_by_job ON job_labels (job_id);
CREATE TRIGGER jobs_labels_delete AFTER DELETE ON jobs
    WHEN OLD.tags_json IS NOT NULL OR OLD.metadata_json IS NOT NULL BEGIN
    DELETE FROM job_labels WHERE job_id = OLD.job_id;
END;
"#;

/// Store the labels of `jobs`, just inserted, in the caller's write.
pub(super) fn insert(conn: &Connection, jobs: &[Job]) -> Result<(), StoreError> {
    let err = db_err("storing a job's tags and metadata");
    for job in jobs.iter().filter(|j| !j.tags.is_empty() || !j.metadata.is_empty()) {
        let id = job.id.to_string();
        let mut statement =
            conn.prepare_cached("INSERT INTO job_labels (label, job_id) VALUES (?1, ?2)").map_err(&err)?;
        for label in labels_of(&job.tags, &job.metadata) {
            statement.execute(params![label, id]).map_err(&err)?;
        }
    }
    Ok(())
}
