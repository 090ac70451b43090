//! Small HTML helpers: escaping and the page frame. Everything the console
//! prints from the catalog, the store or a request goes through [`esc`].

use std::fmt::Write;

use manifold_search::Strategy;

/// Text safe inside an element or a quoted attribute.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A path segment or query value, percent-encoded.
pub fn url(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

const PAGES: [(&str, &str); 8] = [
    ("overview", "/console"),
    ("catalog", "/console/catalog"),
    ("playground", "/console/playground"),
    ("search", "/console/search"),
    ("tokens", "/console/tokens"),
    ("policies", "/console/policies"),
    ("approvals", "/console/approvals"),
    ("audit", "/console/audit"),
];

/// A whole page: head, navigation (with `active` marked) and `body`.
pub fn page(title: &str, active: &str, body: &str) -> String {
    let mut nav = String::new();
    for (name, href) in PAGES {
        let current = if name == active {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(nav, "<a href=\"{href}\"{current}>{name}</a>");
    }
    let signed_in = !active.is_empty();
    let logout = if signed_in {
        "<form method=\"post\" action=\"/console/logout\" class=\"logout\"><button>sign out</button></form>"
    } else {
        ""
    };
    let nav = if signed_in {
        format!("<nav>{nav}</nav>")
    } else {
        String::new()
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · Manifold</title>\
         <link rel=\"stylesheet\" href=\"/console/assets/console.css\">\
         <script src=\"/console/assets/console.js\" defer></script></head>\
         <body><header><a class=\"brand\" href=\"/console\">Manifold</a>{nav}{logout}</header>\
         <main><h1>{}</h1>{body}</main></body></html>",
        esc(title),
        esc(title)
    )
}

/// A table in a scrolling box, so a narrow screen scrolls it, not the page.
pub fn table(headers: &[&str], rows: &[Vec<String>], id: &str) -> String {
    let mut out = String::from("<div class=\"scroll\"><table");
    if !id.is_empty() {
        let _ = write!(out, " id=\"{id}\"");
    }
    out.push_str("><thead><tr>");
    for h in headers {
        let _ = write!(out, "<th>{}</th>", esc(h));
    }
    out.push_str("</tr></thead><tbody>");
    out.push_str(&rows_html(rows, headers.len()));
    out.push_str("</tbody></table></div>");
    out
}

/// Table rows whose cells are already HTML.
pub fn rows_html(rows: &[Vec<String>], columns: usize) -> String {
    let mut out = String::new();
    if rows.is_empty() {
        let _ = write!(
            out,
            "<tr><td colspan=\"{columns}\" class=\"empty\">none</td></tr>"
        );
    }
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{cell}</td>");
        }
        out.push_str("</tr>");
    }
    out
}

/// A button that POSTs to the admin API through the console's script.
pub fn action(method: &str, path: &str, label: &str, class: &str) -> String {
    action_with(method, path, label, class, &[])
}

/// [`action`] with hidden fields sent in its JSON body.
pub fn action_with(
    method: &str,
    path: &str,
    label: &str,
    class: &str,
    hidden: &[(&str, &str)],
) -> String {
    let fields: String = hidden
        .iter()
        .map(|(name, value)| {
            format!(
                "<input type=\"hidden\" name=\"{}\" value=\"{}\">",
                esc(name),
                esc(value)
            )
        })
        .collect();
    format!(
        "<form class=\"inline\" data-api=\"{method} {}\">{fields}<button class=\"{class}\">{}</button></form>",
        esc(path),
        esc(label)
    )
}

/// A badge whose class is the value itself (`connected`, `quarantined`...).
pub fn badge(value: &str) -> String {
    format!(
        "<span class=\"badge {}\">{}</span>",
        esc(&value.replace(' ', "_")),
        esc(value)
    )
}

/// Pretty JSON in a `<pre>`.
pub fn json_block(value: &serde_json::Value) -> String {
    format!(
        "<pre>{}</pre>",
        esc(&serde_json::to_string_pretty(value).unwrap_or_default())
    )
}

/// A `<select>` of every search strategy, `chosen` selected.
pub(crate) fn strategy_select(name: &str, chosen: &str) -> String {
    let mut out = format!("<select name=\"{name}\">");
    for s in Strategy::ALL {
        let s = s.to_string();
        let selected = if s == chosen { " selected" } else { "" };
        let _ = write!(out, "<option{selected}>{s}</option>");
    }
    out.push_str("</select>");
    out
}
