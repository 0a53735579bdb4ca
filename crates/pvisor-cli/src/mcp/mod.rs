//! `pvisor mcp`: a Model Context Protocol server on stdio, so an agent can
//! call pvisor as a tool: run commands in a sandbox (alone or stacked in a
//! session), review and diff what they staged, apply or drop it.
//!
//! Built on `rmcp`, the protocol's official Rust SDK: it owns the JSON-RPC
//! framing, the handshake and version negotiation, and derives each tool's
//! JSON schema from the types in [`schema`]. Every tool goes through
//! [`pvisor::Runtime`] actions; a run's output is captured into pipes
//! (this process's stdout is the protocol) and returned, sanitised, with
//! its result. Tool failures are MCP error results (`isError`), never a
//! dead server: a bad argument, a missing workspace, a refused apply.

mod changes;
mod run;
pub mod schema;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    Implementation, ListResourceTemplatesResult, ListResourcesResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource, ResourceContents,
    ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, Json, RoleServer, ServerHandler, ServiceExt};

use pvisor::actions::{Events, ListJobs, ReadReceipt, ResolveJob, Trace};
use pvisor::{Runtime, RuntimeError};
use pvisor_core::records::ChangeEntry;
use pvisor_core::text::{escape_bytes, Tabs};

use schema::*;

/// Why a tool call failed; its text is the error result the agent reads.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("bad argument: {0}")]
    BadArgument(String),
    #[error("{0}")]
    Refused(String),
    #[error("pvisor could not do it: {0}")]
    Internal(String),
    #[error("{}", shown(&.0.to_string()))]
    Runtime(#[from] RuntimeError),
    #[error("{}", shown(&.0.to_string()))]
    Run(#[from] pvisor::RunError),
    #[error("{}", shown(&.0.to_string()))]
    Effects(#[from] pvisor::EffectsError),
    #[error("{}", shown(&.0.to_string()))]
    Store(#[from] pvisor_core::store::StoreError),
    #[error("{}", shown(&format!("{:#}", .0)))]
    Other(#[from] anyhow::Error),
}

/// The server: one runtime, the workspaces it serves, and the tools.
#[derive(Clone)]
pub struct PvisorMcp {
    runtime: Arc<Runtime>,
    workspace: Arc<Scope>,
    tool_router: ToolRouter<Self>,
}

/// The workspaces a server's tools may name: its root and what lies
/// beneath (or, with `--any-workspace`, any directory), never pvisor's
/// state or a secret store every sandbox has hidden. The agent picks the
/// `workspace` argument; the person who started the server picked the root.
#[derive(Debug, Clone)]
pub struct Scope {
    pub root: PathBuf,
    pub any: bool,
}

impl std::fmt::Debug for PvisorMcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PvisorMcp").field("workspace", &self.workspace).finish_non_exhaustive()
    }
}

/// Serves MCP on stdin/stdout until the client closes it.
pub fn serve(runtime: Runtime, workspace: PathBuf, any_workspace: bool) -> anyhow::Result<i32> {
    let root = workspace.canonicalize().map_err(|e| {
        anyhow::anyhow!("workspace {}: {e}; pass an existing directory with -w", workspace.display())
    })?;
    let scope = Scope { root, any: any_workspace };
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the async runtime: {e}"))?;
    tokio.block_on(async move {
        let server = PvisorMcp::new(runtime, scope);
        let running = server
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("MCP handshake failed: {e}"))?;
        running.waiting().await.map_err(|e| anyhow::anyhow!("MCP server ended: {e}"))?;
        Ok(0)
    })
}

/// Runs `work` on a blocking thread (the runtime's actions block).
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<Json<T>, String> {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(value)) => Ok(Json(value)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(e) => Err(format!("pvisor could not do it: the tool stopped ({e})")),
    }
}

#[tool_router]
impl PvisorMcp {
    pub fn new(runtime: Runtime, workspace: Scope) -> Self {
        Self { runtime: Arc::new(runtime), workspace: Arc::new(workspace), tool_router: Self::tool_router() }
    }

    /// Runs a command in a sandbox that cannot change the workspace: its
    /// writes are staged for review. In a session, it runs on top of
    /// everything the session's earlier runs staged.
    #[tool(
        description = "Run a command in a pvisor sandbox over a workspace. Its file writes are staged, not applied: review, diff, apply or drop them with the other tools. With `session`, the run sees everything earlier runs of that session staged. Returns the Job, exit status, the last bytes of stdout/stderr and what is staged."
    )]
    async fn run(
        &self,
        Parameters(args): Parameters<RunArgs>,
        context: RequestContext<RoleServer>,
    ) -> Result<Json<RunResult>, String> {
        let (runtime, ws) = (self.runtime.clone(), self.workspace.clone());
        let handle = tokio::runtime::Handle::current();
        // A cancelled call (or a client gone) cancels its run, which still
        // ends with a receipt.
        let cancel = run::Cancel::default();
        let watcher = tokio::spawn({
            let (cancel, ct) = (cancel.clone(), context.ct.clone());
            async move {
                ct.cancelled().await;
                cancel.cancel();
            }
        });
        let result = blocking(move || run::run(&runtime, &handle, &ws, args, &cancel)).await;
        watcher.abort();
        result
    }

    #[tool(
        description = "List the staged changes of a Job or session (default: the newest Job of the workspace), with kinds, sizes, conflicts, sensitive paths and, in a session, the run that made each change."
    )]
    async fn review(&self, Parameters(target): Parameters<Target>) -> Result<Json<ReviewResult>, String> {
        let (runtime, ws) = (self.runtime.clone(), self.workspace.clone());
        blocking(move || changes::review(&runtime, &ws, target)).await
    }

    #[tool(description = "Unified diffs of the remaining staged changes, per path, size-capped.")]
    async fn diff(&self, Parameters(args): Parameters<DiffArgs>) -> Result<Json<DiffResult>, String> {
        let (runtime, ws) = (self.runtime.clone(), self.workspace.clone());
        blocking(move || changes::diff(&runtime, &ws, args)).await
    }

    #[tool(
        description = "Apply staged changes to the real workspace: the given paths or globs, or all. Sensitive paths (git hooks and config, editor/CI tasks, dotfiles) are applied only with include_sensitive: true. Refused as a whole if the host changed a path since the run (a conflict). Applying everything ends a session."
    )]
    async fn apply(&self, Parameters(args): Parameters<ApplyArgs>) -> Result<Json<ApplyResult>, String> {
        let (runtime, ws) = (self.runtime.clone(), self.workspace.clone());
        blocking(move || changes::apply(&runtime, &ws, args)).await
    }

    #[tool(
        description = "Discard staged changes (the given paths or globs, or every remaining one). Ends a session once nothing is left."
    )]
    async fn drop(&self, Parameters(args): Parameters<DropArgs>) -> Result<Json<DropResult>, String> {
        let (runtime, ws) = (self.runtime.clone(), self.workspace.clone());
        blocking(move || changes::drop(&runtime, &ws, args)).await
    }

    #[tool(
        description = "A Job's state, exit status, receipt and stage (a session's head, a Job, or the newest of the workspace)."
    )]
    async fn status(&self, Parameters(target): Parameters<Target>) -> Result<Json<StatusResult>, String> {
        let (runtime, ws) = (self.runtime.clone(), self.workspace.clone());
        blocking(move || changes::status(&runtime, &ws, target)).await
    }

    #[tool(description = "The newest Jobs, newest first.")]
    async fn jobs(&self, Parameters(args): Parameters<JobsArgs>) -> Result<Json<JobsResult>, String> {
        let runtime = self.runtime.clone();
        blocking(move || changes::jobs(&runtime, args)).await
    }
}

/// The resources: each Job's Trace and completion receipt.
const TRACE_TEMPLATE: &str = "pvisor://jobs/{job}/trace";
const RECEIPT_TEMPLATE: &str = "pvisor://jobs/{job}/receipt";
/// How many Jobs `resources/list` names.
const LISTED_JOBS: usize = 20;

#[tool_handler(router = self.tool_router)]
impl ServerHandler for PvisorMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
            .with_server_info(Implementation::new("pvisor", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "pvisor runs commands in a sandbox whose writes are staged, never applied until you say so. \
                 Use `run` (with a `session` name to stack runs), then `review`/`diff`, then `apply` or `drop`.",
            )
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let runtime = self.runtime.clone();
        let jobs = tokio::task::spawn_blocking(move || runtime.execute(ListJobs))
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
            .map_err(|e| ErrorData::internal_error(shown(&e.to_string()), None))?;
        let resources = jobs
            .iter()
            .rev()
            .take(LISTED_JOBS)
            .flat_map(|listing| {
                let job = listing.0.to_string();
                [
                    Resource::new(TRACE_TEMPLATE.replace("{job}", &job), format!("{job} trace"))
                        .with_mime_type("application/json"),
                    Resource::new(RECEIPT_TEMPLATE.replace("{job}", &job), format!("{job} receipt"))
                        .with_mime_type("application/json"),
                ]
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(TRACE_TEMPLATE, "A Job's Event Trace")
                .with_description("Every event of the Job, in order, as JSON")
                .with_mime_type("application/json"),
            ResourceTemplate::new(RECEIPT_TEMPLATE, "A Job's completion receipt")
                .with_description("The RunResult and the BLAKE3 of the Run Bundle it binds, as JSON")
                .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let runtime = self.runtime.clone();
        let uri = request.uri.clone();
        let text = tokio::task::spawn_blocking(move || read_resource(&runtime, &uri))
            .await
            .map_err(|e| ErrorData::internal_error(e.to_string(), None))??;
        let contents = ResourceContents::TextResourceContents {
            uri: request.uri,
            mime_type: Some("application/json".into()),
            text,
            meta: None,
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }
}

/// The JSON text of a Trace or receipt resource.
fn read_resource(runtime: &Runtime, uri: &str) -> Result<String, ErrorData> {
    let not_found = || {
        ErrorData::resource_not_found(
            format!("no resource {}; the resources are {TRACE_TEMPLATE} and {RECEIPT_TEMPLATE}", shown(uri)),
            None,
        )
    };
    let rest = uri.strip_prefix("pvisor://jobs/").ok_or_else(not_found)?;
    let (job, what) = rest.split_once('/').ok_or_else(not_found)?;
    let job = runtime
        .execute(ResolveJob { query: Some(job.to_owned()) })
        .map_err(|e| ErrorData::resource_not_found(shown(&e.to_string()), None))?;
    let value = match what {
        "trace" => {
            let Trace { events, warnings } = runtime
                .execute(Events { job })
                .map_err(|e| ErrorData::internal_error(shown(&e.to_string()), None))?;
            serde_json::json!({"events": events, "warnings": warnings})
        }
        "receipt" => {
            let receipt = runtime
                .execute(ReadReceipt { job: job.clone() })
                .map_err(|e| ErrorData::internal_error(shown(&e.to_string()), None))?;
            serde_json::json!({"job": job, "receipt": receipt})
        }
        _ => return Err(not_found()),
    };
    Ok(serde_json::to_string_pretty(&sanitised_json(&value)).unwrap_or_default())
}

/// The workspace a tool names, or the server's root; refused when it does
/// not exist, lies outside the server's scope, holds or is inside pvisor's
/// state directory, or is a secret store every sandbox has hidden.
fn workspace(runtime: &Runtime, given: Option<&str>, scope: &Scope) -> Result<PathBuf, ToolError> {
    let path = given.map_or_else(|| scope.root.clone(), PathBuf::from);
    let path = if path.is_relative() { scope.root.join(path) } else { path };
    let canonical = path.canonicalize().map_err(|e| {
        ToolError::BadArgument(format!(
            "workspace {}: {e}; give an existing directory",
            shown(&path.display().to_string())
        ))
    })?;
    let named = shown(&canonical.display().to_string());
    if !canonical.is_dir() {
        return Err(ToolError::BadArgument(format!("workspace {named} is not a directory")));
    }
    in_scope(runtime, &canonical, scope)?;
    Ok(canonical)
}

/// Refuses a workspace (canonical) outside `scope`, of pvisor's state, or
/// of the secret stores.
fn in_scope(runtime: &Runtime, canonical: &Path, scope: &Scope) -> Result<(), ToolError> {
    let named = shown(&canonical.display().to_string());
    let state = runtime.store().root().canonicalize().unwrap_or_else(|_| runtime.store().root().to_owned());
    if canonical.starts_with(&state) || state.starts_with(canonical) {
        return Err(ToolError::BadArgument(format!(
            "workspace {named} holds or is inside pvisor's state directory {}; give a project directory",
            shown(&state.display().to_string())
        )));
    }
    if !scope.any && !canonical.starts_with(&scope.root) {
        return Err(ToolError::Refused(format!(
            "workspace {named} is outside this server's workspace {}; the person running it can start `pvisor mcp -w DIR` over it, or `pvisor mcp --any-workspace`",
            shown(&scope.root.display().to_string())
        )));
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).and_then(|h| h.canonicalize().ok());
    if let Some(store) = home
        .iter()
        .flat_map(|h| pvisor::DEFAULT_HIDDEN.iter().map(move |s| h.join(s)))
        .find(|s| canonical.starts_with(s))
    {
        return Err(ToolError::Refused(format!(
            "workspace {named} is inside {}, a secret store pvisor hides from every sandbox",
            shown(&store.display().to_string())
        )));
    }
    Ok(())
}

/// Text from a sandbox (a path, a reason) as the agent may read it: no
/// terminal escapes, control or invisible characters (shown as text).
fn shown(text: &str) -> String {
    pvisor_core::text::escape(text, Tabs::Escape).into_owned()
}

/// A command's output as the agent may read it: lines kept, everything
/// else that is not plain text shown as escapes.
fn shown_output(bytes: &[u8]) -> String {
    bytes.split(|&b| b == b'\n').map(|line| escape_bytes(line, Tabs::Keep)).collect::<Vec<_>>().join("\n")
}

/// A record as JSON, with every string sanitised.
fn sanitised_json(value: &impl serde::Serialize) -> serde_json::Value {
    fn clean(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::String(s) => serde_json::Value::String(shown(&s)),
            serde_json::Value::Array(items) => items.into_iter().map(clean).collect(),
            serde_json::Value::Object(map) => map.into_iter().map(|(k, v)| (shown(&k), clean(v))).collect(),
            other => other,
        }
    }
    clean(serde_json::to_value(value).unwrap_or_default())
}

/// The summary of a stage's changes, as `run --json` gives it
/// ([`crate::results::ChangesSummary`]), with its paths sanitised.
fn summary(changes: &[ChangeEntry]) -> ChangesSummary {
    let shared = crate::results::ChangesSummary::of(changes);
    ChangesSummary {
        total: shared.total,
        by_kind: shared.by_kind.into_iter().map(|(kind, n)| (kind.to_owned(), n)).collect(),
        paths: shared
            .paths
            .iter()
            .map(|p| PathKind { path: p.path.display_escaped(), kind: p.kind.as_str().into() })
            .collect(),
        truncated: shared.truncated,
    }
}
