//! Opening the backend: a bad connection string, and a database migrated by a newer
//! tally, are refused with typed errors that say what to do; the schema is created once
//! however many gates open it.

mod common;

use tally_gate_postgres::{Options, Postgres, PostgresError, SCHEMA_VERSION};

#[test]
fn a_connection_string_that_does_not_parse_is_refused_before_connecting() {
    let dir = tempfile::tempdir().expect("dir");
    let refused = Postgres::open(common::ledger(dir.path()), &Options::new("postgres://[::1"));
    match refused {
        Err(e @ PostgresError::Url { .. }) => {
            assert!(
                e.to_string().contains("postgres://USER@HOST:PORT/DATABASE"),
                "{e}"
            )
        }
        other => panic!("expected a URL error, got {other:?}"),
    }
}

#[test]
fn a_schema_from_a_newer_tally_is_refused_and_several_gates_create_it_once() {
    let Some(cluster) = common::Cluster::start() else {
        return;
    };
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().expect("dir")).collect();
    let opened: Vec<_> = dirs
        .iter()
        .map(|d| {
            let ledger = common::ledger(d.path());
            let url = cluster.url();
            std::thread::spawn(move || Postgres::open(ledger, &Options::new(&url)).map(|_| ()))
        })
        .collect();
    for o in opened {
        o.join().expect("thread").expect("open");
    }
    assert_eq!(
        cluster.psql("SELECT count(*) FROM tally_schema").trim(),
        "1"
    );
    cluster.psql("UPDATE tally_schema SET version = 99");
    let dir = tempfile::tempdir().expect("dir");
    match Postgres::open(common::ledger(dir.path()), &Options::new(&cluster.url())) {
        Err(e @ PostgresError::SchemaTooNew { found: 99, .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("up to {SCHEMA_VERSION}")) && msg.contains("upgrade tally"),
                "{msg}"
            );
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[test]
fn a_version_1_schema_is_migrated_in_place() {
    let Some(cluster) = common::Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    drop(Postgres::open(common::ledger(dir.path()), &Options::new(&cluster.url())).expect("open"));
    // What a tally of schema version 1 left: no state version sequence.
    cluster.psql("DROP SEQUENCE tally_state_version; UPDATE tally_schema SET version = 1");
    let gate = common::pg_gate(&cluster, dir.path(), "");
    let req = serde_json::from_value(serde_json::json!({"run": "r"})).expect("request");
    gate.start_blocking(
        tally_gate::Caller {
            uid: None,
            operator: true,
            proxied: false,
        },
        req,
    )
    .expect("a start on the migrated schema");
    assert_eq!(
        cluster.psql("SELECT max(version) FROM tally_schema").trim(),
        SCHEMA_VERSION.to_string()
    );
    // The sequence is back and numbered the start.
    assert_eq!(
        cluster
            .psql("SELECT last_value FROM tally_state_version")
            .trim(),
        "1"
    );
}

/// A database already at schema 10 in its first form (no partial index on reclaimed
/// slices, the older `tally_lease_step`) is brought to its amended form on open, under
/// the same lock, with the version not recorded twice.
#[test]
fn a_version_10_schema_in_its_first_form_is_amended_on_open() {
    let Some(cluster) = common::Cluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().expect("dir");
    drop(Postgres::open(common::ledger(dir.path()), &Options::new(&cluster.url())).expect("open"));
    let amended = "SELECT (SELECT count(*) FROM pg_indexes WHERE indexname = 'tally_leases_reclaimed') || '|' || \
        (SELECT prosrc LIKE '%tally_lease_holders%' FROM pg_proc WHERE proname = 'tally_lease_step' AND pronargs = 8)";
    assert_eq!(cluster.psql(amended).trim(), "1|true");
    // What the first form of schema 10 left (step 11 not run yet: a database at 11 was
    // migrated by a build with the amended step 10, and runs nothing again).
    cluster.psql(
        "ALTER TABLE tally_leases DROP CONSTRAINT tally_leases_committed_within, \
         DROP COLUMN committed_attempts, DROP COLUMN committed_nanos, \
         DROP COLUMN committed_effects, DROP COLUMN committed_polls, DROP COLUMN covers_use; \
         DROP FUNCTION tally_home_write(text, bytea, boolean, text, bigint, text, bigint, \
         text, bigint, bigint, bigint[], bigint, bigint[], timestamptz); \
         UPDATE tally_schema SET version = 10; \
         DROP INDEX tally_leases_reclaimed; \
         CREATE OR REPLACE FUNCTION tally_lease_step(k text, name text, a bigint, n bigint, e bigint, p bigint, \
         r boolean, bill boolean) RETURNS void LANGUAGE plpgsql AS $f$ BEGIN RETURN; END $f$",
    );
    assert_eq!(cluster.psql(amended).trim(), "0|false");
    drop(
        Postgres::open(common::ledger(dir.path()), &Options::new(&cluster.url())).expect("reopen"),
    );
    assert_eq!(cluster.psql(amended).trim(), "1|true", "amended on open");
    assert_eq!(
        cluster
            .psql("SELECT string_agg(version::text, ',' ORDER BY version) FROM tally_schema")
            .trim(),
        format!("10,{SCHEMA_VERSION}"),
        "10 not recorded again, 11 recorded once"
    );
}
