//! The HTTP side of `serve_counts`: serves a store of `Utf8` keys and
//! `U64Be` values over HTTP with axum, forwarding what this instance does
//! not hold to the instance that runs it (the `application_server` the
//! query metadata names). The multi-instance query test
//! (`tests/queries_http.rs`) serves through this same file.
//!
//! | request | answer |
//! |---|---|
//! | `GET /stores/{store}/keys/{key}` | `{"key","value","partition","offset","copy","lag","served_by"}` |
//! | `GET /stores/{store}/range?from=a&to=b&limit=n` | `{"entries":[[key,value]],"partitions":[...],"missing":[p],"truncated"}` over every partition |
//! | `GET /stores/{store}/partitions/{p}/range?...` | one partition's entries (what a range forwards) |
//! | `GET /instances` | every instance, its endpoint and partitions |
//!
//! Query parameters: `after_input=OFFSET` (read your own write: the input
//! offset the producer got back), `max_lag=N` (a standby may answer),
//! `wait_ms=M` (how long a bound may wait). Errors: `{"error": kind,
//! "detail", "active"}`, each kind always with the same status: 503 with
//! `Retry-After: 1` for what a retry may fix (`not_hosted`, `restoring`,
//! `too_stale`, `not_yet`, `not_started`, `shutting_down`, and
//! `forward_failed` when the instance a request was passed to did not
//! answer), 400 for bad input, 404 for an unknown store, 500 for a storage
//! failure.
//!
//! Forwarding: a key this instance cannot answer (not hosted here, or this
//! instance shutting down) goes to the partition's active host, or while
//! there is none other than this one, to a standby host. If that fails, the
//! group's metadata is read again after a short pause and the request goes
//! once more to the new owner: across a clean shutdown the partition's new
//! owner answers instead of the old one's error.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use kstate::codec::{U64Be, Utf8};
use kstate::{Answer, CopyRole, Queries, QueryError, QueryOptions};
use serde::{Deserialize, Serialize};

/// What the handlers share.
pub struct Server {
    pub queries: Queries,
    /// This instance's `application_server`.
    pub me: String,
    pub client: reqwest::Client,
}

/// The routes, ready for `axum::serve`.
pub fn router(server: Arc<Server>) -> Router {
    Router::new()
        .route("/stores/{store}/keys/{key}", get(get_key))
        .route("/stores/{store}/range", get(range))
        .route("/stores/{store}/partitions/{partition}/range", get(partition_range))
        .route("/instances", get(instances))
        .with_state(server)
}

/// Serves until the listener fails (runs a tokio runtime on this thread).
pub fn serve_blocking(server: Arc<Server>, listen: &str) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        axum::serve(listener, router(server)).await
    })
}

#[derive(Debug, Default, Deserialize)]
pub struct Params {
    after_input: Option<i64>,
    max_lag: Option<u64>,
    wait_ms: Option<u64>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<usize>,
    /// Set on forwarded requests: answer here or fail, never forward again.
    #[serde(default)]
    forwarded: bool,
}

impl Params {
    fn options(&self) -> QueryOptions {
        let mut options = QueryOptions::new();
        if let Some(offset) = self.after_input {
            options = options.after_input(offset);
        }
        if let Some(lag) = self.max_lag {
            options = options.allow_stale(lag);
        }
        if let Some(ms) = self.wait_ms {
            options = options.wait(Duration::from_millis(ms));
        }
        options
    }

    /// The same request, marked forwarded.
    fn forwarded_query(&self) -> String {
        let mut q = vec!["forwarded=true".to_string()];
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                q.push(format!("{k}={}", urlencoding(&v)));
            }
        };
        add("after_input", self.after_input.map(|v| v.to_string()));
        add("max_lag", self.max_lag.map(|v| v.to_string()));
        add("wait_ms", self.wait_ms.map(|v| v.to_string()));
        add("from", self.from.clone());
        add("to", self.to.clone());
        add("limit", self.limit.map(|v| v.to_string()));
        q.join("&")
    }
}

/// One key's answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeyAnswer {
    pub key: String,
    pub value: Option<u64>,
    pub partition: i32,
    /// The changelog offset of the state that answered.
    pub offset: Option<i64>,
    pub copy: String,
    pub lag: u64,
    pub served_by: String,
}

/// One partition's part of a range answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct PartitionAnswer {
    pub partition: i32,
    pub offset: Option<i64>,
    pub copy: String,
    pub served_by: String,
    pub entries: Vec<(String, u64)>,
    pub truncated: bool,
}

/// A range over every partition.
#[derive(Debug, Serialize, Deserialize)]
pub struct RangeAnswer {
    pub entries: Vec<(String, u64)>,
    pub partitions: Vec<PartitionAnswer>,
    /// Partitions no instance answered for, with why.
    pub missing: Vec<(i32, String)>,
    pub truncated: bool,
}

/// An error body.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub detail: String,
    /// The active host, for `not_hosted`.
    pub active: Option<String>,
}

fn copy_name(copy: CopyRole) -> String {
    match copy {
        CopyRole::Active => "active",
        CopyRole::Standby => "standby",
        CopyRole::Restoring => "restoring",
        _ => "other",
    }
    .to_string()
}

/// What a client is told to wait before retrying a 503.
const RETRY_AFTER: (&str, &str) = ("retry-after", "1");

/// How long a failed forward waits before reading the metadata again: the
/// time a clean handover takes to reach the group.
const REFRESH_PAUSE: Duration = Duration::from_millis(150);

/// The HTTP status and kind of a query error.
fn error_response(e: &QueryError) -> Response {
    let (status, kind, active) = match e {
        QueryError::NotStarted => (StatusCode::SERVICE_UNAVAILABLE, "not_started", None),
        QueryError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down", None),
        QueryError::NotHosted { active, .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_hosted", active.clone()),
        QueryError::Restoring { .. } => (StatusCode::SERVICE_UNAVAILABLE, "restoring", None),
        QueryError::TooStale { .. } => (StatusCode::SERVICE_UNAVAILABLE, "too_stale", None),
        QueryError::NotYet { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_yet", None),
        QueryError::UnknownStore { .. } => (StatusCode::NOT_FOUND, "unknown_store", None),
        QueryError::WrongStoreKind { .. } => (StatusCode::BAD_REQUEST, "wrong_store_kind", None),
        QueryError::Codec { .. } => (StatusCode::BAD_REQUEST, "codec", None),
        QueryError::InvalidPosition { .. } => (StatusCode::BAD_REQUEST, "invalid_position", None),
        QueryError::Storage { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "storage", None),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "other", None),
    };
    let body = Json(ErrorBody { error: kind.into(), detail: e.to_string(), active });
    if status == StatusCode::SERVICE_UNAVAILABLE {
        return (status, [RETRY_AFTER], body).into_response();
    }
    (status, body).into_response()
}

/// The instance a request was passed to did not answer (it may be
/// stopping or dead, and the group not moved on yet): retriable.
fn forward_failed(detail: String) -> Response {
    let body = Json(ErrorBody { error: "forward_failed".into(), detail, active: None });
    (StatusCode::SERVICE_UNAVAILABLE, [RETRY_AFTER], body).into_response()
}

/// Whether the answer may come from another instance: this one does not
/// hold the partition's active copy, or is shutting down.
fn elsewhere(e: &QueryError) -> bool {
    matches!(e, QueryError::NotHosted { .. } | QueryError::ShuttingDown)
}

/// Where to pass a request for `partition` on, by the group's metadata:
/// its active host unless that is this instance, else a standby host.
fn owner(server: &Server, partition: i32, not: &[&str]) -> Option<String> {
    let meta = server.queries.metadata_for_partition(partition);
    let usable = |h: &String| *h != server.me && !not.contains(&h.as_str());
    meta.active.filter(usable).or_else(|| meta.standbys.into_iter().find(usable))
}

/// Passes a request this instance cannot answer to the partition's owner;
/// if that fails, reads the metadata again after [`REFRESH_PAUSE`] and
/// tries the new owner once. `None`: no other instance to ask.
async fn forward_to_owner(server: &Server, partition: i32, path: &str, params: &Params) -> Option<Response> {
    let first = owner(server, partition, &[])?;
    let answer = forward(server, &first, path, params).await;
    if answer.status().is_success() || answer.status().is_client_error() {
        return Some(answer);
    }
    tokio::time::sleep(REFRESH_PAUSE).await;
    match owner(server, partition, &[first.as_str()]) {
        Some(next) => Some(forward(server, &next, path, params).await),
        None => Some(answer),
    }
}

/// Passes a request on to `host` and its answer back.
async fn forward(server: &Server, host: &str, path: &str, params: &Params) -> Response {
    let url = format!("http://{host}{path}?{}", params.forwarded_query());
    match server.client.get(&url).timeout(Duration::from_secs(10)).send().await {
        Ok(r) => {
            let status = StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            match r.bytes().await {
                // (the status's Retry-After as this instance would send it)
                Ok(body) if status == StatusCode::SERVICE_UNAVAILABLE => (status, [("content-type", "application/json"), RETRY_AFTER], body).into_response(),
                Ok(body) => (status, [("content-type", "application/json")], body).into_response(),
                Err(e) => forward_failed(format!("reading {url}: {e}")),
            }
        }
        Err(e) => forward_failed(format!("{url}: {e}")),
    }
}

async fn get_key(State(server): State<Arc<Server>>, Path((store, key)): Path<(String, String)>, Query(params): Query<Params>) -> Response {
    match server.queries.get_async::<Utf8, U64Be>(&store, &key, &params.options()).await {
        Ok(a) => Json(KeyAnswer {
            key,
            value: a.value,
            partition: a.position.partition,
            offset: a.position.offset,
            copy: copy_name(a.copy),
            lag: a.lag,
            served_by: server.me.clone(),
        })
        .into_response(),
        Err(e) if !params.forwarded && elsewhere(&e) => {
            let Ok(partition) = server.queries.partition_of::<Utf8>(&store, &key) else { return error_response(&e) };
            let path = format!("/stores/{}/keys/{}", urlencoding(&store), urlencoding(&key));
            let Some(answer) = forward_to_owner(&server, partition, &path, &params).await else { return error_response(&e) };
            if answer.status().is_success() || params.max_lag.is_none() {
                return answer;
            }
            // The owner is unreachable (it may have died, and the group not
            // noticed yet): a stale read may come from a standby.
            for standby in server.queries.metadata_for_partition(partition).standbys {
                if standby != server.me {
                    let answer = forward(&server, &standby, &path, &params).await;
                    if answer.status().is_success() {
                        return answer;
                    }
                }
            }
            answer
        }
        Err(e) => error_response(&e),
    }
}

fn partition_answer(server: &Server, a: Answer<Vec<(String, u64)>>, truncated: bool) -> PartitionAnswer {
    PartitionAnswer {
        partition: a.position.partition,
        offset: a.position.offset,
        copy: copy_name(a.copy),
        served_by: server.me.clone(),
        entries: a.value,
        truncated,
    }
}

async fn partition_range(
    State(server): State<Arc<Server>>,
    Path((store, partition)): Path<(String, i32)>,
    Query(params): Query<Params>,
) -> Response {
    let (from, to, limit) = (params.from.clone().unwrap_or_default(), params.to.clone().unwrap_or_else(|| "\u{10ffff}".into()), params.limit.unwrap_or(100));
    // (One more than asked tells whether the partition has more.)
    match server.queries.partition_range::<Utf8, U64Be>(&store, partition, &from, &to, limit + 1, &params.options()) {
        Ok(mut a) => {
            let truncated = a.value.len() > limit;
            a.value.truncate(limit);
            Json(partition_answer(&server, a, truncated)).into_response()
        }
        Err(e) if !params.forwarded && elsewhere(&e) => {
            let path = format!("/stores/{}/partitions/{partition}/range", urlencoding(&store));
            forward_to_owner(&server, partition, &path, &params).await.unwrap_or_else(|| error_response(&e))
        }
        Err(e) => error_response(&e),
    }
}

async fn range(State(server): State<Arc<Server>>, Path(store): Path<String>, Query(params): Query<Params>) -> Response {
    let (from, to, limit) = (params.from.clone().unwrap_or_default(), params.to.clone().unwrap_or_else(|| "\u{10ffff}".into()), params.limit.unwrap_or(100));
    let local = match server.queries.range::<Utf8, U64Be>(&store, &from, &to, limit, &params.options()) {
        Ok(local) => local,
        Err(e) => return error_response(&e),
    };
    let mut answer = RangeAnswer { entries: local.entries, partitions: Vec::new(), missing: Vec::new(), truncated: local.truncated };
    for read in local.read {
        answer.partitions.push(PartitionAnswer {
            partition: read.position.partition,
            offset: read.position.offset,
            copy: copy_name(read.copy),
            served_by: server.me.clone(),
            entries: Vec::new(),
            truncated: false,
        });
    }
    // The partitions held elsewhere: ask their active hosts.
    for (partition, e) in local.skipped {
        let host = match &e {
            QueryError::NotHosted { active: Some(host), .. } if !params.forwarded && *host != server.me => host.clone(),
            _ => {
                answer.missing.push((partition, e.to_string()));
                continue;
            }
        };
        let url = format!("http://{host}/stores/{}/partitions/{partition}/range?{}", urlencoding(&store), params.forwarded_query());
        let got = async {
            let r = server.client.get(&url).timeout(Duration::from_secs(10)).send().await.map_err(|e| e.to_string())?;
            let status = r.status();
            let body = r.bytes().await.map_err(|e| e.to_string())?;
            if !status.is_success() {
                return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
            }
            serde_json::from_slice::<PartitionAnswer>(&body).map_err(|e| e.to_string())
        }
        .await;
        match got {
            Ok(mut p) => {
                answer.truncated |= p.truncated;
                answer.entries.append(&mut p.entries);
                answer.partitions.push(p);
            }
            Err(e) => answer.missing.push((partition, format!("{host}: {e}"))),
        }
    }
    answer.entries.sort();
    if answer.entries.len() > limit {
        answer.entries.truncate(limit);
        answer.truncated = true;
    }
    answer.partitions.sort_by_key(|p| p.partition);
    Json(answer).into_response()
}

/// An instance as `/instances` lists it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Instance {
    pub endpoint: String,
    pub active: Vec<i32>,
    pub standby: Vec<i32>,
}

async fn instances(State(server): State<Arc<Server>>) -> Response {
    match server.queries.instances() {
        Ok(all) => Json(all.into_iter().map(|i| Instance { endpoint: i.endpoint, active: i.active, standby: i.standby }).collect::<Vec<_>>()).into_response(),
        Err(e) => error_response(&e),
    }
}

/// Percent-encodes a path segment or query value.
fn urlencoding(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
