use serde_json::json;

use super::*;

fn one(server: &str, name: &str, input: Value, output: Option<Value>) -> String {
    let tool = StubTool {
        server,
        name,
        description: "Does it.",
        input_schema: &input,
        output_schema: output.as_ref(),
    };
    let all = declarations(&[tool]);
    all.strip_prefix(PRELUDE).unwrap().to_string()
}

#[test]
fn identifiers_are_made_valid_and_unique() {
    assert_eq!(identifier("get-current-time"), "get_current_time");
    assert_eq!(identifier("3d.render"), "_3d_render");
    assert_eq!(identifier("delete"), "_delete");
    assert_eq!(identifier(""), "_");
    let mut scope = Scope::default();
    assert_eq!(scope.claim("a-b"), "a_b");
    assert_eq!(scope.claim("a.b"), "a_b_2");
}

#[test]
fn the_seed_example_shape() {
    let out = one(
        "time",
        "get_current_time",
        json!({"type": "object", "properties": {"timezone": {"type": "string", "description": "IANA name"}}, "required": ["timezone"]}),
        None,
    );
    assert_eq!(
        out,
        "\ndeclare namespace time {\n  type GetCurrentTimeInput = {\n    /**\n     * IANA name\n     */\n    timezone: string;\n    [key: string]: unknown;\n  };\n  /**\n   * Does it.\n   */\n  function get_current_time(input: GetCurrentTimeInput): Promise<ToolResult>;\n}\n"
    );
}

#[test]
fn enums_consts_nullable_and_unions() {
    let out = one(
        "s",
        "t",
        json!({"type": "object", "additionalProperties": false, "properties": {
            "mode": {"enum": ["a", "b", 3]},
            "kind": {"const": "fixed"},
            "maybe": {"type": ["string", "null"]},
            "legacy": {"type": "integer", "nullable": true},
            "either": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "number"}}]},
            "both": {"allOf": [{"type": "object", "properties": {"a": {"type": "string"}}}, {"type": "object", "properties": {"b": {"type": "number"}}}]}
        }}),
        None,
    );
    for want in [
        "mode?: \"a\" | \"b\" | 3;",
        "kind?: \"fixed\";",
        "maybe?: string | null;",
        "legacy?: number | null;",
        "either?: string | number[];",
        ") & (",
    ] {
        assert!(out.contains(want), "{want} not in:\n{out}");
    }
    assert!(
        !out.contains("[key: string]: unknown;\n  };\n  /**"),
        "closed object:\n{out}"
    );
}

#[test]
fn refs_and_recursion() {
    let out = one(
        "fs",
        "tree",
        json!({
            "type": "object",
            "properties": {"root": {"$ref": "#/$defs/Node"}, "old": {"$ref": "#/definitions/Leaf"}},
            "$defs": {"Node": {"type": "object", "properties": {
                "name": {"type": "string"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
            }}},
            "definitions": {"Leaf": {"type": "string"}}
        }),
        None,
    );
    assert!(out.contains("type TreeNode = {"), "{out}");
    assert!(out.contains("children?: TreeNode[];"), "{out}");
    assert!(out.contains("root?: TreeNode;"), "{out}");
    assert!(out.contains("type TreeLeaf = string;"), "{out}");
    let broken = one("fs", "t", json!({"$ref": "#/$defs/Missing"}), None);
    assert!(broken.contains("type TInput = unknown;"), "{broken}");
}

#[test]
fn arrays_tuples_and_maps() {
    let out = one(
        "s",
        "t",
        json!({"type": "object", "additionalProperties": false, "properties": {
            "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}], "items": false},
            "old_tuple": {"type": "array", "items": [{"type": "boolean"}]},
            "tags": {"type": "array", "items": {"type": ["string", "number"]}},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}}
        }}),
        None,
    );
    for want in [
        "pair?: [string, number];",
        "old_tuple?: [boolean, ...unknown[]];",
        "tags?: (string | number)[];",
        "[key: string]: string;",
    ] {
        assert!(out.contains(want), "{want} not in:\n{out}");
    }
}

#[test]
fn output_schema_types_the_result_and_depth_is_bounded() {
    let out = one(
        "w",
        "forecast",
        json!({"type": "object"}),
        Some(
            json!({"type": "object", "properties": {"temp": {"type": "number"}}, "required": ["temp"]}),
        ),
    );
    assert!(out.contains("type ForecastOutput = {"), "{out}");
    assert!(out.contains("Promise<ForecastOutput>"), "{out}");
    assert!(
        out.contains("type ForecastInput = Record<string, unknown>;"),
        "{out}"
    );

    let mut deep = json!({"type": "string"});
    for _ in 0..40 {
        deep = json!({"type": "array", "items": deep});
    }
    let out = one(
        "s",
        "deep",
        json!({"type": "object", "properties": {"x": deep}}),
        None,
    );
    assert!(out.contains("unknown[]"), "{out}");
}

#[test]
fn descriptions_cannot_close_the_comment_and_names_do_not_collide() {
    let input = json!({"type": "object"});
    let tools = [
        StubTool {
            server: "a-b",
            name: "x",
            description: "Ends */ here",
            input_schema: &input,
            output_schema: None,
        },
        StubTool {
            server: "a.b",
            name: "x-y",
            description: "",
            input_schema: &input,
            output_schema: None,
        },
        StubTool {
            server: "a.b",
            name: "x.y",
            description: "",
            input_schema: &input,
            output_schema: None,
        },
    ];
    let out = declarations(&tools);
    assert!(!out[PRELUDE.len()..].contains("Ends */"), "{out}");
    assert!(out.contains("declare namespace a_b {"), "{out}");
    assert!(out.contains("declare namespace a_b_2 {"), "{out}");
    assert!(out.contains("function x_y("), "{out}");
    assert!(out.contains("function x_y_2("), "{out}");
}
