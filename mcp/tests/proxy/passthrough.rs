//! Every message the proxy does not judge passes byte for byte, to the Python SDK's
//! server and to the MCP reference server.

use super::*;

#[test]
fn every_message_passes_through_byte_for_byte() {
    if !sdk_available() {
        return;
    }
    let gate = Gate::start("");
    let straight = raw_script(&["python3".into(), server_py()]);
    let proxied = raw_script(&gate.proxy("raw1", &[]));
    assert!(straight.len() > 10, "{straight:#?}");
    assert_eq!(proxied, straight);
    let ds = gate.finish("raw1");
    let tools: Vec<&str> = allows(&ds)
        .iter()
        .filter_map(|d| d.tool.as_deref())
        .collect();
    assert_eq!(tools, vec!["files/steps", "files/slow"]);
}

#[test]
fn the_mcp_reference_server_passes_through() {
    if !sdk_available() {
        return;
    }
    let Some(server) = reference_server() else {
        return;
    };
    let gate = Gate::start("");
    let straight = client("everything", std::slice::from_ref(&server), &[]);
    let mut proxied_command = gate.proxy("ref1", &[]);
    proxied_command.truncate(proxied_command.len() - 2);
    proxied_command.push(server);
    let proxied = client("everything", &proxied_command, &[]);
    assert_eq!(proxied, straight);
    assert_eq!(proxied["echo"]["content"][0]["text"], "Echo: hi");
    let name = straight["initialize"]["serverInfo"]["name"]
        .as_str()
        .expect("serverInfo.name")
        .to_string();
    let ds = gate.finish("ref1");
    let tools: Vec<String> = allows(&ds).iter().filter_map(|d| d.tool.clone()).collect();
    assert_eq!(
        tools,
        vec![format!("{name}/echo"), format!("{name}/get-sum")]
    );
    let outcomes = ds.iter().filter(|d| d.status == Some(Status::Ok)).count();
    assert_eq!(outcomes, 2);
}
