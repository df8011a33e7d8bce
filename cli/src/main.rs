//! `kstate`: the operator CLI of kstate state directories. A thin layer over
//! [`kstate::admin`]: argument parsing, tables for people, `--json` for
//! machines.
//!
//! Exit status: 0 on success, 1 on an operational error (including names
//! that are not in the state dir and refused changes), 2 on bad arguments or
//! client configuration (`-X`), 3 when `verify` finds differences.

mod savepoint;
mod table;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use kstate::admin::{self, Kafka, PrefixRule};
use serde::Serialize;
use table::{age, bytes, count, Table};

#[derive(Parser, Debug)]
#[command(name = "kstate", version, about = "Operator tool for kstate state directories", max_term_width = 100)]
struct Cli {
    /// The application's state directory (`AppBuilder::state_dir`).
    #[arg(long, env = "KSTATE_STATE_DIR", global = true, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long, global = true)]
    json: bool,
    /// Kafka bootstrap servers (verify, estimate-restore).
    #[arg(long, env = "KSTATE_BOOTSTRAP", global = true, value_name = "HOST:PORT,...")]
    bootstrap: Option<String>,
    /// A librdkafka property for the Kafka client (TLS, SASL, ...); repeatable.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_property, global = true)]
    property: Vec<(String, String)>,
    /// Bound on each Kafka metadata or offsets request, in seconds.
    #[arg(long, global = true, default_value_t = 5.0, value_name = "SECONDS")]
    timeout: f64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every application, store and partition: checkpoint, keys, sizes, last flush, lock.
    Inspect,
    /// One store partition's data: totals, largest keys and values, keys by prefix.
    Sample {
        #[command(flatten)]
        target: StorePartition,
        /// How many of the largest keys, values and prefixes to show.
        #[arg(long, default_value_t = 10)]
        top: usize,
        /// Group keys by their first N bytes.
        #[arg(long, value_name = "N", conflicts_with = "delimiter")]
        prefix_len: Option<usize>,
        /// Group keys by what comes before the first occurrence of this (one ASCII character).
        #[arg(long, value_name = "CHAR", value_parser = parse_delimiter)]
        delimiter: Option<u8>,
    },
    /// Compare a store partition with its changelog (exit status 3 if they differ).
    Verify {
        #[command(flatten)]
        target: StorePartition,
        /// Bound on reading the changelog partition, in seconds.
        #[arg(long, default_value_t = 120.0, value_name = "SECONDS")]
        read_timeout: f64,
        /// A remote store (`StoreDefinition::remote`): the URL the
        /// application gives `RemoteStateConfig::new`; what object storage
        /// holds is compared (no --state-dir needed; the writer is not fenced).
        #[arg(long, env = "KSTATE_REMOTE_URL", value_name = "URL")]
        remote_url: Option<String>,
        /// An object store setting for --remote-url (`aws_endpoint=...`); repeatable.
        #[arg(short = 'O', value_name = "KEY=VALUE", value_parser = parse_property)]
        option: Vec<(String, String)>,
    },
    /// How many changelog records a restart would replay, and how long it would take.
    EstimateRestore {
        /// The application id.
        #[arg(long)]
        app: String,
        /// Also a store without a local directory; repeatable.
        #[arg(long = "store", value_name = "STORE")]
        stores: Vec<String>,
        /// Only these partitions (default: every changelog partition; without local state from the start).
        #[arg(long, value_delimiter = ',', value_name = "P,...")]
        partitions: Vec<i32>,
        /// Restore rate in records per second (default: measured on this state dir, else 100000).
        #[arg(long, value_name = "RECORDS_PER_SEC")]
        rate: Option<f64>,
        /// Bound on reading each partition's size sample, in seconds.
        #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
        read_timeout: f64,
        /// Also price seeding from the application's snapshots at this URL
        /// (`SnapshotConfig::new`; credentials from the environment).
        #[arg(long, env = "KSTATE_SNAPSHOT_URL", value_name = "URL")]
        snapshot_url: Option<String>,
        /// An object store setting for --snapshot-url (`aws_endpoint=...`); repeatable.
        #[arg(short = 'O', value_name = "KEY=VALUE", value_parser = parse_property)]
        option: Vec<(String, String)>,
        /// Snapshot download rate in MB/s (default 100).
        #[arg(long, value_name = "MB_PER_SEC")]
        download_rate: Option<f64>,
    },
    /// Copy a stopped store partition (RocksDB checkpoint) to a new directory.
    Snapshot {
        #[command(flatten)]
        target: StorePartition,
        /// The snapshot directory to create (must not exist).
        dest: PathBuf,
    },
    /// Put a snapshot in place as its store partition's local state.
    ImportSnapshot {
        /// A directory written by `kstate snapshot`.
        snapshot: PathBuf,
        /// Replace local state that is there.
        #[arg(long)]
        force: bool,
    },
    /// Snapshots in object storage (`AppBuilder::snapshots`): list, show, gc.
    Snapshots {
        /// The snapshot URL the application uses (`SnapshotConfig::new`);
        /// credentials come from the environment (AWS_*, GOOGLE_*, AZURE_*).
        #[arg(long, env = "KSTATE_SNAPSHOT_URL", value_name = "URL")]
        url: String,
        /// An object store setting (`aws_endpoint=http://...`); repeatable.
        #[arg(short = 'O', value_name = "KEY=VALUE", value_parser = parse_property)]
        option: Vec<(String, String)>,
        #[command(subcommand)]
        action: SnapshotsAction,
    },
    /// Savepoints (a consistent cut of the whole application, in its
    /// snapshot store): create (online), list, show, delete, restore (offline).
    Savepoint {
        /// The snapshot URL the application uses (`SnapshotConfig::new`).
        #[arg(long, env = "KSTATE_SNAPSHOT_URL", value_name = "URL")]
        url: String,
        /// An object store setting (`aws_endpoint=http://...`); repeatable.
        #[arg(short = 'O', value_name = "KEY=VALUE", value_parser = parse_property)]
        option: Vec<(String, String)>,
        #[command(subcommand)]
        action: savepoint::Action,
    },
    /// Delete one task's local state (every store's partition, or one store's).
    Wipe {
        /// The application id.
        #[arg(long)]
        app: String,
        /// The task's partition.
        #[arg(long)]
        partition: i32,
        /// Only this store (default: every store of the application).
        #[arg(long)]
        store: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
enum SnapshotsAction {
    /// Every snapshot of the application, by store partition.
    List {
        /// The application id.
        #[arg(long)]
        app: String,
        /// Only this store.
        #[arg(long)]
        store: Option<String>,
    },
    /// One snapshot's manifest: checkpoint, topic id, files.
    Show {
        /// The application id.
        #[arg(long)]
        app: String,
        /// The snapshot id (from `list`).
        id: String,
    },
    /// Keep the newest snapshots of each store partition; delete the rest
    /// and every file no kept snapshot names (safe while the application runs).
    Gc {
        /// The application id.
        #[arg(long)]
        app: String,
        /// Snapshots kept per store partition.
        #[arg(long, default_value_t = 3)]
        retain: usize,
    },
}

#[derive(clap::Args, Debug)]
struct StorePartition {
    /// The application id.
    #[arg(long)]
    app: String,
    /// The store.
    #[arg(long)]
    store: String,
    /// The partition.
    #[arg(long)]
    partition: i32,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not KEY=VALUE")),
    }
}

fn parse_delimiter(s: &str) -> Result<u8, String> {
    match s.as_bytes() {
        [b] if b.is_ascii() => Ok(*b),
        _ => Err(format!("`{s}` is not one ASCII character")),
    }
}

fn seconds(s: f64, what: &str) -> Duration {
    Duration::try_from_secs_f64(s).ok().filter(|d| !d.is_zero()).unwrap_or_else(|| {
        Cli::command().error(clap::error::ErrorKind::ValueValidation, format!("{what} must be a positive number of seconds")).exit()
    })
}

fn main() -> ExitCode {
    // Rust ignores SIGPIPE, which turns a closed pipe (`kstate inspect |
    // head`) into a panic in `println!`; a command line tool should just end.
    // SAFETY: setting a signal disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let cli = Cli::parse();
    if let Command::Savepoint { url, option, action } = &cli.command {
        let at = admin::SnapshotStore { url: url.clone(), options: option.clone() };
        return match savepoint::run(&at, action, cli.json, || kafka(&cli, 120.0)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        };
    }
    if let Command::Snapshots { url, option, action } = &cli.command {
        let at = admin::SnapshotStore { url: url.clone(), options: option.clone() };
        return match snapshots(&cli, &at, action) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        };
    }
    if let Command::Verify { target, read_timeout, remote_url: Some(url), option } = &cli.command {
        let mut remote = kstate::RemoteStateConfig::new(url.clone());
        for (k, v) in option {
            remote = remote.option(k.clone(), v.clone());
        }
        let verified = admin::verify_remote(&remote, &target.app, &target.store, target.partition, &kafka(&cli, *read_timeout));
        return match verified {
            Ok(r) => report_verify(&cli, &r),
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(if matches!(e, admin::AdminError::Kstate(kstate::Error::Config(_))) { 2 } else { 1 })
            }
        };
    }
    let Some(state_dir) = cli.state_dir.clone() else {
        Cli::command()
            .error(clap::error::ErrorKind::MissingRequiredArgument, "--state-dir (or KSTATE_STATE_DIR) is required")
            .exit()
    };
    match run(&cli, state_dir) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                admin::AdminError::Kstate(kstate::Error::Config(_)) => ExitCode::from(2),
                _ => ExitCode::from(1),
            }
        }
    }
}

fn kafka(cli: &Cli, read_timeout: f64) -> Kafka {
    let Some(bootstrap) = cli.bootstrap.clone() else {
        Cli::command()
            .error(clap::error::ErrorKind::MissingRequiredArgument, "--bootstrap (or KSTATE_BOOTSTRAP) is required for this command")
            .exit()
    };
    let mut k = Kafka::new(bootstrap);
    k.properties = cli.property.clone();
    k.timeout = seconds(cli.timeout, "--timeout");
    k.read_timeout = seconds(read_timeout, "--read-timeout");
    k
}

/// Prints a verify report; exit status 3 if the store and its changelog differ.
fn report_verify(cli: &Cli, r: &admin::VerifyReport) -> ExitCode {
    if cli.json {
        json(r);
    } else {
        print_verify(r);
    }
    if r.difference_count() > 0 {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

fn json(report: &impl Serialize) {
    println!("{}", serde_json::to_string_pretty(report).expect("reports serialize"));
}

fn run(cli: &Cli, state_dir: PathBuf) -> admin::Result<ExitCode> {
    match &cli.command {
        Command::Inspect => {
            let r = admin::inspect(&state_dir)?;
            if cli.json {
                json(&r);
            } else {
                print_inspect(&r);
            }
        }
        Command::Sample { target, top, prefix_len, delimiter } => {
            let rule = match (prefix_len, delimiter) {
                (_, Some(d)) => PrefixRule::Delimiter(*d),
                (Some(n), None) => PrefixRule::Bytes(*n),
                (None, None) => PrefixRule::default(),
            };
            let r = admin::sample(&state_dir, &target.app, &target.store, target.partition, *top, rule)?;
            if cli.json {
                json(&r);
            } else {
                print_sample(&r);
            }
        }
        Command::Verify { target, read_timeout, .. } => {
            let kafka = kafka(cli, *read_timeout);
            let r = admin::verify(&state_dir, &target.app, &target.store, target.partition, &kafka)?;
            return Ok(report_verify(cli, &r));
        }
        Command::EstimateRestore { app, stores, partitions, rate, read_timeout, snapshot_url, option, download_rate } => {
            let kafka = kafka(cli, *read_timeout);
            let options = admin::EstimateOptions {
                stores: stores.clone(),
                partitions: partitions.clone(),
                rate: *rate,
                snapshots: snapshot_url.as_ref().map(|url| admin::SnapshotStore { url: url.clone(), options: option.clone() }),
                download_rate: download_rate.map(|mb| mb * 1e6),
            };
            let r = admin::estimate_restore(&state_dir, app, &kafka, &options)?;
            if cli.json {
                json(&r);
            } else {
                print_estimate(&r);
            }
        }
        Command::Snapshot { target, dest } => {
            let r = admin::snapshot(&state_dir, &target.app, &target.store, target.partition, dest)?;
            if cli.json {
                json(&r);
            } else {
                let m = &r.manifest;
                println!(
                    "snapshot of {}/{}/{} at checkpoint {} written to {} ({})",
                    m.application_id,
                    m.store,
                    m.partition,
                    opt(m.checkpoint),
                    r.path.display(),
                    bytes(r.bytes)
                );
            }
        }
        Command::ImportSnapshot { snapshot, force } => {
            let r = admin::import_snapshot(&state_dir, snapshot, *force)?;
            if cli.json {
                json(&r);
            } else {
                let m = &r.manifest;
                println!(
                    "imported {}/{}/{} at checkpoint {} into {} ({}; {} files linked, {} copied{})",
                    m.application_id,
                    m.store,
                    m.partition,
                    opt(m.checkpoint),
                    r.path.display(),
                    bytes(r.bytes),
                    r.linked_files,
                    r.copied_files,
                    if r.replaced_existing { "; replaced the local state" } else { "" }
                );
                println!(
                    "The next start replays only the changelog past offset {}. kstate checks the checkpoint against the \
                     changelog's offsets, its topic id and its tombstone retention first, and restores the store in \
                     full if the snapshot is unusable.",
                    opt(m.checkpoint)
                );
            }
        }
        Command::Snapshots { .. } | Command::Savepoint { .. } => unreachable!("handled in main: needs no state dir"),
        Command::Wipe { app, partition, store } => {
            let r = admin::wipe(&state_dir, app, *partition, store.as_deref())?;
            if cli.json {
                json(&r);
            } else {
                let mut t = Table::new(&["STORE", "DIRECTORY", "BYTES"]);
                for d in &r.deleted {
                    t.row(vec![d.store.clone(), d.path.display().to_string(), bytes(d.bytes)]);
                }
                t.print();
                println!(
                    "deleted the local state of task {} of {} ({}); its next owner restores it from the changelogs",
                    r.partition,
                    r.application_id,
                    bytes(r.total_bytes)
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn snapshots(cli: &Cli, at: &admin::SnapshotStore, action: &SnapshotsAction) -> admin::Result<()> {
    match action {
        SnapshotsAction::List { app, store } => {
            let r = admin::list_snapshots(at, app, store.as_deref())?;
            if cli.json {
                json(&r);
                return Ok(());
            }
            let mut t = Table::new(&["STORE", "PARTITION", "SNAPSHOT", "CHECKPOINT", "AGE", "FILES", "BYTES"]);
            for p in &r {
                for s in p.snapshots.iter().rev() {
                    t.row(vec![
                        p.store.clone(),
                        p.partition.to_string(),
                        s.id.clone(),
                        s.checkpoint.to_string(),
                        age((now_ms() - s.created_at_ms) as f64 / 1000.0),
                        count(s.files.len() as u64),
                        bytes(s.bytes()),
                    ]);
                }
                for why in &p.unreadable {
                    eprintln!("warning: {}/{}: {why}", p.store, p.partition);
                }
            }
            t.print();
        }
        SnapshotsAction::Show { app, id } => {
            let s = admin::show_snapshot(at, app, id)?;
            if cli.json {
                json(&s);
                return Ok(());
            }
            println!("snapshot {} of {}/{}/{}", s.id, s.application_id, s.store, s.partition);
            println!("  checkpoint     {} of {} (topic id {})", s.checkpoint, s.changelog_topic, opt(s.changelog_topic_id.as_ref()));
            println!("  taken          {} ago by kstate {}", age((now_ms() - s.created_at_ms) as f64 / 1000.0), s.kstate_version);
            println!("  definition     {} (schema version {}, format {})", s.definition, s.schema_version, s.format_version);
            println!("  size           {} in {} files", bytes(s.bytes()), s.files.len());
            let mut t = Table::new(&["FILE", "OBJECT", "BYTES", "CRC32"]);
            for f in &s.files {
                t.row(vec![f.name.clone(), f.object.clone(), bytes(f.size), format!("{:08x}", f.crc32)]);
            }
            t.print();
        }
        SnapshotsAction::Gc { app, retain } => {
            let r = admin::gc_snapshots(at, app, *retain)?;
            if cli.json {
                json(&r);
                return Ok(());
            }
            let mut t = Table::new(&["STORE", "PARTITION", "KEPT", "DELETED", "FILES DELETED", "BYTES FREED"]);
            for p in &r {
                t.row(vec![
                    p.store.clone(),
                    p.partition.to_string(),
                    p.report.manifests_kept.to_string(),
                    p.report.manifests_deleted.to_string(),
                    p.report.files_deleted.to_string(),
                    bytes(p.report.bytes_deleted),
                ]);
            }
            t.print();
        }
    }
    Ok(())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn print_inspect(r: &admin::InspectReport) {
    println!("state dir {}", r.state_dir.display());
    if r.applications.is_empty() {
        println!("(no applications)");
    }
    for a in &r.applications {
        println!();
        let rate = match &a.restore_rate {
            Some(m) => format!(
                "{} rec/s ({} records in {:.1} s, {} ago)",
                count(m.records_per_sec as u64),
                count(m.records),
                m.seconds,
                age(((now_ms() - m.measured_at_ms).max(0) as f64) / 1000.0)
            ),
            None => "not measured".to_string(),
        };
        println!("application {}  process id {}  restore rate {}", a.application_id, a.process_id.as_deref().unwrap_or("-"), rate);
        let mut t = Table::new(&[
            "STORE", "PART", "LOCK", "CHECKPOINT", "HINT", "KEYS (EST.)", "LOGICAL", "PHYSICAL", "ON DISK", "LAST FLUSH", "PROBLEM",
        ]);
        for p in &a.partitions {
            t.row(vec![
                p.store.clone(),
                p.partition.to_string(),
                if p.locked { "live".into() } else { "free".into() },
                opt(p.checkpoint),
                opt(p.checkpoint_hint),
                count(p.keys),
                bytes(p.logical_bytes),
                bytes(p.physical_bytes),
                bytes(p.disk_bytes),
                p.last_flush_age_secs.map_or_else(|| "-".into(), |s| format!("{} ago", age(s))),
                p.problem.clone().unwrap_or_default(),
            ]);
        }
        t.print();
        for p in &a.partitions {
            if let Some(timers) = &p.timers {
                println!(
                    "time of partition {}: stream time {}; {} stream-time timers (earliest {}); {} wall-clock timers (earliest {})",
                    p.partition,
                    opt(timers.stream_time),
                    count(timers.stream_time_timers),
                    opt(timers.earliest_stream_time_timer),
                    count(timers.wall_clock_timers),
                    opt(timers.earliest_wall_clock_timer),
                );
            }
            if let Some(seg) = &p.segments {
                println!(
                    "{} store {} partition {}: time {} (latest {}), segments of {} ms",
                    seg.kind,
                    p.store,
                    p.partition,
                    seg.time,
                    if seg.kind == "window" { "window start" } else { "session end" },
                    seg.segment_interval_ms,
                );
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn print_sample(r: &admin::SampleReport) {
    println!(
        "{}/{}/{} at checkpoint {}: {} keys, {} of keys, {} of values",
        r.application_id,
        r.store,
        r.partition,
        opt(r.checkpoint),
        count(r.keys),
        bytes(r.key_bytes),
        bytes(r.value_bytes)
    );
    for (title, entries) in [("largest keys", &r.largest_keys), ("largest values", &r.largest_values)] {
        println!("\n{title}:");
        let mut t = Table::new(&["KEY", "KEY BYTES", "VALUE BYTES"]);
        for e in entries {
            t.row(vec![table::cut(&e.key, 60), count(e.key_bytes), count(e.value_bytes)]);
        }
        t.print();
    }
    let rule = match r.prefix_rule {
        PrefixRule::Bytes(n) => format!("first {n} bytes"),
        PrefixRule::Delimiter(d) => format!("up to the first `{}`", admin::escape_bytes(&[d])),
    };
    println!("\nprefixes ({rule}): {} distinct; most keys:", count(r.distinct_prefixes));
    let mut t = Table::new(&["PREFIX", "KEYS", "KEY BYTES", "VALUE BYTES"]);
    for p in &r.top_prefixes {
        t.row(vec![table::cut(&p.prefix, 60), count(p.keys), bytes(p.key_bytes), bytes(p.value_bytes)]);
    }
    t.print();
    if r.other_prefix_keys > 0 {
        println!("({} keys of prefixes past the first 1,000,000 not told apart)", count(r.other_prefix_keys));
    }
    if let Some(segments) = &r.segments {
        println!("\nsegments (window starts / session ends from):");
        let mut t = Table::new(&["FROM (MS)", "KEYS"]);
        for s in segments {
            t.row(vec![s.from_ms.to_string(), count(s.keys)]);
        }
        t.print();
    }
}

fn print_verify(r: &admin::VerifyReport) {
    println!(
        "{}/{}/{}: checkpoint {}; changelog {} [{}] offsets {}..{} ({} committed records read)",
        r.application_id,
        r.store,
        r.partition,
        opt(r.checkpoint),
        r.changelog_topic,
        r.partition,
        r.changelog_start_offset,
        r.changelog_end_offset,
        count(r.records_read)
    );
    println!(
        "store keys {}, changelog keys up to the checkpoint {}, matching {}, unverifiable (written again past the checkpoint) {}",
        count(r.store_keys),
        count(r.changelog_keys),
        count(r.matching),
        count(r.unverifiable)
    );
    if r.difference_count() == 0 {
        println!("OK: the store holds exactly the changelog up to its checkpoint");
        return;
    }
    println!(
        "DIFFERENT: {} keys with different values, {} only in the store, {} only in the changelog",
        count(r.different_values),
        count(r.only_in_store),
        count(r.only_in_changelog)
    );
    if r.only_in_store > 0 && r.changelog_truncated {
        println!(
            "note: the changelog starts at offset {} (records deleted from its start): keys only in the store may be \
             keys whose only changelog records were deleted",
            r.changelog_start_offset
        );
    }
    let mut t = Table::new(&["KEY", "STORE VALUE", "CHANGELOG VALUE"]);
    for d in &r.differences {
        t.row(vec![
            table::cut(&d.key, 48),
            d.store_value.clone().unwrap_or_else(|| "(absent)".into()),
            d.changelog_value.clone().unwrap_or_else(|| "(absent)".into()),
        ]);
    }
    t.print();
    if (r.difference_count() as usize) > r.differences.len() {
        println!("(at most {} keys listed per kind)", admin::MAX_LISTED);
    }
}

fn print_estimate(r: &admin::RestoreEstimate) {
    let mut t = Table::new(&["STORE", "PART", "LOCAL", "CHECKPOINT", "FROM", "END", "RECORDS", "BYTES (EST.)", "NOTE"]);
    for p in &r.partitions {
        t.row(vec![
            p.store.clone(),
            p.partition.to_string(),
            if p.local { "yes".into() } else { "no".into() },
            opt(p.checkpoint),
            p.from_offset.to_string(),
            p.end_offset.to_string(),
            count(p.records),
            bytes(p.estimated_bytes),
            p.note.clone().unwrap_or_default(),
        ]);
    }
    t.print();
    // What the local state costs on each backend (to choose one by numbers).
    let sized: Vec<_> = r.partitions.iter().filter_map(|p| Some((p, p.sizes.as_ref()?))).collect();
    if !sized.is_empty() {
        let mut t = Table::new(&["STORE", "PART", "BACKEND", "KEYS", "KEY+VALUE", "IN MEMORY", "ROCKSDB"]);
        for (p, s) in sized {
            t.row(vec![
                p.store.clone(),
                p.partition.to_string(),
                s.backend.into(),
                count(s.keys),
                bytes(s.data_bytes),
                bytes(s.in_memory_bytes),
                if s.rocksdb_bytes > 0 { bytes(s.rocksdb_bytes) } else { "-".into() },
            ]);
        }
        println!();
        t.print();
        println!("in memory: key + value + {} bytes per entry; RocksDB: its files and memtables", admin::IN_MEMORY_ENTRY_OVERHEAD);
    }
    let source = match r.rate_source {
        admin::RateSource::Given => "given",
        admin::RateSource::Measured => "measured on this state dir",
        admin::RateSource::Assumed => "assumed: no restore measured on this state dir",
    };
    println!(
        "total: {} records, about {} (estimated from samples of up to 1000 records per partition); \
         at {} rec/s ({source}): about {}",
        count(r.total_records),
        bytes(r.total_estimated_bytes),
        count(r.rate_records_per_sec as u64),
        age(r.estimated_seconds)
    );
    if let (Some(with), Some(rate)) = (r.estimated_seconds_with_snapshots, r.download_rate_bytes_per_sec) {
        let mut t = Table::new(&["STORE", "PART", "SNAPSHOT", "CHECKPOINT", "DOWNLOAD", "TAIL RECORDS", "SNAPSHOT PATH", "FULL REPLAY"]);
        for p in &r.partitions {
            if let Some(s) = &p.snapshot {
                t.row(vec![
                    p.store.clone(),
                    p.partition.to_string(),
                    s.snapshot_id.clone(),
                    s.checkpoint.to_string(),
                    bytes(s.bytes),
                    count(s.tail_records),
                    age(s.estimated_seconds),
                    age(p.records as f64 / r.rate_records_per_sec),
                ]);
            }
        }
        t.print();
        println!(
            "with snapshots (downloads at {:.0} MB/s, the rest replayed at {} rec/s): about {}",
            rate / 1e6,
            count(r.rate_records_per_sec as u64),
            age(with)
        );
    }
}
