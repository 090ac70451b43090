//! A server's last hour as inline SVG: one bar per minute (calls, with the
//! failed and refused part on top) and a line for the median latency. The
//! numbers are in the page as well, as `data-` attributes on each minute and
//! as a table, so a reader without eyes (or a test) gets the same figures.

use std::fmt::Write;

use manifold_store::CallChart;

use super::html::esc;
use crate::admin::ops::format_ms;

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 180.0;
/// Room above the bars for the scale's two labels.
const TOP: f64 = 18.0;
const BOTTOM: f64 = 20.0;

fn minute(ms: i64) -> String {
    // `2026-11-30T06:56:10Z` → `06:56`
    format_ms(ms).get(11..16).unwrap_or("").to_string()
}

/// The figure and its table.
pub fn render(chart: &CallChart) -> String {
    let calls: u64 = chart.buckets.iter().map(|b| b.calls).sum();
    let errors: u64 = chart.buckets.iter().map(|b| b.errors).sum();
    let refused: u64 = chart.buckets.iter().map(|b| b.refused).sum();
    let most = chart
        .buckets
        .iter()
        .map(|b| b.calls)
        .max()
        .unwrap_or(0)
        .max(1);
    let slowest = chart
        .buckets
        .iter()
        .filter_map(|b| b.p50_ms)
        .max()
        .unwrap_or(0)
        .max(1);
    let n = chart.buckets.len().max(1) as f64;
    let slot = WIDTH / n;
    let plot = HEIGHT - TOP - BOTTOM;
    let y = |value: f64, max: f64| TOP + plot - plot * value / max;
    let mut bars = String::new();
    let mut line = Vec::new();
    for (i, b) in chart.buckets.iter().enumerate() {
        let x = i as f64 * slot;
        let height = |count: u64| plot * count as f64 / most as f64;
        let ok = b.calls.saturating_sub(b.errors + b.refused);
        let mut top = TOP + plot;
        let mut part = |class: &str, count: u64| {
            if count == 0 {
                return String::new();
            }
            top -= height(count);
            format!(
                "<rect class=\"{class}\" x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\"/>",
                x + 1.0,
                (slot - 2.0).max(1.0),
                height(count)
            )
        };
        let rects = [
            part("ok", ok),
            part("failed", b.errors),
            part("refused", b.refused),
        ]
        .concat();
        let p50 = b.p50_ms.map(|p| p.to_string()).unwrap_or_default();
        let _ = write!(
            bars,
            "<g class=\"minute\" data-start=\"{}\" data-calls=\"{}\" data-errors=\"{}\" \
             data-refused=\"{}\" data-p50=\"{p50}\"><title>{} · {} calls, {} errors, {} refused{}</title>{rects}</g>",
            b.start,
            b.calls,
            b.errors,
            b.refused,
            minute(b.start),
            b.calls,
            b.errors,
            b.refused,
            b.p50_ms
                .map(|p| format!(", p50 {p} ms"))
                .unwrap_or_default(),
        );
        if let Some(p) = b.p50_ms {
            line.push(format!(
                "{:.1},{:.1}",
                x + slot / 2.0,
                y(p as f64, slowest as f64)
            ));
        }
    }
    let latency = if line.len() > 1 {
        format!("<polyline class=\"p50\" points=\"{}\"/>", line.join(" "))
    } else {
        line.first()
            .map(|point| {
                let (cx, cy) = point.split_once(',').unwrap_or(("0", "0"));
                format!("<circle class=\"p50\" cx=\"{cx}\" cy=\"{cy}\" r=\"3\"/>")
            })
            .unwrap_or_default()
    };
    let (first, last) = (
        chart.buckets.first().map_or(0, |b| b.start),
        chart.buckets.last().map_or(0, |b| b.start),
    );
    let axis = format!(
        "<line class=\"axis\" x1=\"0\" y1=\"{base:.1}\" x2=\"{WIDTH}\" y2=\"{base:.1}\"/>\
         <text x=\"0\" y=\"{HEIGHT}\">{}</text><text x=\"{WIDTH}\" y=\"{HEIGHT}\" text-anchor=\"end\">{} UTC</text>\
         <text x=\"2\" y=\"2\" dominant-baseline=\"hanging\">{most} calls</text>\
         <text class=\"p50-label\" x=\"{WIDTH}\" y=\"2\" text-anchor=\"end\" dominant-baseline=\"hanging\">p50 up to {slowest} ms</text>",
        minute(first),
        minute(last),
        base = TOP + plot,
    );
    let mut rows = String::new();
    for b in chart.buckets.iter().filter(|b| b.calls > 0) {
        let _ = write!(
            rows,
            "<tr data-start=\"{}\"><td>{}</td><td class=\"calls\">{}</td><td class=\"errors\">{}</td>\
             <td class=\"refused\">{}</td><td class=\"p50\">{}</td></tr>",
            b.start,
            minute(b.start),
            b.calls,
            b.errors,
            b.refused,
            b.p50_ms
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into())
        );
    }
    if rows.is_empty() {
        rows.push_str("<tr><td colspan=\"5\" class=\"empty\">no calls in the last hour</td></tr>");
    }
    let truncated = if chart.truncated {
        "<p class=\"hint\">More calls than one chart reads: the oldest minutes are undercounted.</p>"
    } else {
        ""
    };
    format!(
        "<figure class=\"chart card\" id=\"chart\" data-calls=\"{calls}\" data-errors=\"{errors}\" data-refused=\"{refused}\">\
         <figcaption>Last hour, by minute: <b>{calls}</b> calls, <b>{errors}</b> errors, <b>{refused}</b> refused \
         <span class=\"legend\"><span class=\"key ok\"></span>ok <span class=\"key failed\"></span>error \
         <span class=\"key refused\"></span>refused <span class=\"key p50\"></span>p50 latency</span></figcaption>\
         <svg viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" aria-label=\"{}\">{axis}{bars}{latency}</svg>\
         {truncated}<details><summary>the numbers</summary><div class=\"scroll\"><table id=\"chart-data\">\
         <thead><tr><th>minute (UTC)</th><th>calls</th><th>errors</th><th>refused</th><th>p50 ms</th></tr></thead>\
         <tbody>{rows}</tbody></table></div></details></figure>",
        esc(&format!(
            "{calls} calls, {errors} errors, {refused} refused in the last hour"
        ))
    )
}

#[cfg(test)]
mod tests {
    use manifold_store::{CHART_BUCKET_MS, CallBucket};

    use super::*;

    #[test]
    fn every_minute_carries_its_numbers_and_the_table_its_busy_ones() {
        let start = 1_800_000_000_000;
        let mut buckets: Vec<CallBucket> = (0..60)
            .map(|i| CallBucket {
                start: start + i * CHART_BUCKET_MS,
                ..CallBucket::default()
            })
            .collect();
        buckets[59] = CallBucket {
            start: buckets[59].start,
            calls: 5,
            errors: 1,
            refused: 2,
            p50_ms: Some(12),
        };
        buckets[10].calls = 1;
        buckets[10].p50_ms = Some(3);
        let html = render(&CallChart {
            buckets,
            truncated: false,
        });
        assert_eq!(html.matches("<g class=\"minute\"").count(), 60);
        assert!(
            html.contains("data-calls=\"6\" data-errors=\"1\" data-refused=\"2\""),
            "{html}"
        );
        assert!(
            html.contains("data-calls=\"5\" data-errors=\"1\" data-refused=\"2\" data-p50=\"12\"")
        );
        assert_eq!(html.matches("<tr data-start").count(), 2);
        assert!(html.contains("<polyline class=\"p50\""));
        assert!(!html.contains("style="), "the CSP allows no inline style");
    }
}
