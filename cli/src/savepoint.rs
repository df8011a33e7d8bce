//! `kstate savepoint ...`: the commands and their printed reports.

use std::time::Duration;

use clap::Subcommand;
use kstate::admin::{self, Kafka};

use crate::table::{age, Table};

#[derive(Subcommand, Debug)]
pub(crate) enum Action {
    /// Ask the running application for a savepoint and wait until every
    /// input partition is in it.
    Create {
        /// The application id.
        #[arg(long)]
        app: String,
        /// The savepoint's name (letters, digits, `.`, `_`, `-`).
        name: String,
        /// How long to wait for every partition, in seconds.
        #[arg(long, default_value_t = 300.0, value_name = "SECONDS")]
        wait: f64,
    },
    /// Every savepoint of the application, complete or in progress.
    List {
        /// The application id.
        #[arg(long)]
        app: String,
    },
    /// One savepoint: per partition, its input offsets and store checkpoints.
    Show {
        /// The application id.
        #[arg(long)]
        app: String,
        /// The savepoint's name.
        name: String,
    },
    /// Delete a savepoint (its snapshots' files go at the next collection).
    Delete {
        /// The application id.
        #[arg(long)]
        app: String,
        /// The savepoint's name.
        name: String,
    },
    /// Put the stopped application's state and input offsets back to a
    /// savepoint (needs --bootstrap).
    Restore {
        /// The application id.
        #[arg(long)]
        app: String,
        /// The savepoint's name.
        name: String,
    },
}

fn json(report: &impl serde::Serialize) {
    println!("{}", serde_json::to_string_pretty(report).expect("reports serialize"));
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

pub(crate) fn run(at: &admin::SnapshotStore, action: &Action, as_json: bool, kafka: impl FnOnce() -> Kafka) -> admin::Result<()> {
    match action {
        Action::Create { app, name, wait } => {
            let wait = Duration::try_from_secs_f64(*wait).map_err(|_| admin::AdminError::Admin("--wait must be a number of seconds".into()))?;
            let sp = admin::create_savepoint(at, app, name, wait)?;
            if as_json {
                json(&sp);
            } else {
                println!("savepoint {name} of {app} complete: {} partitions", sp.partitions);
            }
        }
        Action::List { app } => {
            let r = admin::list_savepoints(at, app)?;
            if as_json {
                json(&r);
                return Ok(());
            }
            let mut t = Table::new(&["SAVEPOINT", "STATE", "AGE", "PARTITIONS"]);
            for e in &r {
                match &e.savepoint {
                    Some(sp) => t.row(vec![
                        e.name.clone(),
                        "complete".into(),
                        age((now_ms() - sp.completed_at_ms) as f64 / 1000.0),
                        sp.partitions.to_string(),
                    ]),
                    None => t.row(vec![e.name.clone(), "in progress".into(), "-".into(), format!("{} done", e.parts.len())]),
                }
            }
            t.print();
        }
        Action::Show { app, name } => {
            let sp = admin::show_savepoint(at, app, name)?;
            if as_json {
                json(&sp);
                return Ok(());
            }
            println!("savepoint {} of {}: {} partitions, completed {} ago", sp.name, sp.application_id, sp.partitions,
                age((now_ms() - sp.completed_at_ms) as f64 / 1000.0));
            let mut t = Table::new(&["PARTITION", "INPUT OFFSETS", "STORE", "SNAPSHOT", "CHECKPOINT"]);
            for task in &sp.tasks {
                let input: Vec<String> = task.input.iter().map(|(t, o)| format!("{t}@{o} ({})", task.input_source.get(t).map_or("?", String::as_str))).collect();
                for (i, s) in task.stores.iter().enumerate() {
                    t.row(vec![
                        if i == 0 { task.partition.to_string() } else { String::new() },
                        if i == 0 { input.join(", ") } else { String::new() },
                        s.store.clone(),
                        s.snapshot_id.clone().unwrap_or_else(|| "(empty)".into()),
                        s.checkpoint.map_or_else(|| "-".into(), |c| c.to_string()),
                    ]);
                }
            }
            t.print();
        }
        Action::Delete { app, name } => {
            let n = admin::delete_savepoint(at, app, name)?;
            if as_json {
                json(&serde_json::json!({ "deleted_snapshots": n }));
            } else {
                println!("savepoint {name} of {app} deleted ({n} snapshots; their files go at the next collection)");
            }
        }
        Action::Restore { app, name } => {
            let r = admin::restore_savepoint(at, app, name, &kafka())?;
            if as_json {
                json(&r);
                return Ok(());
            }
            let mut t = Table::new(&["STORE", "PARTITION", "MODE", "READ", "PUT BACK", "DELETED"]);
            for s in &r.stores {
                t.row(vec![s.store.clone(), s.partition.to_string(), s.mode.clone(), s.records_read.to_string(), s.puts.to_string(), s.deletes.to_string()]);
            }
            t.print();
            println!("input offsets of group {app} set to the savepoint's ({} partitions); start the application", r.offsets.len());
        }
    }
    Ok(())
}
