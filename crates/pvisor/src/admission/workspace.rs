//! The workspace and working directory a run is admitted over.
//!
//! The workspace is resolved to its canonical path once, here; it must be
//! an existing directory other than `/`, with UTF-8 path, and it may neither
//! hold pvisor's state directory nor sit inside it.

use std::path::{Path, PathBuf};

use pvisor_core::store::Store;

use super::AdmissionError;

/// Decides the canonical workspace and returns it with the state directory
/// (which the command must never see), refusing a workspace that holds the
/// state directory or, but for a vm image's rootfs, lies inside it.
pub(super) fn resolve(
    store: &Store,
    executor: super::Backend<'_>,
    requested: &Path,
) -> Result<(PathBuf, PathBuf), AdmissionError> {
    let workspace = canonical_workspace(requested)?;
    let state = store.root().to_owned();
    if state.starts_with(&workspace) {
        return Err(AdmissionError::WorkspaceContainsState { workspace, state });
    }
    // A vm guest sees only an ext4 copy of its workspace, so a sandbox
    // image's rootfs (which holds no state) may be one.
    let image_rootfs = executor.traits.image_rootfs && workspace.starts_with(store.sandbox_images_dir());
    if workspace.starts_with(&state) && !image_rootfs {
        return Err(AdmissionError::WorkspaceInsideState { workspace, state });
    }
    Ok((workspace, state))
}

/// Decides the working directory: the workspace, or `cwd` resolved against
/// it, which must stay inside it.
pub(super) fn cwd(workspace: &Path, cwd: Option<&Path>) -> Result<PathBuf, AdmissionError> {
    Ok(match cwd {
        None => workspace.to_owned(),
        Some(cwd) => {
            let joined = workspace.join(cwd);
            let resolved = std::fs::canonicalize(&joined).unwrap_or(joined);
            if !resolved.starts_with(workspace) {
                return Err(AdmissionError::CwdOutsideWorkspace {
                    cwd: resolved,
                    workspace: workspace.to_owned(),
                });
            }
            resolved
        }
    })
}

fn canonical_workspace(path: &Path) -> Result<PathBuf, AdmissionError> {
    let canonical = std::fs::canonicalize(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => AdmissionError::WorkspaceMissing { path: path.to_owned() },
        _ => AdmissionError::WorkspaceUnreadable { path: path.to_owned(), source },
    })?;
    if !canonical.is_dir() {
        return Err(AdmissionError::WorkspaceNotDirectory { path: path.to_owned() });
    }
    if canonical == Path::new("/") {
        return Err(AdmissionError::WorkspaceIsRoot);
    }
    if canonical.to_str().is_none() {
        return Err(AdmissionError::NonUtf8Path { path: canonical });
    }
    Ok(canonical)
}
