//! Which effect class a tool's calls are checked under: the tool's MCP annotations, unless
//! the policy map (`--policy-map FILE`) names the tool.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rmcp::model::ToolAnnotations;
use serde::Deserialize;
use tally_record::Effect;

/// Why a policy map was refused. Nothing is started when it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MapError {
    /// The file could not be read.
    #[error("cannot read the policy map {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid map: the TOML parser's message names the line and key.
    #[error("the policy map {} is not valid: {why}\nexpected: [effects] with \"server/tool\" = \"read\" | \"idempotent_write\" | \"non_idempotent_write\"", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong, and where.
        why: String,
    },
    /// A key is not a `server/tool` name.
    #[error("the policy map {}: key {key:?} is not a full tool name: write it as \"server/tool\" (the server's name from its initialize answer, or --server-name)", path.display())]
    NotAToolName {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
    },
}

/// Effect overrides by full tool name (`server/tool`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyMap {
    effects: BTreeMap<String, Effect>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MapFile {
    #[serde(default)]
    effects: BTreeMap<String, Effect>,
}

impl PolicyMap {
    /// Read and validate a map file.
    pub fn load(path: &Path) -> Result<PolicyMap, MapError> {
        let text = std::fs::read_to_string(path).map_err(|source| MapError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        PolicyMap::parse(&text, path)
    }

    /// Parse a map's text; `path` only names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<PolicyMap, MapError> {
        let file: MapFile = toml::from_str(text).map_err(|e| MapError::Invalid {
            path: path.to_path_buf(),
            why: e.to_string().trim_end().to_string(),
        })?;
        if let Some(key) = file.effects.keys().find(|k| {
            !k.split_once('/')
                .is_some_and(|(s, t)| !s.is_empty() && !t.is_empty())
        }) {
            return Err(MapError::NotAToolName {
                path: path.to_path_buf(),
                key: key.clone(),
            });
        }
        Ok(PolicyMap {
            effects: file.effects,
        })
    }

    /// The override for a full tool name, if the map has one.
    pub fn effect(&self, tool: &str) -> Option<Effect> {
        self.effects.get(tool).copied()
    }
}

/// The effect class MCP annotations imply. `readOnlyHint` means a read; otherwise
/// `idempotentHint` means repeating is harmless (whatever `destructiveHint` says, since
/// retries are what the class governs); otherwise, and with no annotations at all (MCP's
/// defaults: not read-only, destructive, not idempotent), a non-idempotent write.
pub fn effect_of(annotations: Option<&ToolAnnotations>) -> Effect {
    match annotations {
        Some(a) if a.read_only_hint == Some(true) => Effect::Read,
        Some(a) if a.idempotent_hint == Some(true) => Effect::IdempotentWrite,
        _ => Effect::NonIdempotentWrite,
    }
}
