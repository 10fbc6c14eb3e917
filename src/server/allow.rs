//! `--allow`: which datasets a request may name. Rules are URI prefixes
//! ending at a path boundary; a local dataset is compared as the folder it
//! resolves to, and that folder is held open for the request's store.

use std::sync::Arc;

use super::status::ServiceError;
use crate::store::beneath::Beneath;

/// Whether `rules` (empty: any) admit `dataset`; a local folder comes back
/// held open, to be kept until the request has opened its store. A local
/// folder that cannot be held now is refused: were it compared by its path
/// alone, a link made at that path after the check would lead the store
/// outside the rules.
pub(super) fn check(rules: &[String], dataset: &str) -> Result<Option<Arc<Beneath>>, ServiceError> {
    if rules.is_empty() {
        return Ok(None);
    }
    // A URI that cannot name a dataset is the request's error, whatever
    // the rules say.
    crate::dataset::DatasetUri::parse(dataset)
        .map_err(|error| ServiceError::invalid("dataset", error.to_string()))?;
    let (real, held) = resolved_once(dataset).map_err(|reason| ServiceError::LocalFolder {
        dataset: dataset.to_string(),
        reason,
    })?;
    if rules.iter().any(|rule| rule_admits(&resolved(rule), &real)) {
        Ok(held)
    } else {
        Err(ServiceError::NotAllowed {
            dataset: dataset.to_string(),
            rules: rules.to_vec(),
        })
    }
}

/// Whether `--allow` rule `rule` admits `dataset`. A rule without a trailing
/// slash still ends at a path boundary: `s3://b/train` admits
/// `s3://b/train/x/` but not `s3://b/training/`. Local paths are compared
/// as the directories they resolve to (symlinks and `..` followed), so a
/// link inside an allowed folder does not lead out of it.
pub fn rule_allows(rule: &str, dataset: &str) -> bool {
    rule_admits(&resolved(rule), &resolved(dataset))
}

/// [`rule_allows`] on a rule and a dataset already resolved.
fn rule_admits(rule: &str, dataset: &str) -> bool {
    let dataset = dataset.trim_end_matches('/');
    let rule_dir = rule.trim_end_matches('/');
    dataset == rule_dir
        || dataset
            .strip_prefix(rule_dir)
            .is_some_and(|rest| rest.starts_with('/'))
        || (rule.ends_with("://") && dataset.starts_with(rule))
}

/// A dataset URI as `--allow` compares it, and the local folder it names,
/// held open: the store the request opens is made on that same folder
/// (`store::local::hold_root`), so the folder checked is the folder read,
/// whatever a link in its path points at by the time the store opens. A
/// local folder that cannot be held (absent, not a folder) is an error
/// saying why, never a comparison of its path.
type Resolved<'a> = (std::borrow::Cow<'a, str>, Option<Arc<Beneath>>);

fn resolved_once(dataset: &str) -> Result<Resolved<'_>, String> {
    use crate::dataset::DatasetUri;
    let Ok(DatasetUri::Local { root, manifest }) = DatasetUri::parse(dataset) else {
        return Ok((resolved(dataset), None));
    };
    let held = crate::store::local::hold_root(&root).map_err(|e| e.to_string())?;
    let real = held.resolved().map_err(|e| e.to_string())?;
    let real = real.to_string_lossy().trim_end_matches('/').to_string();
    let uri = match manifest {
        Some(manifest) => format!("file://{real}/{manifest}"),
        None => format!("file://{real}/"),
    };
    Ok((uri.into(), Some(held)))
}

/// A `file://` URI as the path it resolves to; other URIs as they are. Of a
/// path that does not exist (yet), its longest existing ancestor is
/// resolved and the rest normalized on top of it (`..` takes off a part),
/// so it cannot climb out of a rule either.
fn resolved(uri: &str) -> std::borrow::Cow<'_, str> {
    use std::path::{Component, Path, PathBuf};
    let Some(path) = uri.strip_prefix("file://") else {
        return uri.into();
    };
    let components: Vec<Component> = Path::new(path).components().collect();
    let mut split = components.len();
    let mut real = loop {
        let prefix: PathBuf = components[..split].iter().collect();
        if let Ok(found) = std::fs::canonicalize(&prefix) {
            break found;
        }
        if split == 0 {
            break PathBuf::from("/");
        }
        split -= 1;
    };
    for part in &components[split..] {
        match part {
            Component::ParentDir => {
                real.pop();
            }
            Component::Normal(name) => real.push(name),
            _ => {}
        }
    }
    let slash = if uri.ends_with('/') { "/" } else { "" };
    let text = real.to_string_lossy();
    format!("file://{}{slash}", text.trim_end_matches('/')).into()
}
