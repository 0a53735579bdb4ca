//! Start templates: the saved, freshly booted guests a backend's new
//! sandboxes restore instead of booting (the `vm` backend's). Building one
//! ahead of time, listing and removing them; `Gc` sweeps the stale ones.

use pvisor_core::records::ResourceLimits;
use pvisor_sandbox::capabilities::{Templates, WarmedTemplate};
use pvisor_vm::template::TemplateListing;

use super::{Action, Runtime, RuntimeError};

/// The templates of the backend that keeps them (see
/// [`BackendTraits::keeps_templates`](crate::backends::BackendTraits)).
pub(super) fn kept(runtime: &Runtime) -> Option<std::sync::Arc<dyn Templates>> {
    crate::backends::template_backend(runtime.backends.as_ref())
        .and_then(|name| runtime.backends.templates(name))
}

fn templates(runtime: &Runtime) -> Result<std::sync::Arc<dyn Templates>, RuntimeError> {
    kept(runtime).ok_or_else(|| {
        RuntimeError::Template(
            "the vm backend is not available here (no guest image or QEMU; `pvisor doctor` says why)".into(),
        )
    })
}

/// Builds (or verifies) the template that vm starts with `limits` restore.
#[derive(Debug)]
pub struct WarmTemplate {
    pub limits: ResourceLimits,
}

impl Action for WarmTemplate {
    const NAME: &'static str = "warm_template";
    type Outcome = WarmedTemplate;

    fn perform(self, runtime: &Runtime) -> Result<WarmedTemplate, RuntimeError> {
        templates(runtime)?.warm(&self.limits).map_err(|e| RuntimeError::Template(e.to_string()))
    }
}

/// Every template kept, with whether it is stale.
#[derive(Debug)]
pub struct ListTemplates;

impl Action for ListTemplates {
    const NAME: &'static str = "list_templates";
    type Outcome = Vec<TemplateListing>;

    fn perform(self, runtime: &Runtime) -> Result<Vec<TemplateListing>, RuntimeError> {
        Ok(kept(runtime).map(|t| t.list()).unwrap_or_default())
    }
}

/// Removes one template; returns the bytes freed.
#[derive(Debug)]
pub struct RemoveTemplate {
    pub id: String,
}

impl Action for RemoveTemplate {
    const NAME: &'static str = "remove_template";
    type Outcome = u64;

    fn perform(self, runtime: &Runtime) -> Result<u64, RuntimeError> {
        templates(runtime)?.remove(&self.id).map_err(|e| RuntimeError::Template(e.to_string()))
    }
}
