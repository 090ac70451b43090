//! A plain call's JSON-RPC message, written from borrowed parts in the
//! layout rmcp's `ClientJsonRpcMessage` gives it.

use rmcp::model::{InputResponses, JsonObject, NumberOrString};

/// A `tools/call` message as rmcp's `ClientJsonRpcMessage` serialises it,
/// written from borrowed parts: rmcp's path would clone the fixed `_meta`
/// into the request, merge maps, and go through serde's flattening. The
/// test `the_message_is_the_one_rmcp_would_send` holds the two equal.
#[derive(serde::Serialize)]
pub(super) struct CallMessage<'a> {
    pub(super) jsonrpc: &'static str,
    pub(super) id: &'a NumberOrString,
    pub(super) method: &'static str,
    pub(super) params: CallParams<'a>,
}

/// rmcp's `CallToolRequestParams`, field for field.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CallParams<'a> {
    #[serde(rename = "_meta")]
    pub(super) meta: MergedMeta<'a>,
    pub(super) name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) arguments: Option<&'a JsonObject>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) input_responses: Option<&'a InputResponses>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) request_state: Option<&'a str>,
}

/// The maps `layers` merged as `extend` would merge them, in order, then
/// `traceparent` set: each key where it first appears, with the value of
/// the last layer that has it.
pub(super) struct MergedMeta<'a> {
    pub(super) layers: [&'a JsonObject; 3],
    pub(super) traceparent: Option<&'a str>,
}

impl serde::Serialize for MergedMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        const TRACEPARENT_KEY: &str = "traceparent";
        let mut map = serializer.serialize_map(None)?;
        let mut traced = false;
        for (n, layer) in self.layers.iter().enumerate() {
            for (key, value) in layer.iter() {
                if self.layers[..n]
                    .iter()
                    .any(|earlier| earlier.contains_key(key))
                {
                    continue;
                }
                match self.traceparent {
                    Some(traceparent) if key == TRACEPARENT_KEY => {
                        traced = true;
                        map.serialize_entry(key, traceparent)?;
                    }
                    _ => {
                        let last = self.layers[n + 1..]
                            .iter()
                            .rev()
                            .find_map(|later| later.get(key))
                            .unwrap_or(value);
                        map.serialize_entry(key, last)?;
                    }
                }
            }
        }
        if let (Some(traceparent), false) = (self.traceparent, traced) {
            map.serialize_entry(TRACEPARENT_KEY, traceparent)?;
        }
        map.end()
    }
}
