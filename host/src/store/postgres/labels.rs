//! The PostgreSQL store's job labels: a job's tags and metadata entries,
//! one row each, so a list filtered by them reads an index (see
//! [`labels`](crate::job::labels)).

use deadpool_postgres::GenericClient;
use serde_json::{Map, Value};

use super::rows::db_err;
use crate::job::labels::labels_of;
use crate::job::{Job, JobId};
use crate::store::StoreError;

/// The migration that adds tags and metadata (listed in
/// [`MIGRATIONS`](super::schema::MIGRATIONS)). A deleted job's labels go
/// with it; a job without any costs the delete nothing.
pub(super) const MIGRATION: &str = r#"
ALTER TABLE jobs ADD COLUMN tags_json TEXT;
ALTER TABLE jobs ADD COLUMN metadata_json TEXT;
CREATE TABLE job_labels (
    label  TEXT NOT NULL,
    job_id TEXT NOT NULL,
    PRIMARY KEY (label, job_id)
);
CREATE INDEX job_labels_by_job ON job_labels (job_id);
CREATE FUNCTION leash_job_labels_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_labels WHERE job_id = OLD.job_id;
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_labels_delete AFTER DELETE ON jobs FOR EACH ROW
    WHEN (OLD.tags_json IS NOT NULL OR OLD.metadata_json IS NOT NULL)
    EXECUTE FUNCTION leash_job_labels_delete();
"#;

/// Store the labels of `jobs`, just inserted, in the caller's transaction.
pub(super) async fn insert(client: &impl GenericClient, jobs: &[Job]) -> Result<(), StoreError> {
    let columns = Columns::of(jobs.iter().map(|j| (j.id, &j.tags, &j.metadata)));
    if columns.labels.is_empty() {
        return Ok(());
    }
    let err = db_err("storing a job's tags and metadata");
    let statement = client.prepare_cached(INSERT).await.map_err(&err)?;
    client.execute(&statement, &[&columns.labels, &columns.ids]).await.map_err(&err)?;
    Ok(())
}

/// The insert of a job's label rows: [`Columns`] bound as `$1` and `$2`.
pub(super) const INSERT: &str = "INSERT INTO job_labels (label, job_id) SELECT * FROM unnest($1::text[], $2::text[])";

/// The label rows of some jobs, one array per column.
#[derive(Default)]
pub(super) struct Columns {
    pub(super) labels: Vec<String>,
    pub(super) ids: Vec<String>,
}

impl Columns {
    /// The rows for each job's `(id, tags, metadata)`.
    pub(super) fn of<'a>(jobs: impl Iterator<Item = (JobId, &'a Vec<String>, &'a Map<String, Value>)>) -> Self {
        let mut columns = Columns::default();
        for (id, tags, metadata) in jobs {
            for label in labels_of(tags, metadata) {
                columns.labels.push(label);
                columns.ids.push(id.to_string());
            }
        }
        columns
    }
}
