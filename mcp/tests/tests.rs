//! tally-mcp's library: the policy map and the effect classes annotations give. The
//! proxy end to end (real binary, real daemon, the MCP SDKs) is `proxy/`.

use std::path::Path;

use rmcp::model::ToolAnnotations;
use tally_mcp::map::effect_of;
use tally_mcp::{MapError, PolicyMap};
use tally_record::Effect;

mod classify;

fn annotations(
    read_only: Option<bool>,
    destructive: Option<bool>,
    idempotent: Option<bool>,
) -> ToolAnnotations {
    let mut a = ToolAnnotations::default();
    a.read_only_hint = read_only;
    a.destructive_hint = destructive;
    a.idempotent_hint = idempotent;
    a
}

#[test]
fn annotations_give_the_effect_class() {
    assert_eq!(
        effect_of(None),
        Effect::NonIdempotentWrite,
        "MCP's defaults: destructive, not idempotent"
    );
    assert_eq!(
        effect_of(Some(&annotations(None, None, None))),
        Effect::NonIdempotentWrite
    );
    assert_eq!(
        effect_of(Some(&annotations(Some(true), None, None))),
        Effect::Read
    );
    // readOnlyHint wins: the other hints are meaningful only when it is false.
    assert_eq!(
        effect_of(Some(&annotations(Some(true), Some(true), Some(false)))),
        Effect::Read
    );
    assert_eq!(
        effect_of(Some(&annotations(Some(false), Some(false), Some(true)))),
        Effect::IdempotentWrite
    );
    // Destructive but idempotent (delete by id): repeating it changes nothing more.
    assert_eq!(
        effect_of(Some(&annotations(None, Some(true), Some(true)))),
        Effect::IdempotentWrite
    );
    assert_eq!(
        effect_of(Some(&annotations(Some(false), Some(true), None))),
        Effect::NonIdempotentWrite
    );
    assert_eq!(
        effect_of(Some(&annotations(Some(false), Some(false), Some(false)))),
        Effect::NonIdempotentWrite
    );
}

#[test]
fn a_policy_map_overrides_by_full_tool_name() {
    let map = PolicyMap::parse(
        "[effects]\n\"files/lookup\" = \"non_idempotent_write\"\n\"files/put\" = \"read\"\n",
        Path::new("map.toml"),
    )
    .expect("valid");
    assert_eq!(map.effect("files/lookup"), Some(Effect::NonIdempotentWrite));
    assert_eq!(map.effect("files/put"), Some(Effect::Read));
    assert_eq!(map.effect("lookup"), None);
    assert_eq!(
        PolicyMap::parse("", Path::new("empty.toml")).expect("empty is valid"),
        PolicyMap::default()
    );
}

#[test]
fn a_bad_policy_map_is_refused_with_where_and_what() {
    let bad_effect = PolicyMap::parse(
        "[effects]\n\"files/put\" = \"write\"\n",
        Path::new("m.toml"),
    )
    .unwrap_err();
    let text = bad_effect.to_string();
    assert!(
        matches!(bad_effect, MapError::Invalid { .. }),
        "{bad_effect:?}"
    );
    assert!(
        text.contains("m.toml") && text.contains("line 2") && text.contains("write"),
        "{text}"
    );
    assert!(
        text.contains("idempotent_write"),
        "says what is expected: {text}"
    );

    let unknown =
        PolicyMap::parse("[effect]\n\"files/put\" = \"read\"\n", Path::new("m.toml")).unwrap_err();
    assert!(unknown.to_string().contains("effect"), "{unknown}");

    let short = PolicyMap::parse("[effects]\nput = \"read\"\n", Path::new("m.toml")).unwrap_err();
    assert!(
        matches!(&short, MapError::NotAToolName { key, .. } if key == "put"),
        "{short:?}"
    );
    assert!(short.to_string().contains("server/tool"), "{short}");

    let missing = PolicyMap::load(Path::new("/nonexistent/map.toml")).unwrap_err();
    assert!(matches!(missing, MapError::Read { .. }), "{missing:?}");
}
