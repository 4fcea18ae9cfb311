//! The report of one `kvd bench` run, as text for people and as JSON for scripts.
//!
//! Owns: the report's fields, units and JSON shape (written by hand: a flat object with a
//! few nested ones does not need a serialisation library).
//!
//! Invariants:
//! - REPORT-1: the JSON is one object on one line with these members: `workload`,
//!   `endpoints`, `clients`, `connections`, `key_space`, `value_size`, `range_keys`,
//!   `txn_ops`, `serializable`, `requests`, `succeeded`, `errors`, `keys_returned`,
//!   `elapsed_s`, `throughput_rps`, `latency_ms` {`min`, `mean`, `p50`, `p90`, `p99`,
//!   `p999`, `max`}, `histogram` [{`le_ms`, `count`}], `preload` ({`keys`, `elapsed_s`} or
//!   null) and `first_error` (string or null). The histogram counts add up to `succeeded`
//!   (BENCH-2).
//!
//! Contact points: `bench::run` fills it; `src/bin/kvd.rs` prints it.

use std::fmt::Write as _;
use std::time::Duration;

use crate::loadgen::Workload;
use crate::loadgen::histogram::Histogram;

/// The preload of the key space before the measured run.
#[derive(Debug, Clone, Copy)]
pub struct Preload {
    /// Keys written.
    pub keys: u64,
    /// How long it took.
    pub elapsed: Duration,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// The workload.
    pub workload: Workload,
    /// The endpoints.
    pub endpoints: Vec<String>,
    /// Concurrent clients.
    pub clients: usize,
    /// gRPC connections.
    pub connections: usize,
    /// Distinct keys.
    pub key_space: u64,
    /// Bytes per value.
    pub value_size: usize,
    /// Keys per range (range workload).
    pub range_keys: u64,
    /// Puts per txn (txn workload).
    pub txn_ops: usize,
    /// Whether ranges were serializable.
    pub serializable: bool,
    /// Requests sent (`succeeded + errors`).
    pub requests: u64,
    /// Requests answered OK.
    pub succeeded: u64,
    /// Requests that failed.
    pub errors: u64,
    /// Keys returned by all ranges.
    pub keys_returned: u64,
    /// Wall time of the measured run.
    pub elapsed: Duration,
    /// Latencies of the succeeded requests (µs).
    pub latencies: Histogram,
    /// The preload, if one ran.
    pub preload: Option<Preload>,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1_000.0
}

impl Report {
    /// Returns succeeded requests per second of the measured run.
    pub fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.succeeded as f64 / secs
        } else {
            0.0
        }
    }

    /// Returns the latency percentiles in milliseconds: (name, value).
    fn percentiles(&self) -> [(&'static str, f64); 7] {
        let h = &self.latencies;
        [
            ("min", ms(h.min())),
            ("mean", h.mean() / 1_000.0),
            ("p50", ms(h.percentile(50.0))),
            ("p90", ms(h.percentile(90.0))),
            ("p99", ms(h.percentile(99.0))),
            ("p999", ms(h.percentile(99.9))),
            ("max", ms(h.max())),
        ]
    }

    /// Returns the report for people: settings, counts, throughput, percentiles and a
    /// histogram with one bar per power-of-two bucket.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "workload {} against {}: {} clients over {} connections, key space {}, value {} B{}",
            self.workload.name(),
            self.endpoints.join(","),
            self.clients,
            self.connections,
            self.key_space,
            self.value_size,
            match self.workload {
                Workload::Range => format!(
                    ", {} keys per range ({})",
                    self.range_keys,
                    if self.serializable {
                        "serializable"
                    } else {
                        "linearizable"
                    }
                ),
                Workload::Txn => format!(", {} puts per txn", self.txn_ops),
                Workload::Put => String::new(),
            }
        );
        if let Some(p) = &self.preload {
            let _ = writeln!(
                out,
                "preloaded {} keys in {:.2}s",
                p.keys,
                p.elapsed.as_secs_f64()
            );
        }
        let _ = writeln!(
            out,
            "requests {} (succeeded {}, errors {}) in {:.2}s: {:.0} requests/s",
            self.requests,
            self.succeeded,
            self.errors,
            self.elapsed.as_secs_f64(),
            self.throughput()
        );
        if self.workload == Workload::Range {
            let _ = writeln!(out, "keys returned {}", self.keys_returned);
        }
        let line: Vec<String> = self
            .percentiles()
            .iter()
            .map(|(name, v)| format!("{name} {v:.3}"))
            .collect();
        let _ = writeln!(out, "latency ms: {}", line.join(", "));
        let coarse = self.latencies.coarse();
        let widest = coarse.iter().map(|(_, n)| *n).max().unwrap_or(0).max(1);
        for (bound, n) in coarse {
            let bar = "#".repeat(((n * 40).div_ceil(widest)) as usize);
            let _ = writeln!(out, "  ≤ {:>10.3} ms {n:>9} {bar}", ms(bound));
        }
        if let Some(e) = &self.first_error {
            let _ = writeln!(out, "first error: {e}");
        }
        out
    }

    /// Returns the report as one line of JSON (REPORT-1).
    pub fn json(&self) -> String {
        let endpoints: Vec<String> = self.endpoints.iter().map(|e| json_string(e)).collect();
        let latency: Vec<String> = self
            .percentiles()
            .iter()
            .map(|(name, v)| format!("\"{name}\":{}", json_number(*v)))
            .collect();
        let histogram: Vec<String> = self
            .latencies
            .coarse()
            .iter()
            .map(|(bound, n)| format!("{{\"le_ms\":{},\"count\":{n}}}", json_number(ms(*bound))))
            .collect();
        let preload = match &self.preload {
            Some(p) => format!(
                "{{\"keys\":{},\"elapsed_s\":{}}}",
                p.keys,
                json_number(p.elapsed.as_secs_f64())
            ),
            None => "null".to_owned(),
        };
        let first_error = self
            .first_error
            .as_deref()
            .map_or_else(|| "null".to_owned(), json_string);
        format!(
            "{{\"workload\":\"{}\",\"endpoints\":[{}],\"clients\":{},\"connections\":{},\
             \"key_space\":{},\"value_size\":{},\"range_keys\":{},\"txn_ops\":{},\
             \"serializable\":{},\"requests\":{},\"succeeded\":{},\"errors\":{},\
             \"keys_returned\":{},\"elapsed_s\":{},\"throughput_rps\":{},\"latency_ms\":{{{}}},\
             \"histogram\":[{}],\"preload\":{},\"first_error\":{}}}",
            self.workload.name(),
            endpoints.join(","),
            self.clients,
            self.connections,
            self.key_space,
            self.value_size,
            self.range_keys,
            self.txn_ops,
            self.serializable,
            self.requests,
            self.succeeded,
            self.errors,
            self.keys_returned,
            json_number(self.elapsed.as_secs_f64()),
            json_number(self.throughput()),
            latency.join(","),
            histogram.join(","),
            preload,
            first_error,
        )
    }
}

/// Returns `v` as a JSON number (JSON has no NaN or infinity; those become 0).
fn json_number(v: f64) -> String {
    if v.is_finite() {
        format!("{v:.3}")
    } else {
        "0".to_owned()
    }
}

/// Returns `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_string("a\"b\\\n"), "\"a\\\"b\\\\\\u000a\"");
        assert_eq!(json_number(f64::NAN), "0");
        assert_eq!(json_number(1.5), "1.500");
    }

    #[test]
    fn report_counts_and_histogram_agree() {
        let mut latencies = Histogram::default();
        for micros in [100, 200, 4_000] {
            latencies.record(micros);
        }
        let report = Report {
            workload: Workload::Put,
            endpoints: vec!["http://127.0.0.1:1".into()],
            clients: 1,
            connections: 1,
            key_space: 10,
            value_size: 3,
            range_keys: 0,
            txn_ops: 1,
            serializable: false,
            requests: 4,
            succeeded: 3,
            errors: 1,
            keys_returned: 0,
            elapsed: Duration::from_secs(1),
            latencies,
            preload: None,
            first_error: Some("Unavailable: \"down\"".into()),
        };
        let json = report.json();
        assert!(json.starts_with("{\"workload\":\"put\""), "{json}");
        assert!(json.contains("\"throughput_rps\":3.000"), "{json}");
        assert!(
            json.contains("\"first_error\":\"Unavailable: \\\"down\\\"\""),
            "{json}"
        );
        assert!(report.text().contains("requests 4 (succeeded 3, errors 1)"));
    }
}
